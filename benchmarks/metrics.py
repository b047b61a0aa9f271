"""GET /metrics at a million waiting webhook events (issue 46: "At 1M waiting events it
answers within 1 s"), and the upgrade of a 1.3.0 database that holds them.

    python benchmarks/metrics.py                   # SQLite and PostgreSQL, 1M events
    python benchmarks/metrics.py --db sqlite --events 100000 --scrapes 5

Needs the test extra (PostgreSQL is started as the tests start it, with its durable
defaults, and gunicorn serves: pip install -e '.[test]'), and git (1.3.0's code comes
from the repository's history). For each store: 1.3.0's own code makes the tables, then
one SQL statement fills plant_events with --events waiting events spread over
--receivers receivers (URLS URLs of each origin), a tenth of them failed once, as 1.3.0
left them (no creation time). gunicorn -w 2 --threads 4 (the recipe) then starts on it,
each worker opening the database, one of them upgrading it (the column `created`, set on
every event, and SQLite's index) while the other waits: timed until both have built the
app, or until gunicorn gives up. GET /metrics is then timed through the app, in process
(the WSGI callable: the first scrape apart, then --scrapes more), and over HTTP, from
sending the request to the whole answer (--scrapes, on a connection each). Every scrape
must answer 200 with plantstore_database_up 1 and the backlog the table holds.
"""

import argparse
import contextlib
import http.client
import importlib.util
import io
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402 (after sys.path, as the rest)

import plantstore  # noqa: E402 (after sys.path, so that it is this repository's)
import plantstore_postgres  # noqa: E402 (as plantstore)
from testbed import (  # noqa: E402
    Lines,
    Postgres,
    event_columns,
    plantstore_1_3_0,
    read_database,
    read_metrics,
)

TOKEN = "metrics-bench-token-1-a7Qm9xZ2"
URLS = 4  # URLs of each receiver's origin: a scrape adds them up

# Event i, as 1.3.0 wrote it: for receiver i % receivers, at its URL i % URLS; failed
# once if i is a multiple of 10; a plant's body
EVENT = (
    " 'https://receiver-' || (i % {receivers}) || '.example/hook/' || (i % {urls})"
    " || '?key=secret', 'msg_' || i, {body},"
    " CASE WHEN i % 10 = 0 THEN 1 ELSE 0 END, 0"
)
INSERT = "INSERT INTO plant_events (url, webhook_id, body, attempts, next_at)"
FILL = {
    "sqlite": (
        "WITH RECURSIVE n(i) AS"
        " (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count})"
        f" {INSERT} SELECT {EVENT} FROM n"
    ).replace("{body}", "CAST(json_object('id', i, 'name', 'plant ' || i) AS BLOB)"),
    "postgres": (
        f"{INSERT} SELECT {EVENT} FROM generate_series(1, {{count}}) AS i"
    ).replace(
        "{body}",
        "convert_to(json_build_object('id', i, 'name', 'plant ' || i)::text, 'UTF8')",
    ),
}


def old_module(folder):
    """1.3.0's plantstore, imported from its own file."""
    spec = importlib.util.spec_from_file_location(
        "plantstore_1_3_0", plantstore_1_3_0(folder)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fill(kind, db, count, receivers):
    """`count` waiting events straight into 1.3.0's table; return the seconds."""
    sql = FILL[kind].format(count=count, receivers=receivers, urls=URLS)
    started = time.monotonic()
    if kind == "postgres":
        with psycopg.connect(db, autocommit=True) as connection:
            connection.execute(sql)
            connection.execute("VACUUM ANALYZE plant_events")  # as autovacuum would
    else:
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as db:
            db.execute(sql)
    return time.monotonic() - started


def expected_backlog(count, receivers):
    """What a scrape must say: event i waits for receiver i % receivers."""
    first = {r: r or receivers for r in range(receivers)}  # i % receivers == r
    return {
        f"https://receiver-{r}.example": len(range(i, count + 1, receivers))
        for r, i in first.items()
    }


def check(text, expected):
    read = read_metrics(text)
    assert read["plantstore_database_up"] == 1, text
    assert read["plantstore_webhook_events_waiting"] == expected, text
    assert "secret" not in text and "/hook" not in text


def in_process(store, scrapes, expected):
    """Seconds for each scrape through the WSGI callable, the first one first."""
    application = plantstore.make_app([TOKEN], store=store)
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
    }
    seconds, answered = [], []
    for _ in range(scrapes + 1):
        started = time.monotonic()
        body = b"".join(
            application(
                {**environ, "wsgi.input": io.BytesIO()},
                lambda status, _headers, *_: answered.append(status),
            )
        )
        seconds.append(time.monotonic() - started)
        check(body.decode(), expected)
    assert answered == ["200 OK"] * len(seconds), answered
    return seconds


def start_gunicorn(db):
    """gunicorn -w 2 --threads 4 on db; return (process, port, seconds until both
    workers built the app, or None and the line that says why gunicorn stopped)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PLANTSTORE_") and k != "WEB_CONCURRENCY"
    }
    env.update(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=db, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-w", "2", "--threads", "4"]
        + ["-b", "127.0.0.1:0", "plantstore:app"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = Lines(process.stderr)
    port = int(lines.until(r"Listening at: http://[\d.]+:(\d+)")[1])
    while sum(line.count(", plants in ") for line in lines.seen) < 2:
        found = lines.until(r", plants in |cannot be opened.*|Reason: .*")
        if found[0] != ", plants in ":
            process.wait(60)
            said = [line for line in lines.seen if "cannot be opened" in line]
            return process, port, None, (said or [found[0]])[0].strip()
    return process, port, time.monotonic() - started, None


def over_http(port, scrapes, expected):
    """Seconds for each scrape over HTTP, a connection each."""
    seconds = []
    for _ in range(scrapes):
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request(
            "GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
        seconds.append(time.monotonic() - started)
        assert response.status == 200, text
        check(text, expected)
    return seconds


def figures(seconds):
    return (
        f"median {statistics.median(seconds) * 1000:.0f} ms,"
        f" max {max(seconds) * 1000:.0f} ms ({len(seconds)} scrapes)"
    )


def bench(kind, args, folder, postgres):
    name = {"sqlite": "SQLite", "postgres": "PostgreSQL"}[kind]
    old = old_module(folder / "1.3.0")
    if kind == "postgres":
        postgres.reset()
        db, open_store = postgres.url, plantstore_postgres.PostgresStore
        old.PostgresStore(db)
    else:
        db, open_store = str(folder / "plants.sqlite3"), plantstore.SQLiteStore
        old.SQLiteStore(db)
    filled = fill(kind, db, args.events, args.receivers)
    print(
        f"{name}, {args.events:,} waiting events of 1.3.0 for {args.receivers}"
        f" receivers x {URLS} URLs (filled in {filled:.1f} s):",
        flush=True,
    )
    server, port, upgraded, refused = start_gunicorn(db)
    try:
        if refused:
            print(f"  gunicorn -w 2 on it: did not start: {refused}", flush=True)
            done = "created" in event_columns(db)  # by the worker that had the lock
            started = time.monotonic()
            open_store(db).close()
            alone = time.monotonic() - started
            print(
                f"  the upgrade was {'done' if done else 'not done'} then; opened again"
                f" by one process alone in {alone:.2f} s",
                flush=True,
            )
            server, port, upgraded, refused = start_gunicorn(db)
            assert not refused, refused
        else:
            print(
                f"  gunicorn -w 2 on it: upgraded, both workers up in {upgraded:.2f} s"
            )
        (count,) = read_database(db, "SELECT count(*) FROM plant_events")[0]
        assert count == args.events, count
        expected = expected_backlog(args.events, args.receivers)
        store = open_store(db)
        local = in_process(store, args.scrapes, expected)
        print(
            f"  GET /metrics in process: first {local[0] * 1000:.0f} ms,"
            f" then {figures(local[1:])}",
            flush=True,
        )
        remote = over_http(port, args.scrapes, expected)
        print(f"  GET /metrics over HTTP, gunicorn: {figures(remote)}", flush=True)
        if kind == "postgres":  # the upgrade's UPDATE left a dead row for each event
            with psycopg.connect(db, autocommit=True) as connection:
                connection.execute("VACUUM plant_events")
            local = in_process(store, args.scrapes, expected)
            print(f"  after VACUUM, in process: {figures(local[1:])}", flush=True)
        store.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--receivers", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args(argv)
    kinds = args.db or ["sqlite", "postgres"]
    postgres = Postgres(durable=True) if "postgres" in kinds else None
    try:
        with tempfile.TemporaryDirectory(prefix="plantstore-metrics-") as folder:
            for kind in kinds:
                bench(kind, args, Path(folder) / kind, postgres)
    finally:
        if postgres:
            postgres.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
