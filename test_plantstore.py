"""The tests of plantstore.py, the core, and of nothing beside it; they run with pytest
and WebTest alone. In process, plantstore.Application (the `app` fixture) with its
MemoryStore: routing, authentication, Content-Length and size, the media type, strict
JSON, NewPlant, the check order, HEAD, OPTIONS and 405, error rendering, request ids,
pages and the streamed listing, the store under threads. Then plantstore.py copied alone
into a folder and run: the core served in memory, and the settings it refuses. The full
service's tests are each in a file named by its part, test_plantstore_<part>.py."""

import ast
import io
import json
import os
import re
import shutil
import signal
import sys

import pytest
import webtest

import plantstore
from plantstore import Application, INT64_MAX, INT64_MIN, MAX_BODY_BYTES

from testbed import (
    AUTH,
    BAD_AUTH,
    BrokenStore,
    FailingInput,
    HERE,
    KEPT_IDS,
    OTHER_TOKEN,
    REPLACED_IDS,
    SERVICE_LINKS,
    STATUSES_RAISED,
    TOKEN,
    WAIT,
    Lines,
    answered_ids,
    assert_405_with_the_allow_of_options_before_auth,
    assert_error,
    assert_head_as_get,
    assert_options_204_with_allow,
    body_of_size,
    call,
    environ_without_tokens,
    in_threads,
    mounted_at_api,
    exchange,
    post,
    stored,
)

INT64_RANGE = f"from {INT64_MIN} to {INT64_MAX}"  # in the 400 of an id out of range


@pytest.fixture
def store():
    """The core's store, MemoryStore (conftest.py's is make_app's, ChunkedStore)."""
    return plantstore.MemoryStore()


@pytest.fixture
def app(store):
    """The core alone, in WebTest, lint on: anything written to wsgi.errors fails the
    test. It overrides conftest.py's `app`, the whole service as make_app builds it,
    which adds /openapi.json, /metrics, webhooks and CORS: the other files' parts."""
    return webtest.TestApp(Application([TOKEN, OTHER_TOKEN], store=store))


# ---- Creating a plant ----


def test_create_returns_the_plant_without_id(app, store):
    response = post(app, {"id": 1, "name": "Fern", "tag": "indoor"}, 200)
    assert response.json == {"name": "Fern", "tag": "indoor"}
    assert response.content_type == "application/json"
    assert int(response.headers["Content-Length"]) == len(response.body)
    assert stored(store).get(1) == ("Fern", "indoor")


def test_create_without_tag_answers_without_tag(app, store):
    assert post(app, {"id": 2, "name": "Cactus"}, 200).json == {"name": "Cactus"}
    assert stored(store).get(2) == ("Cactus", None)


def test_unknown_fields_are_ignored_and_not_stored(app, store):
    response = post(
        app, {"id": 3, "name": "Ivy", "colour": "green", "owner": {"x": [1]}}, 200
    )
    assert response.json == {"name": "Ivy"}
    assert stored(store).get(3) == ("Ivy", None)


def test_duplicate_id_is_409_and_keeps_the_first_plant(app, store):
    post(app, {"id": 5, "name": "Rose", "tag": "red"}, 200)
    assert_error(post(app, {"id": 5, "name": "Impostor"}, 409), 409, "already exists")
    assert stored(store).get(5) == ("Rose", "red")
    assert len(stored(store)) == 1


@pytest.mark.parametrize(
    "name",
    ["", " ", "Ficus 🌿", "名前", "a" * 10_000, "\u0000"],
    ids=["empty", "space", "emoji", "cjk", "long", "nul-char"],
)
def test_any_string_is_a_name_and_round_trips(app, store, name):
    response = post(app, {"id": 9, "name": name, "tag": name}, 200)
    assert response.body.isascii()  # ensure_ascii: escapes, never raw bytes
    assert response.json == {"name": name, "tag": name}
    assert stored(store).get(9) == (name, name)


def test_lone_surrogate_in_name_is_stored_and_escaped(app, store):
    response = post(app, b'{"id": 10, "name": "\\ud800", "tag": "\\udfff"}', 200)
    assert response.body == b'{"name": "\\ud800", "tag": "\\udfff"}'
    assert stored(store).get(10) == ("\ud800", "\udfff")


# ---- plantstore.py copied alone: the core, served in memory, refusing the rest ----


def alone(tmp_path, spawn, *args, **settings):
    """`python -S plantstore.py ARGS` run from a folder that holds plantstore.py alone:
    no module beside it, and no site-packages (-S), so no installed copy either."""
    shutil.copy(HERE / "plantstore.py", tmp_path)
    command = [sys.executable, "-S", "plantstore.py", *args]
    return spawn(command, environ_without_tokens(**settings), cwd=tmp_path)


def test_plantstore_py_copied_alone_serves_the_core_in_memory(tmp_path, spawn):
    process = alone(tmp_path, spawn, "--port", "0", PLANTSTORE_TOKENS=TOKEN)
    lines = Lines(process.stderr)
    host, port = lines.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    fern = {"id": 1, "name": "Fern"}
    assert exchange(host, port, "POST", "/plants", fern)[::2] == (200, {"name": "Fern"})
    assert exchange(host, port, "POST", "/plants", fern)[0] == 409
    assert exchange(host, port, "GET", "/plants")[::2] == (200, [{"name": "Fern"}])
    status, headers, _ = exchange(host, port, "DELETE", "/plants/1")
    assert status == 204 and "Content-Length" not in headers  # unlike stock wsgiref
    assert exchange(host, port, "GET", "/plants", token="not-a-token-we-know")[0] == 401
    process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.wait(WAIT) == 0
    assert "Traceback" not in lines.rest()


def test_plantstore_py_alone_makes_up_a_token_when_none_is_set(tmp_path, spawn):
    process = alone(tmp_path, spawn, "--port", "0")
    lines = Lines(process.stderr)
    token = lines.until(r"this run accepts one new token: (\S+)")[1]
    host, port = lines.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    assert exchange(host, port, "GET", "/plants", token=token)[0] == 200


@pytest.mark.parametrize(
    "name, value",
    [
        ("PLANTSTORE_DB", "plants.sqlite3"),
        ("PLANTSTORE_DB", "postgresql://plantstore@db/plants"),
        ("PLANTSTORE_WEBHOOK_URL", "http://127.0.0.1:9/hook"),
        ("PLANTSTORE_CORS_ORIGINS", "https://example.org"),
        ("PLANTSTORE_TOKENS_FILE", "/etc/plantstore/tokens"),
    ],
)
def test_plantstore_py_alone_refuses_a_setting_only_the_full_service_serves(
    tmp_path, spawn, name, value
):
    """It never keeps plants in memory when a database was asked for, nor serves
    without webhooks or CORS that were asked for: one line, naming what it needs."""
    process = alone(
        tmp_path, spawn, "--port", "0", PLANTSTORE_TOKENS=TOKEN, **{name: value}
    )
    assert process.wait(WAIT) == 2
    assert process.stderr.read().splitlines() == [
        f"plantstore: {name} needs the full service: plantstore_app.py and the "
        "modules beside plantstore.py, or plantstore.pyz; this file keeps plants in "
        "memory"
    ]
    assert os.listdir(tmp_path) == ["plantstore.py"]  # no file made


def test_plantstore_py_alone_refuses_a_typo_and_lets_service_links_pass(
    tmp_path, spawn
):
    process = alone(
        tmp_path, spawn, "--port", "0", PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB_URL="x"
    )
    assert process.wait(WAIT) == 2
    assert process.stderr.read() == (
        "plantstore: PLANTSTORE_DB_URL is not a plantstore setting: did you mean "
        "PLANTSTORE_DB?\n"
    )
    # what Kubernetes sets for a Service named plantstore and one named plantstore-db
    process = alone(
        tmp_path, spawn, "--port", "0", PLANTSTORE_TOKENS=TOKEN, **SERVICE_LINKS
    )
    Lines(process.stderr).until(r"listening on http://")


def test_python_older_than_3_11_is_told_so_in_one_line(tmp_path, spawn):
    shutil.copy(HERE / "plantstore.py", tmp_path)
    # as Python 3.10 would see it
    code = "import sys; sys.version_info = (3, 10, 13, 'final', 0); import plantstore"
    process = spawn(
        [sys.executable, "-S", "-c", code], environ_without_tokens(), cwd=tmp_path
    )
    assert process.wait(WAIT) == 1
    assert process.stderr.read() == "plantstore needs Python 3.11 or newer\n"


# modules of the standard library that only POSIX systems have
POSIX_ONLY = {"fcntl", "grp", "posix", "pty", "pwd", "resource", "syslog", "termios"}


def test_plantstore_py_imports_only_what_it_uses_and_runs_anywhere():
    """plantstore.py imports nothing it does not use (no noqa hides one), nothing
    beside it but in full_service(), and nothing that only POSIX systems have: it
    copies alone, onto Windows too."""
    tree = ast.parse((HERE / "plantstore.py").read_text(encoding="utf-8"))
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                module = alias.name if isinstance(node, ast.Import) else node.module
                imported[alias.asname or alias.name.split(".")[0]] = module
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert set(imported) - used == set(), "imported, never used"
    assert {module.split(".")[0] for module in imported.values()} & POSIX_ONLY == set()
    assert "# noqa" not in (HERE / "plantstore.py").read_text(encoding="utf-8")
    beside = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Import) and node.names[0].name.startswith("plantstore")
    ]
    handing_over = next(
        n for n in tree.body if getattr(n, "name", "") == "full_service"
    )
    assert (
        len(beside) == 1 and handing_over.lineno < beside[0] < handing_over.end_lineno
    )


class _Anything:
    def __init__(self, kind):
        self.kind = kind

    def __eq__(self, other):
        return isinstance(other, self.kind)


ANY_HEADERS, ANY_TEXT = _Anything(dict), _Anything(str)


# ---- Routes and methods come before authentication ----


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/plants/",
        "/plant",
        "/plants/1/x",
        "/plants//1",
        "/PLANTS",
        "/plants.json",
        "//plants",
        "/plants/1/",
    ],
)
def test_unknown_path_is_404_before_auth(app, path):
    response = app.post(
        path, "{}", content_type="application/json", status=404, expect_errors=True
    )
    assert_error(response, 404)
    assert "WWW-Authenticate" not in response.headers


# The rule, whatever the routes: a 405 sends the Allow OPTIONS sends (docs/http.md).
@pytest.mark.parametrize("path", ["/plants", "/plants/1", "/plants/abc", "/health"])
def test_other_methods_are_405_with_allow_before_auth(app, path):
    assert_405_with_the_allow_of_options_before_auth(app, path)


def test_a_route_declared_beside_plants_id_is_found_as_it_is(app):
    """/plants/{id} takes /plants/<anything> but a path declared as it is."""
    application, allow = app.app, app.options("/plants/7").headers["Allow"]

    @plantstore.operation("GET", "/plants/count")
    def countPlants(_environ, _):
        return 200, b'{"count": 0}', plantstore.JSON_HEADERS

    application.declare(countPlants)
    assert app.get("/plants/count", headers=AUTH, status=200).json == {"count": 0}
    assert app.options("/plants/7").headers["Allow"] == allow  # /plants/{id}'s


# ---- HEAD and OPTIONS, and the app mounted under a prefix ----


@pytest.mark.parametrize(
    "path, headers, status",
    [
        ("/plants?limit=5", AUTH, 200),
        ("/plants", AUTH, 200),
        ("/plants", {}, 401),
        ("/nope", AUTH, 404),
        ("/plants?limit=x", AUTH, 400),
    ],
    ids=[
        "page",
        "streamed-listing",
        "no-token",
        "unknown-path",
        "bad-limit",
    ],
)
def test_head_answers_as_get_would_without_a_body(store, path, headers, status):
    store.add(1, "Fern", None)
    assert_head_as_get(Application([TOKEN], store=store), path, headers, status)


def test_head_on_a_route_without_get_is_405_with_its_allow():
    application = plantstore.Application([TOKEN])
    application.declare(
        plantstore.operation("DELETE", "/things/{id}")(lambda *_: (204, b"", []))
    )
    status, headers, body = call(application, method="HEAD", path="/things/1")
    assert (status, headers["Allow"], body) == (405, "DELETE, OPTIONS", None)


@pytest.mark.parametrize("path", ["/plants", "/plants/7"])
def test_options_answers_204_with_allow_without_a_token(app, path):
    assert_options_204_with_allow(app, path)


def test_options_on_plants_id_answers_the_route_s_allow_whatever_the_id(app):
    """A route's methods do not depend on its {id}: only a handler reads it (DELETE
    /plants/x is a 400), so a preflight for /plants/x learns what /plants/7 allows."""
    allow = app.options("/plants/7", status=204).headers["Allow"]
    assert app.options("/plants/x", status=204).headers["Allow"] == allow


def test_a_chunked_body_the_server_does_not_frame_is_411():
    status, headers, body = call(
        Application([TOKEN]),
        body=b'{"id": 1, "name": "x"}',
        environ={"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked"},
    )
    assert (
        status == 411 and body["error"] == 411 and "Content-Length" in body["message"]
    )


def test_mounted_under_a_prefix_answers_as_at_the_root(store):
    """Routing uses PATH_INFO alone, so SCRIPT_NAME can be anything."""
    mounted = webtest.TestApp(
        Application([TOKEN], store=store), extra_environ={"SCRIPT_NAME": "/api"}
    )
    assert post(mounted, {"id": 1, "name": "Moss"}, 200).json == {"name": "Moss"}
    assert_error(mounted.post("/other", status=404, expect_errors=True), 404)
    assert stored(store).get(1) == ("Moss", None)


def test_mounted_under_a_prefix_a_404_names_the_routes_as_the_client_calls_them(store):
    mounted = webtest.TestApp(
        Application([TOKEN], store=store), extra_environ={"SCRIPT_NAME": "/api"}
    )
    message = mounted.get("/other", status=404, expect_errors=True).json["message"]
    named = message.removeprefix("not found: the routes are ").split(", ")
    assert named and all(route.startswith("/api/") for route in named), message
    assert "/api/plants" in named and "/api/plants/{id}" in named


def test_mounted_behind_a_dispatcher(store):
    """A parent app shifts /api off the path, as a real WSGI stack would."""
    parent = mounted_at_api(Application([TOKEN], store=store))
    status, _, body = call(
        parent, path="/api/plants", body=b'{"id": 4, "name": "Sage"}'
    )
    assert (status, body) == (200, {"name": "Sage"})
    assert stored(store).get(4) == ("Sage", None)


# ---- Authentication ----


@pytest.mark.parametrize("headers, error", BAD_AUTH)
def test_bad_credentials_are_401_with_challenge(app, store, headers, error):
    response = post(app, {"id": 1, "name": "Fern"}, 401, headers=headers)
    assert_error(response, 401)
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith('Bearer realm="plantstore"')
    assert ('error="invalid_token"' in challenge) == (error == "invalid_token")
    assert TOKEN not in response.text and TOKEN not in challenge
    assert len(stored(store)) == 0


@pytest.mark.parametrize(
    "value",
    [
        f"Bearer {TOKEN}",
        f"bearer {TOKEN}",
        f"BEARER {TOKEN}",
        f"Bearer   {TOKEN}",
        f"Bearer {OTHER_TOKEN}",
    ],
    ids=[
        "canonical",
        "lower-case-scheme",
        "upper-case-scheme",
        "extra-spaces",
        "second-token",
    ],
)
def test_accepted_credentials(app, value):
    post(app, {"id": 1, "name": "Fern"}, 200, headers={"Authorization": value})


def test_auth_comes_before_media_type_and_body(app):
    response = post(app, b"not json", 401, headers={}, content_type="text/plain")
    assert_error(response, 401)


class ExplodingInput(io.BytesIO):
    """A wsgi.input that fails the test if the application reads it."""

    def read(self, *_args):
        raise AssertionError("the application read the body")

    readline = read


def test_401_never_reads_the_body():
    status, headers, body = call(
        Application([TOKEN]),
        environ={
            "HTTP_AUTHORIZATION": "Bearer wrong",
            "wsgi.input": ExplodingInput(),
            "CONTENT_LENGTH": "10",
        },
    )
    assert status == 401 and body["error"] == 401


# ---- Media type ----


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "",
        "text/plain;application/json",
        "application/jsonp",
        "application/json-patch+json",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "application/ json",
        "json",
    ],
)
def test_other_media_types_are_415_with_accept(app, store, content_type):
    response = post(app, {"id": 1, "name": "Fern"}, 415, content_type=content_type)
    assert_error(response, 415, "application/json")
    assert response.headers["Accept"] == "application/json"
    assert len(stored(store)) == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/json;charset=UTF-8",
        "application/json ; x=y",
    ],
)
def test_json_media_type_with_parameters_or_any_case_is_accepted(app, content_type):
    post(app, {"id": 1, "name": "Fern"}, 200, content_type=content_type)


def test_missing_content_type_is_415():
    status, headers, body = call(
        Application([TOKEN]),
        body=b'{"id": 1, "name": "x"}',
        environ={"CONTENT_TYPE": ""},
    )
    assert (
        status == 415
        and headers["Accept"] == "application/json"
        and body["error"] == 415
    )


# ---- Content-Length and size (raw WSGI: WebTest would fix these headers) ----


@pytest.mark.parametrize(
    "value",
    ["abc", "-1", "+5", " 5", "5 ", "1e3", "0x10", "\u0663", "1_0", "5.0"],
    ids=[
        "letters",
        "negative",
        "plus",
        "leading-space",
        "trailing-space",
        "exponent",
        "hex",
        "arabic-digit",
        "underscore",
        "decimal",
    ],
)
def test_malformed_content_length_is_400(value):
    # wsgiref's validator refuses such an environ itself, but wsgiref's server passes
    # the header through.
    status, _, body = call(
        Application([TOKEN]),
        body=b'{"id": 1, "name": "x"}',
        environ={"CONTENT_LENGTH": value},
        validate=False,
    )
    assert status == 400 and body == {
        "error": 400,
        "message": "Content-Length must be a non-negative integer",
    }


@pytest.mark.parametrize("value", ["", None], ids=["empty-string", "absent"])
def test_no_content_length_means_an_empty_body(value):
    """PEP 3333: CONTENT_LENGTH may be empty or absent, and then the app must not read
    wsgi.input."""
    status, _, body = call(
        Application([TOKEN]),
        environ={"CONTENT_LENGTH": value, "wsgi.input": ExplodingInput()},
    )
    assert status == 400 and body == {
        "error": 400,
        "message": "request body is empty: send a NewPlant JSON object",
    }


def test_body_at_the_limit_is_accepted(app, store):
    post(app, body_of_size(MAX_BODY_BYTES), 200)
    assert stored(store).get(1) == ("Fern", None)


def test_body_one_byte_over_the_limit_is_413(app, store):
    assert_error(
        post(app, body_of_size(MAX_BODY_BYTES + 1), 413), 413, str(MAX_BODY_BYTES)
    )
    assert len(stored(store)) == 0


@pytest.mark.parametrize("limit", [30, 1000, 1_000_000])
def test_configured_limit(limit):
    application = Application([TOKEN], max_body_bytes=limit)
    assert call(application, body=body_of_size(limit))[0] == 200
    assert call(application, body=body_of_size(limit + 1, plant_id=2))[0] == 413


def test_a_zero_limit_refuses_every_body():
    assert call(Application([TOKEN], max_body_bytes=0), body=b"{}")[0] == 413


@pytest.mark.parametrize(
    "value",
    [str(MAX_BODY_BYTES + 1), "9" * 30, "9" * 5000],
    ids=["limit+1", "30-digits", "5000-digits"],
)
def test_oversized_content_length_is_413_without_reading(value):
    status, _, body = call(
        Application([TOKEN]),
        environ={"wsgi.input": ExplodingInput(), "CONTENT_LENGTH": value},
        # the validator's own int() refuses 5,000 digits
        validate=len(value) < 4300,
    )
    assert status == 413 and body["error"] == 413


def test_leading_zeros_in_content_length_are_digits():
    document = b'{"id": 1, "name": "x"}'
    status, _, body = call(
        Application([TOKEN]),
        body=document,
        environ={"CONTENT_LENGTH": "0" * 40 + str(len(document))},
    )
    assert (status, body) == (200, {"name": "x"})


def test_body_is_never_read_past_content_length():
    document = b'{"id": 1, "name": "x"}'
    stream = io.BytesIO(document + b"GARBAGE THAT BELONGS TO THE NEXT REQUEST")
    status, _, body = call(
        Application([TOKEN]),
        environ={"wsgi.input": stream, "CONTENT_LENGTH": str(len(document))},
    )
    assert (status, body) == (200, {"name": "x"})
    assert stream.read() == b"GARBAGE THAT BELONGS TO THE NEXT REQUEST"


def test_body_shorter_than_content_length_is_400():
    status, _, body = call(
        Application([TOKEN]),
        environ={"wsgi.input": io.BytesIO(b'{"id": 1}'), "CONTENT_LENGTH": "50"},
    )
    assert status == 400 and "shorter" in body["message"]


class ChunkParseError(Exception):
    """Like gunicorn's parse errors for a malformed chunked body: not an OSError."""


@pytest.mark.parametrize(
    "error, status",
    [
        (TimeoutError("timed out"), 408),
        (ConnectionResetError(), 400),
        (ChunkParseError("bad chunk size"), 400),
    ],
    ids=["timeout", "hang-up", "bad-chunk"],
)
def test_a_body_the_server_cannot_read_is_4xx_not_500(error, status):
    for environ in (
        {"CONTENT_LENGTH": "50"},
        {"CONTENT_LENGTH": None, "wsgi.input_terminated": True},
    ):
        got, _, body = call(
            Application([TOKEN]), environ={"wsgi.input": FailingInput(error), **environ}
        )
        assert (
            got == status
            and body["error"] == status
            and "bad chunk" not in body["message"]
        )


@pytest.mark.parametrize(
    "size, status",
    [(MAX_BODY_BYTES, 200), (MAX_BODY_BYTES + 1, 413), (10 * MAX_BODY_BYTES, 413)],
)
def test_chunked_body_is_read_up_to_one_byte_past_the_limit(size, status):
    """Without CONTENT_LENGTH, a server that sets wsgi.input_terminated (gunicorn) lets
    the app read to EOF."""
    stream = io.BytesIO(body_of_size(size))
    got, _, body = call(
        Application([TOKEN]),
        environ={
            "wsgi.input": stream,
            "wsgi.input_terminated": True,
            "CONTENT_LENGTH": None,
        },
    )
    assert got == status and stream.tell() <= MAX_BODY_BYTES + 1


# ---- JSON: strict RFC 8259, and no input makes the parser raise past the handler ----

BAD_JSON = [
    pytest.param(b"", id="empty"),
    pytest.param(b"   \n", id="whitespace-only"),
    pytest.param(b'{"id": 1, "name": "Fern"', id="truncated"),
    pytest.param(b'{"id": 1, "name": "Fe', id="truncated-in-string"),
    pytest.param(b'{"id": 1, "name": "Fern"} x', id="trailing-garbage"),
    pytest.param(b'{"id": 1, "name": "Fern"}{}', id="two-documents"),
    pytest.param(b'{"id": 1, "name": "Fern",}', id="trailing-comma"),
    pytest.param(b"{'id': 1, 'name': 'Fern'}", id="single-quotes"),
    pytest.param(b'{id: 1, name: "Fern"}', id="bare-keys"),
    pytest.param(b'{"id": 1, /* c */ "name": "Fern"}', id="comment"),
    pytest.param(b'{"id": 01, "name": "Fern"}', id="leading-zero"),
    pytest.param(b'{"id": +1, "name": "Fern"}', id="plus-sign"),
    pytest.param(b'{"id": .5, "name": "Fern"}', id="bare-fraction"),
    pytest.param(b'{"id": 0x1F, "name": "Fern"}', id="hex"),
    pytest.param(b'{"id": 1, "name": "Fe\x01rn"}', id="control-char-in-string"),
    pytest.param(b'{"id": 1, "name": "\\x41"}', id="bad-escape"),
    pytest.param(b'{"id": 1, "name": "\\u12"}', id="short-unicode-escape"),
    pytest.param(b'{"id": 1, "name": "\xff"}', id="invalid-utf8"),
    pytest.param(b'{"id": 1, "name": "\xed\xa0\x80"}', id="utf8-encoded-surrogate"),
    pytest.param(b'{"id": 1, "name": "\xc0\xaf"}', id="overlong-utf8"),
    pytest.param('{"id": 1, "name": "Fern"}'.encode("utf-16"), id="utf-16"),
    pytest.param(b'\xef\xbb\xbf{"id": 1, "name": "Fern"}', id="utf8-bom"),
    pytest.param(b'{"id": NaN, "name": "Fern"}', id="nan-id"),
    pytest.param(b'{"id": Infinity, "name": "Fern"}', id="infinity-id"),
    pytest.param(b'{"id": -Infinity, "name": "Fern"}', id="minus-infinity-id"),
    pytest.param(b'{"id": 1, "name": "Fern", "x": NaN}', id="nan-elsewhere"),
    pytest.param(b'{"id": 1, "name": "Fern", "id": 2}', id="duplicate-key"),
    pytest.param(
        b'{"id": 1, "name": "Fern", "x": {"a": 1, "a": 1}}', id="duplicate-nested-key"
    ),
    pytest.param(b"[" * 20_000 + b"]" * 20_000, id="20000-nested-arrays"),
    pytest.param(b'{"a":' * 20_000 + b"1" + b"}" * 20_000, id="20000-nested-objects"),
    pytest.param(b"[" * 20_000, id="20000-unclosed-arrays"),
    pytest.param(b'{"id": ' + b"1" * 5000 + b', "name": "Fern"}', id="5000-digit-id"),
    pytest.param(
        b'{"id": 1, "name": "Fern", "x": ' + b"9" * 5000 + b"}",
        id="5000-digit-elsewhere",
    ),
    pytest.param(
        b'{"id": 1E+9999999999999999999999, "name": "Fern"}',
        id="exponent-beyond-decimal",
    ),
    pytest.param(
        b'{"id": 1, "name": "Fern", "x": 1e-9999999999999999999999}',
        id="tiny-exponent-elsewhere",
    ),
]


@pytest.mark.parametrize("body", BAD_JSON)
def test_malformed_json_is_400(store, body):
    # deep nesting is long
    roomy = webtest.TestApp(
        Application([TOKEN], store=store, max_body_bytes=len(body) + 1)
    )
    assert_error(post(roomy, body, 400), 400)
    assert len(stored(store)) == 0


def test_json_error_message_does_not_echo_input(app):
    response = post(app, b'{"id": 1, "name": "SECRET-VALUE" oops}', 400)
    assert (
        "SECRET-VALUE" not in response.text
        and "not valid JSON" in response.json["message"]
    )


# ---- Shape: NewPlant ----

BAD_SHAPES = [
    pytest.param(False, "JSON object", id="false"),
    pytest.param(True, "JSON object", id="true"),
    pytest.param(0, "JSON object", id="zero"),
    pytest.param(0.0, "JSON object", id="zero-float"),
    pytest.param("", "JSON object", id="empty-string"),
    pytest.param([], "JSON object", id="empty-array"),
    pytest.param(None, "JSON object", id="null"),
    pytest.param([{"id": 1, "name": "Fern"}], "JSON object", id="array-of-plant"),
    pytest.param(
        json.dumps({"id": 1, "name": "Fern"}), "JSON object", id="string-of-json"
    ),
    pytest.param({}, "'id' is required", id="empty-object"),
    pytest.param({"name": "Fern"}, "'id' is required", id="missing-id"),
    pytest.param({"id": 1}, "'name' is required", id="missing-name"),
    pytest.param({"ID": 1, "Name": "Fern"}, "'id' is required", id="wrong-case-keys"),
    pytest.param({"id": None, "name": "Fern"}, "'id' must be an integer", id="null-id"),
    pytest.param({"id": 1, "name": None}, "'name' must be a string", id="null-name"),
    pytest.param(
        {"id": 1, "name": "Fern", "tag": None}, "'tag' must be a string", id="null-tag"
    ),
    pytest.param({"id": True, "name": "Fern"}, "'id' must be an integer", id="true-id"),
    pytest.param(
        {"id": False, "name": "Fern"}, "'id' must be an integer", id="false-id"
    ),
    pytest.param(
        {"id": "7", "name": "Fern"}, "'id' must be an integer", id="string-id"
    ),
    pytest.param(
        {"id": 7.5, "name": "Fern"}, "'id' must be an integer", id="fractional-id"
    ),
    pytest.param({"id": [1], "name": "Fern"}, "'id' must be an integer", id="array-id"),
    pytest.param(
        {"id": {"n": 1}, "name": "Fern"}, "'id' must be an integer", id="object-id"
    ),
    pytest.param({"id": 1, "name": 5}, "'name' must be a string", id="number-name"),
    pytest.param(
        {"id": 1, "name": ["Fern"]}, "'name' must be a string", id="array-name"
    ),
    pytest.param({"id": 1, "name": False}, "'name' must be a string", id="false-name"),
    pytest.param(
        {"id": 1, "name": "Fern", "tag": 5}, "'tag' must be a string", id="number-tag"
    ),
    pytest.param(
        {"id": 1, "name": "Fern", "tag": False},
        "'tag' must be a string",
        id="false-tag",
    ),
    pytest.param(
        {"id": 1, "name": "Fern", "tag": {}}, "'tag' must be a string", id="object-tag"
    ),
    pytest.param(
        {"id": INT64_MAX + 1, "name": "Fern"}, INT64_RANGE, id="int64-max-plus-1"
    ),
    pytest.param(
        {"id": INT64_MIN - 1, "name": "Fern"}, INT64_RANGE, id="int64-min-minus-1"
    ),
    pytest.param({"id": 2**64, "name": "Fern"}, INT64_RANGE, id="2-to-the-64"),
]


@pytest.mark.parametrize("document, message", BAD_SHAPES)
def test_invalid_newplant_is_400_naming_the_rule(app, store, document, message):
    assert_error(post(app, document, 400), 400, message)
    assert len(stored(store)) == 0


@pytest.mark.parametrize(
    "literal",
    [
        b"1e400",
        b"9223372036854775808.0",
        b"-9223372036854775809.0",
        b"7.000000000000000000001",
        b"9223372036854775807.5",
        b"1e-400",
    ],
)
def test_numbers_that_are_no_int64_id_are_400(app, store, literal):
    assert_error(
        post(app, b'{"id": ' + literal + b', "name": "Fern"}', 400), 400, "'id' must be"
    )
    assert len(stored(store)) == 0


@pytest.mark.parametrize(
    "literal, plant_id",
    [
        (b"9223372036854775807", INT64_MAX),
        (b"-9223372036854775808", INT64_MIN),
        (b"0", 0),
        (b"-0", 0),
        (b"7.0", 7),
        (b"7E0", 7),
        (b"7e+0", 7),
        (b"70e-1", 7),
        (b"1e2", 100),
        (b"-0.0", 0),
        (b"9223372036854775807.0", INT64_MAX),
        (b"-9223372036854775808.000", INT64_MIN),
        (b"92233720368547758.07e2", INT64_MAX),
    ],
)
def test_integral_numbers_are_ids_exactly(app, store, literal, plant_id):
    """JSON Schema 2020-12: a number with a zero fraction is an integer; no float
    rounding near 2**63."""
    post(app, b'{"id": ' + literal + b', "name": "Fern"}', 200)
    assert stored(store).get(plant_id) == ("Fern", None)
    assert len(stored(store)) == 1
    # The id really is that integer: the plain spelling now collides with it.
    post(app, {"id": plant_id, "name": "Again"}, 409)


def test_ids_one_apart_near_int64_max_are_distinct(app, store):
    post(app, b'{"id": 9223372036854775807.0, "name": "a"}', 200)
    post(app, b'{"id": 9223372036854775806.0, "name": "b"}', 200)
    assert stored(store).get(INT64_MAX) == ("a", None) and stored(store).get(
        INT64_MAX - 1
    ) == ("b", None)


def test_field_errors_come_in_order_id_name_tag(app):
    assert_error(post(app, {"tag": 1}, 400), 400, "'id' is required")
    assert_error(
        post(app, {"id": "x", "name": 1, "tag": 1}, 400), 400, "'id' must be an integer"
    )
    assert_error(
        post(app, {"id": 1, "name": 1, "tag": 1}, 400), 400, "'name' must be a string"
    )


# ---- Check order: the first failing step answers ----


@pytest.mark.parametrize(
    "request_kwargs, status",
    [
        (
            dict(
                path="/nope",
                method="DELETE",
                headers={},
                content_type="text/plain",
                body=b"x" * 100_000,
            ),
            404,
        ),
        (
            dict(
                path="/plants",
                method="PUT",
                headers={},
                content_type="text/plain",
                body=b"x" * 100_000,
            ),
            405,
        ),
        (
            dict(
                path="/plants",
                method="POST",
                headers={},
                content_type="text/plain",
                body=b"x" * 100_000,
            ),
            401,
        ),
        (
            dict(
                path="/plants",
                method="POST",
                headers=AUTH,
                content_type="text/plain",
                body=b"x" * 100_000,
            ),
            415,
        ),
        (
            dict(
                path="/plants",
                method="POST",
                headers=AUTH,
                content_type="application/json",
                body=b"x" * 100_000,
            ),
            413,
        ),
        (
            dict(
                path="/plants",
                method="POST",
                headers=AUTH,
                content_type="application/json",
                body=b"[1]",
            ),
            400,
        ),
    ],
    ids=["route", "method", "auth", "media-type", "size", "shape"],
)
def test_checks_run_in_the_contract_order(app, request_kwargs, status):
    kwargs = dict(request_kwargs)
    response = app.request(
        kwargs.pop("path"), status=status, expect_errors=True, **kwargs
    )
    assert_error(response, status)


# ---- Failures of the server's own making ----


def test_store_failure_is_a_generic_500_logged_to_wsgi_errors():
    errors = io.StringIO()
    status, headers, body = call(
        Application([TOKEN], store=BrokenStore()),
        body=b'{"id": 1, "name": "x"}',
        environ={"wsgi.errors": errors},
    )
    assert status == 500 and body == {"error": 500, "message": "internal server error"}
    assert headers["Content-Type"] == "application/json"
    assert (
        "Traceback" in errors.getvalue() and "the disk is on fire" in errors.getvalue()
    )
    assert TOKEN not in errors.getvalue()


# Promises at the edges (issue 29): any status a store raises is a final answer; under
# gunicorn and granian too, in test_plantstore_servers.py
class RaisingStore:
    """A store whose add raises plantstore.HTTPError with the status it was given."""

    def __init__(self, status):
        self.status = status

    def add(self, plant_id, name, tag):  # noqa: ARG002 (Store's signature)
        raise plantstore.HTTPError(self.status, f"the store raised {self.status!r}")

    def page(self, after, limit):  # noqa: ARG002 (Store's signature)
        return []

    def delete(self, plant_id):  # noqa: ARG002 (Store's signature)
        return False


@pytest.mark.parametrize(
    "raised, answered",
    STATUSES_RAISED,
    ids=[repr(raised) for raised, _ in STATUSES_RAISED],
)
def test_edges_any_status_a_store_raises_is_a_final_answer_under_webtest(
    raised, answered
):
    # lint: WSGI's validator
    application = webtest.TestApp(Application([TOKEN], store=RaisingStore(raised)))
    response = post(application, {"id": 1, "name": "Fern"}, answered)
    assert_error(response, answered)
    if answered == 500:  # no status of HTTP: the server's fault, logged once
        assert response.json["message"] == "internal server error"
        assert response.errors.count("Traceback") == 1
        assert (
            response.errors.count(f"plantstore.HTTPError: the store raised {raised!r}")
            == 1
        )
    else:
        assert (
            response.json["message"] == f"the store raised {raised!r}"
            and response.errors == ""
        )


def test_a_custom_store_is_used():
    class RecordingStore:
        def __init__(self):
            self.calls = []

        def add(self, plant_id, name, tag):
            self.calls.append((plant_id, name, tag))
            return plant_id != 2

        def page(self, _after, _limit):
            return []

        def delete(self, _plant_id):
            return False

    recording = RecordingStore()
    custom = webtest.TestApp(Application([TOKEN], store=recording))
    post(custom, {"id": 1, "name": "a", "tag": "t"}, 200)
    post(custom, {"id": 2, "name": "b"}, 409)
    assert recording.calls == [(1, "a", "t"), (2, "b", None)]


@pytest.mark.parametrize(
    "tokens, error",
    [
        ([], ValueError),
        ((), ValueError),
        ("a-token-of-more-than-16", ValueError),  # a string: each character a token
        ([""], ValueError),
        (["a b"], ValueError),
        (["tab\there"], ValueError),
        (["caf\u00e9"], ValueError),
        ([None], ValueError),
        ([TOKEN, ""], ValueError),
    ],
    ids=[
        "empty-list",
        "empty-tuple",
        "one-string",
        "empty-token",
        "space",
        "tab",
        "non-ascii",
        "none",
        "one-empty",
    ],
)
def test_application_refuses_bad_tokens(tokens, error):
    with pytest.raises(error) as raised:
        Application(tokens)
    for token in tokens if isinstance(tokens, (list, tuple)) else ():
        assert not token or str(token) not in str(raised.value)


def test_application_refuses_a_short_token_without_quoting_it():
    with pytest.raises(ValueError, match="at least 16 characters") as raised:
        Application(["eleven-char"])
    assert "eleven-char" not in str(
        raised.value
    ) and "secrets.token_urlsafe(32)" in str(raised.value)


@pytest.mark.parametrize("missing", ["add", "page", "delete"])
def test_application_names_the_method_a_store_lacks(missing):
    methods = {
        name: lambda *_args: None
        for name in ("add", "page", "delete")
        if name != missing
    }
    with pytest.raises(TypeError, match=f"the store has no {missing}\\(\\) method"):
        Application([TOKEN], store=type("Store", (), methods)())


@pytest.mark.parametrize("limit", [-1, 1.5, "100"])
def test_application_refuses_a_bad_limit(limit):
    with pytest.raises(ValueError):
        Application([TOKEN], max_body_bytes=limit)


# ---- Request ids (issue 46) ----
#
# Every answer the application makes carries an X-Request-ID: the client's own when it
# matches [A-Za-z0-9._-]{1,64} (safe to echo and to log), else 16 hex digits made anew;
# a 500 names it in its log line, above the traceback.


class AwayStore:
    """A store whose database is away, as the Store interface says one answers: each
    call raises a 503 with Retry-After. (The SQL stores' own outages are
    test_plantstore_sqlite.py's.)"""

    def add(self, *_args):
        raise plantstore.HTTPError(
            503, "the database is unavailable", headers=[("Retry-After", "2")]
        )

    page = delete = ping = add


def answer_of(case, request_id):
    """One request of the case (by its status), sending request_id (None: no header);
    return (status, the X-Request-ID headers answered, what went to wsgi.errors)."""
    store, arguments = plantstore.MemoryStore(), dict(method="GET", path="/plants")
    if case == 500:
        arguments = dict(method="POST", body=b'{"id": 1, "name": "x"}')
        store = BrokenStore()
    if case == 503:
        store = AwayStore()
    arguments |= {
        200: dict(method="POST", body=b'{"id": 1, "name": "Fern"}'),
        204: dict(method="OPTIONS"),
        401: dict(environ={"HTTP_AUTHORIZATION": None}),
        404: dict(path="/plants/"),
        405: dict(method="PUT"),
        413: dict(method="POST", body=b" " * (MAX_BODY_BYTES + 1)),
    }.get(case, {})
    errors, answered = io.StringIO(), []
    environ = {
        **arguments.pop("environ", {}),
        "wsgi.errors": errors,
        "HTTP_X_REQUEST_ID": request_id,  # None: left out
    }
    status, _, _ = call(
        answered_ids(Application([TOKEN], store=store), answered),
        environ=environ,
        **arguments,
    )
    assert status == case, f"the case {case} answered {status}"
    return status, answered, errors.getvalue()


# GET /metrics: test_plantstore_metrics.py's case
ID_CASES = [200, 204, 401, 404, 405, 413, 503, 500]


@pytest.mark.parametrize("case", ID_CASES)
@pytest.mark.parametrize("request_id", KEPT_IDS.values(), ids=list(KEPT_IDS))
def test_request_id_a_client_s_own_is_answered_as_it_is_errors_too(case, request_id):
    _, answered, _ = answer_of(case, request_id)
    assert answered == [request_id]


@pytest.mark.parametrize("case", ID_CASES)
@pytest.mark.parametrize("request_id", REPLACED_IDS.values(), ids=list(REPLACED_IDS))
def test_request_id_any_other_is_replaced_by_16_hex_digits_errors_too(case, request_id):
    _, answered, _ = answer_of(case, request_id)
    assert len(answered) == 1 and re.fullmatch("[0-9a-f]{16}", answered[0])


def test_request_id_made_anew_for_each_request():
    answered = []
    application = answered_ids(Application([TOKEN]), answered)
    for _ in range(200):
        call(application, method="GET", path="/plants")
    assert len(set(answered)) == 200


@pytest.mark.parametrize(
    "request_id", ["client-chose.this_1", None, "not kept: spaces"], ids=str
)
def test_request_id_of_a_500_is_in_its_log_line_above_the_traceback(request_id):
    status, (answered,), logged = answer_of(500, request_id)
    assert status == 500
    if request_id == "client-chose.this_1":
        assert answered == request_id
    first, second, *_ = logged.splitlines()
    assert first == f"plantstore: request {answered} failed:"
    assert second == "Traceback (most recent call last):"
    assert "the disk is on fire" in logged and TOKEN not in logged
    assert logged.count(answered) == 1 and "not kept" not in logged


# ---- Threads against one application ----


def create(application, plant_id, name):
    return call(application, body=json.dumps({"id": plant_id, "name": name}).encode())[
        0
    ]


def test_concurrent_unique_creates_are_all_stored(store):
    application = Application([TOKEN], store=store)
    threads, per_thread = 8, 50

    def create_many(n):
        return [
            create(application, i, f"p{i}")
            for i in range(n * per_thread, (n + 1) * per_thread)
        ]

    statuses = in_threads(threads, create_many)
    assert statuses == [[200] * per_thread] * threads
    assert len(stored(store)) == threads * per_thread
    assert all(
        stored(store).get(i) == (f"p{i}", None) for i in range(threads * per_thread)
    )


def test_racers_on_one_id_get_one_200_and_the_rest_409(store):
    application = Application([TOKEN], store=store)
    racers = 32
    statuses = in_threads(racers, lambda n: create(application, 42, f"racer-{n}"))
    assert sorted(statuses) == [200] + [409] * (racers - 1)
    assert stored(store).get(42) == (f"racer-{statuses.index(200)}", None)


# ---- Pages, and the whole listing streamed ----


def test_a_page_link_is_relative_to_where_the_app_is_mounted(store):
    for plant_id in range(3):
        store.add(plant_id, f"p{plant_id}", None)
    response = webtest.TestApp(Application([TOKEN], store=store)).get(
        "/plants?limit=2",
        headers=AUTH,
        extra_environ={"SCRIPT_NAME": "/api v1"},
        status=200,
    )
    assert re.fullmatch(
        r'</api%20v1/plants\?limit=2&after=1>; rel="next"',  # the seq of its last plant
        response.headers["Link"],
    )


def test_the_last_page_and_an_empty_page_have_no_next_link(app, store):
    for plant_id in range(4):
        store.add(plant_id, f"p{plant_id}", None)
    for query in ("limit=4", "limit=10", "limit=0"):
        assert (
            "Link" not in app.get(f"/plants?{query}", headers=AUTH, status=200).headers
        )
    assert app.get("/plants?limit=3", headers=AUTH, status=200).headers["Link"]


@pytest.mark.parametrize(
    "after",
    [
        "",
        "abc",
        "AAAAAAAAAAk",  # 1.5.0's cursors
        "7.5",
        "%207",
        "9223372036854775808",
        "7&after=7",
    ],
)
def test_a_malformed_cursor_is_400_naming_after(app, after):
    response = app.get(
        f"/plants?limit=2&after={after}", headers=AUTH, status=400, expect_errors=True
    )
    assert_error(response, 400, "'after'")


def test_a_page_never_holds_more_than_page_max(app, store):
    for plant_id in range(plantstore.PAGE_MAX + 5):
        store.add(plant_id, "p", None)
    response = app.get("/plants?limit=5000", headers=AUTH, status=200)
    assert (
        len(response.json) == plantstore.PAGE_MAX
        and "limit=5000&after=" in response.headers["Link"]
    )


def test_the_whole_listing_streams_a_page_at_a_time(store):
    for plant_id in range(2500):
        store.add(plant_id, f"p{plant_id}", "t" if plant_id % 2 else None)
    asked = []

    class Watched:  # the store, with each page it is asked for written down
        add, delete = store.add, store.delete

        def page(self, after, limit):
            asked.append(limit)
            return store.page(after, limit)

    status, headers, body = call(Application([TOKEN], store=Watched()), method="GET")
    assert (
        status == 200
        and "Content-Length" not in headers
        and headers["Content-Type"] == "application/json"
    )
    assert body == [
        {"name": f"p{i}", **({"tag": "t"} if i % 2 else {})} for i in range(2500)
    ]
    # the lock is never held for more than one page
    assert asked == [plantstore.PAGE_MAX] * 3


@pytest.mark.parametrize("path", ["/plants/{id}", "/plants/%7Bid%7D"])
def test_a_route_template_sent_as_a_path_is_a_400_naming_id(app, path):
    """Audit item 10: DELETE /plants/%7Bid%7D decodes to the route's own template,
    /plants/{id}; 1.5.0 took it for that route's key, gave its handler no id, and
    answered 500. It is the template's path, with "{id}" its id: a 400."""
    response = app.delete(path, headers=AUTH, status=400, expect_errors=True)
    assert_error(response, 400, "'id' must be an integer")
