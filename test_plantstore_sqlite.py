"""Tests for the SQL stores of plantstore.py ("The SQL stores: the SQL once, SQLite
here, PostgreSQL in plantstore_postgres.py"), on SQLite: its store across processes and
restarts, and on files that are not its database; a database away (read-only, deleted,
replaced, held by another process's transaction) answered 503 within the bounds and
recovered from without a restart (issue 38); group commit (issue 31); and
docs/operations.md's runbook for SQLite (a backup, a restore, events re-pointed). The
outage and group commit tests run on PostgreSQL too, beside SQLite, as the SQL is the
same; the PostgreSQL store's own tests are test_plantstore_postgres.py's."""

import concurrent.futures
import collections
import contextlib
import http.client
import http.server
import itertools
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import webtest

from plantstore_postgres import PostgresStore
from plantstore import MAX_BODY_BYTES
from plantstore_app import make_app
from plantstore_sqlite import SQLiteStore
from testbed import (
    AUTH,
    HERE,
    Creates,
    listed,
    Lines,
    OUTAGE_BACK_BOUND,
    OUTAGE_CREATE_BOUND,
    OUTAGE_HEALTH_BOUND,
    SECRET,
    SQLITE_LOCKER,
    TOKEN,
    WAIT,
    assert_unavailable,
    call,
    cluster_pids,
    environ_without_tokens,
    exchange,
    fill,
    free_port,
    in_threads,
    listed_ids,
    make_read_only,
    over_http,
    plantstore_1_4_0,
    post,
    post_over_http,
    read_database,
    serve_batches,
    serve_plantstore,
    start_gunicorn,
    stop_service,
    stored_plants,
    timed_exchange,
    tmpfs,
    wait_apps_built,
    wait_until,
)


# ---- The SQLite store across processes and restarts ----


def test_sqlite_store_finds_every_plant_after_a_restart(tmp_path):
    first = SQLiteStore(tmp_path / "plants.sqlite3")
    for i in range(20):
        first.add(i, f"p{i}", "t" if i % 2 else None)
    first.delete(3)
    again = SQLiteStore(tmp_path / "plants.sqlite3")
    assert listed(again) == [
        (f"p{i}", "t" if i % 2 else None) for i in range(20) if i != 3
    ]
    assert again.add(0, "dup", None) is False


WRITER = """
import sys, threading
from plantstore_sqlite import SQLiteStore
store, results = SQLiteStore(sys.argv[1]), []
def write(n):
    name = f"writer {sys.argv[2]}"
    for plant_id in range(40):
        results.append(store.add((plant_id * 7 + n) % 40, name, None))
threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(results.count(True))
"""


def test_sqlite_store_catches_duplicates_across_processes(tmp_path, spawn):
    path = str(tmp_path / "plants.sqlite3")
    SQLiteStore(path)
    writers = [
        spawn([sys.executable, "-c", WRITER, path, str(n)], environ_without_tokens())
        for n in range(4)
    ]
    created = []
    for writer in writers:
        assert writer.wait(WAIT * 2) == 0, writer.stderr.read()
        created.append(int(writer.stdout.read()))
    # 4 processes x 4 threads tried every id: each was created once
    assert sum(created) == 40
    assert len(listed(SQLiteStore(path))) == 40


OPENER = """
import sys, time
from plantstore_sqlite import SQLiteStore
start = float(sys.argv[1])
for n, path in enumerate(sys.argv[2:]):
    # every opener on the same file at the same moment
    time.sleep(max(0.0, start + 0.03 * n - time.time()))
    SQLiteStore(path)
"""


def test_sqlite_store_opens_while_other_processes_make_the_same_new_file(
    tmp_path, spawn
):
    """gunicorn's workers boot together: each must start on a database file that is
    being made."""
    paths = [str(tmp_path / f"new{n}.sqlite3") for n in range(20)]
    start = time.time() + 0.5  # once every opener has imported plantstore
    openers = [
        spawn(
            [sys.executable, "-c", OPENER, str(start), *paths], environ_without_tokens()
        )
        for _ in range(4)
    ]
    for opener in openers:
        assert opener.wait(WAIT * 2) == 0, opener.stderr.read()


@pytest.mark.parametrize(
    "content", [b"this is not a database" * 100, b""], ids=["garbage", "empty-file-ok"]
)
def test_sqlite_store_refuses_a_file_that_is_not_its_database(tmp_path, content):
    path = tmp_path / "plants.sqlite3"
    path.write_bytes(content)
    if content:
        with pytest.raises(
            ValueError, match="cannot be opened as a plantstore database"
        ):
            SQLiteStore(path)
    else:
        assert listed(SQLiteStore(path)) == []


def test_sqlite_store_refuses_a_foreign_plants_table(tmp_path):
    path = tmp_path / "plants.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE plants (name TEXT)")
    with pytest.raises(ValueError, match="did not make"):
        SQLiteStore(path)


def test_python_plantstore_py_refuses_a_bad_database_in_one_line(spawn, tmp_path):
    (tmp_path / "bad.db").write_bytes(b"garbage" * 100)
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(tmp_path / "bad.db")
        ),
    )
    assert process.wait(WAIT) == 2
    err = process.stderr.read()
    assert "cannot be opened as a plantstore database" in err and "Traceback" not in err


def test_kill_9_loses_no_answered_plant(spawn, tmp_path):
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(tmp_path / "plants.sqlite3")
    )

    def serve():
        process = spawn([sys.executable, "plantstore.py", "--port", "0"], env)
        return process, Lines(process.stderr).until(
            r"listening on http://([\d.]+):(\d+)/plants"
        ).groups()

    process, (host, port) = serve()
    for i in range(30):
        assert post_over_http(host, port, TOKEN, {"id": i, "name": f"p{i}"})[0] == 200
    os.killpg(process.pid, signal.SIGKILL)  # the moment after the last 200
    process.wait(WAIT)
    _, (host, port) = serve()
    assert over_http(host, port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": f"p{i}"} for i in range(30)],
    )


def test_gunicorn_with_three_workers_and_sqlite(spawn, tmp_path):
    """20 ids each raced by 16 requests across 3 worker processes: 20 created, 300
    conflicts, all kept."""
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(tmp_path / "plants.sqlite3")
    )

    def serve():
        process = spawn(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-w",
                "3",
                "--threads",
                "4",
                "-b",
                "127.0.0.1:0",
                "plantstore:app",
            ],
            env,
        )
        err = Lines(process.stderr)
        address = err.until(r"Listening at: http://([\d.]+):(\d+)").groups()
        for _ in range(3):
            err.until(r"Booting worker")
        return process, address

    process, (host, port) = serve()
    attempts = [(plant_id, n) for n in range(16) for plant_id in range(20)]
    statuses = in_threads(
        len(attempts),
        lambda k: post_over_http(
            host,
            port,
            TOKEN,
            {
                "id": attempts[k][0],
                "name": f"id {attempts[k][0]} by racer {attempts[k][1]}",
            },
        )[0],
    )
    assert sorted(statuses) == [200] * 20 + [409] * 300
    # one after another, each on whichever worker takes it
    for plant_id in range(100, 110):
        assert (
            post_over_http(
                host, port, TOKEN, {"id": plant_id, "name": f"id {plant_id} in order"}
            )[0]
            == 200
        )
    status, listed = over_http(host, port, TOKEN, "GET", "/plants")
    assert status == 200 and [int(p["name"].split()[1]) for p in listed[20:]] == list(
        range(100, 110)
    )
    assert sorted(int(p["name"].split()[1]) for p in listed[:20]) == list(range(20))
    # a restart, then kill -9 of the master and workers at once
    for stop in (signal.SIGTERM, signal.SIGKILL):
        os.killpg(process.pid, stop)
        process.wait(WAIT)
        process, (host, port) = serve()
        assert over_http(host, port, TOKEN, "GET", "/plants") == (200, listed)


# ---- SQL stores: a database away is a 503, and the service recovers by itself ----


def test_sqlite_recovers_from_a_read_only_spell_without_a_restart(tmp_path):
    path = tmp_path / "plants.sqlite3"
    app = webtest.TestApp(make_app([TOKEN], store=SQLiteStore(path)))
    # a gunicorn thread: it keeps its connection
    one_thread = concurrent.futures.ThreadPoolExecutor(1)
    try:
        make_read_only(path, True)
        try:  # this thread's first connection is made now, read-only
            assert_unavailable(
                one_thread.submit(post, app, {"id": 1, "name": "Fern"}, 503).result()
            )
        finally:
            make_read_only(path, False)
        # the same thread, writable again
        one_thread.submit(post, app, {"id": 1, "name": "Fern"}, 200).result()
    finally:
        one_thread.shutdown()
    assert listed(SQLiteStore(path)) == [("Fern", None)]


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_sqlite_acknowledges_nothing_into_a_file_deleted_or_replaced(tmp_path, change):
    path = tmp_path / "plants.sqlite3"
    app = webtest.TestApp(make_app([TOKEN], store=SQLiteStore(path)))
    post(app, {"id": 1, "name": "Fern"}, 200)
    if change == "deleted":
        os.remove(path)
    else:  # a copy put in its place, as a careless restore from a backup would
        sqlite3.connect(tmp_path / "other.sqlite3").close()
        os.replace(tmp_path / "other.sqlite3", path)
    # This thread's connection still has the old file open: what it writes there, no one
    # would read.
    assert_unavailable(post(app, {"id": 2, "name": "lost?"}, 503))
    # and new connections find no file: they do not make one anew
    if change == "deleted":
        statuses = in_threads(
            8, lambda n: post(app, {"id": 10 + n, "name": "lost?"}, 503).status_int
        )
        assert statuses == [503] * 8 and not path.exists()
        assert_unavailable(
            app.get("/plants", headers=AUTH, status=503, expect_errors=True)
        )


def test_a_line_a_request_causes_names_its_request_id(tmp_path, caplog):
    """The outage a create finds, and its end that a later create finds, are each
    logged once, naming the request that found it: its X-Request-ID, the client's own
    or the one made for it."""
    path = tmp_path / "plants.sqlite3"
    app = webtest.TestApp(make_app([TOKEN], store=SQLiteStore(path)))
    make_read_only(path, True)
    try:
        refused = post(app, {"id": 1, "name": "Fern"}, 503)
    finally:
        make_read_only(path, False)
    headers = {**AUTH, "X-Request-ID": "client-id-7"}
    post(app, {"id": 1, "name": "Fern"}, 200, headers=headers)
    said = [m for m in caplog.messages if "unavailable" in m or "reachable" in m]
    made = refused.headers["X-Request-ID"]
    assert len(said) == 2 and said[0].endswith(f" (request {made})"), said
    assert said[1] == f"the SQLite file {path} is reachable again (request client-id-7)"


def test_a_1_4_0_sqlite_file_is_upgraded_in_place_and_1_4_0_still_serves_it(
    spawn, tmp_path, receiver
):
    """A file made by 1.4.0, its own code, events waiting for a receiver that is
    down: this release adds the index its sender claims through (plant_events_claims)
    at start, serves every plant, and delivers every event once the receiver is up;
    1.4.0 then serves the upgraded file again (a rollback)."""
    old = plantstore_1_4_0(tmp_path / "1.4.0")
    path, down = tmp_path / "plants.sqlite3", free_port()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=str(path),
        PLANTSTORE_WEBHOOK_URL=f"http://127.0.0.1:{down}/plant/webhook",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )

    def serve(script):
        process = spawn([sys.executable, str(script), "--port", "0"], env)
        err = Lines(process.stderr)
        return process, *err.until(r"listening on http://([\d.]+):(\d+)/").groups()

    process, host, port = serve(old)
    for plant_id in 1, 2, 3:
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http(host, port, TOKEN, document)[0] == 200
    stop_service(process)
    index = "SELECT count(*) FROM sqlite_master WHERE name = 'plant_events_claims'"
    assert read_database(str(path), index) == [(0,)]

    process, host, port = serve(HERE / "plantstore.py")
    assert read_database(str(path), index) == [(1,)]
    assert listed_ids(host, port) == [1, 2, 3]
    assert post_over_http(host, port, TOKEN, {"id": 4, "name": "plant 4"})[0] == 200
    hook = receiver(down)
    assert sorted(event["id"] for event in hook.wait_for(4)) == [1, 2, 3, 4]
    stop_service(process)

    process, host, port = serve(old)  # rolled back: 1.4.0 serves the file as it is
    assert listed_ids(host, port) == [1, 2, 3, 4]
    assert post_over_http(host, port, TOKEN, {"id": 5, "name": "plant 5"})[0] == 200
    assert hook.wait_for(5)[-1]["id"] == 5
    stop_service(process)


def test_sqlite_full_at_start_is_waited_for_as_an_outage(spawn, tmp_path):
    """What the nemesis found (issue 54), its disk-full and restart-server together:
    gunicorn started while the SQLite file's filesystem is full, with no -wal nor -shm
    beside the file (the last connection to close removes them). Each worker must wait
    for room, as a PostgreSQL away at start is waited for: 503 while it is full, 200
    once it is freed, gunicorn serving throughout. In 1.4.0 each worker stopped at
    "cannot be opened as a plantstore database: disk I/O error" (SQLite cannot make its
    -shm), and gunicorn exited 4 or 1, statuses the unit does not restart: the service
    stayed down once the disk had room again."""
    with tmpfs(tmp_path / "db") as folder:
        db = folder / "plants.sqlite3"
        env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(db))
        process, host, port, _ = start_gunicorn(spawn, env, 2, 4)
        assert post_over_http(host, port, TOKEN, {"id": 1, "name": "plant 1"})[0] == 200
        stop_service(process)
        # the last connection to close checkpoints the WAL and removes -wal and -shm:
        # as after an idle stop, or the operator's sqlite3 (a backup, a look)
        with contextlib.closing(sqlite3.connect(db)) as last:
            last.execute("SELECT count(*) FROM plants").fetchall()  # opens the WAL
        assert sorted(path.name for path in folder.iterdir()) == [
            "plants.sqlite3",
            "plants.sqlite3-writers",
            "plants.sqlite3-writers-bell",
        ]
        fill(folder)
        process, host, port, err = start_gunicorn(spawn, env, 2, 4)
        wait_apps_built(err, 2)  # the line each worker says once it has built the app
        document = {"id": 2, "name": "plant 2"}
        assert post_over_http(host, port, TOKEN, document)[0] == 503
        (folder / "filler").unlink()
        wait_until(
            lambda: post_over_http(host, port, TOKEN, document)[0] == 200,
            "no create succeeded once the disk had room",
            seconds=10,
        )
        assert process.poll() is None, err.so_far()
        stop_service(process)


def test_sqlite_names_a_missing_directory(tmp_path):
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(tmp_path / 'nowhere'))}: no such directory"
    ):
        SQLiteStore(tmp_path / "nowhere" / "plants.sqlite3")


def test_sqlite_names_a_directory_it_cannot_write(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    make_read_only(folder, True)
    try:
        with pytest.raises(
            ValueError,
            match=(
                f"^{re.escape(str(folder))}: this user cannot write in this directory"
            ),
        ):
            SQLiteStore(folder / "plants.sqlite3")
    finally:
        make_read_only(folder, False)


# ---- The database away: every bound holds when clients outnumber threads (issue 38)

# The bounds are testbed.py's OUTAGE_*_BOUND, counted as a client counts them, from
# sending a request to its whole answer: a request may also wait for a thread, which
# answering 503 at once keeps short.
OUTAGE_CLIENTS = 32  # creates sent at once to each server: 4 per thread of -w 2 -t 4
OUTAGE_HEALTH_AT = 6  # seconds into the outage, a GET /health
SQLITE_LOCK_SECONDS = 15  # a migration's exclusive transaction, as issue 38 has it


def serve_for_an_outage(spawn, server, db, first_id):
    """gunicorn -w 2 --threads 4, or python plantstore.py, on db, once each of its
    processes has built the app, and 16 creates have been answered 200; return
    ((host, port), its stderr lines)."""
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=db)
    if server == "gunicorn":
        _, host, port, err = start_gunicorn(spawn, env, 2, 4)
    else:
        err = Lines(spawn([sys.executable, "plantstore.py", "--port", "0"], env).stderr)
        host, port = err.until(r"listening on http://([\d.]+):(\d+)/").groups()
    # no worker is still starting when the clients come: each takes its share
    while sum("plants in" in line for line in err.seen) < (server == "gunicorn") + 1:
        err.until("plants in")
    warm = in_threads(
        16,
        lambda n: exchange(
            host, port, "POST", "/plants", {"id": first_id + n, "name": "warm"}
        )[0],
    )
    assert warm == [200] * 16
    return (host, port), err


def first_200_after(address, back, first_id):
    """Send creates one after another from `back` on until one answers 200, or the
    bound has passed; return when that was, in seconds after `back`."""
    for plant_id in itertools.count(first_id):
        status = timed_exchange(
            address, "POST", "/plants", {"id": plant_id, "name": "back"}
        )[1]
        if status == 200 or time.monotonic() - back > OUTAGE_BACK_BOUND:
            return time.monotonic() - back
        time.sleep(0.05)


def make_the_database_away(database, postgres, files, stopped, lockers):
    """PostgreSQL: every process of the cluster stopped, listed in `stopped` (SIGCONT
    them). SQLite: each file held by a process of its own that ends its transaction by
    itself after SQLITE_LOCK_SECONDS, listed in `lockers`."""
    if database == "postgres":
        postmaster, *_ = cluster_pids(postgres)
        os.kill(postmaster, signal.SIGSTOP)  # first: stopped, it starts no process
        stopped.append(postmaster)
        for pid in cluster_pids(postgres)[1:]:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        return
    for path in files:
        lockers.append(
            subprocess.Popen(
                [sys.executable, "-c", SQLITE_LOCKER, path, str(SQLITE_LOCK_SECONDS)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for locker in lockers:
        assert locker.stdout.readline() == "locked\n"


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_outage_32_clients_on_8_threads_are_each_answered_within_the_bounds(
    database, spawn, tmp_path, request
):
    """PostgreSQL silent (every process stopped), or each SQLite file held for 15 s by
    another process's exclusive transaction, while 32 clients each send one create to
    gunicorn -w 2 --threads 4, and 32 others to the embedded server: each create is
    answered within 7 s of being sent, 503 with Retry-After and the Error body (or
    200); a /health sent 6 s in, within 2.5 s (503; SQLite's reads go on, so 200 or
    503); once the database is back, a create answers 200 within 3 s; no server prints
    a traceback; every create answered 200 is in the table, and on SQLite none answered
    503 is. The two servers share one outage, each on its own connections and clients,
    which keeps the suite's time."""
    servers = ["gunicorn", "embedded"]
    postgres = files = None
    if database == "postgres":
        postgres = request.getfixturevalue("postgres")
        dbs = [request.getfixturevalue("pg_url")] * 2  # one table, ids apart
    else:
        files = dbs = [str(tmp_path / f"{server}.sqlite3") for server in servers]
    bases = [100_000, 200_000]  # each server's ids: warm, burst at +1000, back at +2000
    served = [
        serve_for_an_outage(spawn, server, db, base)
        for server, db, base in zip(servers, dbs, bases, strict=True)
    ]
    addresses = [address for address, _ in served]
    go, stopped, lockers = threading.Event(), [], []
    # a thread for each client, and one for each server's creates once it is back
    pool = concurrent.futures.ThreadPoolExecutor(2 * (OUTAGE_CLIENTS + 2))

    def create(address, plant_id):
        go.wait(WAIT)
        return timed_exchange(
            address, "POST", "/plants", {"id": plant_id, "name": f"p{plant_id}"}
        )

    def health(address, at):
        time.sleep(max(0, at - time.monotonic()))
        return timed_exchange(address, "GET", "/health")

    try:
        make_the_database_away(database, postgres, files, stopped, lockers)
        away = time.monotonic()
        creates = [
            {
                plant_id: pool.submit(create, address, plant_id)
                for plant_id in range(base + 1000, base + 1000 + OUTAGE_CLIENTS)
            }
            for address, base in zip(addresses, bases, strict=True)
        ]
        checks = [
            pool.submit(health, address, away + OUTAGE_HEALTH_AT)
            for address in addresses
        ]
        go.set()
        if stopped:  # until every answer is in, or a bound was missed already
            until = away + OUTAGE_HEALTH_AT + OUTAGE_HEALTH_BOUND
            concurrent.futures.wait(
                [*checks, *(f for each in creates for f in each.values())],
                timeout=until - time.monotonic(),
            )
        for locker in lockers:  # it ends its transaction by itself
            locker.wait(SQLITE_LOCK_SECONDS + WAIT)
    finally:
        go.set()  # no client is left waiting to start
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for locker in lockers:
            locker.kill()
            locker.wait()
            locker.stdout.close()
        back = time.monotonic()
        returns = [
            pool.submit(first_200_after, address, back, base + 2000)
            for address, base in zip(addresses, bases, strict=True)
        ]
        pool.shutdown()
    for process in spawn.processes:  # stopped, so that their logs are whole
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(WAIT)
    plants = stored_plants(dbs[0]) if database == "postgres" else None
    missed = []  # every bound missed, by either server: one failure says them all
    for server, db, (_, err), answers, check, returned in zip(
        servers, dbs, served, creates, checks, returns, strict=True
    ):
        answers = {plant_id: future.result() for plant_id, future in answers.items()}
        said, stored = err.rest(), plants or stored_plants(db)
        statuses = collections.Counter(status for _, status, *_ in answers.values())
        late = sorted(s for s, *_ in answers.values() if s >= OUTAGE_CREATE_BOUND)
        seconds, status, headers, body = check.result()
        missed += [
            f"{server} on {database}: {what}"
            for what, held in [
                (
                    f"statuses {dict(statuses)}, each a whole HTTP answer",
                    set(statuses) <= {200, 503},
                ),
                (
                    "each 503 with Retry-After and the Error body",
                    all(
                        int(h["Retry-After"]) > 0 and b["error"] == 503
                        for _, s, h, b in answers.values()
                        if s == 503
                    ),
                ),
                (
                    f"{len(late)} creates answered {OUTAGE_CREATE_BOUND} s or more "
                    "after they were sent: " + " ".join(f"{s:.2f}" for s in late),
                    not late,
                ),
                (
                    f"/health sent {OUTAGE_HEALTH_AT} s in answered {status} after "
                    f"{seconds:.2f} s",
                    seconds < OUTAGE_HEALTH_BOUND
                    and status in ((503,) if database == "postgres" else (200, 503)),
                ),
                (
                    "/health's 503 with Retry-After and the Error body",
                    status != 503
                    or int(headers["Retry-After"]) > 0
                    and body["error"] == 503,
                ),
                (
                    f"a create answered 200 {returned.result():.2f} s after the "
                    "database's return",
                    returned.result() < OUTAGE_BACK_BOUND,
                ),
                ("a traceback printed:\n" + said, "Traceback" not in said),
                (
                    "a create answered 200 is missing from the table",
                    all(i in stored for i, (_, s, *_) in answers.items() if s == 200),
                ),
                # refused before anything is written: a 503 leaves nothing behind.
                # PostgreSQL may yet commit a create answered 503 whose statement
                # reached the stopped server before its bound cut the connection: its
                # outcome is unknown (README), and a retry answers 409.
                (
                    "a create answered 503 is in the table",
                    database == "postgres"
                    or not any(
                        i in stored for i, (_, s, *_) in answers.items() if s == 503
                    ),
                ),
            ]
            if not held
        ]
    assert not missed, "\n".join(missed)


# ---- Group commit: the creates waiting at one moment share one commit (issue 31) ----


def batch_database(database, tmp_path, request):
    """Where the plants go: an SQLite file of this test, or the suite's PostgreSQL,
    emptied."""
    return (
        str(tmp_path / "plants.sqlite3")
        if database == "sqlite"
        else request.getfixturevalue("pg_url")
    )


def queued_behind_a_held_batch(store, application, bodies):
    """POST a first create, and hold its batch until each of `bodies` is queued behind
    it, one after another (so their order of arrival is known); return the batches
    written, as lists of ids, and each answer by its place in `bodies` ("held" for the
    first)."""
    batches, release, insert = [], threading.Event(), store.insert

    def held_insert(run, plants):
        batches.append([plant_id for plant_id, _, _ in plants])
        if len(batches) == 1:
            release.wait(WAIT)
        return insert(run, plants)

    store.insert = held_insert
    answers = {}

    def send(k, body):
        answers[k] = call(application, body=json.dumps(body).encode())[0]

    threads = [
        threading.Thread(target=send, args=("held", {"id": 0, "name": "create held"}))
    ]
    threads[0].start()
    try:
        deadline = time.monotonic() + WAIT
        for k, body in enumerate([*bodies, None]):
            # the one before is queued
            while not (batches if k == 0 else len(store._state().queue) == k):
                assert time.monotonic() < deadline, "the creates did not queue"
                time.sleep(0.005)
            if body is not None:
                threads.append(threading.Thread(target=send, args=(k, body)))
                threads[-1].start()
    finally:
        release.set()
        for thread in threads:
            thread.join(WAIT)
    return batches, answers


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_group_commit_a_batch_keeps_arrival_order_and_the_first_of_an_id_wins(
    database, tmp_path, request, webhook_app, receiver
):
    """Creates queued behind a commit under way go in the next batch, together: each
    answered for itself, a repeated id to the first that came, rows and their webhook
    events in the order the creates came."""
    hook = receiver()
    hook.stop()  # the events stay in plant_events, where the test reads them
    db = batch_database(database, tmp_path, request)
    store = SQLiteStore(db) if database == "sqlite" else PostgresStore(db)
    application = webhook_app(store, hook.url).app
    # 0 is the held create's; 1, 2 and 4 come twice in the next batch
    ids = [0, 1, 2, 1, 3, 0, 2, 4, 4, 5]
    # tags and NULLs in one batch; a NUL, a lone surrogate, a 4-byte UTF-8
    plants = [
        (
            f"create {k}" + (" \x00 \ud800 \U0001f33f" if k % 3 == 0 else ""),
            "indoor" if k % 2 else None,
        )
        for k in range(len(ids))
    ]
    bodies = [
        {"id": plant_id, "name": name, **({"tag": tag} if tag else {})}
        for plant_id, (name, tag) in zip(ids, plants, strict=True)
    ]
    batches, answers = queued_behind_a_held_batch(store, application, bodies)
    assert batches == [[0], ids]
    winners = [k for k, plant_id in enumerate(ids) if plant_id not in [0, *ids[:k]]]
    assert answers == {
        "held": 200,
        **{k: 200 if k in winners else 409 for k in range(len(ids))},
    }
    assert listed(store) == [("create held", None)] + [plants[k] for k in winners]
    events = [
        json.loads(bytes(body))
        for (body,) in store.one_statement("SELECT body FROM plant_events ORDER BY seq")
    ]
    assert events == [{"id": 0, "name": "create held"}] + [bodies[k] for k in winners]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
@pytest.mark.parametrize("bound", ["creates", "bytes"])
def test_group_commit_a_long_queue_is_written_in_bounded_batches_in_arrival_order(
    database, bound, tmp_path, request
):
    """More creates queued than one batch takes: batches of at most BATCH creates, or of
    BATCH_BYTES of names and tags (a lone create larger than that is a batch of its
    own), oldest first."""
    db = batch_database(database, tmp_path, request)
    store = SQLiteStore(db) if database == "sqlite" else PostgresStore(db)
    if bound == "creates":
        # 30 ids come twice
        bodies = [{"id": 1 + k % 70, "name": f"create {k}"} for k in range(100)]
    else:
        bodies = [
            {
                "id": 1 + k,
                "name": f"create {k} ".ljust(MAX_BODY_BYTES - 100, "x"),
                "tag": "t",
            }
            for k in range(24)
        ]
    batches, answers = queued_behind_a_held_batch(
        store, make_app([TOKEN], store=store), bodies
    )
    assert (
        batches[0] == [0]
        and sum(batches[1:], []) == [body["id"] for body in bodies]
        and len(batches) > 2
    )
    sizes = {
        body["id"]: len(body["name"]) + len(body.get("tag", "")) for body in bodies
    }
    for batch in batches[1:]:
        assert (
            len(batch) <= store.BATCH
            and sum(sizes[plant_id] for plant_id in batch) <= store.BATCH_BYTES
        )
    if bound == "creates":
        assert [len(batch) for batch in batches] == [
            1,
            store.BATCH,
            len(bodies) - store.BATCH,
        ]
    winners = [
        k
        for k, body in enumerate(bodies)
        if body["id"] not in [b["id"] for b in bodies[:k]]
    ]
    assert answers == {
        "held": 200,
        **{k: 200 if k in winners else 409 for k in range(len(bodies))},
    }
    assert [name for name, _ in listed(store)] == ["create held"] + [
        bodies[k]["name"] for k in winners
    ]


SERVED = [
    pytest.param("sqlite", "gunicorn", id="sqlite-gunicorn"),
    pytest.param("postgres", "granian", id="postgres-granian"),
]
KILLED = [
    pytest.param("sqlite", "granian", id="sqlite-granian"),
    pytest.param("postgres", "gunicorn", id="postgres-gunicorn"),
]


@pytest.mark.parametrize("database, server", SERVED)
def test_group_commit_a_burst_with_repeated_ids_stores_exactly_the_creates_answered_200(
    spawn, tmp_path, request, database, server
):
    """16 clients, 320 creates of 128 ids, each id raced at about the same moment (in
    one batch) and again later (across batches): one 200 per id, 409 for the rest, and
    the plants listed are the ones answered 200, each client's in the order it sent
    them."""
    db = batch_database(database, tmp_path, request)
    _, address = serve_batches(spawn, server, database, db)
    chooser = random.Random(31)
    # round k: mostly 8 new ids for 16 clients, some older ones
    plans = [
        [
            chooser.randrange(6 * k, 6 * k + 8)
            if chooser.random() < 0.8
            else chooser.randrange(6 * k + 8)
            for k in range(20)
        ]
        for _ in range(16)
    ]

    def client(n):
        return [
            post_over_http(
                *address, TOKEN, {"id": plant_id, "name": f"client {n} create {k}"}
            )[0]
            for k, plant_id in enumerate(plans[n])
        ]

    statuses = in_threads(16, client)
    sent = [
        (plans[n][k], f"client {n} create {k}", statuses[n][k])
        for n in range(16)
        for k in range(20)
    ]
    assert {status for _, _, status in sent} == {200, 409}
    won = {}
    for plant_id, name, status in sent:
        if status == 200:
            assert plant_id not in won, f"id {plant_id} answered 200 twice"
            won[plant_id] = name
    assert set(won) == {plant_id for plant_id, _, _ in sent}  # each id created once
    status, listed = over_http(*address, TOKEN, "GET", "/plants")
    names = [plant["name"] for plant in listed]
    # those, and nothing else
    assert status == 200 and sorted(names) == sorted(won.values())
    assert stored_plants(db) == won
    for n in range(16):
        assert [name for name in names if name.startswith(f"client {n} ")] == [
            name
            for _, name, status in sent
            if status == 200 and name.startswith(f"client {n} ")
        ]
    # rows written in one transaction share its xmin: batches were formed
    if database == "postgres":
        assert read_database(
            db, "SELECT count(*) FROM plants GROUP BY xmin::text HAVING count(*) > 1"
        ), "every create was committed alone: this test saw no batch"


@pytest.mark.parametrize("database, server", KILLED)
def test_group_commit_kill_9_mid_burst_loses_no_plant_answered_200_nor_its_event(
    spawn, tmp_path, request, receiver, database, server
):
    """kill -9 of every server process while 16 clients create, the webhook receiver
    down: each plant answered 200 is in the database afterwards, with its event in
    plant_events; no event without its plant."""
    hook = receiver()
    hook.stop()
    db = batch_database(database, tmp_path, request)
    process, address = serve_batches(
        spawn,
        server,
        database,
        db,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    answered, other, killed = [], [], threading.Event()

    def client(n):
        for k in range(400):  # clients n and n + 8 race on the same ids
            plant_id, name = (n % 8) * 1000 + k, f"client {n} create {k}"
            try:
                status, _ = post_over_http(
                    *address, TOKEN, {"id": plant_id, "name": name}
                )
            except (OSError, http.client.HTTPException) as error:
                # refused, reset or cut off by the kill
                if not killed.is_set():
                    other.append(repr(error))
                return
            if status == 200:
                answered.append((plant_id, name))
            elif status != 409:
                other.append(status)

    clients = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in clients:
        thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while len(answered) < 150:  # mid-burst
            assert time.monotonic() < deadline and all(
                map(threading.Thread.is_alive, clients)
            ), len(answered)
            time.sleep(0.01)
    finally:
        killed.set()
        # the server and all its workers, at once
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(WAIT)
        for thread in clients:
            thread.join(WAIT)
    assert other == []  # before the kill, 200 or 409 alone
    plants = stored_plants(db)
    assert all(plants.get(plant_id) == name for plant_id, name in answered), (
        "a plant answered 200 is lost"
    )
    events = collections.Counter(
        json.loads(bytes(body))["id"]
        for (body,) in read_database(db, "SELECT body FROM plant_events")
    )
    # one event for each plant, none for anything else
    assert events == collections.Counter(list(plants))


# ---- Backups, restores and the move to PostgreSQL (docs/operations.md) ----


def test_operations_sqlite_backup_amid_creates_restores_all_answered_before_it(
    runbook, spawn
):
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(runbook.settings["SQLITE"])
    )
    service, host, port, _ = start_gunicorn(spawn, env, 2, 4)
    creates = Creates(host, port)
    before = creates.wait_for(200)  # each answered 200 before the backup started
    backup = Path(runbook.run("sqlite-backup").strip())
    # creates go on during and after it
    during = creates.wait_for(len(creates.answered) + 200)
    answered = creates.stop()
    stop_service(service)  # the restore's first step, as the doc says
    assert creates.statuses.keys() == {200} and answered > during > before
    # readable by its owner alone, as plantstore's own file
    assert backup.stat().st_mode & 0o777 == 0o600
    said = runbook.run("sqlite-restore")
    process, host, port, _ = serve_plantstore(spawn, env)
    restored = listed_ids(host, port)
    assert said == f"ok\n{len(restored)} plants, 0 waiting events\n"
    # less those after it
    assert before <= set(restored) < answered and len(restored) == len(set(restored))
    assert post_over_http(host, port, TOKEN, {"id": -1, "name": "steady -1"})[0] == 200
    assert listed_ids(host, port)[-1] == -1  # listed last
    # the replaced file is kept
    assert Path(f"{runbook.settings['SQLITE']}.before-restore").exists()


def test_operations_events_repointed_in_sqlite_go_to_the_new_url(
    runbook, webhook_app, receiver, caplog
):
    old_hook, new_hook = receiver(), receiver()
    old_hook.stop()
    path = runbook.settings["SQLITE"]
    make_app(
        [TOKEN],
        store=(store := SQLiteStore(path)),
        webhook_urls=[old_hook.url],
        webhook_secret=SECRET,
    ).webhook_sender.close()  # the events wait; none is sent from here
    for plant_id in range(5):
        assert store.add(plant_id, f"p{plant_id}", None)
    said = runbook.run("repoint-sqlite", OLD_URL=old_hook.url, NEW_URL=new_hook.url)
    assert said == "5 events re-pointed\n"
    webhook_app(SQLiteStore(path), new_hook.url)  # the restart, with the new URL
    assert sorted(plant["id"] for plant in new_hook.wait_for(5)) == list(range(5))
    assert "dropped" not in caplog.text
