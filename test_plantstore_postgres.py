"""Tests for plantstore_postgres: the PostgreSQL store and its settings, against a real
PostgreSQL 15, under the servers, and on hosts of its own.

The suite's PostgreSQL, the fixtures and the helpers are test_plantstore.py's, and so
are the tests every store passes, PostgreSQL included."""

import concurrent.futures
import os
import re
import signal
import sys
import threading
import time

import psycopg
import pytest
import webtest

import plantstore
import plantstore_postgres
from plantstore_postgres import PostgresStore
from plantstore import make_app
from test_plantstore import (
    AUTH,
    SECRET,
    SECRET_SPELLINGS,
    TOKEN,
    WAIT,
    Lines,
    assert_secret_kept,
    assert_unavailable,
    environ_without_tokens,
    exchange,
    next_link,
    over_http,
    post,
    post_over_http,
    run_plantstore,
    serve_plantstore,
    start_gunicorn,
    stop_service,
)

# test_plantstore.py's fixtures, named here with `as`: pytest finds a test's fixtures
# among its module's names.
from test_plantstore import (
    pg_url as pg_url,
    postgres as postgres,
    receiver as receiver,
    spawn as spawn,
)


# ---- The health check, for load balancers ----


def test_health_is_503_with_retry_after_while_postgres_is_away(postgres, pg_url):
    app = webtest.TestApp(make_app([TOKEN], store=PostgresStore(pg_url)))
    app.get("/health", status=200)
    postgres.stop()
    try:
        response = app.get("/health", status=503, expect_errors=True)
    finally:
        postgres.start()
    assert_unavailable(response)
    assert "127.0.0.1" not in response.text and postgres.password not in response.text
    assert str(postgres.port) not in response.text
    app.get("/health", status=200)


# ---- SQL stores: a database away is a 503, and the service recovers by itself ----


def test_a_commit_held_by_a_missing_sync_standby_is_a_bounded_503_and_a_retry_409(
    pg_url,
):
    """The bound on a statement: the commit is cut at DB_WAIT_SECONDS, though PostgreSQL
    keeps it."""
    app = webtest.TestApp(make_app([TOKEN], store=PostgresStore(pg_url)))
    post(app, {"id": 1, "name": "Fern"}, 200)

    def standby(name):
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            db.execute("SELECT pg_reload_conf()")

    def commit_of_its_own():
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute("CREATE TEMPORARY TABLE probe (x int)")

    # every commit now waits for a standby that never comes, once reloaded
    standby("nobody")
    deadline, probe = time.monotonic() + WAIT, None
    with psycopg.connect(pg_url, autocommit=True) as db:
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        while not db.execute(waiting).fetchone()[0]:  # until a commit is seen to wait
            assert time.monotonic() < deadline, (
                "synchronous_standby_names never took effect"
            )
            if probe is None or not probe.is_alive():
                probe = threading.Thread(target=commit_of_its_own, daemon=True)
                probe.start()
            time.sleep(0.05)
    try:
        started = time.monotonic()
        response = post(app, {"id": 2, "name": "Ivy"}, 503)
        waited = time.monotonic() - started
    finally:
        standby("")  # which also lets the held commit end
    assert_unavailable(response)
    # cut, not held for as long as the standby is away
    assert waited < 2 * plantstore.DB_WAIT_SECONDS
    # PostgreSQL committed it: the retry finds it
    post(app, {"id": 2, "name": "Ivy"}, 409)
    assert app.get("/plants", headers=AUTH, status=200).json == [
        {"name": "Fern"},
        {"name": "Ivy"},
    ]


def test_postgres_away_is_503_then_recovers_without_a_restart(postgres, pg_url, capsys):
    app = webtest.TestApp(make_app([TOKEN], store=PostgresStore(pg_url)))
    post(app, {"id": 1, "name": "Fern"}, 200)
    postgres.stop()
    try:
        assert_unavailable(post(app, {"id": 2, "name": "Ivy"}, 503))
        assert_unavailable(
            app.get("/plants", headers=AUTH, status=503, expect_errors=True)
        )
        assert_unavailable(
            app.delete("/plants/1", headers=AUTH, status=503, expect_errors=True)
        )
    finally:
        postgres.start()
    post(app, {"id": 2, "name": "Ivy"}, 200)  # the same application, a new connection
    assert app.get("/plants", headers=AUTH, status=200).json == [
        {"name": "Fern"},
        {"name": "Ivy"},
    ]
    logged = capsys.readouterr().err
    assert "is unavailable" in logged and "reachable again" in logged
    assert (
        postgres.password not in logged
        and "postgresql://plantstore@127.0.0.1" in logged
    )


def test_postgres_store_at_start_up_waits_for_a_database_that_is_away(postgres, pg_url):
    postgres.stop()
    try:
        # does not refuse to start
        app = webtest.TestApp(make_app([TOKEN], store=PostgresStore(pg_url)))
        assert_unavailable(post(app, {"id": 1, "name": "Fern"}, 503))
    finally:
        postgres.start()
    post(app, {"id": 1, "name": "Fern"}, 200)


@pytest.mark.parametrize("missing", ["psycopg", "plantstore_postgres"])
def test_python_plantstore_py_names_what_postgres_needs_when_it_is_missing(
    spawn, missing
):
    code = (
        f"import runpy, sys; sys.modules[{missing!r}] = None;"
        " sys.argv[1:] = ['--port', '0'];"
        "runpy.run_path('plantstore.py', run_name='__main__')"
    )
    process = spawn(
        [sys.executable, "-c", code],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB="postgresql://plantstore:hunter2-secret@127.0.0.1:1/plants",
        ),
    )
    assert process.wait(WAIT) == 2
    err = process.stderr.read()
    assert err == (
        "plantstore: PLANTSTORE_DB names a PostgreSQL database, which needs "
        f"{missing}: pip install 'plantstore[postgres]'\n"
    )


def test_python_plantstore_py_on_postgres_is_one_module_not_two(
    spawn, postgres, pg_url, receiver
):
    """python plantstore.py runs the file as __main__; plantstore_postgres imports
    plantstore: one module, or its store is no SQLStore here (webhooks would wait in
    memory) and its 503 no HTTPError here (a 500)."""
    hook = receiver()
    hook.stop()  # the event waits in the outbox, where the test reads it
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB=pg_url,
            PLANTSTORE_WEBHOOK_URL=hook.url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
        ),
    )
    host, port = (
        Lines(process.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    )
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    with postgres.local() as db:
        assert db.execute("SELECT count(*) FROM plant_events").fetchone()[0] == 1
    postgres.stop()
    try:
        status, body = post_over_http(host, port, TOKEN, {"id": 2, "name": "Ivy"})
    finally:
        postgres.start()
    assert (status, body["error"]) == (503, 503)


def test_after_a_postgres_restart_no_request_pays_for_a_stale_connection_reconnect(
    spawn, postgres, pg_url
):
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=pg_url)
    process, host, port, err = start_gunicorn(spawn, env, 2, 4)

    def sixty_four_gets():
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            return list(
                pool.map(
                    lambda _: exchange(host, port, "GET", "/plants?limit=1")[0],
                    range(64),
                )
            )

    # every thread of both workers has its connection now
    assert sixty_four_gets() == [200] * 64
    postgres.stop()
    postgres.start()  # pg_ctl -w: the database answers again
    assert sixty_four_gets() == [200] * 64
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(WAIT)
    assert "unavailable" not in err.rest()  # no request failed, so no outage was seen


# ---- Backups, restores and the move to PostgreSQL (docs/operations.md) ----


def identity_behind(url, plant_seqs, event_seqs, webhook_url="http://127.0.0.1:1/hook"):
    """plantstore's tables holding rows copied with their seq, as pgloader copies them:
    identities left at 1."""
    PostgresStore(url)
    with psycopg.connect(url, autocommit=True) as db:
        for seq in plant_seqs:
            db.execute(
                "INSERT INTO plants (seq, id, name, tag) OVERRIDING SYSTEM VALUE "
                "VALUES (%s, %s, %s, NULL)",
                (seq, seq, f"copied {seq}".encode()),
            )
        for seq in event_seqs:
            db.execute(
                "INSERT INTO plant_events (seq, url, webhook_id, body, next_at) "
                "OVERRIDING SYSTEM VALUE VALUES (%s, %s, %s, %s, 0)",
                (
                    seq,
                    webhook_url,
                    f"msg_copied{seq}",
                    plantstore.event_json(seq, f"copied {seq}", None),
                ),
            )


def test_postgres_identity_behind_copied_rows_is_moved_at_start_and_said_in_one_line(
    pg_url, spawn, receiver, postgres
):
    hook = receiver()
    # the next seq, 1, is taken in each
    identity_behind(pg_url, [1, 2, 3, 20550], [1, 2, 21550], hook.url)
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    process, host, port, err = serve_plantstore(spawn, env)
    assert post_over_http(host, port, TOKEN, {"id": 7, "name": "new"}) == (
        200,
        {"name": "new"},
    )
    # listed last
    assert over_http(host, port, TOKEN, "GET", "/plants")[1][-1] == {"name": "new"}
    status, _, page = exchange(
        host, port, "GET", f"/plants?limit=5&after={plantstore.cursor(20550)}"
    )
    assert (status, page) == (200, [{"name": "new"}])  # after the largest copied seq
    # the event of the create too
    assert sorted(plant["id"] for plant in hook.wait_for(4)) == [1, 2, 7, 21550]
    stop_service(process)
    said = [line for line in err.rest().splitlines() if "identity" in line]
    assert sorted(
        re.search(r"\b(plants|plant_events)\b", line)[1] for line in said
    ) == ["plant_events", "plants"]
    assert all(
        line.startswith("plantstore: ") and postgres.password not in line
        for line in said
    )
    assert "20550" in " ".join(said) and "21550" in " ".join(said)


def test_postgres_identity_is_only_ever_moved_forward(pg_url, spawn):
    """The newest plants deleted, then a restart: a new plant still comes after every
    link given before."""
    store = PostgresStore(pg_url)
    for plant_id in range(12):
        store.add(plant_id, f"p{plant_id}", None)
    response = webtest.TestApp(make_app([TOKEN], store=store)).get(
        "/plants?limit=10", headers=AUTH, status=200
    )
    link = next_link(response)  # after the 10th plant
    for plant_id in range(5, 12):
        assert store.delete(plant_id)
    process, host, port, err = serve_plantstore(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=pg_url)
    )
    assert post_over_http(host, port, TOKEN, {"id": 99, "name": "new"})[0] == 200
    assert over_http(host, port, TOKEN, "GET", link) == (200, [{"name": "new"}])
    stop_service(process)
    assert "identity" not in err.rest()  # nothing was behind: nothing said


@pytest.mark.parametrize(
    "columns, column, problem",
    [
        ("id BIGINT UNIQUE, name BYTEA NOT NULL", "id", "null"),
        ("id BIGINT NOT NULL, name BYTEA NOT NULL", "id", "duplicates"),
        ("id BIGINT NOT NULL UNIQUE, name BYTEA", "name", "null"),
    ],
    ids=["id-nullable", "id-not-unique", "name-nullable"],
)
def test_postgres_a_plants_table_plantstore_could_not_have_made_is_refused_in_one_line(
    pg_url, postgres, tmp_path, columns, column, problem
):
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE plants (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            f" {columns}, tag BYTEA)"
        )
    code, lines = run_plantstore(tmp_path, PLANTSTORE_DB=pg_url)
    said = "".join(lines)
    assert (
        code == 2
        and len(lines) == 1
        and "Traceback" not in said
        and postgres.password not in said
    )
    assert (
        said.startswith("plantstore: ")
        and re.search(rf"\b{column}\b", said)
        and problem in said.lower()
    )


# ---- Settings that mean what they say, and secrets that never show ----


PASSWORD = "s3cr3t-pw"


@pytest.mark.parametrize("value", SECRET_SPELLINGS.values(), ids=SECRET_SPELLINGS)
def test_settings_a_database_password_is_never_shown_however_it_is_spelt(value):
    try:
        parameters, shown = plantstore_postgres.postgres_settings(value)
    except ValueError as refusal:
        shown = str(refusal)
        assert shown.startswith("PLANTSTORE_DB ") and "%-escape" in shown
    else:
        assert shown == "PostgreSQL postgresql://plant@db.example:5432/plants"
        # meant
        assert PASSWORD in (parameters.get("password"), parameters.get("sslpassword"))
    assert_secret_kept(shown)
    assert "\n" not in shown


POSTGRES_FORMS = [  # PLANTSTORE_DB, some of libpq's parameters, shown
    (
        "POSTGRESQL://plant:s3cr3t-pw@Db.Example/plants",
        {"host": "Db.Example"},
        "postgresql://plant@Db.Example/plants",
    ),
    (
        "postgres://plant@db.example/plants",
        {"user": "plant"},
        "postgresql://plant@db.example/plants",
    ),
    (
        "host = db.example  dbname = plants",
        {"host": "db.example"},
        "postgresql://db.example/plants",
    ),
    (
        "postgresql://plant@h1:5432,h2:5433/plants",
        {"port": "5432,5433"},
        "postgresql://plant@h1:5432,h2:5433/plants",
    ),
    (
        "host=h1,h2 port=5433 dbname=plants",
        {"host": "h1,h2"},
        "postgresql://h1:5433,h2:5433/plants",
    ),
    (
        "postgresql://plant@[::1]:5432/plants",
        {"host": "::1"},
        "postgresql://plant@[::1]:5432/plants",
    ),
    (
        "postgresql:///plants?host=/run/postgresql",
        {"host": "/run/postgresql"},
        "postgresql://%2Frun%2Fpostgresql/plants",
    ),
]


@pytest.mark.parametrize(
    "value, parameters, shown", POSTGRES_FORMS, ids=[row[0] for row in POSTGRES_FORMS]
)
def test_settings_each_postgresql_form_is_read_as_libpq_reads_it(
    value, parameters, shown
):
    read, said = plantstore_postgres.postgres_settings(value)
    assert parameters.items() <= read.items()
    # a URL libpq reads back: brackets, %2F for a socket
    assert said == f"PostgreSQL {shown}"
