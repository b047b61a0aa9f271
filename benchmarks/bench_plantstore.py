"""Benchmark plantstore side by side: in process, over HTTP, memory per stored plant.

    python benchmarks/bench_plantstore.py          # the full run (a few minutes)
    python benchmarks/bench_plantstore.py --quick  # tiny counts, in process only

Needs `pip install -e '.[bench]'` (Falcon, gunicorn, granian) and, for the HTTP rows,
`wrk` (Debian: `apt-get install wrk`); section 5 also runs `pgbench` (Debian:
postgresql), and git. Contenders run in interleaved rounds, so that noise from the
machine hits all of them alike (in process, they take turns every 100 requests). Each
figure is the median round, and each ratio the median of the ratios within a round: a
slow minute of the machine slows both sides of a ratio, so it does not move it.

1. In process: microseconds per valid POST /plants through the WSGI callable, for
   plantstore, a raw WSGI "ceiling" app that only reads the body and answers a
   constant JSON, and the same endpoint with the same behaviour written in Falcon;
   the rounds run in three fresh processes in turn, since each process's memory
   layout and hash seed move the figures a little.
2. Over HTTP: requests per second under gunicorn's gthread worker (1 worker,
   8 threads) on loopback, plantstore against the ceiling app, with wrk sending
   unique ids; the same two under granian with GRANIAN's in-memory flags (those of
   deploy/plantstore-granian.service), and granian's ratios to gunicorn and to
   its own ceiling; and the embedded server (python plantstore.py).
3. Memory: bytes per stored plant at 1,000,000 plants with short names and tags.
4. The SQLite store against the in-memory one: creates per second in process, and
   over HTTP under gunicorn -w 4 --threads 4 with PLANTSTORE_DB.
5. Durable creates over HTTP, all in one run (--only durable, about four minutes), with
   the servers' flags per store from GUNICORN and GRANIAN (below; the README's recipes
   and those of deploy/plantstore-granian.service). Loaded: each store (memory, SQLite,
   PostgreSQL) under gunicorn and under granian, wrk -t1 -c16 unique creates, and
   pgbench inserting the same rows into the same PostgreSQL with 16 clients, in
   interleaved rounds: requests per second, p99, the longest wait, bad answers, the
   ratios of issue 31's bars, and the sizes of the batches each SQL row wrote with group
   commit (PostgreSQL's from the rows' xmin; SQLite's counted in the serving processes
   by benchmarks/batch_sizes.py). Low load: each SQL store under each server with one
   connection, one create at a time (wrk -t1 -c1), mean, p50 and p99, each beside the
   same server running plantstore.py as it was at --baseline (1.2.0). Each server has a
   database of its own. PostgreSQL is started the way the tests start it, with its
   durable defaults (fsync, synchronous_commit on), so this section also needs the test
   extra: pip install -e '.[bench,test]'.
6. Listing at size, in process with the in-memory store: a page of 10 at 1,000
   plants, at --listing-plants, and after deleting the oldest 90%; the whole
   listing at --listing-plants: its time, the extra memory at its peak, and the
   longest gap between creates made on another thread meanwhile.
"""

import argparse
import configparser
import contextlib
import glob
import io
import itertools
import json
import os
import platform
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))  # create_cost.py, beside this file

import create_cost  # noqa: E402 (after sys.path, which finds it)
import plantstore  # noqa: E402 (after sys.path, so that it is this repository's)
import plantstore_postgres  # noqa: E402 (as plantstore)

# made up per run; reaches servers through the environment only
TOKEN = secrets.token_urlsafe(32)
CEILING_BODY = b'{"name": "Fern", "tag": "indoor"}'


# ---- The contenders ----


def ceiling(environ, start_response):
    """The least a WSGI app can do here: read the body, answer a constant JSON."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response(
        "200 OK",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(CEILING_BODY))),
        ],
    )
    return [CEILING_BODY]


def make_falcon_app(tokens, max_body_bytes=plantstore.MAX_BODY_BYTES):
    """POST /plants in Falcon's idiom, with plantstore's checks, statuses and bodies."""
    import hmac

    import falcon

    store = plantstore.PlantStore()
    accepted = [token.encode() for token in tokens]

    class Plants:
        def on_post(self, req, resp):
            scheme, _, token = (req.auth or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise plantstore.HTTPError(
                    401,
                    "a bearer token is required",
                    headers=[("WWW-Authenticate", 'Bearer realm="plantstore"')],
                )
            sent = token.strip().encode("latin-1", "replace")
            if not sum(hmac.compare_digest(sent, good) for good in accepted):
                raise plantstore.HTTPError(
                    401,
                    "the bearer token is not valid",
                    headers=[
                        (
                            "WWW-Authenticate",
                            'Bearer realm="plantstore", error="invalid_token"',
                        )
                    ],
                )
            media_type = (req.content_type or "").partition(";")[0].strip().lower()
            if media_type != "application/json":
                raise plantstore.HTTPError(
                    415,
                    "Content-Type must be application/json",
                    headers=[("Accept", "application/json")],
                )
            if (req.content_length or 0) > max_body_bytes:
                raise plantstore.HTTPError(
                    413, f"request body is larger than {max_body_bytes} bytes"
                )
            plant_id, name, tag = plantstore.read_new_plant(req.bounded_stream.read())
            if not store.add(plant_id, name, tag):
                raise plantstore.HTTPError(409, "a plant with this 'id' already exists")
            resp.media = {"name": name} if tag is None else {"name": name, "tag": tag}

    def render(req, resp, error, params):  # noqa: ARG001 (Falcon's signature)
        resp.status = error.status
        resp.media = {"error": error.status, "message": error.message}
        for name, value in error.headers:
            resp.set_header(name, value)

    app = falcon.App()
    app.add_route("/plants", Plants())
    app.add_error_handler(plantstore.HTTPError, render)
    return app


def in_process_contenders():
    contenders = {
        "plantstore": lambda: plantstore.make_app([TOKEN]),
        "ceiling": lambda: ceiling,
    }
    if falcon_installed():
        contenders["falcon"] = lambda: make_falcon_app([TOKEN])
    return contenders


def falcon_installed():
    try:
        import falcon  # noqa: F401 (imported to learn whether it can be)
    except ImportError:
        return False
    return True


# ---- 1. In process ----


def request_environs(first_id, count):
    """WSGI environs for `count` valid creates with unique ids, built before the clock
    starts: create_cost.py's, with this run's token."""
    return create_cost.environs(first_id, count, TOKEN)


def time_round(apps, first_id, count, batch=100):
    """Return {name: microseconds per request} over `count` valid creates each; fail
    unless all were 200.

    The contenders take turns every `batch` requests, in an order that rotates, so that
    a burst of noise from the machine lands on all of them alike. Environs are built per
    batch outside the clock, as a server builds each one just before it calls the app:
    thousands built up front would be cold in the cache when their turn came.
    """
    statuses = []

    def start_response(status, *_):
        statuses.append(status)

    clock = time.perf_counter
    names, elapsed = list(apps), dict.fromkeys(apps, 0.0)
    for turn, start in enumerate(range(first_id, first_id + count, batch)):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            environs = request_environs(start, min(batch, first_id + count - start))
            application = apps[name]
            begin = clock()
            for environ in environs:
                b"".join(application(environ, start_response))
            elapsed[name] += clock() - begin
    if statuses != ["200 OK"] * (count * len(apps)):
        raise SystemExit(
            f"a contender answered other than 200: {sorted(set(statuses))}"
        )
    return {name: seconds / count * 1e6 for name, seconds in elapsed.items()}


def bench_in_process(processes, rounds, per_round):
    """Per contender, microseconds per valid create, and the ratios to the ceiling and
    plantstore.

    The rounds run in several fresh processes, one after another, as pyperf does: where
    a process happens to lay out its memory, and its hash seed, move the figures by a
    few percent.
    """
    if not falcon_installed():
        print(
            "Falcon is not installed (pip install -e '.[bench]'): its row is left out.",
            file=sys.stderr,
        )
    samples = []
    for _ in range(processes):
        worker = [
            sys.executable,
            __file__,
            "--worker",
            "--rounds",
            str(rounds),
            "--per-round",
            str(per_round),
        ]
        samples += json.loads(
            subprocess.run(worker, stdout=subprocess.PIPE, text=True, check=True).stdout
        )
    return {
        name: (value, ratio, median_ratio(samples, name, "plantstore"))
        for name, (value, ratio) in summarize(samples, "ceiling").items()
    }


def in_process_rounds(rounds, per_round):
    """The rounds of one process: a list of {contender: microseconds per request}."""
    apps = {name: build() for name, build in in_process_contenders().items()}
    time_round(apps, 10**12, 200)  # warm up, and prove each one answers 200
    return [
        time_round(apps, round_number * per_round, per_round)
        for round_number in range(rounds)
    ]


def median_ratio(samples, name, baseline):
    """The median over rounds of name's figure divided by baseline's figure in the same
    round."""
    return statistics.median(sample[name] / sample[baseline] for sample in samples)


def summarize(samples, baseline):
    """{name: (median figure, median ratio to baseline)} from rounds, each {name:
    figure}."""
    return {
        name: (
            statistics.median(sample[name] for sample in samples),
            median_ratio(samples, name, baseline),
        )
        for name in samples[0]
    }


# ---- 2. Over HTTP ----

WRK_SCRIPT = r"""
-- Unique ids: each wrk thread counts in its own range, above a base new to each run.
local threads, base = 0, tonumber(os.getenv("BENCH_ID_BASE"))
local auth = "Bearer " .. os.getenv("BENCH_TOKEN")
function setup(thread) thread:set("slot", threads); threads = threads + 1 end
function init() counter = base + slot * 100000000 end
function request()
  counter = counter + 1
  -- %d, not `..`: Lua writes a number of 15 digits or more as 1.0000000000001e+14,
  -- and ids would repeat
  return wrk.format("POST", "/plants",
    {["Content-Type"] = "application/json", ["Authorization"] = auth},
    string.format('{"id": %d, "name": "Fern", "tag": "indoor"}', counter))

end
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port, process, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the server did not start listening")


# The servers' flags per store, in one place: the README's recipes for gunicorn, and
# those of deploy/plantstore-granian.service (docs/granian.md) for granian. Change them
# here to measure others: the output says when granian's differ from the unit's. With
# group commit, a batch in one process holds at most as many creates as that process has
# threads.
GUNICORN = {
    "memory": "-w 1 --threads 8",
    "sqlite": "-w 2 --threads 4",
    "postgres": "-w 2 --threads 4",
}
GRANIAN = {
    "memory": "--workers 1 --blocking-threads 8 --runtime-mode st",
    "sqlite": "--workers 2 --blocking-threads 8 --runtime-mode st",
    "postgres": "--workers 2 --blocking-threads 8 --runtime-mode st",
}
STORE_NAMES = {"memory": "memory", "sqlite": "SQLite", "postgres": "PostgreSQL"}


def gunicorn_command(store, port, app="plantstore:app", pythonpath=HERE.parent):
    return [
        sys.executable,
        "-m",
        "gunicorn",
        *GUNICORN[store].split(),
        "-k",
        "gthread",
        "-b",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "--pythonpath",
        str(pythonpath),
        app,
    ]


def granian_command(store, port, app="plantstore:app"):
    """granian as deploy/plantstore-granian.service runs it, with GRANIAN's flags for
    the store."""
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "wsgi",
        "--http",
        "1",
        "--no-ws",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *GRANIAN[store].split(),
        "--log-level",
        "warning",
        app,
    ]


def server_label(server, store):
    """gunicorn's flags as written; granian's as docs/granian.md names them: w2 bt8 st
    is --workers 2 --blocking-threads 8 --runtime-mode st."""
    if server == "gunicorn":
        return f"gunicorn {GUNICORN[store]}"
    short = {
        "workers": "w",
        "blocking-threads": "bt",
        "runtime-threads": "rt",
        "backpressure": "bp",
        "runtime-mode": "",
    }
    return "granian " + re.sub(
        r"--([\w-]+) (\w+)",
        lambda m: short[m[1]] + m[2] if m[1] in short else m[0],
        GRANIAN[store],
    )


def unlike_the_unit():
    """The stores whose GRANIAN flags are not those of
    deploy/plantstore-granian.service."""
    unit = (HERE.parent / "deploy" / "plantstore-granian.service").read_text()
    lines = {
        "memory": r"^ExecStart=\S*granian (.*) plantstore:app$",
        "sqlite": r"^#\s*SQLite:\s*ExecStart=\S*granian (.*) plantstore:app$",
        "postgres": r"^#\s*PostgreSQL:\s*ExecStart=\S*granian (.*) plantstore:app$",
    }
    found = {
        store: re.search(line, unit, re.MULTILINE) for store, line in lines.items()
    }
    return [
        store
        for store in lines
        if not found[store] or f" {GRANIAN[store]} " not in f" {found[store][1]} "
    ]


def server_environ(db=None, **more):
    """A server's environment: the token, the store (None: in memory), no flag's
    override."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("WEB_CONCURRENCY", "PLANTSTORE_DB")
        and not name.startswith("GRANIAN_")
    }
    return {
        **env,
        "PLANTSTORE_TOKENS": TOKEN,
        **({"PLANTSTORE_DB": db} if db else {}),
        **more,
    }


def spawn(args, port, env, cwd=HERE.parent):
    """Start a server and return its process once it listens on port."""
    process = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, process)
    return process


def start_server(kind, port, db_path):
    if kind == "sqlite":
        args = [
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            "4",
            "--threads",
            "4",
            "-k",
            "gthread",
            "-b",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "--pythonpath",
            str(HERE.parent),
            "plantstore:app",
        ]
        return spawn(args, port, server_environ(db_path))
    if kind == "embedded":
        args = [sys.executable, str(HERE.parent / "plantstore.py"), "--port", str(port)]
        return spawn(args, port, server_environ())
    # the in-memory flags: plantstore, or the ceiling app
    if kind.startswith("granian"):
        app = (
            "plantstore:app"
            if kind == "granian"
            else f"{Path(__file__).resolve()}:ceiling"
        )
        return spawn(granian_command("memory", port, app), port, server_environ())
    app = "plantstore:app" if kind == "plantstore" else "bench_plantstore:ceiling"
    args = gunicorn_command("memory", port, app, pythonpath=f"{HERE.parent},{HERE}")
    return spawn(args, port, server_environ())


def run_wrk(port, script, seconds, connections, id_base, latencies=None):
    """Requests per second, non-2xx answers and socket errors; with a dict, also the
    mean, p50, p99 and longest latency ("max"), in ms."""
    env = {**os.environ, "BENCH_TOKEN": TOKEN, "BENCH_ID_BASE": str(id_base)}
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--latency",
            "-s",
            script,
            f"http://127.0.0.1:{port}/plants",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    non_2xx = (
        int(m[1]) if (m := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)) else 0
    )
    errors = sum(
        int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out)
    )
    if latencies is not None:
        mean, _, longest = re.search(
            r"Latency\s+([\d.]+\w+)\s+(\S+)\s+([\d.]+\w+)", out
        ).groups()
        latencies.update(mean=milliseconds(mean), max=milliseconds(longest))
        for name, percent in ("p50", "50"), ("p99", "99"):
            found = re.search(rf"^\s+{percent}%\s+([\d.]+\w+)", out, re.MULTILINE)
            latencies[name] = milliseconds(found[1])
    return rps, non_2xx, errors


def milliseconds(text):
    """wrk's 950.00us, 1.20ms or 1.05s, in milliseconds."""
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[unit]


def bench_http(rounds, seconds, connections, db_path):
    """Per server: median requests/s, median ratio to gunicorn's ceiling, bad answers;
    and granian's own ratios."""
    kinds = [
        "plantstore",
        "ceiling",
        "granian",
        "granian-ceiling",
        "embedded",
        "sqlite",
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    servers = {}
    samples = []  # one {kind: requests per second} per round
    bad = {kind: 0 for kind in kinds}
    try:
        for kind in kinds:
            servers[kind] = (port := free_port()), start_server(kind, port, db_path)
        for round_number in range(rounds):
            # Each pair a ratio is about runs back to back, each first every other
            # round; then the rest.
            flip = 1 if round_number % 2 else -1
            samples.append({})
            for kind in (
                ["plantstore", "ceiling"][::flip]
                + ["granian", "granian-ceiling"][::flip]
                + ["embedded", "sqlite"]
            ):
                port = servers[kind][0]
                rps, non_2xx, errors = run_wrk(
                    port,
                    script.name,
                    seconds,
                    connections,
                    id_base=(round_number + 1) * 10**12,
                )
                samples[-1][kind] = rps
                bad[kind] += non_2xx + errors
    finally:
        for _, process in servers.values():
            process.terminate()
            process.wait(30)
        os.unlink(script.name)
    rates = {
        kind: (rps, ratio, bad[kind])
        for kind, (rps, ratio) in summarize(samples, "ceiling").items()
    }

    granian = {
        "vs gunicorn": median_ratio(samples, "granian", "plantstore"),
        "vs its ceiling": median_ratio(samples, "granian", "granian-ceiling"),
        "ceilings": median_ratio(samples, "granian-ceiling", "ceiling"),
    }
    return rates, granian


# ---- 3. Memory ----


def bench_memory(plants):
    """Bytes per plant held by the store after `plants` creates through the
    application."""
    store = plantstore.PlantStore()
    application = plantstore.make_app([TOKEN], store=store)
    tags = ["indoor", "outdoor", "succulent", "fern", "herb"]
    start_response = lambda *_: None  # noqa: E731 (a one-line WSGI callback)
    environ = request_environs(0, 1)[0]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for plant_id in range(plants):
        tag = tags[plant_id % 5].encode()
        body = b'{"id": %d, "name": "plant %d", "tag": "%s"}' % (
            plant_id,
            plant_id,
            tag,
        )
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        application(environ, start_response)
    environ = body = tag = None
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(store._seq) == plants
    return (after - before) / plants


# ---- 4. The SQLite store ----


def bench_stores(rounds, per_round, db_path):
    """Creates per second through the application, in-memory store against SQLite,
    interleaved."""
    apps = {
        "memory": plantstore.make_app([TOKEN]),
        "sqlite": plantstore.make_app([TOKEN], store=plantstore.SQLiteStore(db_path)),
    }
    samples = [
        {
            name: 1e6 / micros
            for name, micros in time_round(
                apps, round_number * per_round, per_round
            ).items()
        }
        for round_number in range(rounds)
    ]

    return summarize(samples, "memory")


# ---- 5. Durable creates over HTTP: PostgreSQL, SQLite, memory ----

SERVERS = ("gunicorn", "granian")
STORES = ("memory", "sqlite", "postgres")
LOADED = [(store, server) for server in SERVERS for store in STORES]
# the database's own rate at the same inserts, without HTTP
PGBENCH = ("postgres", "pgbench")
LOW_LOAD = [(store, server) for store in ("sqlite", "postgres") for server in SERVERS]
BARS = [  # (row, against, the bar of issue 31 or None), as median ratios within a round
    (("postgres", "granian"), PGBENCH, 0.75),
    (("sqlite", "granian"), ("memory", "granian"), 0.3),
    (("postgres", "gunicorn"), PGBENCH, None),
    (("sqlite", "gunicorn"), ("memory", "gunicorn"), None),
    (("postgres", "granian"), ("postgres", "gunicorn"), None),  # issue 20's bar was 1.8
]
LOW_LOAD_BAR = 1.10  # issue 31: one create at a time, at most 10% slower than on 1.2.0
# main before group commit: plantstore 1.2.0
BASELINE = "cb8c6625be8c3603113af195e5fa7c9c616d8681"
# Issue 44: a loaded row's contenders beside this checkout (--against), and the bar
# they are held to: the checkout at least AGAINST_BAR times the first of them.
AGAINST_BAR = 0.9
NOW = "now"  # this checkout's plantstore.py, as a loaded row's contender
# by then each serving process has written its counts anew (batch_sizes.DUMP_SECONDS)
COUNTS_SETTLE = 0.25

# The rows plantstore inserts on a create (no webhooks): one statement, in autocommit,
# as PostgresStore runs it. pgbench reads a statement on one line: no "\n" inside it.
PGBENCH_SCRIPT = (
    "\n\\set id random(1, 9000000000000000000)\n"
    "INSERT INTO plants (id, name, tag)"
    " VALUES (:id, '\\x4665726e'::bytea, '\\x696e646f6f72'::bytea)"
    " ON CONFLICT (id) DO NOTHING RETURNING seq;\n"
)


def run_pgbench(postgres, script, seconds, clients):
    """Transactions per second of pgbench with this script: `clients` sessions, 2
    threads."""
    env = {**os.environ, "PGPASSWORD": postgres.password}  # never on the command line
    binary = shutil.which("pgbench") or max(
        glob.glob("/usr/lib/postgresql/*/bin/pgbench"), default="pgbench"
    )
    out = subprocess.run(
        [
            binary,
            "-n",
            "-c",
            str(clients),
            "-j",
            "2",
            "-M",
            "prepared",
            "-T",
            str(seconds),
            "-f",
            script,
            "-h",
            "127.0.0.1",
            "-p",
            str(postgres.port),
            "-U",
            "plantstore",
            "plantstore",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    return float(
        re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)[1]
    )


def baseline_source(ref, folder):
    """Write plantstore.py as it was at git `ref` into folder; return its version (else
    the ref), or None if git cannot show it."""
    try:
        source = subprocess.run(
            ["git", "-C", str(HERE.parent), "show", f"{ref}:plantstore.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    os.makedirs(folder)
    Path(folder, "plantstore.py").write_text(source)
    found = re.search(r'^__version__ = "([^"]+)"', source, re.MULTILINE)
    return found[1] if found else ref[:12]


def git_show(commit, name):
    """A file as it was at a commit, or None."""
    shown = subprocess.run(
        ["git", "-C", str(HERE.parent), "show", f"{commit}:{name}"],
        capture_output=True,
        text=True,
    )
    return shown.stdout if shown.returncode == 0 else None


def contender_source(source, folder):
    """Make `folder` the tree of an --against contender and return its label: `source`
    is a git commit (its plantstore.py and every module its setup.cfg lists, or
    plantstore_postgres.py where it lists none) or the path of a copy of plantstore.py,
    such as a change tried alone, beside this checkout's other modules."""
    os.makedirs(folder)
    if os.path.isfile(source):
        for module in HERE.parent.glob("plantstore_*.py"):
            shutil.copyfile(module, Path(folder, module.name))
        shutil.copyfile(source, Path(folder, "plantstore.py"))
        path = Path(source)
        return path.stem if path.name != "plantstore.py" else path.parent.name
    setup = configparser.ConfigParser()
    setup.read_string(git_show(source, "setup.cfg") or "[options]\n")
    listed = setup["options"].get("py_modules", "").replace(",", " ").split()
    for name in {*(f"{name}.py" for name in listed), "plantstore_postgres.py"}:
        if (text := git_show(source, name)) is not None:
            Path(folder, name).write_text(text)
    if git_show(source, "plantstore.py") is None:
        raise SystemExit(f"--against {source}: neither a file nor a git commit")
    Path(folder, "plantstore.py").write_text(git_show(source, "plantstore.py"))
    return source[:12]


def served_modules(folder):
    """The plantstore.py files that a server's processes imported, as
    benchmarks/batch_sizes.py wrote them down."""
    return {
        Path(path).read_text() for path in glob.glob(os.path.join(folder, "*.module"))
    }


def xmin_batches(url):
    """{batch size: batches} in a PostgreSQL database: a transaction's rows share its
    xmin."""
    import psycopg

    with psycopg.connect(url) as connection:
        return Counter(
            dict(
                connection.execute(
                    "SELECT size, count(*) FROM"
                    " (SELECT count(*) AS size FROM plants GROUP BY xmin) AS batches"
                    " GROUP BY size"
                )
            )
        )


def counted_batches(folder, store_class):
    """{batch size: batches} that benchmarks/batch_sizes.py counted in a server's
    processes, one per call of _write_batch; None for a plantstore without that method
    (before group commit)."""
    if not hasattr(store_class, "_write_batch"):
        return None
    counts = Counter()
    for path in glob.glob(os.path.join(folder, "*.json")):
        counts.update(
            {
                int(size): batches
                for size, batches in json.loads(Path(path).read_text()).items()
            }
        )
    return counts


def creates_by_process(folder):
    """{process id: creates} that benchmarks/batch_sizes.py counted in a server's
    processes so far."""
    counts = {}
    for path in glob.glob(os.path.join(folder, "*[0-9].json")):
        with contextlib.suppress(OSError, ValueError):  # replaced meanwhile
            sizes = json.loads(Path(path).read_text())
            counts[Path(path).stem] = sum(int(n) * k for n, k in sizes.items())
    return counts


def busiest_share(before, after):
    """The share of a run's creates that its busiest process wrote (0.5: two shared
    them evenly; 1.0: one wrote them all), None where none was counted."""
    done = [after[pid] - before.get(pid, 0) for pid in after]
    return max(done) / sum(done) if sum(done) else None


def batch_figures(counts):
    """The median, mean and largest batch, aligned for the table; n/a without
    batches."""
    if not counts:
        return f"{'n/a':>6} {'n/a':>5} {'n/a':>4}"
    sizes = sorted(counts.elements())
    return (
        f"{statistics.median(sizes):>6g} {sum(sizes) / len(sizes):>5.1f} {sizes[-1]:>4}"
    )


def bench_durable(
    rounds,
    seconds,
    connections,
    low_rounds,
    low_seconds,
    baseline,
    workdir,
    stores=STORES,
    servers=SERVERS,
    against=(),
):
    """Section 5, in two parts. Loaded: each of `stores` under each of `servers` at
    `connections` connections, and pgbench with as many clients if PostgreSQL is among
    them, in interleaved rounds, each first in turn; then the sizes of the batches each
    SQL row wrote. A loaded row has contenders: this checkout's plantstore.py, and one
    per source in `against` (a git commit or a copy of plantstore.py), each a server of
    its own with the same flags, run back to back within the row, each first in turn.
    Low load: each SQL store under each server at one connection, beside the same server
    running plantstore.py as it was at git `baseline` (empty: alone), the two back to
    back, each first every other round. Every server has a database of its own: the
    stores grow alike, and no id is another's."""
    sys.path.insert(0, str(HERE.parent))

    postgres = None
    if "postgres" in stores:
        import psycopg

        # the tests' own: initdb and pg_ctl in a temporary folder
        from testbed import Postgres

        postgres = Postgres(durable=True)
    script = os.path.join(workdir, "creates.lua")
    Path(script).write_text(WRK_SCRIPT)
    insert_script = os.path.join(workdir, "insert.sql")
    Path(insert_script).write_text(PGBENCH_SCRIPT)
    folders, labels = {NOW: HERE.parent}, []
    for number, source in enumerate(against):
        folder = os.path.join(workdir, f"against{number}")
        label = contender_source(source, folder)
        label = label if label not in folders else f"{label}#{number}"
        folders[label] = folder
        labels.append(label)
    contenders, others = [NOW, *labels], labels
    groups = [(store, server) for server in servers for store in stores]
    # a row: (store, server) for this checkout, (store, server, label) for another
    loaded_rows = [
        group if contender == NOW else (*group, contender)
        for group in groups
        for contender in contenders
    ]
    low_rows = [
        row for row in LOW_LOAD if row[0] in stores and row[1] in servers
    ] * bool(low_rounds)
    old = os.path.join(workdir, "baseline")
    version = baseline_source(baseline, old) if baseline and low_rows else None
    processes, ports, databases, counters = [], {}, {}, {}

    def start(row, folder=HERE.parent, app="plantstore:app", **environ):
        (store, server), number = row[:2], len(processes)
        if store == "sqlite":
            databases[row] = os.path.join(workdir, f"store{number}.sqlite3")
        elif store == "postgres":
            with psycopg.connect(postgres.url, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE store{number}")
            databases[row] = f"{postgres.url.rpartition('/')[0]}/store{number}"
        ports[row] = port = free_port()
        if server == "gunicorn":
            args = gunicorn_command(store, port, app, pythonpath=folder)
        else:
            args = granian_command(store, port, app)
        env = server_environ(databases.get(row), **environ)
        processes.append(spawn(args, port, env, cwd=folder))

    try:
        for row in loaded_rows:
            # served by benchmarks/batch_sizes.py, which counts the creates of each
            # commit and notes which plantstore.py each process imported
            counters[row] = os.path.join(workdir, f"batches{len(processes)}")
            os.makedirs(counters[row])
            start(
                row,
                folder=folders[row[2] if len(row) > 2 else NOW],
                app="batch_sizes:app",
                BENCH_BATCHES=counters[row],
                PYTHONPATH=str(HERE),
            )
        # servers of their own, on plantstore now and at the baseline
        for row in low_rows:
            start((*row, "now"))
            if version:
                start((*row, "baseline"), folder=old)
        if postgres:  # pgbench's table
            with psycopg.connect(postgres.url, autocommit=True) as connection:
                for statement in plantstore_postgres.PostgresStore.schema:
                    connection.execute(statement)

        units = [*groups, PGBENCH] if postgres else groups
        loaded, p99s = [], {row: [] for row in loaded_rows}
        shares = {row: [] for row in loaded_rows}
        worst = {row: {"p99": 0, "max": 0, "bad": 0} for row in loaded_rows}
        for round_number in range(rounds):
            loaded.append({})
            turn = round_number % len(units)
            for unit in units[turn:] + units[:turn]:  # each first in turn
                if unit == PGBENCH:
                    loaded[-1][unit] = run_pgbench(
                        postgres, insert_script, seconds, connections
                    )
                    continue
                first = round_number % len(contenders)
                for contender in contenders[first:] + contenders[:first]:
                    row = unit if contender == NOW else (*unit, contender)
                    latencies, before = {}, creates_by_process(counters[row])
                    rps, non_2xx, errors = run_wrk(
                        ports[row],
                        script,
                        seconds,
                        connections,
                        id_base=(round_number + 1) * 10**12,
                        latencies=latencies,
                    )
                    loaded[-1][row] = rps
                    p99s[row].append(latencies["p99"])
                    if row[0] != "memory" and others:
                        # how the processes shared the run: under gunicorn, the one
                        # that accepts a connection serves it, and one may take all
                        time.sleep(COUNTS_SETTLE)
                        shares[row].append(
                            busiest_share(before, creates_by_process(counters[row]))
                        )
                    worst[row] = {
                        "p99": max(worst[row]["p99"], latencies["p99"]),
                        "max": max(worst[row]["max"], latencies["max"]),
                        "bad": worst[row]["bad"] + non_2xx + errors,
                    }
        time.sleep(COUNTS_SETTLE)  # each serving process writes its counts anew
        batches, served = {}, {}
        for row, folder in counters.items():
            served[row] = served_modules(folder)
            expected = str(Path(folders[row[2] if len(row) > 2 else NOW]).resolve())
            if served[row] != {os.path.join(expected, "plantstore.py")}:
                raise SystemExit(
                    f"{row}: the server imported {sorted(served[row])}, not the "
                    f"plantstore.py in {expected}"
                )
            if row[0] == "memory":
                continue
            store_class = {
                "sqlite": plantstore.SQLiteStore,
                "postgres": plantstore_postgres.PostgresStore,
            }[row[0]]
            batches[row] = {
                "counted": counted_batches(folder, store_class),
                "xmin": xmin_batches(databases[row]) if row[0] == "postgres" else None,
            }

        low = []  # one {server: its latencies in ms, and its bad answers} per round
        for round_number in range(low_rounds if low_rows else 0):
            low.append({})
            turn = round_number % len(low_rows)
            for row in low_rows[turn:] + low_rows[:turn]:
                pair = (
                    [(*row, "now"), (*row, "baseline")] if version else [(*row, "now")]
                )
                for server in pair[:: 1 if round_number % 2 else -1]:
                    latencies = {}
                    _, non_2xx, errors = run_wrk(
                        ports[server],
                        script,
                        low_seconds,
                        1,
                        id_base=(round_number + 1) * 10**12,
                        latencies=latencies,
                    )
                    low[-1][server] = {**latencies, "bad": non_2xx + errors}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        if postgres:
            postgres.remove()
    return {
        "loaded": loaded,
        "p99s": p99s,
        "shares": shares,
        "worst": worst,
        "batches": batches,
        "low": low,
        "low_rows": low_rows,
        "version": version,
        "groups": groups,
        "contenders": contenders,
        "postgres": bool(postgres),
    }


def print_durable(results, args):
    """Section 5's two tables, the ratios of issue 31's bars (and issue 44's, with
    --against), and how each figure was taken."""
    loaded, worst, batches = results["loaded"], results["worst"], results["batches"]
    contenders, others = results["contenders"], results["contenders"][1:]

    def label(row):
        if row == PGBENCH:
            return f"PostgreSQL, pgbench -c {args.connections}"
        return f"{STORE_NAMES[row[0]]}, {server_label(row[1], row[0])}"

    def rows_of(group):
        return [group if c == NOW else (*group, c) for c in contenders]

    print(
        f"\nDurable creates over HTTP, wrk -t1 -c{args.connections} unique creates, "
        f"{args.durable_rounds} interleaved rounds of {args.durable_seconds} s; "
        f"requests/s is the median round, vs memory the median ratio within a round to "
        f"the in-memory store under the same server, p99 the worst round's, max the "
        f"longest wait; a batch is the creates written by one commit:"
    )
    if others:
        print(
            f"  each row's contenders run back to back, each first in turn: this "
            f"checkout ({NOW}) and {', '.join(others)} (--against); vs {others[0]} is "
            f"the median ratio within a round to {others[0]} under the same server"
        )
    print(
        f"  {'store, server':<38} {'requests/s':>10}  {'vs memory':>9}  {'p99 ms':>7}  "
        f"{'max ms':>7}  {'non-2xx/err':>11}  {'batch median':>12} {'mean':>5} "
        f"{'max':>4}" + (f"  {'vs ' + others[0]:>16}" if others else "")
    )
    for group in results["groups"]:
        for row in rows_of(group):
            rps = statistics.median(sample[row] for sample in loaded)
            name = label(row) if len(row) == 2 else f"  {row[2]}"
            memory = ("memory", *row[1:])
            versus = (
                f"{median_ratio(loaded, row, memory):>8.3f}x"
                if memory in worst
                else f"{'':>9}"
            )
            line = (
                f"  {name:<38} {rps:>10.0f}  {versus}  "
                f"{worst[row]['p99']:>7.1f}  {worst[row]['max']:>7.1f}  "
                f"{worst[row]['bad']:>11}"
            )
            line += "  " + (
                batch_figures(batches[row]["counted" if row[0] == "sqlite" else "xmin"])
                if row in batches
                else f"{'':>23}"
            )
            if others:
                line += f"  {median_ratio(loaded, row, (*group, others[0])):>15.3f}x"
            print(line)
    if results["postgres"]:
        rps = statistics.median(sample[PGBENCH] for sample in loaded)
        print(
            f"  {label(PGBENCH):<38} {rps:>10.0f}  (inserts/s of the same rows, one "
            f"transaction each, no HTTP)"
        )
    print(
        "  batches: PostgreSQL's read from its database after the rounds (the rows of "
        "one transaction share xmin); SQLite's counted in the serving processes, one "
        "per call of SQLStore._write_batch (benchmarks/batch_sizes.py)"
        + (
            ""
            if hasattr(plantstore.SQLiteStore, "_write_batch")
            else ", which this plantstore has not: n/a"
        )
    )
    for row in batches:
        if row[0] == "postgres" and batches[row]["counted"] is not None:
            median, mean, largest = batch_figures(batches[row]["counted"]).split()
            named = label(row) + (f" ({row[2]})" if len(row) > 2 else "")
            print(
                f"  {named}, its batches counted as SQLite's are: median "
                f"{median}, mean {mean}, largest {largest}"
            )
    bars = [  # those whose two rows ran
        (row, against, bar)
        for row, against, bar in BARS
        if row in worst
        and (against in worst or (against == PGBENCH and PGBENCH in loaded[0]))
    ]
    if bars:
        print("  the issue's bars, median ratios within a round:")
    for row, against, bar in bars:
        ratio = median_ratio(loaded, row, against)
        verdict = (
            f"  bar >= {bar}: {'met' if ratio >= bar else 'NOT met'}" if bar else ""
        )
        print(f"    {label(row) + ' / ' + label(against):<72} {ratio:>6.2f}x{verdict}")
    if others:
        print_against(results, label, rows_of)
    if differ := [store for store in unlike_the_unit() if store in args.stores]:
        print(
            f"  granian's flags for "
            f"{', '.join(STORE_NAMES[store] for store in differ)} are not those of "
            f"deploy/plantstore-granian.service (GRANIAN in this file)"
        )
    if results["low"]:
        print_low_load(results, label, args)


def print_against(results, label, rows_of):
    """Each round of each contender, and issue 44's bar: this checkout's rate at least
    AGAINST_BAR times the first --against contender's, as the median of the ratios
    within a round (a slow minute of the machine slows both sides of a ratio)."""
    loaded, p99s, shares = results["loaded"], results["p99s"], results["shares"]
    reference = results["contenders"][1]
    print(
        "  every round, in the order run (requests/s / p99 ms, and for a SQL store / "
        "the share of the creates its busiest process wrote: 50% is an even split "
        f"between two workers), and the ratio to {reference} within each round:"
    )
    for group in results["groups"]:
        print(f"    {label(group)}")
        for row in rows_of(group):
            rates = [sample[row] for sample in loaded]
            ratios = [
                sample[row] / sample[(*group, reference)]
                for sample in loaded
                if sample[(*group, reference)]
            ]
            print(
                f"      {row[2] if len(row) > 2 else NOW:<14} req/s "
                f"{min(rates):>6.0f}-{max(rates):<6.0f} median "
                f"{statistics.median(rates):>6.0f}  p99 "
                f"{min(p99s[row]):>6.1f}-{max(p99s[row]):<6.1f} median "
                f"{statistics.median(p99s[row]):>6.1f}  ratio "
                f"{min(ratios):.2f}-{max(ratios):.2f} median "
                f"{statistics.median(ratios):.2f}"
            )
            print(
                "        "
                + " ".join(
                    f"{rate:.0f}/{p99:.0f}"
                    + (f"/{share:.0%}" if share is not None else "")
                    for rate, p99, share in itertools.zip_longest(
                        rates, p99s[row], shares[row]
                    )
                )
            )
        if any(shares[group]):
            # Under gunicorn, the worker that accepts a connection serves it, and at
            # times one accepts all 16: no writer then waits for another process's,
            # and the rate is another. Each contender's rounds of each kind:
            for row in rows_of(group):
                kinds = [
                    (
                        "shared by the processes (busiest <= 75%)",
                        lambda share: share <= 0.75,
                    ),
                    ("served by one (busiest >= 95%)", lambda share: share >= 0.95),
                ]
                figures = []
                for name, kind in kinds:
                    picked = [
                        (sample[row], p99)
                        for sample, p99, share in zip(
                            loaded, p99s[row], shares[row], strict=True
                        )
                        if share is not None and kind(share)
                    ]
                    if picked:
                        figures.append(
                            f"{name}: {len(picked)} rounds, median "
                            f"{statistics.median(rate for rate, _ in picked):.0f}/s "
                            f"p99 {statistics.median(p99 for _, p99 in picked):.1f} ms"
                        )
                label_ = row[2] if len(row) > 2 else NOW
                print(f"      {label_:<14} " + "; ".join(figures))
        ratio = median_ratio(loaded, group, (*group, reference))
        print(
            f"      {NOW} / {reference}: {ratio:.2f}x, bar >= {AGAINST_BAR}: "
            f"{'met' if ratio >= AGAINST_BAR else 'NOT met'}"
        )


def print_low_load(results, label, args):
    """The low-load table: each row's median round, and its median ratios to the
    baseline's."""
    low, version = results["low"], results["version"]
    print(
        f"\nLow load, wrk -t1 -c1, one create at a time: {args.low_rounds} interleaved "
        f"rounds of {args.low_seconds} s; the median round's latencies",
        end="",
    )
    if version:
        print(
            f", and the median ratio within a round to the same server on plantstore "
            f"{version} (git {args.baseline[:12]}), run back to back with it, each "
            f"first every other round (the issue's bar: at most {LOW_LOAD_BAR:.2f}x):"
        )
    elif args.baseline:
        print(f" (no baseline: git showed no plantstore.py at {args.baseline}):")
    else:
        print(":")
    print(
        f"  {'store, server':<38} {'mean ms':>7}  {'p50 ms':>7}  {'p99 ms':>7}  "
        f"{'non-2xx/err':>11}"
        + (
            f"  {'vs ' + version + ': mean':>17}  {'p50':>6}  {'p99':>6}"
            if version
            else ""
        )
    )
    for row in results["low_rows"]:
        now, then = (*row, "now"), (*row, "baseline")
        for server in [now, then] if version else [now]:
            figures = [
                statistics.median(sample[server][name] for sample in low)
                for name in ("mean", "p50", "p99")
            ]
            line = (
                f"  {label(row) if server == now else '  the same on ' + version:<38} "
                f"{figures[0]:>7.2f}  {figures[1]:>7.2f}  {figures[2]:>7.2f}  "
                f"{sum(sample[server]['bad'] for sample in low):>11}"
            )
            if version and server == now:
                for name, width in ("mean", 16), ("p50", 5), ("p99", 5):
                    ratio = statistics.median(
                        sample[now][name] / sample[then][name] for sample in low
                    )

                    line += f"  {ratio:>{width}.2f}x"
            print(line)


# ---- 6. Listing at size ----


def bench_listing(plants):
    """Microseconds per page of 10 at three sizes; the whole listing's seconds, peak MB
    and the longest gap between creates made meanwhile."""
    application = None

    def page_micros(store, repeat=2000):
        nonlocal application
        application = plantstore.make_app([TOKEN], store=store)
        environ = request_environs(0, 1)[0]
        environ.update(REQUEST_METHOD="GET", QUERY_STRING="limit=10", CONTENT_LENGTH="")
        start_response = lambda *_: None  # noqa: E731 (a one-line WSGI callback)
        begin = time.perf_counter()
        for _ in range(repeat):
            b"".join(application(environ, start_response))
        return (time.perf_counter() - begin) / repeat * 1e6

    def filled(count):
        store = plantstore.PlantStore()
        for plant_id in range(count):
            store.add(plant_id, f"plant {plant_id}", "indoor")
        return store

    small, large = page_micros(filled(1000)), page_micros(store := filled(plants))
    for plant_id in range(plants * 9 // 10):
        store.delete(plant_id)
    after_deletes = page_micros(store)

    store = filled(plants)
    application = plantstore.make_app([TOKEN], store=store)
    environ = request_environs(0, 1)[0]
    environ.update(REQUEST_METHOD="GET", QUERY_STRING="", CONTENT_LENGTH="")

    def whole_listing():
        size = 0
        for chunk in application(environ, lambda *_: None):
            size += len(chunk)  # as a server would: written out, then let go
        return size

    # The time, and the creates on another thread meanwhile, first; then, apart, the
    # memory: tracemalloc slows every allocation, which would stretch the time and the
    # gaps many times.
    gaps, done = [], threading.Event()

    def create_meanwhile():
        last, plant_id = time.perf_counter(), plants
        while not done.is_set():
            store.add(plant_id, "meanwhile", None)
            now = time.perf_counter()
            gaps.append(now - last)
            last, plant_id = now, plant_id + 1
            time.sleep(0.0005)

    creator = threading.Thread(target=create_meanwhile)
    creator.start()
    begin = time.perf_counter()
    size = whole_listing()
    seconds = time.perf_counter() - begin
    done.set()
    creator.join()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    whole_listing()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {
        "small": small,
        "large": large,
        "after_deletes": after_deletes,
        "seconds": seconds,
        "peak_mb": peak / 1e6,
        "gap_ms": max(gaps) * 1e3,
        "bytes": size,
    }


# ---- Report ----


def names_of(choices):
    """An argparse type: a comma-separated subset of choices, in their order."""

    def names(text):
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        if not chosen or set(chosen) - set(choices):
            raise argparse.ArgumentTypeError(f"choose among {', '.join(choices)}")
        return tuple(name for name in choices if name in chosen)

    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="tiny counts, in process only (a smoke run)",
    )
    add(
        "--processes",
        type=int,
        default=3,
        help="fresh processes for the in-process rounds",
    )
    add("--rounds", type=int, default=11, help="in-process rounds per process")
    add(
        "--per-round", type=int, default=20_000, help="requests per contender per round"
    )
    add(
        "--http-seconds",
        type=int,
        default=1,
        help="wrk seconds per contender per round",
    )
    add("--http-rounds", type=int, default=60)
    add("--connections", type=int, default=16)
    add(
        "--plants",
        type=int,
        default=1_000_000,
        help="plants stored for the memory figure",
    )
    add("--store-rounds", type=int, default=5)
    add(
        "--store-per-round", type=int, default=2_000, help="creates per store per round"
    )
    add(
        "--durable-rounds",
        type=int,
        default=10,
        help="rounds of section 5 (durable creates)",
    )
    add(
        "--durable-seconds",
        type=int,
        default=2,
        help="wrk seconds per server per round",
    )
    add(
        "--low-rounds",
        type=int,
        default=10,
        help="rounds of section 5's low load (wrk -c1)",
    )
    add(
        "--low-seconds",
        type=int,
        default=1,
        help="wrk seconds per server per low-load round",
    )
    add(
        "--baseline",
        default=BASELINE,
        help=(
            "the git commit whose plantstore.py serves beside each low-load row"
            " ('': none)"
        ),
    )
    add(
        "--listing-plants",
        type=int,
        default=1_000_000,
        help="plants for section 6 (listing)",
    )
    add("--only", choices=["durable", "listing"], help="run one section alone")
    add(
        "--stores",
        type=names_of(STORES),
        default=STORES,
        help="section 5's stores, comma-separated (default: %(default)s)",
    )
    add(
        "--servers",
        type=names_of(SERVERS),
        default=SERVERS,
        help="section 5's servers, comma-separated (default: %(default)s)",
    )
    add(
        "--against",
        action="append",
        default=[],
        metavar="COMMIT_OR_FILE",
        help=(
            "serve this plantstore.py too, as a contender of each loaded row of "
            "section 5 in the same rounds: a git commit (6cbd149, 1.3.0) or the path "
            "of a copy of plantstore.py; repeatable, the first is what ratios and "
            f"issue 44's bar ({AGAINST_BAR}x) compare with"
        ),
    )
    # one process of section 1
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(in_process_rounds(args.rounds, args.per_round)))
        return 0
    if args.quick:
        args.processes, args.rounds, args.per_round = 2, 2, 200
        args.plants, args.store_rounds, args.store_per_round = 2_000, 2, 50
    workdir = tempfile.TemporaryDirectory(prefix="plantstore-bench-")

    print(
        f"plantstore {plantstore.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"
    )
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python benchmarks/bench_plantstore.py {command}")

    if args.quick:
        args.listing_plants = 20_000
    if args.only in (None, "listing"):
        listing = bench_listing(args.listing_plants)
        print("\nListing at size, in process, in-memory store:")
        print(f"  a page of 10 at 1,000 plants        {listing['small']:>8.1f} us")
        print(
            f"  a page of 10 at {args.listing_plants:<,} plants "
            f"{listing['large']:>10.1f} us  "
            f"({listing['large'] / listing['small']:.2f}x)"
        )
        print(
            f"  the same after deleting the oldest 90% "
            f"{listing['after_deletes']:>5.1f} us  "
            f"({listing['after_deletes'] / listing['small']:.2f}x)"
        )
        print(
            f"  the whole listing at {args.listing_plants:,} plants: "
            f"{listing['seconds']:.2f} s, {listing['bytes'] / 1e6:.0f} MB sent, "
            f"{listing['peak_mb']:.1f} MB more memory at its peak, creates on another "
            f"thread at most {listing['gap_ms']:.1f} ms apart"
        )
    if args.only == "listing":
        return 0
    if not args.quick and args.only in (None, "durable"):
        results = bench_durable(
            args.durable_rounds,
            args.durable_seconds,
            args.connections,
            args.low_rounds,
            args.low_seconds,
            args.baseline,
            workdir.name,
            stores=args.stores,
            servers=args.servers,
            against=args.against,
        )
        print_durable(results, args)
    if args.only == "durable":
        return 0

    micro = bench_in_process(args.processes, args.rounds, args.per_round)
    print(
        f"\nIn process, median of {args.processes * args.rounds} interleaved rounds of "
        f"{args.per_round} valid creates ({args.processes} fresh processes x "
        f"{args.rounds}):"
    )
    print(
        f"  {'contender':<12} {'us/request':>10}  {'vs ceiling':>10}  "
        f"{'vs plantstore':>13}"
    )
    for name, (micros, vs_ceiling, vs_plantstore) in micro.items():
        print(
            f"  {name:<12} {micros:>10.2f}  {vs_ceiling:>9.2f}x  "
            f"{vs_plantstore:>12.2f}x"
        )

    stores = bench_stores(
        args.store_rounds,
        args.store_per_round,
        os.path.join(workdir.name, "inproc.sqlite3"),
    )
    print(
        f"\nStores in process, median of {args.store_rounds} interleaved rounds of "
        f"{args.store_per_round} creates:"
    )
    for name, (rate, vs_memory) in stores.items():
        print(f"  {name:<12} {rate:>10.0f} creates/s  {vs_memory:>6.3f}x")

    if not args.quick:
        rates, granian = bench_http(
            args.http_rounds,
            args.http_seconds,
            args.connections,
            os.path.join(workdir.name, "http.sqlite3"),
        )
        print(
            f"\nOver HTTP on loopback, wrk -t1 -c{args.connections}, median of "
            f"{args.http_rounds} interleaved {args.http_seconds} s rounds (gunicorn "
            f"-w 1 --threads 8, gthread; {server_label('granian', 'memory')}):"
        )
        print(
            f"  {'server':<24} {'requests/s':>10}  {'vs ceiling':>10}  "
            f"{'non-2xx or errors':>17}"
        )

        print(
            "  (the SQLite row runs 4 workers x 4 threads: gunicorn -w 4 --threads 4)"
        )
        for kind, label in [
            ("plantstore", "gunicorn plantstore:app"),
            ("ceiling", "gunicorn ceiling"),
            ("granian", "granian plantstore:app"),
            ("granian-ceiling", "granian ceiling"),
            ("embedded", "python plantstore.py"),
            ("sqlite", "gunicorn -w 4, SQLite"),
        ]:
            rps, vs_ceiling, bad = rates[kind]
            print(f"  {label:<24} {rps:>10.0f}  {vs_ceiling:>9.3f}x  {bad:>17}")
        print(
            f"  granian plantstore:app: {granian['vs gunicorn']:.2f}x "
            f"gunicorn plantstore:app, {granian['vs its ceiling']:.3f}x the ceiling "
            f"app under granian (which is {granian['ceilings']:.2f}x the ceiling under "
            f"gunicorn); median ratios within a round"
        )

    per_plant = bench_memory(args.plants)
    print(
        f"\nMemory: {per_plant:.0f} bytes per stored plant at {args.plants:,} plants "
        f"({per_plant * 1e6 / 1e6:.0f} MB per million)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
