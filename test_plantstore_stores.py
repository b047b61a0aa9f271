"""The tests every store passes, one suite parametrized over each (`any_store`, from
conftest.py): the core's MemoryStore, make_app's ChunkedStore ("Accelerators"),
SQLiteStore ("The SQL stores") and plantstore_postgres's PostgresStore, each added to,
listed and deleted from, directly and through the app, in threads too, paged while
plants come and go, and asked for its health. A test of the core's answers on
MemoryStore alone is test_plantstore.py's."""

import pytest
import webtest

from plantstore import INT64_MAX, INT64_MIN
from plantstore_app import make_app
from testbed import (
    AUTH,
    BAD_AUTH,
    TOKEN,
    assert_error,
    follow_pages,
    in_threads,
    listed,
    post,
)


@pytest.fixture
def any_app(any_store):
    """The service on each store in turn, in WebTest."""
    return webtest.TestApp(make_app([TOKEN], store=any_store))


# ---- The health check, for load balancers ----


def test_health_needs_no_token_and_says_ok(any_app):
    response = any_app.get("/health", status=200)
    assert (
        response.json == {"status": "ok"}
        and response.content_type == "application/json"
    )
    assert any_app.head("/health", status=200).body == b""


# ---- Reading back and deleting, on every store ----


def test_store_adds_lists_and_deletes(any_store):
    assert any_store.add(1, "Fern", "indoor") is True
    assert any_store.add(-5, "Cactus", None) is True
    assert any_store.add(1, "Impostor", None) is False
    assert any_store.add(INT64_MAX, "\ud800 lone", "caf\u00e9 \U0001f33f") is True
    assert listed(any_store) == [
        ("Fern", "indoor"),
        ("Cactus", None),
        ("\ud800 lone", "caf\u00e9 \U0001f33f"),
    ]
    assert listed(any_store, 0) == [] and listed(any_store, 2) == [
        ("Fern", "indoor"),
        ("Cactus", None),
    ]
    assert (
        any_store.delete(1) is True
        and any_store.delete(1) is False
        and any_store.delete(2) is False
    )
    # a deleted id can be created again, and comes last
    assert any_store.add(1, "Fern again", None) is True
    assert listed(any_store) == [
        ("Cactus", None),
        ("\ud800 lone", "caf\u00e9 \U0001f33f"),
        ("Fern again", None),
    ]


def test_store_under_threads(any_store):
    created = in_threads(
        8,
        lambda n: [
            any_store.add(n * 25 + i, f"p{n * 25 + i}", None) for i in range(25)
        ],
    )
    assert created == [[True] * 25] * 8
    assert sorted(name for name, _ in listed(any_store)) == sorted(
        f"p{i}" for i in range(200)
    )
    racers = in_threads(16, lambda n: any_store.add(1000, f"racer-{n}", None))
    assert racers.count(True) == 1
    assert listed(any_store)[-1] == (f"racer-{racers.index(True)}", None)


def test_get_lists_plants_oldest_first_without_ids(any_app):
    assert any_app.get("/plants", headers=AUTH, status=200).json == []
    for plant_id, name, tag in [
        (3, "Fern", "indoor"),
        (1, "Cactus", None),
        (2, "Ivy", "hanging"),
    ]:
        post(
            any_app,
            {"id": plant_id, "name": name, **({"tag": tag} if tag else {})},
            200,
        )
    response = any_app.get("/plants", headers=AUTH, status=200)
    assert response.content_type == "application/json"
    assert response.json == [
        {"name": "Fern", "tag": "indoor"},
        {"name": "Cactus"},
        {"name": "Ivy", "tag": "hanging"},
    ]
    assert (
        any_app.get("/plants?limit=2", headers=AUTH, status=200).json
        == response.json[:2]
    )
    assert any_app.get("/plants?limit=0", headers=AUTH, status=200).json == []
    assert (
        any_app.get(
            f"/plants?limit={2**31 - 1}&colour=green", headers=AUTH, status=200
        ).json
        == response.json
    )
    # an integer, as in JSON
    assert (
        any_app.get("/plants?limit=1.0", headers=AUTH, status=200).json
        == response.json[:1]
    )
    assert (
        any_app.get("/plants?limit=2E0", headers=AUTH, status=200).json
        == response.json[:2]
    )


@pytest.mark.parametrize(
    "query",
    [
        "limit=-1",
        "limit=abc",
        "limit=",
        "limit=1.5",
        "limit=2147483648",
        "limit=+1",
        "limit=%201",
        "limit=1&limit=2",
        "limit=1e400",
        "limit=99999999999999999999999",
        "limit=01",
        "limit=NaN",
        "limit=1E+9999999999999999999999",
    ],
)
def test_get_with_a_bad_limit_is_400(any_app, query):
    assert_error(
        any_app.get(f"/plants?{query}", headers=AUTH, status=400, expect_errors=True),
        400,
        "'limit'",
    )


def test_delete_answers_204_and_the_id_can_be_created_again(any_app):
    post(any_app, {"id": 5, "name": "Rose"}, 200)
    post(any_app, {"id": 6, "name": "Tulip"}, 200)
    response = any_app.delete("/plants/5", headers=AUTH, status=204)
    assert response.body == b"" and "Content-Type" not in response.headers
    assert any_app.get("/plants", headers=AUTH, status=200).json == [{"name": "Tulip"}]
    assert_error(
        any_app.delete("/plants/5", headers=AUTH, status=404, expect_errors=True),
        404,
        "'id'",
    )
    post(any_app, {"id": 5, "name": "Rose again"}, 200)
    assert any_app.get("/plants", headers=AUTH, status=200).json == [
        {"name": "Tulip"},
        {"name": "Rose again"},
    ]


@pytest.mark.parametrize(
    "plant_id",
    [
        "abc",
        "1.5",
        "+1",
        "01",
        "1e400",
        "%20",
        "9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999999",
        "--1",
        "0x1",
        "NaN",
        "1E+9999999999999999999999",
        "1.",
        ".5",
        "true",
    ],
)
def test_delete_with_an_id_that_is_no_int64_is_400(any_app, plant_id):
    assert_error(
        any_app.delete(
            f"/plants/{plant_id}", headers=AUTH, status=400, expect_errors=True
        ),
        400,
        "'id'",
    )


@pytest.mark.parametrize(
    "plant_id, stored_id",
    [
        (str(INT64_MAX), INT64_MAX),
        (str(INT64_MIN), INT64_MIN),
        ("0", 0),
        ("-0", 0),
        ("7.0", 7),
        ("7E0", 7),
        ("70e-1", 7),
        ("9223372036854775807.0", INT64_MAX),
    ],
)
def test_delete_accepts_the_int64_range_as_json_does(any_app, plant_id, stored_id):
    post(any_app, {"id": stored_id, "name": "Edge"}, 200)
    any_app.delete(f"/plants/{plant_id}", headers=AUTH, status=204)
    assert any_app.get("/plants", headers=AUTH, status=200).json == []


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/plants"), ("DELETE", "/plants/1"), ("DELETE", "/plants/abc")],
)
@pytest.mark.parametrize("headers, error", BAD_AUTH[:1] + BAD_AUTH[6:7])
def test_read_and_delete_need_the_token(any_app, method, path, headers, error):
    response = any_app.request(
        path, method=method, headers=headers, status=401, expect_errors=True
    )
    assert_error(response, 401)
    assert ('error="invalid_token"' in response.headers["WWW-Authenticate"]) == (
        error == "invalid_token"
    )


# ---- Pages, and the whole listing streamed ----


def test_next_links_visit_every_plant_once_oldest_first(any_store):
    for plant_id in range(2100):
        any_store.add(plant_id, f"p{plant_id}", None)
    application = webtest.TestApp(make_app([TOKEN], store=any_store))
    assert follow_pages(application, "/plants?limit=1000") == (
        [f"p{i}" for i in range(2100)],
        3,
    )


def test_next_links_skip_no_plant_while_others_come_and_go(any_store):
    for plant_id in range(60):
        any_store.add(plant_id, f"p{plant_id}", None)
    application = webtest.TestApp(make_app([TOKEN], store=any_store))

    # after each page: one plant ahead and one behind deleted, one created
    def meanwhile(page_number):
        any_store.delete(page_number * 10 + 5)
        any_store.delete(page_number * 10 - 3)
        any_store.add(1000 + page_number, f"new {page_number}", None)

    names, pages = follow_pages(application, "/plants?limit=10", meanwhile)
    throughout = [f"p{i}" for i in range(60) if i % 10 not in (5, 7)]  # never deleted
    # each once, in order
    assert [name for name in names if name in throughout] == throughout
    assert len(names) == len(set(names))
    # deleted before reached: left out
    assert not {f"p{page * 10 + 5}" for page in range(1, pages)} & set(names)


@pytest.mark.parametrize("after", ["1", "-1", "9223372036854775807", "-7e0", "2.0"])
def test_any_well_formed_cursor_is_a_place_in_the_order(any_app, after):
    post(any_app, {"id": 1, "name": "Fern"}, 200)
    assert any_app.get(
        f"/plants?limit=5&after={after}", headers=AUTH, status=200
    ).json in ([], [{"name": "Fern"}])


def test_make_app_pages_a_store_that_has_list_and_no_page():
    class ListOnly:  # add, list and delete only, as the README's DictStore
        def __init__(self):
            self.plants = {}

        def add(self, plant_id, name, tag):
            return self.plants.setdefault(plant_id, (name, tag)) == (name, tag)

        def list(self, limit):
            return list(self.plants.values())[:limit]

        def delete(self, plant_id):
            return self.plants.pop(plant_id, None) is not None

    store = ListOnly()
    for plant_id in range(25):
        store.add(plant_id, f"p{plant_id}", None)
    application = webtest.TestApp(make_app([TOKEN], store=store))
    assert follow_pages(application, "/plants?limit=10") == (
        [f"p{i}" for i in range(25)],
        3,
    )
    assert len(application.get("/plants", headers=AUTH, status=200).json) == 25
    # a cursor no page made: before the oldest
    assert application.get(
        "/plants?limit=2&after=-1", headers=AUTH, status=200
    ).json == [{"name": "p0"}, {"name": "p1"}]
