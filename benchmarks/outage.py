"""Issue 38's scenario, measured as the clients count it: the database away while more
clients than threads send creates.

    python benchmarks/outage.py                       # all four: gunicorn and the
                                                      # embedded server, on PostgreSQL
                                                      # and on SQLite
    python benchmarks/outage.py --server gunicorn --db postgres --runs 3

Needs the test extra (it starts PostgreSQL as the tests do: pip install -e '.[test]').
For each run: the server starts on a database of its own kind, each of its processes
builds the app, 16 creates warm it up, then the database goes away: PostgreSQL has
every process stopped (SIGSTOP: no answer, no refusal), SQLite has another process hold
an exclusive transaction on the file for --lock seconds (a migration, say). At once, 32
clients each send one create on a connection of their own, and a `GET /health` is sent
6 s in. Each answer's time is counted from just before its client connects to the full
answer read. PostgreSQL gets SIGCONT once every create and the /health are answered (or
--cap seconds in), SQLite its lock back after --lock seconds; from that moment creates
are sent one after another (50 ms apart) until one answers 200. Last, the table is
read: every create answered 200 must be in it, and any answered 503 that is there is
counted (on PostgreSQL, a create whose statement reached the stopped server before its
bound cut the connection: an outcome unknown, which a retry answers 409).
"""

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from testbed import Lines, Postgres, cluster_pids  # noqa: E402

TOKEN = "outage-token-1-a7Qm9xZ2"
CLIENTS = 32
HEALTH_AT = 6.0


def exchange(port, method, path, document=None, timeout=60):
    """One request on a connection of its own: (status, headers, body) or the error."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            method,
            path,
            None if document is None else json.dumps(document),
            {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        )
        response = connection.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), data
    except (OSError, http.client.HTTPException) as error:
        return repr(error), {}, b""
    finally:
        connection.close()


def start_server(kind, db):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PLANTSTORE_") and k != "WEB_CONCURRENCY"
    }
    env.update(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),
    )
    if kind == "gunicorn":
        args = [sys.executable, "-m", "gunicorn", "-w", "2", "--threads", "4"]
        args += ["-b", "127.0.0.1:0", "plantstore:app"]
        pattern = r"Listening at: http://[\d.]+:(\d+)"
    else:
        args = [sys.executable, "plantstore.py", "--port", "0"]
        pattern = r"listening on http://[\d.]+:(\d+)/"
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = Lines(process.stderr)
    port = int(lines.until(pattern).group(1))
    # every process has built the app, and so can take connections
    while sum("plants in" in line for line in lines.seen) < (kind == "gunicorn") + 1:
        lines.until("plants in")
    process.lines = lines
    return process, port


def run_once(kind, database, postgres, lock_seconds, cap, tmp):
    if database == "postgres":
        postgres.reset()
        db = postgres.url
    else:
        db = str(Path(tmp) / "plants.sqlite3")
    server, port = start_server(kind, db)
    stopped, locker = [], None
    try:
        # warm: the workers hold connections
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            warm = pool.map(
                lambda n: exchange(port, "POST", "/plants", {"id": n, "name": "w"})[0],
                range(16),
            )
            assert list(warm) == [200] * 16
        assert exchange(port, "GET", "/health")[0] == 200

        # the database goes away
        if database == "postgres":
            pids = cluster_pids(postgres)
            os.kill(pids[0], signal.SIGSTOP)  # first: stopped, it starts no process
            stopped.append(pids[0])
            for pid in cluster_pids(postgres)[1:]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        else:
            locker = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sqlite3, sys, time\n"
                    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "db.execute('BEGIN EXCLUSIVE')\n"
                    "print('locked', flush=True)\n"
                    "time.sleep(float(sys.argv[2]))\n"
                    "db.execute('ROLLBACK')\n",
                    db,
                    str(lock_seconds),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert locker.stdout.readline() == "locked\n"
        away = time.monotonic()

        answers = [None] * CLIENTS
        barrier = threading.Barrier(CLIENTS + 1)

        def client(n):
            barrier.wait()
            sent = time.monotonic()
            status, headers, body = exchange(
                port, "POST", "/plants", {"id": 1000 + n, "name": f"c{n}"}
            )
            answers[n] = (sent - away, time.monotonic() - sent, status, headers, body)

        health = []

        def health_check():
            time.sleep(max(0, away + HEALTH_AT - time.monotonic()))
            sent = time.monotonic()
            status, headers, body = exchange(port, "GET", "/health")
            health.append((sent - away, time.monotonic() - sent, status, headers))

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        threads.append(threading.Thread(target=health_check))
        for thread in threads:
            thread.start()
        barrier.wait()
        if database == "postgres":
            for thread in threads:
                thread.join(max(0, away + cap - time.monotonic()))
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stopped.clear()
            back = time.monotonic()
        else:
            locker.wait(lock_seconds + 30)
            back = time.monotonic()
        # once back: creates one after another until a 200
        first_200, tries, plant_id = None, 0, 10_000
        while time.monotonic() - back < 30:
            tries += 1
            status = exchange(
                port, "POST", "/plants", {"id": plant_id, "name": "back"}
            )[0]
            plant_id += 1
            if status == 200:
                first_200 = time.monotonic() - back
                break
            time.sleep(0.05)
        for thread in threads:
            thread.join(60)
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if locker is not None and locker.poll() is None:
            locker.kill()
            locker.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    said = server.lines.rest()
    if database == "postgres":
        with psycopg.connect(postgres.url) as connection:
            stored = {i for (i,) in connection.execute("SELECT id FROM plants")}
    else:
        with contextlib.closing(sqlite3.connect(db)) as connection:
            stored = {i for (i,) in connection.execute("SELECT id FROM plants")}
        for suffix in "", "-wal", "-shm", "-writers":
            with contextlib.suppress(FileNotFoundError):
                os.remove(db + suffix)
    ok_missing = [
        1000 + n
        for n, a in enumerate(answers)
        if a[2] == 200 and 1000 + n not in stored
    ]
    stored_503 = [
        1000 + n for n, a in enumerate(answers) if a[2] == 503 and 1000 + n in stored
    ]
    bad = [
        a[2:]
        for a in answers
        if a[2] not in (200, 503)
        or a[2] == 503
        and not (
            int(a[3].get("Retry-After", 0)) > 0 and json.loads(a[4])["error"] == 503
        )
    ]
    return {
        "times": sorted(a[1] for a in answers),
        "statuses": sorted(str(a[2]) for a in answers),
        "bad": bad,
        "health": health[0][:3] if health else None,
        "first_200": first_200,
        "tries": tries,
        "ok_missing": ok_missing,
        "stored_503": stored_503,
        "traceback": "Traceback" in said,
        "log": said,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["gunicorn", "embedded"], action="append")
    parser.add_argument("--db", choices=["postgres", "sqlite"], action="append")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--lock", type=float, default=15.0, help="SQLite lock, s")
    parser.add_argument("--cap", type=float, default=30.0, help="PostgreSQL stop, s")
    parser.add_argument("--log", action="store_true", help="print each server's log")
    args = parser.parse_args()
    postgres = Postgres() if "postgres" in (args.db or ["postgres"]) else None
    try:
        for kind in args.server or ["gunicorn", "embedded"]:
            for database in args.db or ["postgres", "sqlite"]:
                for run in range(args.runs):
                    with tempfile.TemporaryDirectory() as tmp:
                        result = run_once(
                            kind, database, postgres, args.lock, args.cap, tmp
                        )
                    times = result["times"]
                    counts = {
                        s: result["statuses"].count(s) for s in set(result["statuses"])
                    }
                    health = result["health"]
                    print(
                        f"{kind} {database} run {run + 1}: creates answered in "
                        f"{times[0]:.2f} .. median {statistics.median(times):.2f} .. "
                        f"max {times[-1]:.2f} s; {counts}; "
                        + (
                            f"/health sent at {health[0]:.2f} s: {health[2]} in "
                            f"{health[1]:.2f} s; "
                            if health
                            else "/health: no answer; "
                        )
                        + (
                            f"first 200 {result['first_200']:.2f} s after back "
                            f"({result['tries']} tries); "
                            if result["first_200"] is not None
                            else "no 200 within 30 s of back; "
                        )
                        + f"200 missing {result['ok_missing']}; "
                        f"503 stored {len(result['stored_503'])}; "
                        f"bad {result['bad']}; traceback {result['traceback']}",
                        flush=True,
                    )
                    print("  times:", " ".join(f"{t:.2f}" for t in times), flush=True)
                    if args.log:
                        print(result["log"], flush=True)
    finally:
        if postgres is not None:
            postgres.remove()


if __name__ == "__main__":
    main()
