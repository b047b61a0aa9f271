"""Tests for plantstore_postgres: the PostgreSQL store and its settings, against a real
PostgreSQL 15, under the servers, and on hosts of its own.

The suite's PostgreSQL, the servers and the helpers the test files share are
testbed.py's, and the fixtures conftest.py's; the tests every store passes, PostgreSQL
included, are test_plantstore_stores.py's."""

import concurrent.futures
import collections
import contextlib
import fcntl
import http.client
import http.server
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from termios import FIONREAD
from types import SimpleNamespace
from urllib.parse import urlencode

import psycopg
import pytest
import webtest
from psycopg import sql

import plantstore_webhooks
import plantstore_sql
import plantstore_postgres
from plantstore_postgres import PostgresStore
from plantstore import INT64_MAX, INT64_MIN, HTTPError
from plantstore_app import make_app
from plantstore_sqlite import SQLiteStore
from testbed import (
    AUTH,
    HERE,
    Hosts,
    SECRET,
    SECRET_SPELLINGS,
    TOKEN,
    WAIT,
    Creates,
    Lines,
    Postgres,
    Runbook,
    assert_secret_kept,
    assert_unavailable,
    backlog,
    clock_shifted,
    environ_without_tokens,
    first_retry_after,
    exchange,
    free_port,
    frozen_postgres,
    in_threads,
    listed_ids,
    left_by_1_5_0,
    made_by_1_5_0,
    make_read_only,
    next_link,
    over_http,
    post,
    post_over_http,
    processes_in_group,
    read_database,
    read_metrics,
    plantstore_1_3_0,
    rolled_back_to_1_3_0_and_forward,
    run_plantstore,
    same_backlog_from_every_worker,
    scrape,
    serve_batches,
    serve_plantstore,
    start_gunicorn,
    start_nginx,
    stop_service,
    stored_plants,
    wait_apps_built,
    wait_until,
)


# ---- The health check, for load balancers ----


def test_health_is_503_with_retry_after_while_postgres_is_away(postgres, pg_url):
    """/health is readiness: it asks the database. /livez is liveness: it does not, so
    an orchestrator restarts no process for an outage of the database."""
    app = webtest.TestApp(make_app([TOKEN], store=PostgresStore(pg_url)))
    app.get("/health", status=200)
    postgres.stop()
    try:
        response = app.get("/health", status=503, expect_errors=True)
        assert app.get("/livez", status=200).json == {"status": "ok"}
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
    assert waited < 2 * plantstore_sql.DB_WAIT_SECONDS
    # PostgreSQL committed it: the retry finds it
    post(app, {"id": 2, "name": "Ivy"}, 409)
    # and lists it, once the backend that held its commit has ended its wait for the
    # standby: a listing right after the 409 once showed Fern alone (on 3.15)
    wait_until(
        lambda: (
            app.get("/plants", headers=AUTH, status=200).json
            == [{"name": "Fern"}, {"name": "Ivy"}]
        ),
        "the plant kept by PostgreSQL was never listed",
        10,
    )


def test_postgres_away_is_503_then_recovers_without_a_restart(postgres, pg_url, caplog):
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
    logged = caplog.text
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
        f"{missing}: pip install 'psycopg[binary]' (or '.[postgres]' in plantstore's "
        "folder)\n"
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


# ---- Descriptors past 1023, which select() refuses: both SQL stores ----

# python plantstore.py with 1,100 descriptors open before it starts, its soft
# RLIMIT_NOFILE raised (a container's is often 1M): every file and socket it opens then
# is numbered past 1023
MANY_DESCRIPTORS = """
import os, resource, runpy, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
sys.argv = ["plantstore.py", "--port", "0"]
runpy.run_path("plantstore.py", run_name="__main__")
"""


@pytest.mark.parametrize("database", ["PostgreSQL", "SQLite"])
def test_descriptors_past_1023_serve_as_the_first_1023_do(
    spawn, pg_url, tmp_path, database
):
    """The tokens' file is read, a pooled PostgreSQL connection is reused, and an SQLite
    writer waits for its turn behind another process's writer, all on descriptors past
    1023: 1.5.0 refused the start, and answered 500 to each reuse and each wait."""
    (tmp_path / "tokens").write_text(TOKEN)
    db = pg_url if database == "PostgreSQL" else str(tmp_path / "plants.db")
    env = environ_without_tokens(
        PLANTSTORE_TOKENS_FILE=str(tmp_path / "tokens"), PLANTSTORE_DB=db
    )
    process = spawn([sys.executable, "-c", MANY_DESCRIPTORS], env)
    host, port = (
        Lines(process.stderr).until(r"listening on http://(.+):(\d+)/").groups()
    )
    assert len(os.listdir(f"/proc/{process.pid}/fd")) > 1100
    answers = [
        post_over_http(host, port, TOKEN, {"id": n, "name": f"p{n}"})[0]
        for n in range(3)
    ]
    if database == "SQLite":
        writers = os.open(f"{db}-writers", os.O_RDWR)
        bell = os.open(f"{db}-writers-bell", os.O_RDWR | os.O_NONBLOCK)
        fcntl.flock(writers, fcntl.LOCK_EX)  # another process's writer has the turn
        os.write(bell, b"\0")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            create = pool.submit(
                post_over_http, host, port, TOKEN, {"id": 3, "name": "p3"}
            )
            # its writer waits on the bell once it has read the ring: then let it go
            wait_until(
                lambda: create.done() or not any(fcntl.ioctl(bell, FIONREAD, bytes(4))),
                "the create neither waited for the writers' turn nor was answered",
            )
            fcntl.flock(writers, fcntl.LOCK_UN)
            answers.append(create.result(WAIT)[0])
        os.close(writers)
        os.close(bell)
    assert answers == [200] * len(answers)
    assert len(over_http(host, port, TOKEN, "GET", "/plants")[1]) == len(answers)


# ---- Group commit: the creates waiting at one moment share one commit (issue 31) ----


def creates_until(address, first_id, count, wait):
    """Send creates one after another until `count` are answered 200, within `wait`
    seconds; return the ids."""
    created, deadline = [], time.monotonic() + wait
    for plant_id in itertools.count(first_id):
        assert time.monotonic() < deadline, (
            f"creates did not succeed again ({len(created)} of {count})"
        )
        status, headers, _ = exchange(
            *address, "POST", "/plants", {"id": plant_id, "name": f"p{plant_id}"}
        )
        assert status in (200, 503) and (status == 200 or "Retry-After" in headers), (
            status,
            headers,
        )
        if status == 200:
            created.append(plant_id)
            if len(created) == count:
                return created
        else:
            time.sleep(0.05)


def test_group_commit_postgres_stopped_mid_burst_answers_200_or_503_and_keeps_every_200(
    spawn, postgres, pg_url
):
    """pg_ctl stop -m immediate while 16 clients create: every answer is 200, or 503
    with Retry-After; nothing answered 200 is missing once PostgreSQL is back; and
    creates succeed again with the same gunicorn."""
    _, address = serve_batches(spawn, "gunicorn", "postgres", pg_url)
    answers, done = [], threading.Event()

    def client(n):
        for k in range(2000):
            if done.is_set():
                return
            plant_id = n * 100_000 + k
            try:
                status, headers, body = exchange(
                    *address,
                    "POST",
                    "/plants",
                    {"id": plant_id, "name": f"p{plant_id}"},
                )
            except (OSError, http.client.HTTPException) as error:
                # fails the test below
                status, headers, body = repr(error), {}, None
            answers.append((plant_id, status, headers.get("Retry-After"), body))
            if status != 200:
                # a real client would wait Retry-After seconds; the test keeps it short
                time.sleep(0.05)

    clients = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in clients:
        thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while len(answers) < 100:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        try:
            postgres._pg(
                "pg_ctl",
                "-D",
                postgres.folder / "data",
                "-w",
                "-t",
                WAIT,
                "-m",
                "immediate",
                "stop",
            )
            time.sleep(1)
        finally:
            postgres.start()
        # the same servers, with new connections
        creates_until(address, 10_000_000, 10, WAIT)
    finally:
        done.set()
        for thread in clients:
            thread.join(WAIT)
    assert {status for _, status, _, _ in answers} == {200, 503}
    for _, status, retry_after, body in answers:
        assert status == 200 or (int(retry_after) > 0 and body["error"] == 503), (
            status,
            retry_after,
            body,
        )
    plants = stored_plants(pg_url)
    assert all(
        plant_id in plants for plant_id, status, _, _ in answers if status == 200
    )


def test_group_commit_stalled_postgres_answers_every_waiting_create_503_while_stalled(
    spawn, postgres, pg_url
):
    """kill -STOP of every process of the cluster: the creates waiting for it answer 503
    with Retry-After within their bound, while it is still stopped; after kill -CONT
    creates answer 200 again."""
    _, address = serve_batches(spawn, "gunicorn", "postgres", pg_url)
    # each worker has its writer, connections in its pool
    creates_until(address, 0, 16, WAIT)
    answers = {}

    def send(n):
        answers[n] = exchange(
            *address, "POST", "/plants", {"id": 100 + n, "name": f"stalled {n}"}
        )

    # 2 workers x 4 threads
    senders = [threading.Thread(target=send, args=(n,), daemon=True) for n in range(8)]
    with frozen_postgres(postgres):
        for thread in senders:
            thread.start()
        # generous: two rounds of 4 threads
        deadline = time.monotonic() + 3 * plantstore_sql.DB_WAIT_SECONDS
        for thread in senders:
            thread.join(max(0, deadline - time.monotonic()))
        answered = dict(answers)  # as they are while the database is still stopped
    assert len(answered) == 8, (
        f"{8 - len(answered)} of 8 creates got no answer while the database was stalled"
    )
    for status, headers, body in answered.values():
        assert (
            status == 503 and int(headers["Retry-After"]) > 0 and body["error"] == 503
        ), (status, headers, body)
    created = creates_until(address, 1000, 8, WAIT)
    assert set(created) <= set(stored_plants(pg_url))


# ---- Metrics for Prometheus (issue 46) ----


def test_metrics_postgres_counts_by_receiver_origin_and_1_3_0_s_events_have_no_age(
    pg_url,
):
    urls = [
        "http://a.example:8080/hook",
        "http://a.example:8080/other?key=SECRET-IN-QUERY",
        "https://b.example/hook",
    ]
    served = make_app(
        [TOKEN], store=PostgresStore(pg_url), webhook_urls=urls, webhook_secret=SECRET
    )
    application = webtest.TestApp(served)
    now = time.time()
    with psycopg.connect(pg_url) as db:  # due in a year: the sender leaves them be
        db.cursor().executemany(
            "INSERT INTO plant_events"
            " (url, webhook_id, body, attempts, next_at, created)"
            f" VALUES (%s, 'msg_x', '\\x7b7d', %s, {now + 3e7}, %s)",
            [
                ("http://a.example:8080/hook", 0, now - 3600),
                ("http://a.example:8080/other?key=SECRET-IN-QUERY", 1, now - 10),
                ("http://a.example:8080/hook", 0, None),  # 1.3.0's, after a rollback
                ("https://b.example/hook", 2, None),
            ],
        )
    text = application.get("/metrics", headers=AUTH, status=200).text
    asked, read = time.time(), read_metrics(text)
    assert read["plantstore_database_up"] == 1
    assert read["plantstore_webhook_events_waiting"] == {
        "http://a.example:8080": 3,
        "https://b.example": 1,
    }
    assert read["plantstore_webhook_events_failing"] == {
        "http://a.example:8080": 1,
        "https://b.example": 1,
    }
    ages = read["plantstore_webhook_oldest_event_age_seconds"]
    assert 3600 - 0.001 <= ages["http://a.example:8080"] <= asked - now + 3600 + 0.001
    assert ages["https://b.example"] == 0
    assert "SECRET" not in text and "/hook" not in text
    served.webhook_sender.close()


def test_metrics_postgres_silent_answers_200_within_2_5_s_with_database_up_0(
    postgres, pg_url, spawn
):
    """Every process of the cluster stopped (no answer, no refusal): each scrape of
    gunicorn -w 2 --threads 4 answers 200 within 2.5 s, the database down, the
    configured receiver at 0; once it is back, the scrapes say so."""
    down = free_port()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=f"http://127.0.0.1:{down}/plant/webhook",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    _, host, port, err = start_gunicorn(spawn, env, 2, 4)
    wait_apps_built(err, 2)
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    origin = f"http://127.0.0.1:{down}"
    assert backlog(host, port) == {origin: 1}
    with frozen_postgres(postgres):
        scrapes = [scrape(host, port) for _ in range(4)]
    for seconds, status, headers, text in scrapes:
        assert status == 200, text
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert seconds < 2.5, f"answered after {seconds:.2f} s"
        read = read_metrics(text)
        assert read["plantstore_database_up"] == 0
        # no figure read, none shown: a 0 would say no event waits
        assert "plantstore_webhook_events_waiting" not in read
    back = {  # in one scrape: a worker whose breaker is still open says 0, and none
        "plantstore_database_up": 1,
        "plantstore_webhook_events_waiting": {origin: 1},
    }

    def said():
        read = read_metrics(scrape(host, port)[3])
        return {name: read.get(name) for name in back}

    wait_until(lambda: said() == back, lambda: f"once it is back: {said()}")


def test_metrics_every_worker_answers_the_same_backlog_on_postgres(spawn, pg_url):
    expected, backlogs, answered = same_backlog_from_every_worker(spawn, pg_url)
    assert backlogs == [expected] * len(backlogs), f"answered by {answered}"


def test_metrics_a_1_3_0_postgres_database_is_upgraded_at_start_and_1_3_0_serves_it(
    spawn, tmp_path, pg_url, receiver
):
    rolled_back_to_1_3_0_and_forward(spawn, tmp_path, pg_url, receiver)


# ---- Two gunicorn instances on one PostgreSQL ----


@pytest.fixture
def two_instances(spawn, pg_url):
    """Two gunicorn instances x 2 workers x 4 threads, as on two machines, on the
    suite's PostgreSQL."""
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=pg_url)
    instances = [start_gunicorn(spawn, env, workers=2, threads=4) for _ in range(2)]
    for *_, err in instances:  # each worker has built its app: it serves from now on
        wait_apps_built(err, 2)
    return instances


def test_two_gunicorn_instances_on_postgres_share_ids_and_order(two_instances):
    addresses = [(host, port) for _, host, port, _ in two_instances]
    attempts = [(plant_id, n) for n in range(16) for plant_id in range(20)]
    statuses = in_threads(
        len(attempts),
        lambda k: post_over_http(
            *addresses[k % 2],
            TOKEN,
            {
                "id": attempts[k][0],
                "name": f"id {attempts[k][0]} by racer {attempts[k][1]}",
            },
        )[0],
    )
    assert sorted(statuses) == [200] * 20 + [409] * 300
    for plant_id in range(100, 110):  # one after another, on alternate instances
        assert (
            post_over_http(
                *addresses[plant_id % 2],
                TOKEN,
                {"id": plant_id, "name": f"id {plant_id}"},
            )[0]
            == 200
        )
    first, second = (
        over_http(*address, TOKEN, "GET", "/plants") for address in addresses
    )
    assert first == second and first[0] == 200
    assert [p["name"] for p in first[1][20:]] == [
        f"id {plant_id}" for plant_id in range(100, 110)
    ]
    assert sorted(int(p["name"].split()[1]) for p in first[1][:20]) == list(range(20))
    # kill -9 of one instance: the other serves on
    os.killpg(two_instances[0][0].pid, signal.SIGKILL)
    two_instances[0][0].wait(WAIT)
    assert (
        post_over_http(*addresses[1], TOKEN, {"id": 200, "name": "after the kill"})[0]
        == 200
    )
    assert over_http(*addresses[1], TOKEN, "GET", "/plants")[1] == first[1] + [
        {"name": "after the kill"}
    ]


def test_two_gunicorn_instances_ride_out_a_postgres_restart(two_instances, postgres):
    addresses = [(host, port) for _, host, port, _ in two_instances]
    answers, acknowledged, stop = [], [], threading.Event()

    def client(n):
        for k in itertools.count():
            if stop.is_set():
                return
            plant_id = n * 1_000_000 + k
            status, headers, _ = exchange(
                *addresses[k % 2],
                "POST",
                "/plants",
                {"id": plant_id, "name": f"p{plant_id}"},
            )
            answers.append((k % 2, status, "Retry-After" in headers))
            if status == 200:
                acknowledged.append(plant_id)
            else:
                # a real client would wait Retry-After seconds; the test keeps it short
                time.sleep(0.05)

    clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(0.5)
        postgres.stop()
        # Down until each instance has answered a 503, not for a set time: clients held
        # up by one instance (its workers still loading, under load) sent the other
        # nothing while PostgreSQL was down, and it had no outage to log.
        stopped = len(answers)
        wait_until(
            lambda: (
                {n for n, status, _ in answers[stopped:] if status == 503} == {0, 1}
            ),
            "an instance answered no 503 while PostgreSQL was down",
        )
        postgres.start()
        for address in addresses:  # each instance serves again, with nothing restarted
            deadline = time.monotonic() + WAIT
            while exchange(*address, "GET", "/plants?limit=1")[0] != 200:
                assert time.monotonic() < deadline, "an instance did not recover"
                time.sleep(0.1)
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in clients:
            thread.join(WAIT)
    assert {status for _, status, _ in answers} == {200, 503}
    assert all(retry_after for _, status, retry_after in answers if status == 503)
    listed = {p["name"] for p in over_http(*addresses[0], TOKEN, "GET", "/plants")[1]}
    # nothing answered 200 is lost
    assert {f"p{plant_id}" for plant_id in acknowledged} <= listed
    for process, _, _, err in two_instances:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(WAIT)
        logged = err.rest()
        assert "is unavailable" in logged and postgres.password not in logged


# ---- Promises at the edges (issue 29) ----


# the password, and the parts libpq would show of it
EDGE_PASSWORD_PARTS = ("S3cretPW", "S3c", "retPW")


# PLANTSTORE_DB values of no form it takes; {closed} is a port nothing listens on, which
# libpq never reaches: it refuses the option's value first.
DB_FORMS_OF_NO_KIND = {
    "double-quoted-url": '"postgresql://app:S3cretPW@127.0.0.1/db"',
    "single-quoted-libpq-string": "'host=127.0.0.1 password=S3cretPW'",
    "byte-order-mark": "\ufeffpostgresql://app:S3cretPW@127.0.0.1/db",
    "no-colon-after-the-scheme": "postgresql//app:S3cretPW@127.0.0.1/db",
    "at-in-the-password": "postgresql://app:S3c@retPW@127.0.0.1/plants",
    "question-mark-in-the-password": "postgresql://app:S3c?retPW@127.0.0.1/db",
    "hash-in-the-password": "postgresql://app:S3c#retPW@127.0.0.1/db",
    **{
        f"{option}={value}": (
            f"host=127.0.0.1 port={{closed}} {option}={value}"
            " password=S3cretPW dbname=plants"
        )
        for option, value in [
            ("connect_timeout", "abc"),
            ("sslmode", "bogus"),
            ("keepalives", "x"),
        ]
    },
}


def db_form_of_no_kind(form):
    return DB_FORMS_OF_NO_KIND[form].format(closed=free_port())


def assert_no_secret_and_the_option_named(said, form):
    """No traceback, nothing of the password nor the user-info; a libpq option named,
    its value never quoted."""
    assert "Traceback" not in said and "app:" not in said
    for part in EDGE_PASSWORD_PARTS:
        assert part not in said
    if "=" in form:
        option, value = form.split("=")
        assert f"option {option}" in said and not re.search(rf"\b{value}\b", said), said


@pytest.mark.parametrize("form", DB_FORMS_OF_NO_KIND)
def test_edges_plantstore_py_refuses_a_db_value_of_no_form_in_one_line_quoting_nothing(
    form, tmp_path
):
    # the process's own temporary folder, to see that nothing lands in it
    (tmp_path / "tmp").mkdir()
    value = db_form_of_no_kind(form)
    code, lines = run_plantstore(
        tmp_path, PLANTSTORE_DB=value, TMPDIR=str(tmp_path / "tmp")
    )
    said = "".join(lines)
    assert (
        code == 2 and len(lines) == 1 and said.startswith("plantstore: PLANTSTORE_DB")
    ), lines
    assert_no_secret_and_the_option_named(said, form)
    assert value.strip("\"'\ufeff") not in said
    assert [path.name for path in tmp_path.iterdir()] == ["tmp"] and list(
        (tmp_path / "tmp").iterdir()
    ) == []


@pytest.mark.parametrize(
    "form", ["single-quoted-libpq-string", "at-in-the-password", "keepalives=x"]
)
def test_edges_gunicorn_refuses_a_db_setting_of_no_form_in_one_line_that_quotes_nothing(
    form, spawn, tmp_path
):
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db_form_of_no_kind(form),
        TMPDIR=str(tmp),
        PYTHONPATH=str(HERE),  # this plantstore.py, from `work`
    )
    process = spawn(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            "1",
            "--threads",
            "8",
            "-b",
            "127.0.0.1:0",
            "--chdir",
            str(work),
            "plantstore:app",
        ],
        env,
    )
    assert process.wait(WAIT) != 0
    said = process.stderr.read()
    named = [line for line in said.splitlines() if "PLANTSTORE_DB" in line]
    # the line through the logger plantstore, which no handler of gunicorn's takes
    assert len(named) == 1 and named[0].startswith("plantstore: PLANTSTORE_DB"), said
    assert_no_secret_and_the_option_named(said, form)
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []


AWKWARD_PASSWORD = "S3c@re?t#PW"  # @ ? #: each written percent-encoded in a URL


@pytest.fixture
def awkward_role(limited_role, postgres):
    """limited_role, its password holding @ ? and #, given its tables by their owner;
    and its URL."""
    with psycopg.connect(limited_role["owner"], autocommit=True) as db:
        db.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(limited_role["role"]), sql.Literal(AWKWARD_PASSWORD)
            )
        )
    PostgresStore(limited_role["owner"])  # the owner makes the tables
    grant_the_tables(limited_role)
    role = limited_role["role"]
    encoded = (
        AWKWARD_PASSWORD.replace("@", "%40").replace("?", "%3F").replace("#", "%23")
    )
    return {
        **limited_role,
        "url": f"postgresql://{role}:{encoded}@127.0.0.1:{postgres.port}/{role}",
    }


def test_edges_a_percent_encoded_password_connects_and_shows_on_no_start_or_outage_line(
    awkward_role, spawn
):
    role = awkward_role["role"]
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=awkward_role["url"]
        ),
    )
    err = Lines(process.stderr)
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    assert f"plants in PostgreSQL postgresql://{role}@127.0.0.1:" in "".join(err.seen)
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"}) == (
        200,
        {"name": "Fern"},
    )
    with psycopg.connect(awkward_role["owner"], autocommit=True) as db:
        # stored, by the role with that password
        assert db.execute("SELECT id FROM plants").fetchall() == [(1,)]

        def may_log_in(yes):
            db.execute(
                sql.SQL("ALTER ROLE {} " + ("LOGIN" if yes else "NOLOGIN")).format(
                    sql.Identifier(role)
                )
            )
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = %s",
                [role],
            )
            wait_until(
                lambda: (
                    not db.execute(
                        "SELECT pid FROM pg_stat_activity WHERE usename = %s", [role]
                    ).fetchall()
                ),
                "the role's connections stayed",
            )

        may_log_in(False)  # an outage: its connection is gone, and no new one is let in
        try:
            status, headers, body = exchange(
                host, port, "POST", "/plants", {"id": 2, "name": "Ivy"}
            )
            assert (
                status == 503
                and int(headers["Retry-After"]) > 0
                and body["error"] == 503
            )
            err.until("is unavailable")
        finally:
            may_log_in(True)
    assert post_over_http(host, port, TOKEN, {"id": 3, "name": "Moss"}) == (
        200,
        {"name": "Moss"},
    )
    err.until("reachable again")
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT) == 0
    said = err.rest()
    assert f"postgresql://{role}@127.0.0.1" in said and "Traceback" not in said
    for part in (AWKWARD_PASSWORD, "S3c", "re?t", "#PW", "%40re", "%23PW"):
        assert part not in said


def test_edges_a_table_locked_elsewhere_costs_requests_their_bound_not_the_locks_length(
    spawn, pg_url
):
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=pg_url)
    _, host, port, _ = start_gunicorn(spawn, env, 1, 8)
    deadline = time.monotonic() + WAIT
    # the worker has built the app, and made the tables: asking no question of the
    # database
    while True:
        with contextlib.suppress(OSError):
            if exchange(host, port, "GET", "/openapi.json")[0] == 200:
                break
        assert time.monotonic() < deadline, "gunicorn never served"
        time.sleep(0.05)
    # not autocommit: the lock lasts until the transaction ends
    locker = psycopg.connect(pg_url)
    locker.execute("LOCK TABLE plants IN ACCESS EXCLUSIVE MODE")
    released, release_once = threading.Event(), threading.Lock()

    def release():
        with release_once:
            if not released.is_set():
                # set first: an answer that finds it unset came while the lock was held
                released.set()
                locker.rollback()

    # the lock is held ~15 s at most, whatever happens here
    timer = threading.Timer(15, release)
    timer.start()
    try:

        def ask(n):
            if n < 4:
                answer = exchange(
                    host, port, "POST", "/plants", {"id": n, "name": f"p{n}"}
                )
            else:
                answer = exchange(host, port, "GET", "/health")
            return (*answer, released.is_set())

        answers = in_threads(6, ask)
    finally:
        release()
        timer.cancel()
        locker.close()
    # each answered while the lock was still held
    assert [late for *_, late in answers] == [False] * 6
    for status, headers, body, _ in answers[:4]:  # the creates
        assert (status, body.get("error")) == (503, 503) and int(
            headers["Retry-After"]
        ) > 0, body
    # The health checks: the database answers (a lock on one table is no outage, and a
    # 503 here would take every instance out of its load balancer at once), within their
    # own bound.
    assert [(status, body) for status, _, body, _ in answers[4:]] == [
        (200, {"status": "ok"})
    ] * 2
    # Creates go again once the breaker tries the database, RETRY_AFTER after its last
    # wait (README, "When the database is away"): within 3 s of the lock's end.
    wait_until(
        lambda: post_over_http(host, port, TOKEN, {"id": 99, "name": "x"})[0] == 200,
        "no create succeeded once the lock was gone",
        3,
    )
    # a create cut at its bound may have been committed since: 200, or 409
    for n in range(4):
        assert post_over_http(host, port, TOKEN, {"id": n, "name": f"p{n}"})[0] in (
            200,
            409,
        )
    assert post_over_http(host, port, TOKEN, {"id": 10, "name": "after"}) == (
        200,
        {"name": "after"},
    )
    assert exchange(host, port, "GET", "/health")[0] == 200


def test_edges_a_health_flood_holds_at_most_the_pool_and_holds_up_no_other_instance(
    spawn, pg_url
):
    def embedded(url):
        process = spawn(
            [sys.executable, "plantstore.py", "--port", "0"],
            environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=url),
        )
        err = Lines(process.stderr)
        return (
            process,
            err,
            err.until(r"listening on http://([\d.]+):(\d+)/plants").groups(),
        )

    # its connections, named
    flooded, flooded_err, address = embedded(pg_url + "?application_name=flooded")
    _, _, other = embedded(pg_url)
    ending, statuses = time.monotonic() + 4, []

    def flood():
        while time.monotonic() < ending:
            try:
                statuses.append(exchange(*address, "GET", "/health")[0])
            except OSError as error:
                # counted: a refused or reset connection is an answer too
                statuses.append(repr(error))

    clients = [threading.Thread(target=flood) for _ in range(60)]
    for client in clients:
        client.start()
    held, created = [], None
    try:
        with psycopg.connect(pg_url, autocommit=True) as db:
            while time.monotonic() < ending:
                held.append(
                    db.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE application_name = 'flooded'"
                    ).fetchone()[0]
                )
                # the flood is on: a create on the other instance
                if created is None and len(statuses) > 60:
                    created = (
                        post_over_http(*other, TOKEN, {"id": 1, "name": "Fern"}),
                        time.monotonic() < ending,
                    )
                time.sleep(0.05)
    finally:
        for client in clients:
            client.join(WAIT)
    # answered while the flood was still on
    assert created == ((200, {"name": "Fern"}), True)
    assert max(held) <= plantstore_sql.SQLStore.POOL_SIZE + 1, held
    assert len(statuses) > 60 and set(statuses) == {200}
    flooded.send_signal(signal.SIGINT)
    assert flooded.wait(WAIT) == 0
    assert "unavailable" not in flooded_err.rest()


# ---- Backups, restores and the move to PostgreSQL (docs/operations.md) ----


@pytest.fixture
def runbook_pg(runbook, postgres, tmp_path):
    """The same, with the suite's PostgreSQL emptied: its password in a file of libpq's,
    never in $PG."""
    postgres.reset()
    password_file = tmp_path / "pgpass"
    password_file.write_text(
        f"127.0.0.1:{postgres.port}:plantstore:plantstore:{postgres.password}\n"
    )
    password_file.chmod(0o600)
    return Runbook(
        tmp_path,
        **{
            **runbook.settings,
            "PG": f"postgresql://plantstore@127.0.0.1:{postgres.port}/plantstore",
        },
    )


def test_operations_postgres_backup_amid_creates_restores_all_answered_before_it(
    runbook_pg, postgres, spawn
):
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=postgres.url)
    service, host, port, _ = start_gunicorn(spawn, env, 2, 4)
    creates = Creates(host, port)
    before = creates.wait_for(200)
    backup = Path(runbook_pg.run("postgres-backup").strip())
    creates.wait_for(len(creates.answered) + 200)  # creates go on during and after it
    answered = creates.stop()
    assert creates.statuses.keys() == {200} and backup.stat().st_mode & 0o777 == 0o600
    # a mistake, to be undone
    status, _ = over_http(host, port, TOKEN, "DELETE", f"/plants/{min(before)}")
    assert status == 204
    stop_service(service)
    said = runbook_pg.run("postgres-restore")
    process, host, port, _ = serve_plantstore(spawn, env)
    restored = listed_ids(host, port)
    assert said == f"{len(restored)} plants, 0 waiting events\n"
    assert before <= set(restored) < answered and len(restored) == len(set(restored))
    # the identity too
    assert post_over_http(host, port, TOKEN, {"id": -1, "name": "steady -1"})[0] == 200
    assert listed_ids(host, port)[-1] == -1


HARD_PIECES = [
    "\x00",
    "\ud800",
    "\udfff",
    "\U0001f335",
    "\U0001fab4",
    "\u862d",
    "\u30b7\u30c0",
    "\t",
    "\\",
    "\\N",
    "\n",
    "\r",
    "'",
    '"',
    ",",
    "\x1b",
    "\x7f",
    "\u2028",
    "\ufeff",
    "\x01",
    " ",
    "NULL",
    "{}",
]


def hard_plants(rng, count):
    """count plants whose names and tags hold what a copy by text would break, over the
    whole int64 range."""
    ids = [
        INT64_MIN,
        INT64_MAX,
        0,
        -1,
        *rng.sample(range(-(2**62) + 1, 2**62), count - 4),
    ]
    return [
        (
            plant_id,
            f"{n} " + "".join(rng.choices(HARD_PIECES, k=rng.randrange(12))),
            rng.choice([None, "", "indoor", "\x00", "\udc80\U0001f33f"]),
        )
        for n, plant_id in enumerate(ids)
    ]


EVENT_COLUMNS = "seq, url, webhook_id, body, attempts, next_at, lease"


def rows(db, sql):
    return [
        tuple(bytes(value) if isinstance(value, memoryview) else value for value in row)
        for row in db.execute(sql).fetchall()
    ]


def test_operations_the_move_to_postgres_keeps_every_byte_link_order_and_waiting_event(
    runbook_pg, postgres, spawn, receiver, tmp_path
):
    """docs/operations.md's move, command by command: 2,000 hard names, deletions, ids
    made again, events. The event the service tries before the move is retried 1 s
    after its attempt rather than 5 s (first_retry_after): its next_at is moved byte
    for byte all the same, and the service after the move need not wait for it."""
    rng, path = random.Random(30), str(runbook_pg.settings["SQLITE"])
    old_hook, new_hook = receiver(), receiver()
    old_hook.stop()  # the old receiver is gone: its events wait
    plants, store = hard_plants(rng, 2000), SQLiteStore(path)
    for plant_id, name, tag in plants[:1700]:
        assert store.add(plant_id, name, tag)
    # from here, events wait; no sender of this process sends them
    make_app(
        [TOKEN], store=store, webhook_urls=[old_hook.url], webhook_secret=SECRET
    ).webhook_sender.close()
    for plant_id, name, tag in plants[1700:]:
        assert store.add(plant_id, name, tag)
    again = []  # deleted, then made again: listed last
    for plant_id, _, _ in rng.sample(plants, 100):
        assert store.delete(plant_id)
        if plant_id % 2:
            assert store.add(plant_id, f"{plant_id} again \x00\ud800", None)
            again.append(plant_id)
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=path,
        PLANTSTORE_WEBHOOK_URL=old_hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
        PYTHONPATH=str(first_retry_after(tmp_path / "schedule", 1)),
    )
    service, host, port, _ = start_gunicorn(spawn, env, 2, 4)
    for plant_id in range(1, 11):
        assert (
            post_over_http(
                host,
                port,
                TOKEN,
                {"id": plant_id, "name": f"{plant_id} over HTTP \ud83c"},
            )[0]
            == 200
        )
    # next links issued before the move, and the pages they led to
    pages, link = {}, "/plants?limit=150"
    while link:
        status, headers, body = exchange(host, port, "GET", link)
        assert status == 200
        pages[link] = body
        link = (
            re.fullmatch(r'<([^>]+)>; rel="next"', headers["Link"])[1]
            if "Link" in headers
            else None
        )
    # an event tried already: a next_at of its own
    with contextlib.closing(sqlite3.connect(path)) as db:
        deadline = time.monotonic() + WAIT
        while not db.execute(
            "SELECT count(*) FROM plant_events WHERE attempts > 0"
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the sender tried no event"
            time.sleep(0.05)
    stop_service(service)  # the downtime starts
    with contextlib.closing(sqlite3.connect(path)) as db:
        plants_before = rows(db, "SELECT seq, id, name, tag FROM plants ORDER BY seq")
        events_before = rows(
            db, f"SELECT {EVENT_COLUMNS} FROM plant_events ORDER BY seq"
        )
    assert (
        len(plants_before) == 2000 - 100 + len(again) + 10
        and len(events_before) == 300 + len(again) + 10
    )

    # started once on the empty database, then Ctrl-C
    tables = runbook_pg.start(spawn, "make-tables")
    # it serves: the tables are there
    assert over_http(
        *Lines(tables.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups(),
        TOKEN,
        "GET",
        "/health",
    ) == (200, {"status": "ok"})
    os.killpg(tables.pid, signal.SIGINT)
    assert tables.wait(WAIT) == 0
    runbook_pg.run("pgloader-file")
    runbook_pg.run("pgloader")
    runbook_pg.run("empty-tables")  # a copy to do again, as the doc says
    runbook_pg.run("pgloader")
    assert runbook_pg.run("check-move") == "the same rows\n"
    said = runbook_pg.run(
        "repoint-postgres", OLD_URL=old_hook.url, NEW_URL=new_hook.url
    )
    assert f"UPDATE {len(events_before)}" in said
    with psycopg.connect(postgres.url) as db:
        # byte for byte
        assert (
            rows(db, "SELECT seq, id, name, tag FROM plants ORDER BY seq")
            == plants_before
        )
        events_after = rows(
            db, f"SELECT {EVENT_COLUMNS} FROM plant_events ORDER BY seq"
        )
    assert events_after == [
        (seq, new_hook.url, *rest) for seq, _, *rest in events_before
    ]

    # the service, on PostgreSQL
    env.update(PLANTSTORE_DB=postgres.url, PLANTSTORE_WEBHOOK_URL=new_hook.url)
    service, host, port, err = start_gunicorn(spawn, env, 2, 4)
    # every link issued before the move leads to the same page
    for link, body in pages.items():
        assert exchange(host, port, "GET", link)[::2] == (200, body)
    assert post_over_http(
        host, port, TOKEN, {"id": 11, "name": "11 after the move"}
    ) == (200, {"name": "11 after the move"})
    everything = over_http(host, port, TOKEN, "GET", "/plants")[1]
    assert everything == [plant for body in pages.values() for plant in body] + [
        {"name": "11 after the move"}
    ]
    # made before the move: in SQLite, again, over HTTP
    for plant_id in INT64_MIN, again[0], 5:
        assert over_http(host, port, TOKEN, "DELETE", f"/plants/{plant_id}")[0] == 204
    waiting = {
        webhook_id: json.loads(body) for _, _, webhook_id, body, *_ in events_before
    }
    delivered = wait_for_deliveries(new_hook, len(waiting) + 1)
    # each, with its webhook-id
    assert {webhook_id: delivered[webhook_id] for webhook_id in waiting} == waiting
    assert [
        delivered[webhook_id] for webhook_id in delivered.keys() - waiting.keys()
    ] == [{"id": 11, "name": "11 after the move"}]
    stop_service(service)
    logged = err.rest()
    # no event was lost to the old URL
    assert "dropped" not in logged and postgres.password not in logged
    # a line from each worker that moved it
    moved = [line for line in logged.splitlines() if "identity" in line]
    assert {re.search(r"\b(plants|plant_events)\b", line)[1] for line in moved} == {
        "plant_events",
        "plants",
    }


def wait_for_deliveries(hook, count):
    """{webhook-id: payload} of the deliveries answered 2xx, once count different ones
    came."""
    deadline = time.monotonic() + WAIT
    while (
        len(
            delivered := {
                webhook_id: payload
                for webhook_id, payload, status in list(hook.deliveries)
                if 200 <= status < 300
            }
        )
        < count
    ):
        assert time.monotonic() < deadline, f"{len(delivered)} of {count} events came"
        time.sleep(0.05)
    return delivered


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
                    plantstore_webhooks.event_json(seq, f"copied {seq}", None),
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
    status, _, page = exchange(host, port, "GET", "/plants?limit=5&after=20550")
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


# ---- A real PostgreSQL 15: a role that may not create tables in schema public ----


@pytest.fixture
def limited_role(postgres):
    """A fresh database of the suite's superuser, and a role that may log in, nothing
    more."""
    name, password = f"settings_{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    base = postgres.url.rpartition("/")[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as db:
        db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        db.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
    host_port = base.rpartition("@")[2]
    try:
        yield {
            "owner": f"{base}/{name}",
            "role": name,
            "password": password,
            "url": f"postgresql://{name}:{password}@{host_port}/{name}",
        }
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as db:
            db.execute(
                sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name))
            )
            db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def grant_the_tables(limited_role):
    with psycopg.connect(limited_role["owner"], autocommit=True) as db:
        db.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON plants, plant_events TO {}"
            ).format(sql.Identifier(limited_role["role"]))
        )


@pytest.mark.parametrize(
    "wrong", ["password", "database", "role", "login", "connect", "pg_hba.conf"]
)
@pytest.mark.parametrize("server", ["python plantstore.py", "gunicorn"])
def test_settings_a_database_that_refuses_for_good_stops_the_start(
    limited_role, postgres, spawn, wrong, server
):
    """A wrong password, a database or a role that does not exist, a role without LOGIN
    or without CONNECT on the database, a pg_hba.conf line that rejects it: no retry
    mends it, so the start stops in one line, with no password, rather than serve 503s;
    under gunicorn, the master stops. A database merely away still starts (the tests of
    outages)."""
    role, url = limited_role["role"], limited_role["url"]
    url = {
        "password": url.replace(limited_role["password"], "wrong-pw"),
        "database": url + "-none",
        "role": url.replace(f"//{role}:", "//nobody:"),
    }.get(wrong, url)
    hba = postgres.folder / "data" / "pg_hba.conf"
    kept = hba.read_text()
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=url)
    command = [sys.executable, "plantstore.py", "--port", "0"]
    if server == "gunicorn":
        command = [sys.executable, "-m", "gunicorn", "-b", "127.0.0.1:0"]
        command += ["plantstore:app"]
    try:
        if wrong == "pg_hba.conf":  # first: the first line that matches is the one
            hba.write_text(f"host {role} {role} 127.0.0.1/32 reject\n{kept}")
        with psycopg.connect(limited_role["owner"], autocommit=True) as db:
            db.execute(
                {
                    "login": f"ALTER ROLE {role} NOLOGIN",
                    "connect": f"REVOKE CONNECT ON DATABASE {role} FROM PUBLIC",
                }.get(wrong, "SELECT pg_reload_conf()")
            )
        process = spawn(command, env)
        assert process.wait(WAIT) == (2 if server == "python plantstore.py" else 4)
    finally:
        hba.write_text(kept)
        with postgres.local("postgres") as db:
            db.execute("SELECT pg_reload_conf()")
    said = [
        line
        for line in process.stderr.read().splitlines()
        if line.startswith("plantstore:")
    ]
    assert len(said) == 1 and "PostgreSQL refuses the connection" in said[0], said
    assert said[0].startswith("plantstore: PLANTSTORE_DB: PostgreSQL postgresql://")
    assert {
        "password": "password authentication failed",
        "role": "nobody",
        "login": "is not permitted to log in",
        "connect": "permission denied for database",
        "pg_hba.conf": "pg_hba.conf rejects connection",
    }.get(wrong, "does not exist") in said[0]
    assert limited_role["password"] not in said[0] and "wrong-pw" not in said[0]


def test_settings_a_role_without_create_on_public_is_refused_in_one_line(
    limited_role, tmp_path
):
    code, lines = run_plantstore(tmp_path, PLANTSTORE_DB=limited_role["url"])
    said = "".join(lines)
    assert code == 2 and len(lines) == 1 and "Traceback" not in said
    assert said.startswith("plantstore: PLANTSTORE_DB") and "CREATE" in said
    assert limited_role["password"] not in said


def test_settings_a_role_without_its_grants_is_told_which_privilege_is_missing(
    limited_role,
):
    # the owner makes the tables, grants nothing
    PostgresStore(limited_role["owner"])
    with pytest.raises(ValueError) as refusal:
        PostgresStore(limited_role["url"])
    assert "SELECT, INSERT, UPDATE and DELETE" in str(refusal.value)
    assert limited_role["password"] not in str(refusal.value)


def test_settings_a_role_given_the_tables_by_their_owner_starts_and_stores(
    limited_role,
):
    PostgresStore(limited_role["owner"])  # the owner makes the tables
    grant_the_tables(limited_role)
    store = PostgresStore(limited_role["url"])
    assert store.add(7, "Fern", None) is True and store.add(7, "Fern", None) is False
    assert [(name, tag) for _, name, tag in store.page(None, 10)] == [("Fern", None)]
    assert store.delete(7) is True


@pytest.mark.parametrize("tables", ["made by the role", "granted by their owner"])
def test_an_upgrade_from_1_3_0_starts_for_each_documented_role_setup(
    tables, limited_role, spawn, tmp_path, receiver
):
    """docs/deploy.md's two setups, each served by 1.3.0's own code first: a role that
    may create the tables (their owner), and one their owner granted them. The first
    upgrades them at start; the second is refused in one line that gives the owner's
    SQL, and starts once the owner ran it. Every plant and waiting event is kept, the
    backlog's age counts, and the events are delivered."""
    owner, role = limited_role["owner"], limited_role["url"]
    old = plantstore_1_3_0(tmp_path / "1.3.0")
    down = free_port()
    settings = {
        "PLANTSTORE_WEBHOOK_URL": f"http://127.0.0.1:{down}/plant/webhook",
        "PLANTSTORE_WEBHOOK_SECRET": SECRET,
    }
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, **settings)
    if tables == "made by the role":
        with psycopg.connect(owner, autocommit=True) as db:
            db.execute(
                sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
                    sql.Identifier(limited_role["role"])
                )
            )
    else:  # 1.3.0, as the owner, makes the tables; the role is granted them
        made = spawn(
            [sys.executable, str(old), "--port", "0"], {**env, "PLANTSTORE_DB": owner}
        )
        Lines(made.stderr).until("listening on")
        stop_service(made)
        grant_the_tables(limited_role)
    served = spawn(
        [sys.executable, str(old), "--port", "0"], {**env, "PLANTSTORE_DB": role}
    )
    address = (
        Lines(served.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    )
    for plant_id in 1, 2, 3:
        assert (
            post_over_http(
                *address, TOKEN, {"id": plant_id, "name": f"plant {plant_id}"}
            )[0]
            == 200
        )
    stop_service(served)

    code, lines = run_plantstore(tmp_path, PLANTSTORE_DB=role, **settings)
    said = "".join(lines)
    assert limited_role["password"] not in said and "Traceback" not in said
    if tables == "granted by their owner":
        assert code == 2 and len(lines) == 1, said
        assert "only the tables' owner may add" in said
        statements = said.rpartition("run once: ")[2].strip().split("; ")
        with psycopg.connect(owner, autocommit=True) as db:
            for statement in statements:  # exactly what the line says
                db.execute(statement)
        code, lines = run_plantstore(tmp_path, PLANTSTORE_DB=role, **settings)
    assert code is None, "".join(lines)  # it serves

    process, host, port, _ = serve_plantstore(spawn, {**env, "PLANTSTORE_DB": role})
    assert listed_ids(host, port) == [1, 2, 3]
    read = read_metrics(scrape(host, port)[3])
    assert read["plantstore_webhook_events_waiting"] == {f"http://127.0.0.1:{down}": 3}
    assert (
        read["plantstore_webhook_oldest_event_age_seconds"][f"http://127.0.0.1:{down}"]
        > 0
    )
    hook = receiver(down)
    assert sorted(event["id"] for event in hook.wait_for(3)) == [1, 2, 3]
    stop_service(process)


def test_settings_a_libpq_string_reaches_the_database_the_url_does(
    limited_role, postgres
):
    PostgresStore(limited_role["owner"])
    grant_the_tables(limited_role)
    role, password = limited_role["role"], limited_role["password"]
    keywords = (
        f"host=127.0.0.1 port={postgres.port} user={role} password='{password}' "
        f"dbname={role}"
    )
    assert PostgresStore(keywords).add(1, "Fern", "indoor") is True
    upper = limited_role["url"].replace("postgresql://", "POSTGRESQL://")
    plants = PostgresStore(upper).page(None, 10)
    assert [(name, tag) for _, name, tag in plants] == [("Fern", "indoor")]


# ---- Restarts, forks and stops (issue 43) ----


HOLD_SECONDS = 8


def test_restarts_rows_an_operator_holds_turn_no_create_away(spawn, receiver, pg_url):
    """Issue 43's fourth item: waiting events' rows held by another connection's `SELECT
    ... FOR UPDATE` while 4 clients create, with webhooks. Every create is a 200 within
    its bound; the sender, whose claim waits on those rows, says so once, in one line,
    and once they are free, that it goes on, and every event arrives. The rows are held
    8 s, not the issue's 20: past DB_WAIT_SECONDS and the RETRY_AFTER that follows it,
    so that a sender waiting on the requests' terms would have waited out a request's
    bound (5 s) and kept their breaker open after it, and 8 times BACKGROUND_WAIT, the
    sender's own."""
    assert HOLD_SECONDS > plantstore_sql.DB_WAIT_SECONDS + plantstore_sql.RETRY_AFTER
    hook = receiver()
    PostgresStore(pg_url).close()  # the tables
    with psycopg.connect(pg_url, autocommit=True) as db:
        for n in range(10):  # events left waiting, due now
            db.execute(
                "INSERT INTO plant_events (url, webhook_id, body, next_at, created)"
                " VALUES (%s, %s, %s, 0, 0)",
                (
                    hook.url,
                    f"msg_held{n}",
                    json.dumps({"id": -n, "name": "held"}).encode(),
                ),
            )
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    answers = []  # (id, status, seconds)
    with psycopg.connect(pg_url) as operator:  # its transaction holds the rows
        assert len(operator.execute("SELECT * FROM plant_events FOR UPDATE").fetchall())
        process, host, port, err = serve_plantstore(spawn, env)
        held_until = time.monotonic() + HOLD_SECONDS

        def create(plant_id):
            while time.monotonic() < held_until:
                started = time.monotonic()
                document = {"id": plant_id, "name": f"p{plant_id}"}
                status = exchange(host, port, "POST", "/plants", document)[0]
                answers.append((plant_id, status, time.monotonic() - started))
                plant_id += 4
                time.sleep(0.1)  # a steady stream, its events delivered in a moment

        in_threads(4, create)
        operator.rollback()
    assert len(answers) >= 4 * HOLD_SECONDS, len(answers)  # creates all along
    assert not [
        answer
        for answer in answers
        if answer[1] != 200 or answer[2] >= plantstore_sql.DB_WAIT_SECONDS
    ]
    created = {plant_id for plant_id, _, _ in answers}
    wait_until(
        lambda: (
            {plant["id"] for plant in hook.delivered()}
            >= created | {-n for n in range(10)}
        ),
        "not every event arrived once the rows were free",
    )
    stop_service(process)
    logged = err.rest()
    assert logged.count("webhook delivery waits for the") == 1, logged
    assert logged.count("webhook delivery goes on") == 1, logged
    assert "unavailable" not in logged and "Traceback" not in logged, logged


def test_restarts_a_read_only_postgres_is_a_503_said_once(
    spawn, receiver, pg_url, tmp_path
):
    """Issue 43's fifth item: PostgreSQL turned read-only under a running service, as a
    demoted primary is (default_transaction_read_only on, reloaded: every session takes
    it at its next statement). Creates answer 503 with Retry-After, said in one log
    line, with no traceback, from the requests or the sender; /health answers as it
    does for a read-only SQLite file; creates are 200 again within 3 s of the database
    taking writes."""
    path = tmp_path / "plants.sqlite3"
    sqlite_app = webtest.TestApp(make_app([TOKEN], store=SQLiteStore(path)))
    make_read_only(path, True)
    try:
        sqlite_health = sqlite_app.get("/health", expect_errors=True).status_int
    finally:
        make_read_only(path, False)
    hook = receiver()
    process, host, port, err = serve_plantstore(
        spawn,
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB=pg_url,
            PLANTSTORE_WEBHOOK_URL=hook.url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
        ),
    )
    ids = itertools.count()

    def create():
        plant_id = next(ids)
        return exchange(host, port, "POST", "/plants", {"id": plant_id, "name": "p"})

    assert create()[0] == 200
    refused = []
    with read_only(pg_url):
        while len(refused) < 10:  # a few seconds of it
            status, headers, body = create()
            if status != 200:
                refused.append((status, headers.get("Retry-After"), body))
                time.sleep(0.2)
        spell = err.so_far()
        health = exchange(host, port, "GET", "/health")[0]
    writable = time.monotonic()
    while (answer := create())[0] != 200:
        assert time.monotonic() < writable + 3, answer
    assert {(status, retry) for status, retry, _ in refused} == {(503, "2")}, refused
    assert health == sqlite_health
    said = [line for line in spell.splitlines() if "unavailable" in line]
    assert len(said) == 1 and "read-only transaction" in said[0], spell
    assert spell.count("webhook delivery waits for the") <= 1, spell
    wait_until(lambda: "webhook delivery goes on" in err.so_far(), err.so_far)
    stop_service(process)
    logged = err.rest()
    assert "Traceback" not in logged, logged
    assert logged.count("webhook delivery waits for the") == 1, logged


def test_restarts_a_read_only_spell_is_said_once_while_health_is_polled(spawn, pg_url):
    """A read-only PostgreSQL, creates refused while a load balancer polls /health (a
    read, which the database answers): the log says once that the database takes no
    writes, not once for each create that follows a health check (issue 43's fifth
    item: one log line)."""
    process, host, port, err = serve_plantstore(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=pg_url)
    )
    statuses = []
    with read_only(pg_url):
        for plant_id in range(5):
            document = {"id": plant_id, "name": "p"}
            statuses.append(exchange(host, port, "POST", "/plants", document)[0])
            statuses.append(exchange(host, port, "GET", "/health")[0])
    stop_service(process)
    logged = err.rest()
    assert statuses[1:] == [200, 503] * 4 + [200], statuses
    assert logged.count("unavailable: cannot execute INSERT") == 1, logged


@contextlib.contextmanager
def read_only(pg_url):
    """PostgreSQL read-only while the block runs, as a demoted primary is
    (default_transaction_read_only on, reloaded: every session takes it at its next
    statement); then it takes writes again."""
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SET default_transaction_read_only = off")  # this session's own
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
        try:
            yield
        finally:
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            admin.execute("SELECT pg_reload_conf()")


def test_restarts_a_fork_never_waits_on_a_silent_postgres(
    spawn, receiver, postgres, pg_url
):
    """Issue 43's eighth item: under gunicorn --preload, whose master forks each worker
    from the app it built, PostgreSQL silent (every process of it stopped): a killed
    worker's replacement boots within 1 s, and once PostgreSQL is back and gunicorn has
    stopped cleanly, no event is left leased (a statement cut short at the database
    commits nothing)."""
    hook = receiver()
    hook.statuses = [500] * 1000  # events wait, none due for 5 s after their first try
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    process, host, port, err = start_gunicorn(spawn, env, 2, 4, "--preload")
    for plant_id in range(5):
        document = {"id": plant_id, "name": f"p{plant_id}"}
        assert post_over_http(host, port, TOKEN, document)[0] == 200
    wait_until(lambda: len(hook.arrivals) >= 5, "the first tries never came")
    workers = [pid for pid in processes_in_group(process.pid) if pid != process.pid]
    with frozen_postgres(postgres):
        # the master's sender, and the workers', each in a wait on the database
        time.sleep(plantstore_webhooks.WebhookSender.POLL_SECONDS + 0.2)
        killed = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        err.until(r"Booting worker")
        booted = time.monotonic() - killed
    assert booted < 1, err.so_far()
    stop_service(process)
    leased = read_database(
        pg_url, f"SELECT count(*) FROM plant_events WHERE lease > {time.time()}"
    )
    assert leased == [(0,)], err.rest()
    assert "Traceback" not in err.rest()


# ---- Separate hosts: network namespaces the test makes and removes ----
# As root, the way CI runs the tests.


@pytest.fixture
def hosts():
    """Hosts for this test, always removed with every process on them, even when the run
    is stopped with SIGTERM."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    made = Hosts()
    try:
        yield made
    finally:
        made.remove()
        signal.signal(signal.SIGTERM, previous)


class PostgresOnHost(Postgres):
    """The suite's PostgreSQL on a host of `hosts`, listening on its addresses there;
    with `standby_of` (a server and the address it is reached at from this host), that
    server's standby, cloned with pg_basebackup -R, streaming from it."""

    def __init__(self, hosts, host, addresses, *, standby_of=None):
        self.inside, self.listen, self.addresses = (
            hosts.inside(host),
            ",".join(addresses),
            addresses,
        )
        # its processes are gone
        hosts.cleanups.append(lambda: shutil.rmtree(self.folder, ignore_errors=True))
        if standby_of is None:
            super().__init__()
            # from the test network, by password
            with (self.folder / "data" / "pg_hba.conf").open("a") as hba:
                hba.write(
                    "host all all 10.213.0.0/16 scram-sha-256\n"
                    "host replication all 10.213.0.0/16 scram-sha-256\n"
                )
            with self.local() as db:
                db.execute("SELECT pg_reload_conf()")
        else:
            primary, address = standby_of
            self.durable, self.password, self.port = (
                False,
                primary.password,
                free_port(),
            )
            self.folder = Path(tempfile.mkdtemp(prefix="plantstore-pg-"))
            self.as_postgres = [*self.inside]
            if os.geteuid() == 0:
                shutil.chown(self.folder, "postgres")
                self.as_postgres += ["runuser", "-u", "postgres", "--"]
            self._pg(
                "pg_basebackup",
                "-h",
                address,
                "-p",
                primary.port,
                "-U",
                "plantstore",
                "-D",
                self.folder / "data",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                env={**os.environ, "PGPASSWORD": self.password},
            )
            self.start()

    def url_at(self, *servers, **query):
        """The URL of this database at one or several servers (each: address, port),
        with query parameters."""
        hosts = ",".join(f"{address}:{port}" for address, port in servers)
        return f"postgresql://plantstore:{self.password}@{hosts}/plantstore" + (
            f"?{urlencode(query)}" if query else ""
        )

    def make_synchronous(self):
        """Commit only once a standby has the commit too (on this server, not in what
        was cloned from it)."""
        with self.local() as db:
            db.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            db.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + WAIT
            while db.execute(
                "SELECT sync_state FROM pg_stat_replication"
            ).fetchall() != [("sync",)]:
                assert time.monotonic() < deadline, (
                    "the standby did not become synchronous"
                )
                time.sleep(0.05)

    def kill(self):
        """SIGKILL the postmaster and every backend at once, as when its host dies."""
        pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])
        # pg_ctl made the postmaster a process group's leader
        os.killpg(pid, signal.SIGKILL)

    def promote(self):
        self._pg("pg_ctl", "-D", self.folder / "data", "-w", "-t", WAIT, "promote")

    def ids(self):
        with self.local() as db:
            return [plant_id for (plant_id,) in db.execute("SELECT id FROM plants")]


class Clients:
    """Clients in threads, each sending requests one after another until stopped; every
    answer is kept.

    A creating client sends each plant once, with an id of its own: a retry would muddle
    what each answer says. A client told to also ask for `health` polls GET /health, and
    one told to `list`, GET /plants?limit=1. Every answer: what was asked, the plant's
    id, when it was sent and answered (time.monotonic()), its status (or the exception's
    name), headers and raw body, and whether the body came whole.
    """

    def __init__(self, address, port, creating=4, health=False, listing=False):
        self.address, self.port, self.answers, self._stop = (
            address,
            int(port),
            [],
            threading.Event(),
        )
        self._threads = [
            threading.Thread(target=self._create, args=(n,)) for n in range(creating)
        ]
        if health:
            self._threads.append(
                threading.Thread(target=self._poll, args=("health", "GET", "/health"))
            )
        if listing:
            self._threads.append(
                threading.Thread(
                    target=self._poll, args=("list", "GET", "/plants?limit=1")
                )
            )
        for thread in self._threads:
            thread.start()

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT * 2)
            assert not thread.is_alive(), "a client is still waiting for an answer"
        return self.answers

    def _create(self, n):
        for k in itertools.count():
            if self._stop.is_set():
                return
            plant_id = n * 1_000_000 + k
            self._ask(
                "create",
                plant_id,
                "POST",
                "/plants",
                json.dumps({"id": plant_id, "name": f"p{plant_id}"}),
            )

    def _poll(self, what, method, path):
        while not self._stop.wait(0.1):
            self._ask(what, None, method, path)

    def _ask(self, what, plant_id, method, path, body=None):
        connection = http.client.HTTPConnection(self.address, self.port, timeout=WAIT)
        sent, status, headers, data, whole = time.monotonic(), None, {}, b"", False
        try:
            connection.request(
                method, path, body, {"Content-Type": "application/json", **AUTH}
            )
            response = connection.getresponse()
            status, headers = response.status, dict(response.getheaders())
            data, whole = response.read(), True
        except (OSError, http.client.HTTPException) as error:
            # a status and a body cut short: whole is False
            status = status or type(error).__name__
        finally:
            connection.close()
        self.answers.append(
            SimpleNamespace(
                what=what,
                plant_id=plant_id,
                sent=sent,
                answered=time.monotonic(),
                status=status,
                headers=headers,
                body=data,
                whole=whole,
            )
        )
        if status != 200:
            # a real client would wait Retry-After seconds; the test keeps it short
            time.sleep(0.05)

    def first(self, what, status, sent_after):
        """The first answer with this status to a request sent after `sent_after`, or
        None."""
        return min(
            (
                a
                for a in list(self.answers)
                if a.what == what and a.status == status and a.sent >= sent_after
            ),
            key=lambda a: a.answered,
            default=None,
        )

    def wait_for(self, what, status, sent_after, seconds):
        """Wait until first(...) is there or `seconds` have passed since `sent_after`;
        return it or None."""
        while (
            found := self.first(what, status, sent_after)
        ) is None and time.monotonic() < sent_after + seconds:
            time.sleep(0.05)
        return found


def assert_503s_say_when_to_retry(answers):
    for answer in answers:
        if answer.status == 503:
            assert (
                int(answer.headers["Retry-After"]) > 0
                and answer.headers["Content-Type"] == "application/json"
            )
            assert json.loads(answer.body)["error"] == 503


def test_failover_to_a_promoted_standby_through_a_multi_host_url(hosts, spawn):
    """A primary and its synchronous standby on two hosts; gunicorn on a third, with a
    multi-host URL. The primary dies under load and the standby is promoted 2 s later:
    clients see 200 or 503 only, creates succeed again within 10 s of the promotion, and
    every create answered 200 is on the new primary."""
    app, db1, db2 = hosts.host("app"), hosts.host("db1"), hosts.host("db2")
    front, to_db1, to_db2, between = (
        hosts.link(None, app),
        hosts.link(app, db1),
        hosts.link(app, db2),
        hosts.link(db1, db2),
    )
    primary = PostgresOnHost(hosts, db1, [to_db1[db1][0], between[db1][0]])
    standby = PostgresOnHost(
        hosts,
        db2,
        [to_db2[db2][0], between[db2][0]],
        standby_of=(primary, between[db1][0]),
    )
    primary.make_synchronous()
    url = primary.url_at(
        (to_db1[db1][0], primary.port),
        (to_db2[db2][0], standby.port),
        target_session_attrs="read-write",
    )
    _, address, port, _ = start_gunicorn(
        spawn,
        environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=url),
        2,
        4,
        inside=hosts.inside(app),
        address=front[app][0],
    )
    clients = Clients(address, port)
    try:
        assert clients.wait_for("create", 200, time.monotonic(), WAIT), (
            "no create succeeded before the failover"
        )
        time.sleep(0.5)
        primary.kill()
        killed = time.monotonic()
        time.sleep(2)
        promoted = time.monotonic()
        standby.promote()
        again = clients.wait_for("create", 200, promoted, 10)
        time.sleep(0.5)
    finally:
        answers = clients.stop()
    creates = [a for a in answers if a.what == "create"]
    print(
        f"failover: {len(creates)} creates: {count_statuses(creates)}; longest wait "
        f"{max(a.answered - a.sent for a in creates):.2f} s; first 200 "
        f"{after(again, promoted)} after the promotion ({promoted - killed:.1f} s "
        f"after the kill)"
    )
    assert {a.status for a in creates} == {200, 503} and all(a.whole for a in creates)
    assert_503s_say_when_to_retry(creates)
    assert again and again.answered - promoted <= 10, (
        "creates did not succeed again within 10 s of the promotion"
    )
    acknowledged = {a.plant_id for a in creates if a.status == 200}
    # nothing answered 200 was lost with the old primary
    assert acknowledged <= set(standby.ids())


def test_partition_of_the_database_host_is_503_within_bounds_then_recovers(
    hosts, spawn
):
    """The database host's link goes down for 15 s under load (it falls silent: no
    reset, no error), three times a statement's bound of 5 s. Every request is answered
    within 10 s, 503 with Retry-After meanwhile; /health says 503 within 5 s of the cut
    and 200 within 10 s of the return; creates succeed again within 15 s of it; nothing
    answered 200 is lost."""
    app, db = hosts.host("app"), hosts.host("db")
    front, data = hosts.link(None, app), hosts.link(app, db)
    server = PostgresOnHost(hosts, db, [data[db][0]])
    url = server.url_at((data[db][0], server.port))
    _, address, port, _ = start_gunicorn(
        spawn,
        environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=url),
        2,
        4,
        inside=hosts.inside(app),
        address=front[app][0],
    )
    # 4 at once: never more than a worker's threads
    clients = Clients(address, port, creating=3, health=True)
    try:
        assert clients.wait_for("create", 200, time.monotonic(), WAIT), (
            "no create succeeded before the cut"
        )
        time.sleep(0.5)
        cut = time.monotonic()
        hosts.set_link(db, data[db][1], "down")
        try:
            time.sleep(15)
        finally:
            hosts.set_link(db, data[db][1], "up")
        back = time.monotonic()
        again = clients.wait_for("create", 200, back, 15)
        healthy = clients.wait_for("health", 200, back, 10)
        time.sleep(0.5)
    finally:
        answers = clients.stop()
    creates, polls = (
        [a for a in answers if a.what == "create"],
        [a for a in answers if a.what == "health"],
    )
    longest, unhealthy = (
        max(answers, key=lambda a: a.answered - a.sent),
        clients.first("health", 503, cut),
    )
    print(
        f"partition: {len(creates)} creates: {count_statuses(creates)}; {len(polls)} "
        f"/health: {count_statuses(polls)}; longest wait "
        f"{longest.answered - longest.sent:.2f} s; /health 503 {after(unhealthy, cut)} "
        f"after the cut, 200 {after(healthy, back)} after the return; first create 200 "
        f"{after(again, back)} after the return"
    )
    assert {a.status for a in answers} == {200, 503} and all(a.whole for a in answers)
    assert longest.answered - longest.sent <= 10, (
        f"a request waited {longest.answered - longest.sent:.1f} s"
    )
    assert_503s_say_when_to_retry(answers)
    assert again and again.answered - back <= 15, (
        "creates did not succeed again within 15 s of the link's return"
    )
    # nothing answered 200 is lost
    assert {a.plant_id for a in creates if a.status == 200} <= set(server.ids())
    for answer in polls:
        if answer.status == 200:
            assert json.loads(answer.body) == {"status": "ok"}
        else:  # an Error body that names no address, port or password
            assert not any(
                secret in answer.body.decode()
                for secret in (server.password, "10.213.", str(server.port))
            )
    assert healthy and healthy.answered - back <= 10, (
        "/health did not say 200 within 10 s of the link's return"
    )
    assert unhealthy and unhealthy.answered - cut <= 5, (
        "/health did not say 503 within 5 s of the cut"
    )


# python plantstore.py with psycopg imported first: once it has said the run's token
# (its port bound), nothing but its store takes time until it listens
STORE_TIMED = (
    "import psycopg, runpy; runpy.run_path('plantstore.py', run_name='__main__')"
)


def asked(resolver):
    """The names a resolver that never answers was asked: each query's question."""
    names = set()
    with contextlib.suppress(BlockingIOError):
        while query := resolver.recv(512, socket.MSG_DONTWAIT):
            labels, at = [], 12  # the name, label by label, past the header
            while query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode())
                at += 1 + query[at]
            names.add(".".join(labels))
    return names


@pytest.mark.parametrize("servers", ["two silent hosts", "a name no one resolves"])
def test_hosts_the_bounds_hold_with_every_host_silent_or_a_lookup_never_answered(
    hosts, spawn, servers
):
    """docs/failover.md's two-host URL with both hosts silent (libpq's connect_timeout
    is each host's), or a host name whose lookup no resolver answers (it comes before
    any bound of libpq's): the start waits CONNECT_SECONDS for the database at most,
    /health answers 503 within its 2 s, and a create within 5 s, its connect given up
    within 3 s; the embedded server looks no name up. 1.5.0 took 6 s and 4 s with the
    hosts, 10 s each with the lookup, and its server's start asked DNS for its own
    address's name. Timed by a client of an idle server, given 0.5 s for the way."""
    app = hosts.host("app")
    link, silent = hosts.link(None, app), hosts.silent(app)
    front = link[app][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as resolver:
        resolver.bind((link[None][0], 53))  # this end of the link, which never answers
        hosts.resolver(app, link[None][0])
        where = {
            "two silent hosts": f"{silent}:5432,{silent}:5433",
            "a name no one resolves": "db.test",
        }[servers]
        url = (
            f"postgresql://plantstore:pw@{where}/plants?target_session_attrs=read-write"
        )
        process = spawn(
            [*hosts.inside(app), sys.executable, "-c", STORE_TIMED]
            + ["--host", front, "--port", "0"],
            environ_without_tokens(PLANTSTORE_DB=url),
        )
        err = Lines(process.stderr)
        token = err.until(r"accepts one new token: (\S+)")[1]
        started = time.monotonic()
        port = err.until(r"listening on http://.+:(\d+)/")[1]
        start = time.monotonic() - started

        def timed(*request):
            sent = time.monotonic()
            status = exchange(front, port, *request, token=token)[0]
            return round(time.monotonic() - sent, 2), status

        health = timed("GET", "/health")  # a read: the writes' breaker stays shut
        create = timed("POST", "/plants", {"id": 1, "name": "Fern"})
        names = asked(resolver)
    said = f"start {start:.2f} s, /health {health}, create {create}, asked {names}"
    print(f"{servers}: {said}")
    assert start <= plantstore_sql.CONNECT_SECONDS + 0.5, said
    assert health[1] == 503 and health[0] <= plantstore_sql.HEALTH_WAIT_SECONDS + 0.5, (
        said
    )
    assert create[1] == 503 and create[0] <= plantstore_sql.CONNECT_SECONDS + 0.5, said
    # the database's name alone, as libpq was given it (the resolver may add domains)
    assert all(name.startswith("db.test") for name in names), said
    assert bool(names) == (servers == "a name no one resolves"), said


def test_connects_given_up_never_outnumber_the_pool_and_close_what_they_make(
    postgres, pg_url, monkeypatch
):
    """A host name whose lookup hangs: each connect is given up at its bound, the
    threads still making one are never more than POOL_SIZE however many requests come,
    and once the lookup answers, each closes what it made."""
    answer, lookups, real = threading.Event(), [], socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if host == "db.test":
            lookups.append(host)
            answer.wait(WAIT)
        return real("127.0.0.1" if host == "db.test" else host, *args, **kwargs)

    def health(_):
        try:
            store.ping()
        except HTTPError as error:
            return error.status
        return 200

    def connecting():
        return [t for t in threading.enumerate() if t.name == "plantstore-connect"]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    url = f"{pg_url.replace('@127.0.0.1:', '@db.test:')}?application_name=given-up"
    started = time.monotonic()
    try:
        store = PostgresStore(url)  # the database is away at start: it starts
        assert time.monotonic() - started <= plantstore_sql.CONNECT_SECONDS + 1
        # twice as many as the pool: each waits for a connection, or makes one
        assert in_threads(2 * store.POOL_SIZE, health) == [503] * 2 * store.POOL_SIZE
        assert len(connecting()) == store.POOL_SIZE and lookups
    finally:
        answer.set()
    wait_until(lambda: not connecting(), "a thread still makes a connection")
    with postgres.local() as db:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'given-up'"
        )
        wait_until(lambda: db.execute(query).fetchone() == (0,), "a connection is open")
    wait_until(lambda: health(0) == 200, "the store did not serve once looked up")
    store.close()


def count_statuses(answers):
    """'200 x 644, 503 x 45': how many answers had each status."""
    return ", ".join(
        f"{status} x {n}"
        for status, n in sorted(
            collections.Counter(a.status for a in answers).items(),
            key=lambda item: str(item[0]),
        )
    )


def after(answer, moment):
    """How long after `moment` the answer came, or 'never'."""
    return "never" if answer is None else f"{answer.answered - moment:.2f} s"


def unread(hosts, host, address):
    """The bytes waiting to be read on each connection to `address` (host:port) on
    `host`: requests sent to it."""
    port = address.rpartition(":")[2]
    listed = subprocess.run(
        [
            *hosts.inside(host),
            "ss",
            "-Htn",
            "state",
            "established",
            f"( sport = :{port} )",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=WAIT,
    ).stdout
    return [int(line.split()[0]) for line in listed.splitlines()]


def test_hosts_behind_nginx_one_dies_gets_keep_answering_and_no_post_is_sent_twice(
    hosts, spawn, tmp_path
):
    """Two app hosts on one PostgreSQL behind nginx with the shipped upstream recipe.
    One host hangs under load, then dies: GETs keep answering 200, creates answer 200 or
    nginx's 502 in JSON, and no POST reaches two hosts."""
    app1, app2, db = hosts.host("app1"), hosts.host("app2"), hosts.host("db")
    front1, front2, data1, data2 = (
        hosts.link(None, app1),
        hosts.link(None, app2),
        hosts.link(app1, db),
        hosts.link(app2, db),
    )
    server = PostgresOnHost(hosts, db, [data1[db][0], data2[db][0]])
    upstreams, gunicorns = [], []
    for app, front, data in ((app1, front1, data1), (app2, front2, data2)):
        env = environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB=server.url_at((data[db][0], server.port)),
        )
        process, address, port, _ = start_gunicorn(
            spawn, env, 2, 4, inside=hosts.inside(app), address=front[app][0]
        )
        upstreams.append(f"{address}:{port}")
        gunicorns.append(process)
    # What nginx sent where, for each request: the hosts it tried and the bytes each one
    # was sent. $request, as the client sent it: an error page makes $request_method GET
    # and $uri the page's.
    logged = (
        '    log_format upstreams \'"$request" $status '
        '"$upstream_addr" "$upstream_bytes_sent"\';\n'
        f"    access_log {tmp_path}/upstreams.log upstreams;\n"
    )
    port = start_nginx(spawn, tmp_path, upstreams, logged)
    clients = Clients("127.0.0.1", port, listing=True)
    try:
        assert clients.wait_for("create", 200, time.monotonic(), WAIT), (
            "no create succeeded through nginx"
        )
        time.sleep(0.5)
        # the host hangs: requests sent to it wait for an answer
        os.killpg(gunicorns[0].pid, signal.SIGSTOP)
        deadline = time.monotonic() + WAIT
        # a GET is 206 bytes
        while not any(waiting > 220 for waiting in unread(hosts, app1, upstreams[0])):
            assert time.monotonic() < deadline, "no POST reached the hung host"
            time.sleep(0.05)
        # then it dies, with a POST it was sent and never answered
        os.killpg(gunicorns[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        time.sleep(2)
    finally:
        answers = clients.stop()
    creates, gets = (
        [a for a in answers if a.what == "create"],
        [a for a in answers if a.what == "list"],
    )
    cut_short = [a for a in answers if not a.whole]
    print(
        f"hosts: {len(creates)} creates: {count_statuses(creates)}; {len(gets)} GETs: "
        f"{count_statuses(gets)}; {len(cut_short)} answers cut short"
    )
    deadline = time.monotonic() + WAIT
    while len(
        posts := [
            line
            for line in (tmp_path / "upstreams.log").read_text().splitlines()
            if line.startswith('"POST ')
        ]
    ) < len(creates):
        # it logs just after it answers
        assert time.monotonic() < deadline, "nginx did not log every POST"
        time.sleep(0.05)
    # a POST may go on to the next host only if the first got none of it
    for line in posts:
        sent_to = [int(n) for n in re.findall(r"\d+", line.split('"')[5])]
        assert sum(n > 0 for n in sent_to) <= 1, (
            f"a POST was sent to more than one host: {line}"
        )
    assert gets and {a.status for a in gets} == {200}
    # 502: a POST the dead host had taken
    assert {a.status for a in creates} == {200, 502}
    # A host that dies between the head of its answer and the body leaves that answer
    # cut short: nginx had passed the head on. It said 200, so the plant is stored
    # (asserted below); a client that retries gets 409.
    assert all(a.status == 200 for a in cut_short)
    for answer in creates:
        if answer.status == 502:
            assert answer.headers["Content-Type"] == "application/json"
            assert json.loads(answer.body) == {
                "error": 502,
                "message": "the service is not answering",
            }
    acknowledged = [a.plant_id for a in creates if a.status == 200]
    assert set(acknowledged) <= set(server.ids())
    assert clients.first("create", 200, killed + 0.5)  # the other host took over


def test_the_senders_claim_reads_a_few_rows_of_a_large_backlog(pg_url):
    """The claim that fixed SQLite's drain (issue 54: each claim sorted the receiver's
    whole backlog) takes the events due longest, next_at then seq. On PostgreSQL, where
    a granted role may add no index, it walks plant_events_due: each event is due from
    its birth, so ties are few and a claim of 4 reads about 4 rows of 20,000 waiting,
    not all of them (at next_at 0 for every new event, a sort of all: 31 ms at
    100,000)."""
    PostgresStore(pg_url).close()  # its tables and indexes, as it makes them
    event = plantstore_postgres._pyformat(plantstore_webhooks.WebhookSender.EVENT)
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("DROP INDEX plant_events_claims")  # as a granted role finds it
        with db.cursor() as cursor:  # written as the sender writes them
            cursor.executemany(
                event,
                [
                    {"url": "http://r/", "webhook_id": f"msg_{n}", "body": b"{}"}
                    for n in range(20_000)
                ],
            )
        db.execute("ANALYZE plant_events")
        claim = {"lease": 17, "url": "http://r/", "ahead": 0}
        with db.transaction(force_rollback=True):
            (((plan,),),) = [
                db.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) "
                    + plantstore_postgres._pyformat(
                        plantstore_webhooks.WebhookSender.CLAIM
                    ),
                    {**claim, "free": 4},
                ).fetchall()
            ]

    def rows_read(node):
        """Rows each scan of the plan gave, summed over the plan."""
        own = node["Actual Rows"] if "Scan" in node["Node Type"] else 0
        return own + sum(rows_read(child) for child in node.get("Plans", []))

    assert plan[0]["Plan"]["Actual Rows"] == 4
    assert rows_read(plan[0]["Plan"]) < 50, json.dumps(plan, indent=1)


# ---- The outbox's clock, PostgreSQL's own, and a role granted 1.5.0's tables ----


def test_clock_a_host_an_hour_ahead_leaves_no_event_nor_lease_for_another_to_wait_out(
    spawn, pg_url, receiver, tmp_path
):
    """Issue 57, item 7: two app hosts share PostgreSQL, one with its wall clock an
    hour ahead. The host ahead stores 8 plants, takes 4 of their events to a receiver
    that accepts and never answers, and is killed mid-attempt. The receiver comes back,
    and the other host delivers all 8: the 4 at once, and the 4 leased once their lease
    runs out, 17 s on. 1.5.0 wrote when each is due, and when a lease ends, by the
    writer's clock: the other host saw the events due, and the leases out, an hour
    later."""
    silent = socket.socket()  # takes connections, in its backlog, and answers none
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=f"http://127.0.0.1:{port}/plant/webhook",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    ahead = clock_shifted(tmp_path / "ahead", 3600)
    command = [sys.executable, "plantstore.py", "--port", "0"]
    host = spawn(command, {**env, "PYTHONPATH": f"{ahead}{os.pathsep}{HERE}"})
    address = Lines(host.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    for plant_id in range(8):
        document = {"id": plant_id, "name": "Fern"}
        assert post_over_http(*address, TOKEN, document)[0] == 200
    leased = "SELECT count(*) FROM plant_events WHERE lease > 0"
    wait_until(lambda: read_database(pg_url, leased) == [(4,)], "4 attempts began")
    os.killpg(host.pid, signal.SIGKILL)
    silent.close()
    hook = receiver(port)
    Lines(spawn(command, env).stderr).until("listening on")
    assert sorted(event["id"] for event in hook.wait_for(8)) == list(range(8))


def test_clock_a_host_an_hour_ahead_signs_with_postgresql_s_clock(
    spawn, pg_url, receiver, tmp_path
):
    """Issue 57, item 7: an app host whose wall clock is an hour ahead signs its
    webhooks with PostgreSQL's clock, as it dates its events: the receiver, which
    refuses a webhook-timestamp 5 min off its own clock (as Standard Webhooks
    libraries do), takes all 3 from that host. Signed by the host's own clock, none
    got through."""
    hook = receiver()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=pg_url,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
        PYTHONPATH=f"{clock_shifted(tmp_path / 'ahead', 3600)}{os.pathsep}{HERE}",
    )
    host = spawn([sys.executable, "plantstore.py", "--port", "0"], env)
    address = Lines(host.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    for plant_id in range(3):
        document = {"id": plant_id, "name": "Fern"}
        assert post_over_http(*address, TOKEN, document)[0] == 200
    assert sorted(event["id"] for event in hook.wait_for(3)) == [0, 1, 2]
    assert all(status == 200 for *_, status in hook.deliveries)


def test_outbox_two_starts_upgrading_1_5_0_s_at_once_count_each_event_once(
    pg_url, tmp_path
):
    """Issue 57, item 6: two processes start together on 1.5.0's outbox with 3 events
    waiting. Both find no counts; the second waits while the first adds them, then
    finds them made and counts nothing again: each receiver's events are counted
    once. After an advisory lock's wait, the second's cache of names (warm from its
    first DO block) still said no counts to to_regclass(), and it counted the events
    again: UniqueViolation, a 500 in 1 nemesis run of 10 and 1 start of 480 at once.
    A table lock's wait reads what other sessions committed."""
    made_by_1_5_0(tmp_path / "1.5.0", pg_url)
    left_by_1_5_0(pg_url, "http://r/", 3)
    first, second = (psycopg.connect(pg_url, autocommit=True) for _ in range(2))
    with first, second:
        for db in first, second:  # as each start asks, before it upgrades
            assert not db.execute(PostgresStore.COUNTED).fetchone()[0]
        begin = PostgresStore.COUNTS.index("BEGIN")
        for statement in PostgresStore.COUNTS[: begin + 2]:  # to its lock, held
            first.execute(statement)
        failed = []

        def start_second():
            try:
                for statement in PostgresStore.COUNTS:
                    second.execute(statement)
            except psycopg.Error as error:
                failed.append(error)

        started = threading.Thread(target=start_second)
        started.start()
        waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
        pid = second.info.backend_pid
        wait_until(
            lambda: first.execute(waiting, [pid]).fetchone() == ("Lock",),
            "the second start waits for the first's lock",
        )
        for statement in PostgresStore.COUNTS[begin + 2 :]:
            first.execute(statement)
        started.join()
    assert failed == []
    counted = "SELECT url, sum(waiting) FROM plant_event_counts GROUP BY url"
    assert read_database(pg_url, counted) == [("http://r/", 3)]


def test_outbox_a_role_granted_1_5_0_s_tables_claims_and_says_once_what_the_owner_runs(
    limited_role, tmp_path, receiver, caplog
):
    """Issue 57, item 6: tables made by their owner with 1.5.0, granted to a role as
    1.5.0's docs say. The role may add no index, table or trigger: the service starts
    all the same, claims and delivers as 1.5.0 did, and says once, in one line, the SQL
    that the owner runs; run as it is in psql, it gives the outbox its counts, which
    the service uses from its next start."""
    made_by_1_5_0(tmp_path / "1.5.0", limited_role["owner"])
    grant_the_tables(limited_role)
    hook = receiver()

    def served():
        return make_app(
            [TOKEN],
            store=PostgresStore(limited_role["url"]),
            webhook_urls=[hook.url],
            webhook_secret=SECRET,
        )

    with caplog.at_level("INFO", logger="plantstore"):
        first = served()
    said = [r.getMessage() for r in caplog.records if "psql" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert limited_role["password"] not in said[0]
    try:
        post(webtest.TestApp(first), {"id": 1, "name": "Fern"}, 200)
        assert [event["id"] for event in hook.wait_for(1)] == [1]
    finally:
        first.webhook_sender.close()
    owner = psycopg.conninfo.conninfo_to_dict(limited_role["owner"])
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER"}
    names |= {"password": "PGPASSWORD", "dbname": "PGDATABASE"}
    subprocess.run(  # the owner, with psql: every secret in its environment
        ["psql", "-v", "ON_ERROR_STOP=1", "-q"],
        input=said[0].partition("run once in psql: ")[2].partition("; then")[0],
        env={**os.environ, **{names[key]: owner[key] for key in names}},
        text=True,
        check=True,
        timeout=WAIT,
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="plantstore"):
        second = served()
    try:
        assert second.store.counting is None  # the counts, read
        assert not [r for r in caplog.records if "psql" in r.getMessage()]
        post(webtest.TestApp(second), {"id": 2, "name": "Fern"}, 200)

        def delivered():  # at least once: 1 twice if the first closed before it
            return {event["id"] for event in hook.delivered()}  # settled its 200

        wait_until(lambda: delivered() == {1, 2}, lambda: f"came: {delivered()}")

        def waiting():  # the counts: each delivered event's row deleted after its 200
            scraped = webtest.TestApp(second).get("/metrics", headers=AUTH, status=200)
            return read_metrics(scraped.text)["plantstore_webhook_events_waiting"]

        origin = hook.url.rpartition("/plant")[0]
        wait_until(lambda: waiting() == {origin: 0}, lambda: f"waiting: {waiting()}")
    finally:
        second.webhook_sender.close()
