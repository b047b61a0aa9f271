"""Tests for CORS, plantstore.py's "CORS: browser pages of other origins, as a wrapper
the core never sees": a preflight from a listed origin answered, the headers of every
answer to it (errors too), nothing for any other origin, nothing changed without
cors_origins, and make_app refusing an origin no browser sends. HEAD and OPTIONS without
CORS are the core's, in test_plantstore.py; how PLANTSTORE_CORS_ORIGINS is read is
test_plantstore_settings.py's."""

import pytest
import webtest

from plantstore_app import make_app
from testbed import AUTH, TOKEN, post


# ---- CORS: listed origins, and no other ----

ORIGIN = "https://playground.example"


@pytest.fixture
def cors_app(store):
    return webtest.TestApp(
        make_app([TOKEN], store=store, cors_origins=[ORIGIN, "http://localhost:3000"])
    )


def test_a_preflight_from_a_listed_origin_is_answered(cors_app):
    response = cors_app.options(
        "/plants",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        status=204,
    )
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert response.headers["Access-Control-Allow-Methods"] == response.headers["Allow"]
    assert (
        response.headers["Access-Control-Allow-Headers"]
        == "Authorization, Content-Type, X-Request-ID"
    )
    assert (
        int(response.headers["Access-Control-Max-Age"]) > 0
        and response.headers["Vary"] == "Origin"
    )


def test_answers_to_a_listed_origin_carry_cors_headers_errors_too(cors_app):
    created = post(
        cors_app, {"id": 1, "name": "Fern"}, 200, headers={**AUTH, "Origin": ORIGIN}
    )
    refused = post(cors_app, {"id": 2, "name": "Ivy"}, 401, headers={"Origin": ORIGIN})
    for response in created, refused:
        assert (
            response.headers["Access-Control-Allow-Origin"] == ORIGIN
            and response.headers["Vary"] == "Origin"
        )
        assert "Link" in response.headers["Access-Control-Expose-Headers"]


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "https://playground.example.evil", "null", None]
)
def test_other_origins_get_no_cors_headers(cors_app, origin):
    headers = {"Origin": origin} if origin else {}
    preflight = cors_app.options(
        "/plants",
        headers={**headers, "Access-Control-Request-Method": "POST"},
        status=204,
    )
    created = post(
        cors_app, {"id": 1, "name": "Fern"}, 200, headers={**AUTH, **headers}
    )
    for response in preflight, created:
        assert not any(name.startswith("Access-Control") for name in response.headers)
        # the answer to a listed origin differs: caches must know
        assert response.headers["Vary"] == "Origin"


def test_without_cors_origins_nothing_changes(app):
    response = post(
        app, {"id": 1, "name": "Fern"}, 200, headers={**AUTH, "Origin": ORIGIN}
    )
    assert (
        not any(name.startswith("Access-Control") for name in response.headers)
        and "Vary" not in response.headers
    )


@pytest.mark.parametrize(
    "origin",
    [
        "*",
        "https://playground.example/",
        "https://playground.example/docs",
        "playground.example",
        "ftp://playground.example",
    ],
)
def test_make_app_refuses_an_origin_no_browser_sends(origin):
    with pytest.raises(ValueError, match="must be one a browser sends"):
        make_app([TOKEN], cors_origins=[origin])
