"""The real components the tests and the benchmarks start, and the helpers and the
tables the test files share; nothing here is a test. The fixtures `spawn`, `postgres`,
`pg_url`, `receiver` and `runbook`, and those of the app in process, `store`, `app`,
`any_store` and `webhook_app`, are defined here and registered for the suite by
conftest.py; the benchmarks import `Postgres` and the rest from here. Each is always
stopped: every subprocess (plantstore.py, 1.3.0's too, gunicorn, granian, uWSGI,
waitress, cheroot, werkzeug, nginx, prometheus, a runbook's block) is started by `spawn`
in a session of its own, and when the test ends, its whole process group is killed
(SIGKILL), workers included; the suite's PostgreSQL (`Postgres`: initdb and pg_ctl in a
temporary folder, on a free loopback port) is started once, by the session fixture
`postgres`, and stopped with its folder removed when the session ends, on SIGTERM too,
while a benchmark that starts one removes it itself, in a `finally`; each webhook
`Receiver` is shut down by the `receiver` fixture; and `run_plantstore` kills the
process it started before it returns.

psycopg, standardwebhooks and prometheus_client, and the modules of the full service,
are imported where they are used, not at the top: test_plantstore.py, the core's tests,
runs with none of them loaded, beside plantstore.py alone."""

import base64
import collections
import contextlib
import fcntl
import glob
import http.client
import http.server
import io
import itertools
import json
import os
import queue
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest
import webtest

import plantstore
from plantstore import INT64_MAX, JSON_TYPE, MemoryStore

TOKEN = "test-token-1-a7Qm9xZ2"
# What Kubernetes sets in every pod of a namespace with a Service named plantstore (its
# port 80, named http) and one named plantstore-db (5432): no setting of plantstore's
SERVICE_LINKS = {
    **{
        f"PLANTSTORE{service}_{name}": value.format(address=address, port=port)
        for service, address, port in [
            ("", "10.0.0.11", 80),
            ("_DB", "10.0.0.12", 5432),
        ]
        for name, value in {
            "SERVICE_HOST": "{address}",
            "SERVICE_PORT": "{port}",
            "PORT": "tcp://{address}:{port}",
            f"PORT_{port}_TCP": "tcp://{address}:{port}",
            f"PORT_{port}_TCP_PROTO": "tcp",
            f"PORT_{port}_TCP_PORT": "{port}",
            f"PORT_{port}_TCP_ADDR": "{address}",
        }.items()
    },
    "PLANTSTORE_SERVICE_PORT_HTTP": "80",
}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HERE = Path(__file__).resolve().parent
WAIT = 30  # seconds any test waits for a server or a subprocess before failing


# ---- Subprocesses: each in a session of its own, its group killed at the end ----


def processes_in_group(group):
    """The process ids of a process group still running (a zombie has ended)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # it ended meanwhile
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            state, _, pgrp = stat.read_text().rpartition(")")[2].split()[:3]
            if int(pgrp) == group and state != "Z":
                running.append(int(stat.parent.name))
    return running


@pytest.fixture
def spawn():
    """Start subprocesses in this folder; always kill the ones still running."""
    processes = []

    def start(args, env, cwd=HERE, pass_fds=(), stderr=subprocess.PIPE):
        process = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            pass_fds=pass_fds,  # a listening socket a test holds, as systemd does
        )
        processes.append(process)
        return process

    start.processes = processes
    yield start
    for process in processes:
        # the process and any workers it forked; once the process is reaped and its
        # workers are gone, the group's number may be another program's
        if process.returncode is None or processes_in_group(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(WAIT)
        process.stdout.close()
        if process.stderr:  # None: the test gave a stream of its own
            process.stderr.close()


class Lines:
    """Read a subprocess stream line by line in a thread, with a deadline on each
    line."""

    def __init__(self, stream):
        self.queue = queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        with contextlib.suppress(ValueError):  # closed by spawn's end, as it is read
            for line in stream:
                self.queue.put(line)
        self.queue.put(None)

    def until(self, pattern):
        """Return the first match of pattern in the lines to come; fail at EOF or after
        WAIT seconds."""
        while True:
            line = self.queue.get(timeout=WAIT)
            assert line is not None, f"stream ended before {pattern!r}; saw {self.seen}"
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match

    def rest(self):
        while (line := self.queue.get(timeout=WAIT)) is not None:
            self.seen.append(line)
        return "".join(self.seen)

    def so_far(self):
        """Every line read until now, waiting for none."""
        with contextlib.suppress(queue.Empty):
            while (line := self.queue.get_nowait()) is not None:
                self.seen.append(line)
        return "".join(self.seen)


@contextlib.contextmanager
def tmpfs(folder, megabytes=4):
    """A tmpfs of its own at folder (made here) while the block runs."""
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=700", "tmpfs"]
    subprocess.run([*mount, str(folder)], check=True, timeout=WAIT)
    try:
        yield folder
    finally:  # lazily: a process killed a moment ago may still hold a file there
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=WAIT)


def fill(folder):
    """Fill the filesystem of folder to its last byte, with its file "filler": a write
    that needs room then fails (ENOSPC), until the filler is removed."""
    with open(folder / "filler", "wb", buffering=0) as filler:
        free = os.statvfs(folder)
        os.posix_fallocate(filler.fileno(), 0, free.f_bavail * free.f_frsize)
        filler.seek(0, os.SEEK_END)
        with pytest.raises(OSError):  # to the last byte
            for _ in range(4096):
                filler.write(b"\0" * 512)


def environ_without_tokens(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PLANTSTORE_TOKENS", "PLANTSTORE_DB", "WEB_CONCURRENCY")
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(condition, what, seconds=WAIT):
    """Wait for condition(), failing after `seconds` with `what` (or what(), said as
    things are then)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def wait_listening(process, port):
    deadline = time.monotonic() + WAIT
    while True:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
            return
        assert process.poll() is None and time.monotonic() < deadline, (
            "the server is not listening"
        )
        time.sleep(0.05)


# ---- PostgreSQL: a server of the suite's own, started once, removed at the end ----


class Postgres:
    """A PostgreSQL server of the suite's own: initdb in a temporary folder, pg_ctl on a
    free loopback port."""

    listen = "127.0.0.1"  # its listen_addresses
    # the command that runs a program on the server's host (ip netns exec NS); () for
    # this one
    inside = ()

    def __init__(self, durable=False):
        # the tests need no fsync; the benchmark measures PostgreSQL as shipped
        self.durable = durable
        self.folder = Path(tempfile.mkdtemp(prefix="plantstore-pg-"))
        self.as_postgres = [*self.inside]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(self.folder, "postgres")
            self.as_postgres += ["runuser", "-u", "postgres", "--"]
        # through a file: never on a command line
        self.password = secrets.token_urlsafe(18)
        password_file = self.folder / "password"
        password_file.write_text(self.password)
        password_file.chmod(0o600)
        if self.as_postgres:
            shutil.chown(password_file, "postgres")
        self.port = free_port()
        self._pg(
            "initdb",
            "-D",
            self.folder / "data",
            "-U",
            "plantstore",
            "--pwfile",
            password_file,
            "-A",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        password_file.unlink()
        self.start()
        self.url = (
            f"postgresql://plantstore:{self.password}@127.0.0.1:{self.port}/plantstore"
        )
        try:
            with self.local("postgres") as db:
                db.execute("CREATE DATABASE plantstore")
        except BaseException:  # started, but of no use: never leave it running
            self.remove()
            raise

    def local(self, database="plantstore"):
        """A connection through the server's Unix socket: it reaches a server on any
        host, whatever its network."""
        import psycopg  # here, not at the top: see this file's docstring

        return psycopg.connect(
            host=str(self.folder),
            port=self.port,
            dbname=database,
            user="plantstore",
            password=self.password,
            autocommit=True,
        )

    def _pg(self, program, *args, env=None):
        binary = shutil.which(program) or max(
            glob.glob(f"/usr/lib/postgresql/*/bin/{program}"),
            key=lambda path: int(path.split("/")[4]),
            default=program,
        )
        subprocess.run(
            [*self.as_postgres, binary, *map(str, args)],
            check=True,
            timeout=WAIT * 2,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )

    def start(self):
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses={self.listen}"
            " -c max_connections=200"
        )
        self._pg(
            "pg_ctl",
            "-D",
            self.folder / "data",
            "-l",
            self.folder / "log",
            "-w",
            "-t",
            WAIT,
            "start",
            "-o",
            options if self.durable else f"{options} -c fsync=off",
        )

    def stop(self):
        self._pg(
            "pg_ctl", "-D", self.folder / "data", "-w", "-t", WAIT, "-m", "fast", "stop"
        )

    def remove(self):
        with contextlib.suppress(Exception):
            self._pg("pg_ctl", "-D", self.folder / "data", "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)

    def reset(self):
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute("DROP TABLE IF EXISTS plants, plant_events, plant_event_counts")


# pytest registers a fixture again in each file that imports it, each registration
# with a value of its own; conftest.py imports the one below, for the whole suite. Were
# another file to import it too, every registration would hold this one server, and
# the last to let go of it would stop it.
SUITE_POSTGRES = SimpleNamespace(server=None, holders=0)


@pytest.fixture(scope="session")
def postgres():
    """Started once for the suite, always stopped; no skip: if it cannot start, the
    tests that need it fail."""
    # A run stopped with SIGTERM (a timeout, say) still tears down, and so stops this
    # server.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    if SUITE_POSTGRES.server is None:
        SUITE_POSTGRES.server = Postgres()
    SUITE_POSTGRES.holders += 1
    try:
        yield SUITE_POSTGRES.server
    finally:
        SUITE_POSTGRES.holders -= 1
        if not SUITE_POSTGRES.holders:
            SUITE_POSTGRES.server.remove()
            SUITE_POSTGRES.server = None
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def pg_url(postgres):
    """The suite's database, emptied for this test."""
    postgres.reset()
    return postgres.url


def cluster_pids(postgres):
    """The postmaster of the suite's PostgreSQL and every process it started (its
    backends among them)."""
    postmaster = int(
        (postgres.folder / "data" / "postmaster.pid").read_text().split()[0]
    )
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if int(stat.read_text().rpartition(")")[2].split()[1]) == postmaster:
                children.append(int(stat.parent.name))
    return [postmaster, *children]


@contextlib.contextmanager
def frozen_postgres(postgres):
    """Every process of the suite's PostgreSQL stopped (SIGSTOP) for the block: a
    database that takes connections and statements and answers nothing. Always
    continued (SIGCONT) after it."""
    stopped = []
    try:
        postmaster = cluster_pids(postgres)[0]
        os.kill(postmaster, signal.SIGSTOP)  # first: stopped, it starts no process
        stopped.append(postmaster)
        for pid in cluster_pids(postgres)[1:]:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def make_read_only(path, read_only):
    """Make a file read-only even for root, who ignores permission bits (chattr +i), or
    writable again."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if read_only else "-i", str(path)], check=True)
    else:
        os.chmod(path, 0o444 if read_only else 0o644)


def read_database(db, query):
    """Rows read straight from the database, with no plantstore in between."""
    if db.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(db) as connection:
            return connection.execute(query).fetchall()
    with contextlib.closing(sqlite3.connect(db)) as connection:
        return connection.execute(query).fetchall()


def stored_plants(db):
    """{id: name} of every plant the database holds."""
    return {
        plant_id: bytes(name).decode()
        for plant_id, name in read_database(db, "SELECT id, name FROM plants")
    }


# ---- plantstore under the servers a user may pick, and nginx in front ----


def serve_plantstore(spawn, env):
    """python plantstore.py on a free port; return the process, its address and its
    stderr lines."""
    process = spawn([sys.executable, "plantstore.py", "--port", "0"], env)
    err = Lines(process.stderr)
    return (
        process,
        *err.until(r"listening on http://([\d.]+):(\d+)/plants").groups(),
        err,
    )


def stop_service(process):
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(WAIT) == 0


def run_plantstore(tmp_path, **settings):
    """Start python plantstore.py in tmp_path; return its exit code (None: it serves)
    and lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANTSTORE_")}
    process = subprocess.Popen(
        [sys.executable, HERE / "plantstore.py", "--port", "0"],
        cwd=tmp_path,
        env={**env, "PYTHONUNBUFFERED": "1", "PLANTSTORE_TOKENS": TOKEN, **settings},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines, err = [], Lines(process.stderr)
        while not lines or "listening on" not in lines[-1]:
            line = err.queue.get(timeout=WAIT)
            if line is None:
                return process.wait(WAIT), lines
            lines.append(line)
        return None, lines
    finally:
        process.kill()
        process.wait(WAIT)  # the reading thread then meets the end of the stream


def start_gunicorn(
    spawn, env, workers=1, threads=8, *options, inside=(), address="127.0.0.1"
):
    """Start gunicorn on a free port of `address` (on the host `inside` runs programs
    on: this one by default); return (process, host, port, its stderr lines) once all
    workers boot."""
    process = spawn(
        [
            *inside,
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            str(workers),
            "--threads",
            str(threads),
            "--no-control-socket",  # as the docs run it: no $HOME/.gunicorn of root's
            *options,
            "-b",
            f"{address}:0",
            "plantstore:app",
        ],
        env,
    )
    err = Lines(process.stderr)
    host, port = err.until(r"Listening at: http://([\d.]+):(\d+)").groups()
    for _ in range(workers):
        err.until(r"Booting worker")
    return process, host, port, err


def granian_recipe(store):
    """granian's flags from deploy/plantstore-granian.service: its ExecStart (memory),
    or a commented one."""
    unit = (HERE / "deploy" / "plantstore-granian.service").read_text()
    lines = {
        "memory": r"^ExecStart=\S*granian (.*) plantstore:app$",
        "sqlite": r"^#\s*SQLite:\s*ExecStart=\S*granian (.*) plantstore:app$",
        "postgres": r"^#\s*PostgreSQL:\s*ExecStart=\S*granian (.*) plantstore:app$",
    }
    match = re.search(lines[store], unit, re.MULTILINE)
    assert match, (
        f"deploy/plantstore-granian.service has no {store} ExecStart line: "
        f"change the test with it"
    )
    flags = match[1].split()
    assert flags[flags.index("--host") + 1] == "127.0.0.1" and "--port" in flags
    return flags


def granian_command(store, port=None):
    """The command line of the recipe for that store, on a free loopback port (or the
    one given)."""
    flags = granian_recipe(store)
    flags[flags.index("--port") + 1] = str(port or free_port())
    return [sys.executable, "-m", "granian", *flags, "plantstore:app"]


def start_granian(spawn, env, store="memory"):
    """granian with the recipe's flags on a free loopback port; return it once every
    worker has started.

    The answer has the process, its port, its log (granian logs to stdout; Python's
    tracebacks go to stderr) and its workers' process ids.
    """
    command = granian_command(store)
    process = spawn(command, env)
    port = int(command[command.index("--port") + 1])
    log = Lines(process.stdout)
    workers = int(command[command.index("--workers") + 1])
    pids, started = {}, set()
    while len(started) < workers:  # each worker's runtime is up: it accepts connections
        spawned, pid, ready = log.until(
            r"Spawning worker-(\d+) with PID: (\d+)|Started worker-(\d+) runtime"
        ).groups()
        if spawned:
            pids[int(spawned)] = int(pid)
        else:
            started.add(int(ready))
    deadline = time.monotonic() + WAIT
    while True:  # and the socket listens
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
            break
        assert process.poll() is None and time.monotonic() < deadline, (
            f"granian is not listening: {log.seen}"
        )
        time.sleep(0.05)
    return SimpleNamespace(
        process=process, port=port, log=log, pids=[pids[n] for n in sorted(pids)]
    )


def serve_batches(spawn, server, database, db, **settings):
    """gunicorn -w 2 --threads 4, or granian with the recipe for the store; return
    (process, (host, port))."""
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=db, **settings)
    if server == "gunicorn":
        process, host, port, _ = start_gunicorn(spawn, env, 2, 4)
        return process, (host, port)
    started = start_granian(spawn, env, database)
    return started.process, ("127.0.0.1", started.port)


FIRST_RETRY_AFTER = """\
# Written by testbed.first_retry_after for one test: the webhook schedule's first step
# shortened in every Python process started with this folder on PYTHONPATH, set as the
# class is made in plantstore_webhooks, so before any app is built, whatever server
# imports plantstore, and under `python plantstore.py` too.
import builtins

_build_class = builtins.__build_class__


def _build(function, name, /, *bases, **keywords):
    made = _build_class(function, name, *bases, **keywords)
    if name == "WebhookSender" and made.__module__ == "plantstore_webhooks":
        made.SCHEDULE = ({seconds!r}, *made.SCHEDULE[1:])
    return made


builtins.__build_class__ = _build
"""


def first_retry_after(folder, seconds):
    """A folder to put first on a server's PYTHONPATH (its sitecustomize.py, above) so
    that a failed attempt is retried `seconds` later rather than after
    WebhookSender.SCHEDULE's first step (5 s), the rest of the schedule as it is: for a
    test whose events a restart finds not yet due, which must wait for them. A Python
    started with -E, -I or -S reads none of it: its schedule is the shipped one."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(FIRST_RETRY_AFTER.format(seconds=seconds))
    return folder


def start_a_server(kind, spawn, env, database, pythonpath=()):
    """Start plantstore under one of the servers a user may pick, as its documentation
    says, on a free loopback port; return it once it accepts connections, with no
    request sent. `pythonpath`: folders to look in before this one, such as
    first_retry_after's.

    The answer has the process, its host and port, and output(): all it printed, once
    it has ended.
    """
    # plantstore: this folder's, on any server
    env = {**env, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(HERE)])}
    if kind == "python-plantstore-py":
        process = spawn([sys.executable, "plantstore.py", "--port", "0"], env)
        log = Lines(process.stderr)
        host, port = log.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
        logs = [log, Lines(process.stdout)]
    elif kind == "granian":
        server = start_granian(spawn, env, database)
        process, host, port = server.process, "127.0.0.1", server.port
        logs = [server.log, Lines(process.stderr)]
    elif kind in ("gunicorn", "gunicorn-preload"):
        process, host, port, log = start_gunicorn(
            spawn, env, 2, 4, *(["--preload"] if kind == "gunicorn-preload" else [])
        )
        logs = [log, Lines(process.stdout)]
    else:
        host, port = "127.0.0.1", free_port()
        process = spawn(other_server_command(kind, port), env)
        logs = [Lines(process.stdout), Lines(process.stderr)]
        # a connection, and no request: the test is that none is needed
        wait_listening(process, port)
    return SimpleNamespace(
        process=process,
        host=host,
        port=port,
        output=lambda: "".join(log.rest() for log in logs),
    )


def other_server_command(kind, port):
    """The command docs/deploy.md gives for uWSGI, waitress, cheroot or werkzeug, on
    this loopback port, with this Python's virtualenv and the commands it installed."""
    table = (HERE / "docs" / "deploy.md").read_text()
    row = re.search(rf"^\| {kind} \| `([^`]+)`", table, re.IGNORECASE | re.MULTILINE)
    assert row, f"docs/deploy.md has no row for {kind}: change the test with it"
    assert "127.0.0.1:8000" in row[1] or "'127.0.0.1', 8000" in row[1], row[1]
    program, *args = shlex.split(row[1].replace("8000", str(port)))
    scripts = Path(sysconfig.get_path("scripts"))
    return [
        sys.executable if program == "python" else scripts / program,
        *(arg.replace("/path/to/venv", sys.prefix) for arg in args),
    ]


def nginx_binary():
    found = shutil.which("nginx") or next(
        (path for path in ("/usr/sbin/nginx",) if os.path.exists(path)), None
    )
    assert found, (
        "nginx is not installed: apt-get install nginx-light (.ci/run does it)"
    )
    return found


def start_nginx(spawn, folder, upstreams, logged="", changed=()):
    """nginx with the shipped deploy/nginx.conf, its ports and paths substituted, in
    front of the gunicorns at `upstreams` (host:port, one or two); `logged`: http-level
    lines the test adds; `changed`: (shipped line, the test's) for a test of a
    mechanism, not of the shipped figure. Return its loopback port."""
    port = free_port()
    config = (HERE / "deploy" / "nginx.conf").read_text()
    substitutions = [
        # workers as the test's own user
        ("user www-data;", "user root;" if os.geteuid() == 0 else ""),
        ("pid /run/nginx.pid;", f"pid {folder}/nginx.pid;"),
        ("/var/log/nginx/", f"{folder}/"),
        ("listen 80 default_server;", f"listen 127.0.0.1:{port} default_server;"),
        ("server 127.0.0.1:8000 ", f"server {upstreams[0]} "),
        *(
            [("# server 10.0.0.2:8000 ", f"server {upstreams[1]} ")]
            if len(upstreams) > 1
            else []
        ),
        (
            "http {",
            f"http {{\n    client_body_temp_path {folder}/body;"
            f" proxy_temp_path {folder}/proxy;\n{logged}",
        ),
        *changed,
    ]
    for shipped, local in substitutions:
        assert shipped in config, (
            f"deploy/nginx.conf no longer has {shipped!r}: change the test with it"
        )
        config = config.replace(shipped, local)
    (folder / "nginx.conf").write_text(config)
    nginx = spawn(
        [
            nginx_binary(),
            "-p",
            str(folder),
            "-c",
            str(folder / "nginx.conf"),
            "-e",
            str(folder / "error.log"),
            "-g",
            "daemon off;",
        ],
        environ_without_tokens(),
    )
    deadline = time.monotonic() + WAIT
    while True:
        assert nginx.poll() is None, (
            f"nginx did not start: {(folder / 'error.log').read_text()}"
        )
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port
        assert time.monotonic() < deadline
        time.sleep(0.05)


# ---- Requests: in WebTest, and over HTTP ----


def post(app, body, status, *, headers=AUTH, content_type="application/json", **kwargs):
    """POST body to /plants: bytes as they are, anything else as JSON."""
    if not isinstance(body, bytes):
        body = json.dumps(body)
    return app.post(
        "/plants",
        body,
        headers=headers,
        content_type=content_type,
        status=status,
        expect_errors=status >= 400,
        **kwargs,
    )


def assert_error(response, status, message_part=""):
    """Assert a JSON Error body (spec's Error shape, `error` the status) with a sound
    Content-Length."""
    assert response.status_int == status
    assert response.content_type == "application/json"
    assert int(response.headers["Content-Length"]) == len(response.body)
    assert set(response.json) == {"error", "message"}
    assert response.json["error"] == status
    assert isinstance(response.json["message"], str) and response.json["message"]
    assert message_part in response.json["message"]
    assert "Traceback" not in response.json["message"]


def assert_405_with_the_allow_of_options_before_auth(app, path):
    """Every method path's route lacks is a 405 with the Allow its OPTIONS sends, and
    no challenge: the token is not looked at."""
    allow = app.options(path, status=204).headers["Allow"]
    for method in sorted(HTTP_METHODS - set(allow.split(", "))):
        response = app.request(path, method=method, status=405, expect_errors=True)
        if method != "HEAD":  # which has no body
            assert_error(response, 405)
        assert response.headers["Allow"] == allow, method
        assert "WWW-Authenticate" not in response.headers, method


def assert_options_204_with_allow(app, path):
    response = app.options(path, status=204)
    assert response.headers["Allow"] and response.body == b""
    assert (
        "Content-Type" not in response.headers
        and "Content-Length" not in response.headers
    )
    assert not any(name.startswith("Access-Control") for name in response.headers)


def assert_head_as_get(application, path, headers, status):
    """HEAD on path (its query included) answers the status and the headers GET does,
    Content-Length included, and no body bytes at all."""
    path, _, query = path.partition("?")
    environ = {
        "HTTP_AUTHORIZATION": headers.get("Authorization", ""),
        "QUERY_STRING": query,
    }
    got, got_headers, body = call(
        application, method="HEAD", path=path, environ=environ
    )
    expected = call(application, method="GET", path=path, environ=environ)
    assert got == status == expected[0] and body is None
    assert got_headers == expected[1]


def assert_unavailable(response):
    assert_error(response, 503, "database")
    assert int(response.headers["Retry-After"]) > 0


def next_link(response):
    """The target of a rel="next" Link header, or None."""
    match = re.fullmatch(r'<([^>]+)>; rel="next"', response.headers.get("Link", ""))
    return match and match[1]


def in_threads(count, work):
    """Run work(n) for n in range(count) in as many threads, released together; return
    the results."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(n):
        barrier.wait()
        results[n] = work(n)

    pool = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(WAIT)
    return results


def exchange(host, port, method, path, document=None, *, token=TOKEN, headers=None):
    """Send one request; return (status, headers, decoded JSON body or None)."""
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    try:
        body = None if document is None else json.dumps(document)
        connection.request(
            method,
            path,
            body,
            {
                "Content-Type": "application/json",
                "Authorization": f"Bearer {token}",
                **(headers or {}),
            },
        )
        response = connection.getresponse()
        data = response.read()
        return (
            response.status,
            dict(response.getheaders()),
            json.loads(data) if data else None,
        )
    finally:
        connection.close()


def over_http(host, port, token, method, path, document=None):
    """Send one request; return (status, decoded JSON body or None)."""
    status, _, body = exchange(host, port, method, path, document, token=token)
    return status, body


def post_over_http(host, port, token, document):
    return over_http(host, port, token, "POST", "/plants", document)


def listed_ids(host, port):
    status, plants = over_http(host, port, TOKEN, "GET", "/plants")
    assert status == 200
    return [int(plant["name"].split()[1]) for plant in plants]


class Creates:
    """Threads that create plants over HTTP until stopped; `answered` lists, in turn,
    each id answered 200, and `statuses` counts the answers, and the errors met instead
    (a reset, a refused connection) by their names."""

    def __init__(self, host, port, threads=4):
        self.answered, self.statuses, self._stop = (
            [],
            collections.Counter(),
            threading.Event(),
        )
        ids = itertools.count(random.randrange(10**15))
        self._threads = [
            threading.Thread(target=self._create, args=(host, port, ids))
            for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _create(self, host, port, ids):
        while not self._stop.is_set():
            plant_id = next(ids)
            try:
                status = post_over_http(
                    host, port, TOKEN, {"id": plant_id, "name": f"steady {plant_id}"}
                )[0]
            except (OSError, http.client.HTTPException) as error:
                status = type(error).__name__
            self.statuses[status] += 1
            if status == 200:
                self.answered.append(plant_id)

    def wait_for(self, count):
        deadline = time.monotonic() + WAIT
        while len(self.answered) < count:
            assert time.monotonic() < deadline, (
                f"{len(self.answered)} of {count} creates answered"
            )
            time.sleep(0.01)
        return set(self.answered)

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT)
        return set(self.answered)


def raw_request(document, *, content_length=None, token=TOKEN):
    body = (
        json.dumps(document).encode() if not isinstance(document, bytes) else document
    )
    length = len(body) if content_length is None else content_length
    head = (
        f"POST /plants HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    return head.encode() + body


def read_raw(sock):
    """Read until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_status(sock):
    """Read a whole HTTP response from sock and return (status, body)."""
    head, _, body = read_raw(sock).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def timed_exchange(address, method, path, document=None):
    """(seconds from sending to the whole answer, status, headers, body); the status
    is the error's repr when no whole HTTP answer came."""
    sent = time.monotonic()
    try:
        answer = exchange(*address, method, path, document)
    except (OSError, http.client.HTTPException, ValueError) as error:
        answer = repr(error), {}, None
    return time.monotonic() - sent, *answer


# ---- The app in process: the fixtures and the tables several test files share ----
#
# `store`, `app`, `any_store` and `webhook_app` are registered by conftest.py, as the
# fixtures above. test_plantstore.py has an `app` of its own, which overrides this one
# there: the core alone, plantstore.Application, with nothing make_app adds.

OTHER_TOKEN = "test-token-2-Lp4Wc8Rt"


@pytest.fixture
def store():
    from plantstore_accelerators import ChunkedStore

    return ChunkedStore()


@pytest.fixture
def app(store):
    """The whole service as make_app builds it (the document, /metrics), in WebTest,
    lint on: anything written to wsgi.errors fails the test."""
    from plantstore_app import make_app

    return webtest.TestApp(make_app([TOKEN, OTHER_TOKEN], store=store))


@pytest.fixture(params=["memory", "chunked", "sqlite", "postgres"])
def any_store(request, tmp_path):
    """Each store, held to the same behaviour: the core's MemoryStore, make_app's
    ChunkedStore, SQLite and PostgreSQL."""
    from plantstore_accelerators import ChunkedStore
    from plantstore_sqlite import SQLiteStore

    if request.param == "postgres":
        from plantstore_postgres import PostgresStore  # psycopg: only where it is used

        return PostgresStore(request.getfixturevalue("pg_url"))
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "plants.sqlite3")
    return {"memory": MemoryStore, "chunked": ChunkedStore}[request.param]()


@pytest.fixture
def webhook_app(monkeypatch):
    """make_app with webhooks, on a schedule short enough for a test; its sender is
    always closed."""
    import plantstore_webhooks
    from plantstore_app import make_app

    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (0.2, 0.2, 0.2))
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "PROBE_SECONDS", 0.3)
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "POLL_SECONDS", 0.05)
    apps = []

    def build(store, *urls, secret=SECRET):
        apps.append(
            make_app(
                [TOKEN], store=store, webhook_urls=list(urls), webhook_secret=secret
            )
        )
        return webtest.TestApp(apps[-1])

    yield build
    # a test that waits for what close() delivers calls it itself: here, at the end,
    # nothing is waited for
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "CLOSE_SECONDS", 0)
    for application in apps:
        application.webhook_sender.close()


def listed(store, limit=None):
    """Up to `limit` (None: all) (name, tag) pairs a store holds, oldest first."""
    plants = store.page(None, INT64_MAX if limit is None else limit)
    return [(name, tag) for _, name, tag in plants]


def stored(store):
    """What an in-memory store holds, by id: (name, tag)."""
    if isinstance(store, plantstore.MemoryStore):  # id: (seq, name, tag)
        return {plant_id: plant[1:] for plant_id, plant in store._plants.items()}
    plants = {seq: (name, tag) for seq, name, tag in store.page(None, INT64_MAX)}
    return {plant_id: plants[seq] for plant_id, seq in store._seq.items()}


def call(
    application, *, method="POST", path="/plants", body=b"", environ=None, validate=True
):
    """Call a WSGI application directly, under wsgiref's validator; return (status,
    headers, body)."""
    env = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "wsgi.input": io.BytesIO(body),
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
    }
    env.update(environ or {})
    # None: leave the key out
    env = {key: value for key, value in env.items() if value is not None}
    setup_testing_defaults(env)
    started = []
    chunks = (validator(application) if validate else application)(
        env, lambda status, headers, _exc_info=None: started.append((status, headers))
    )
    try:
        data = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    status, headers = started[0]
    headers = dict(headers)
    # on every answer, made anew unless the client sent one (tested on its own)
    assert re.fullmatch("[A-Za-z0-9._-]{1,64}", headers.pop("X-Request-ID"))
    if data and headers.get("Content-Type") != JSON_TYPE:  # /metrics: text
        return int(status.split()[0]), headers, data.decode()
    return int(status.split()[0]), headers, json.loads(data) if data else None


def body_of_size(size, plant_id=1):
    """A valid NewPlant of exactly `size` bytes, padded with JSON whitespace."""
    document = json.dumps({"id": plant_id, "name": "Fern"}).encode()
    return document + b" " * (size - len(document))


class FailingInput(io.BytesIO):
    """A wsgi.input whose read() raises, as a server's stream does on a stall or a
    broken chunk."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def read(self, *_args):
        raise self.error


class BrokenStore:
    def add(self, *_args):
        raise RuntimeError("the disk is on fire")

    page = delete = add


def follow_pages(application, first, meanwhile=lambda _page_number: None):
    """GET first, then every next link; return the names seen, in order, and how many
    pages."""
    names, url, pages = [], first, 0
    while url:
        response = application.get(url, headers=AUTH, status=200)
        names += [plant["name"] for plant in response.json]
        url, pages = next_link(response), pages + 1
        meanwhile(pages)
    return names, pages


def mounted_at_api(application):
    """A parent WSGI app that mounts application at /api, as a real stack would."""
    from wsgiref.util import shift_path_info

    def parent(environ, start_response):
        if shift_path_info(environ) == "api":
            return application(environ, start_response)
        start_response(
            "404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "0")]
        )
        return [b""]

    return parent


def call_case(arguments, tmp_path):
    """call() of the whole service with one case's arguments (a row of
    test_plantstore_document.py's STATUS_CASES), and its store made as the case says."""
    from plantstore_accelerators import ChunkedStore
    from plantstore_app import make_app
    from plantstore_sqlite import SQLiteStore

    arguments = dict(arguments)
    given = arguments.pop("store", None)
    store = BrokenStore() if given == "broken" else ChunkedStore()
    if given == "away":  # an SQLite file deleted under the running service
        store = SQLiteStore(tmp_path / "plants.sqlite3")
        os.remove(tmp_path / "plants.sqlite3")
    if given == "taken":
        store.add(1, "Taken", None)
    arguments["environ"] = {
        **arguments.get("environ", {}),
        "wsgi.errors": io.StringIO(),
    }
    return call(make_app([TOKEN], store=store), **arguments)


def operations_of(document):
    """Each (METHOD, path, operation) of a document's paths and webhooks."""
    return [
        (method.upper(), path, operation)
        for items in (document["paths"], document["webhooks"])
        for path, item in items.items()
        for method, operation in item.items()
        if method != "parameters"  # the path's own
    ]


HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}
BAD_AUTH = [
    pytest.param({}, None, id="no-header"),
    pytest.param({"Authorization": "Basic dXNlcjpwYXNz"}, None, id="basic"),
    pytest.param({"Authorization": TOKEN}, None, id="bare-token"),
    pytest.param({"Authorization": "Bearer"}, None, id="bearer-nothing"),
    pytest.param({"Authorization": "Bearer    "}, None, id="bearer-spaces"),
    pytest.param({"Authorization": ""}, None, id="empty-header"),
    pytest.param({"Authorization": "Bearer nope"}, "invalid_token", id="wrong-token"),
    pytest.param(
        {"Authorization": f"Bearer {TOKEN}x"},
        "invalid_token",
        id="token-prefix-of-sent",
    ),
    pytest.param(
        {"Authorization": f"Bearer {TOKEN[:-1]}"}, "invalid_token", id="token-truncated"
    ),
    pytest.param(
        {"Authorization": f"Bearer {TOKEN.upper()}"},
        "invalid_token",
        id="token-case-changed",
    ),
    pytest.param(
        {"Authorization": f"Bearer {TOKEN} {TOKEN}"}, "invalid_token", id="token-twice"
    ),
    pytest.param(
        {"Authorization": "Bearer t\u00e9st"}, "invalid_token", id="latin-1-token"
    ),
]
# Request ids (issue 46): kept as the client sent them, or made anew
KEPT_IDS = {
    "one character": "a",
    "a uuid": "0f8fad5b-d9cb-469f-a165-70867728950e",
    "dots and underscores": "req.42_Retry-2",
    "64 characters": "A" * 64,
    "nginx's": "5e1f3b2a9c8d7e6f5a4b3c2d1e0f9a8b",
}
REPLACED_IDS = {  # None: no X-Request-ID sent
    "absent": None,
    "empty": "",
    "65 characters": "A" * 65,
    "a space": "two words",
    "a slash": "a/b",
    "a quote": 'a"b',
    "a colon": "a:b",
    "a line break": "a\nb",
    "not ASCII": "caf\xe9",  # as a WSGI server hands a header on: latin-1
}


def answered_ids(application, answered):
    """application, recording in `answered` each X-Request-ID header it answers."""

    def recorded(environ, start_response):
        def start(status, headers, exc_info=None):
            answered.extend(v for k, v in headers if k.lower() == "x-request-id")
            return start_response(status, headers, exc_info)

        return application(environ, start)

    return recorded


# A store's add raising plantstore.HTTPError with each status: raised, answered
# a status HTTPStatus lacks (499, nginx's own; 600; a 1xx, no final answer) is a 500
STATUSES_RAISED = [
    (418, 418),
    (499, 500),
    (600, 500),
    ("503", 500),
    (100, 500),
    (102, 500),
]


# ---- The database away: the bounds a client counts, and an SQLite file held ----

# The bounds as a client counts them, from sending a request to its whole answer: a
# request may also wait for a thread, which answering 503 at once keeps short.
OUTAGE_CREATE_BOUND = 7  # seconds: DB_WAIT_SECONDS, and 2 for a thread
OUTAGE_HEALTH_BOUND = 2.5  # seconds: HEALTH_WAIT_SECONDS, and 0.5 for a thread
OUTAGE_BACK_BOUND = 3  # seconds from the database's return to a create answered 200
SQLITE_LOCKER = (  # python -c SQLITE_LOCKER FILE SECONDS: another process's transaction
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "db.execute('ROLLBACK')\n"
)
SQLITE_FILE_HOLDER = (  # python -c SQLITE_FILE_HOLDER FILE SECONDS: from readers too
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('PRAGMA locking_mode=EXCLUSIVE')\n"
    "db.execute('BEGIN EXCLUSIVE')\n"
    "db.execute('DELETE FROM plants WHERE id = -1')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@contextlib.contextmanager
def sqlite_held(path, holder):
    """The SQLite file at path held by another process while the block runs: `holder`
    is SQLITE_LOCKER (a write transaction) or SQLITE_FILE_HOLDER (from readers too)."""
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(path), str(WAIT)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "locked\n"
        yield
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


# ---- Metrics: scraped as Prometheus scrapes them, and Prometheus itself ----


def scrape(host, port, token=TOKEN):
    """GET /metrics with the token, as Prometheus sends it; return (seconds from sending
    to the whole answer, status, headers, text)."""
    sent = time.monotonic()
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    try:
        connection.request(
            "GET", "/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        response = connection.getresponse()
        text = response.read().decode()
        headers = dict(response.getheaders())
        return time.monotonic() - sent, response.status, headers, text
    finally:
        connection.close()


def read_metrics(text):
    """A scrape as prometheus_client's parser reads it: {name: value} for a series
    without labels, {name: {its one label's value: value}} for the others
    (plantstore_info by version, the webhook series by receiver)."""
    from prometheus_client.parser import text_string_to_metric_families

    read = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels:
                (label,) = sample.labels.values()
                read.setdefault(sample.name, {})[label] = sample.value
            else:
                read[sample.name] = sample.value
    return read


def backlog(host, port):
    """The webhook events waiting, by receiver, as one scrape of /metrics says."""
    _, status, _, text = scrape(host, port)
    assert status == 200, text
    return read_metrics(text).get("plantstore_webhook_events_waiting", {})


def prometheus_binary(name="prometheus"):
    found = shutil.which(name)
    assert found, (
        f"{name} is not installed: apt-get install prometheus (.ci/run does it)"
    )
    return found


def start_prometheus(spawn, folder, targets, token=TOKEN):
    """Debian's prometheus on a free loopback port, scraping /metrics of `targets`
    (host:port) every second with the bearer token, which it reads from a file (never
    on a command line); return its port once it is ready. `spawn` stops it."""
    token_file = folder / "prometheus-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config = folder / "prometheus.yml"
    config.write_text(
        "scrape_configs:\n"
        "  - job_name: plantstore\n"
        "    scrape_interval: 1s\n"
        "    scrape_timeout: 1s\n"
        "    metrics_path: /metrics\n"
        "    authorization:\n"
        f"      credentials_file: {token_file}\n"
        "    static_configs:\n"
        f"      - targets: {json.dumps(list(targets))}\n"
    )
    port = free_port()
    process = spawn(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        environ_without_tokens(),
    )
    log = Lines(process.stderr)  # read as it comes: a full pipe would stop it
    Lines(process.stdout)

    def ready():
        assert process.poll() is None, f"prometheus stopped: {log.rest()}"
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
            try:
                connection.request("GET", "/-/ready")
                return connection.getresponse().status == 200
            finally:
                connection.close()
        return False

    wait_until(ready, "prometheus did not get ready")
    return port


def prometheus_query(port, query):
    """An instant query of Prometheus's HTTP API: {the series' labels, as a sorted
    tuple of pairs: its value}."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        connection.request("GET", "/api/v1/query?" + urlencode({"query": query}))
        answer = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    assert answer["status"] == "success", answer
    return {
        tuple(sorted(series["metric"].items())): float(series["value"][1])
        for series in answer["data"]["result"]
    }


def wait_apps_built(err, processes):
    """Wait until `processes` processes have printed their start line ("version ...,
    plants in ..."): each has built the app. Counted in the text, not by lines: two
    processes writing at once may put their lines on one, since print() writes a
    message and its line break apart."""
    while sum(line.count(", plants in ") for line in err.seen) < processes:
        err.until(", plants in ")


# gunicorn's access log on its stdout, naming the worker (its pid) that answered
WORKER_ACCESS_LOG = ("--access-logfile", "-", "--access-logformat", "%(p)s %(r)s")


def same_backlog_from_every_worker(spawn, db, creates=10, scrapes=12):
    """gunicorn -w 2 --threads 4 on db, its webhook's receiver down: `creates` creates,
    then GET /metrics in a row, `scrapes` times and until each worker has answered
    some (gunicorn's access log names the worker); return the backlogs said, and the
    scrapes each worker answered, by pid."""
    down = free_port()  # no one listens there: every event waits
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db,
        PLANTSTORE_WEBHOOK_URL=f"http://127.0.0.1:{down}/plant/webhook",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    process, host, port, _ = start_gunicorn(spawn, env, 2, 4, *WORKER_ACCESS_LOG)
    access = Lines(process.stdout)
    for plant_id in range(1, creates + 1):
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http(host, port, TOKEN, document)[0] == 200
    backlogs, answered = [], collections.Counter()
    while len(backlogs) < scrapes or len(answered) < 2:
        assert len(backlogs) < 20 * scrapes, f"one worker answered: {answered}"
        backlogs.append(backlog(host, port))
        answered[int(access.until(r"^<(\d+)> GET /metrics ")[1])] += 1
    return {f"http://127.0.0.1:{down}": creates}, backlogs, answered


RELEASE_1_3_0 = "6cbd149"  # the commit of 1.3.0: an upgrade is tested with its own code
RELEASE_1_4_0 = "ab8de6f"  # the commit of 1.4.0
RELEASE_1_5_0 = "25eeb94"  # the commit of 1.5.0, the last release


def release(commit, version, names, folder):
    """A release's files (names), from the repository's history, written into folder;
    return the path of its plantstore.py, which must say it is `version`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shown = subprocess.run(
            ["git", "-C", str(HERE), "show", f"{commit}:{name}"],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert shown.returncode == 0, (
            f"{version}'s code comes from the repository's history (git show "
            f"{commit}:{name}): {shown.stderr}"
        )
        (folder / name).write_text(shown.stdout)
    assert f'\n__version__ = "{version}"\n' in (folder / "plantstore.py").read_text()
    return folder / "plantstore.py"


def plantstore_1_3_0(folder):
    """1.3.0's plantstore.py (PostgresStore was inside it) in folder; its path."""
    return release(RELEASE_1_3_0, "1.3.0", ["plantstore.py"], folder)


def plantstore_1_4_0(folder):
    """1.4.0's plantstore.py and plantstore_postgres.py in folder; its plantstore.py."""
    names = ["plantstore.py", "plantstore_postgres.py"]
    return release(RELEASE_1_4_0, "1.4.0", names, folder)


def made_by_1_5_0(folder, db):
    """1.5.0's tables in db (a PostgreSQL URL or an SQLite path), made by 1.5.0's own
    code, in a process of its own: the URL is never on a command line."""
    release(RELEASE_1_5_0, "1.5.0", ["plantstore.py", "plantstore_postgres.py"], folder)
    make = (
        "import os, plantstore, plantstore_postgres; db = os.environ['DB']; ("
        "plantstore_postgres.PostgresStore if '://' in db else plantstore.SQLiteStore"
        ")(db).close()"
    )
    subprocess.run(
        [sys.executable, "-c", make],
        cwd=folder,
        env={**os.environ, "DB": str(db)},
        check=True,
        timeout=WAIT,
    )


def left_by_1_5_0(db, url, count, ago=3600):
    """`count` events waiting for url, as 1.5.0 writes them (due at their birth, by the
    writer's clock), born over the last `ago` seconds, written in one statement."""
    fill = (
        "INSERT INTO plant_events (url, webhook_id, body, next_at, created)"
        " SELECT {url}, 'msg_' || n, {body}, {at}, {at} FROM {numbers}"
    )
    at = f"{time.time() - ago} + n * {ago / count}"
    body = b'{"id": 1, "name": "Fern"}'
    if "://" in str(db):
        import psycopg  # here, not at the top: see this file's docstring

        numbers = f"generate_series(1, {count}) AS n"
        with psycopg.connect(db, autocommit=True) as connection:
            connection.execute(
                fill.format(url="%s", body="%s", at=at, numbers=numbers), (url, body)
            )
            connection.execute("ANALYZE plant_events")
        return
    numbers = (
        "(WITH RECURSIVE n (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n"
        f" WHERE n < {count}) SELECT n FROM n)"
    )
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute(
            fill.format(url="?", body="?", at=at, numbers=numbers), (url, body)
        )
        connection.execute("ANALYZE")


CLOCK_SHIFTED = """\
# Written by testbed.clock_shifted for one test: every Python process started with this
# folder on PYTHONPATH reads a wall clock {seconds} s off, as a host whose clock is
# wrong would (time.monotonic() is left as it is, as such a host's is).
import time

_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + {seconds}
time.time_ns = lambda: _time_ns() + {seconds} * 10**9
"""


def clock_shifted(folder, seconds):
    """A folder to put first on the PYTHONPATH of processes whose wall clock is to be
    `seconds` off (its sitecustomize.py, above)."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(CLOCK_SHIFTED.format(seconds=seconds))
    return folder


def event_columns(db):
    """The columns of plant_events, in the SQLite file or the PostgreSQL database."""
    if db.startswith("postgresql://"):
        query = (
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'plant_events' ORDER BY ordinal_position"
        )
    else:
        query = "SELECT name FROM pragma_table_info('plant_events')"
    return [column for (column,) in read_database(db, query)]


# An UPDATE that changes none of 1.3.0's columns of an event: the upgrade's, which sets
# `created`, and no other (a sender's changes `lease`, `next_at` or `attempts`)
UPGRADE_UPDATE = " AND ".join(
    f"NEW.{column} = OLD.{column}" for column in ("lease", "next_at", "attempts")
)


def slow_upgrade(db, seconds):
    """Make the upgrade of each event of db (1.3.0's) last about `seconds`, with a
    trigger: workers that start together then overlap it, and must wait it out."""
    if db.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(db, autocommit=True) as connection:
            connection.execute(
                "CREATE FUNCTION slow_upgrade() RETURNS trigger LANGUAGE plpgsql AS"
                f" $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END $$"
            )
            connection.execute(
                "CREATE TRIGGER slow_upgrade BEFORE UPDATE ON plant_events FOR EACH"
                f" ROW WHEN ({UPGRADE_UPDATE}) EXECUTE FUNCTION slow_upgrade()"
            )
        return
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("CREATE TABLE slow (n)")  # SQLite cannot sleep: it counts
        connection.executemany("INSERT INTO slow VALUES (?)", [(0,)] * 2000)
        count = "SELECT count(*) FROM slow a, slow b;"
        started = time.monotonic()
        connection.execute(count).fetchone()
        times = max(1, round(seconds / (time.monotonic() - started)))
        connection.execute(
            f"CREATE TRIGGER slow_upgrade AFTER UPDATE ON plant_events"
            f" WHEN {UPGRADE_UPDATE} BEGIN {count * times} END"
        )


def rolled_back_to_1_3_0_and_forward(spawn, folder, db, receiver):
    """A database of 1.3.0 with events waiting, served in turn by 1.3.0, by this
    version under gunicorn -w 4 (its workers all start while one upgrades 1.3.0's
    tables, which a trigger makes last a second),
    by 1.3.0 again (a rollback), by this version again, and by 1.3.0 once its receiver
    is up. Each step keeps every plant and every event; this version counts them in
    /metrics, their age from the upgrade, and 1.3.0 delivers them all at the end."""
    old, new = plantstore_1_3_0(folder / "1.3.0"), HERE / "plantstore.py"
    down = free_port()  # the receiver's port: no one listens there until the end
    origin = f"http://127.0.0.1:{down}"
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db,
        PLANTSTORE_WEBHOOK_URL=f"{origin}/plant/webhook",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )

    def serve(script, workers=0):
        """python plantstore.py, 1.3.0's or this one, or this one under gunicorn."""
        if workers:
            process, host, port, err = start_gunicorn(spawn, env, workers, 2)
        else:
            process = spawn([sys.executable, str(script), "--port", "0"], env)
            err = Lines(process.stderr)
            host, port = err.until(r"listening on http://([\d.]+):(\d+)/").groups()
        wait_apps_built(err, max(workers, 1))
        served = SimpleNamespace(process=process, address=(host, port), err=err)
        served.old = script == old
        return served

    def create(served, ids):
        for plant_id in ids:
            document = {"id": plant_id, "name": f"plant {plant_id}"}
            assert post_over_http(*served.address, TOKEN, document)[0] == 200

    def stop(served):
        if served.old:  # 1.3.0 stops mid-attempt, leaving its event leased for 17 s
            settled = "SELECT max(attempts) > 0 AND max(lease) = 0 FROM plant_events"
            wait_until(  # so it stops once its probe was tried (refused at once)
                lambda: read_database(db, settled)[0][0] in (None, 1, True),
                "1.3.0 never settled its first attempt",
            )
        stop_service(served.process)
        said = served.err.rest()
        assert "Traceback" not in said and "failed to boot" not in said, said

    def events():
        """{plant id: the event's `created`, or None}, one event a plant."""
        has_created = "created" in event_columns(db)
        rows = read_database(
            db, f"SELECT body, {'created' if has_created else 'NULL'} FROM plant_events"
        )
        found = {json.loads(bytes(body))["id"]: created for body, created in rows}
        assert len(found) == len(rows), "one event a plant"
        return found

    def metrics(served):
        before = time.time()
        _, status, _, text = scrape(*served.address)
        assert status == 200, text
        read = read_metrics(text)
        assert read["plantstore_database_up"] == 1
        ages = read["plantstore_webhook_oldest_event_age_seconds"]
        return read["plantstore_webhook_events_waiting"], ages[origin], before

    served = serve(old)  # 1.3.0 makes the tables, and events wait
    create(served, range(1, 6))
    stop(served)
    assert "created" not in event_columns(db)
    assert events() == dict.fromkeys(range(1, 6))

    slow_upgrade(db, 0.2)  # 1 s for the 5 events: the workers all start meanwhile
    upgrade = time.time()
    served = serve(new, workers=4)  # 4 workers upgrade it at once
    assert listed_ids(*served.address) == list(range(1, 6))
    kept = events()
    assert set(kept) == set(range(1, 6)), "1.3.0's events are all kept"
    (upgraded,) = set(kept.values())  # one upgrade, its time for every event of 1.3.0
    assert upgrade <= upgraded <= time.time()
    waiting, age, asked = metrics(served)
    assert waiting == {origin: 5}
    assert asked - upgraded - 0.001 <= age <= time.time() - upgraded + 0.001
    create(served, range(6, 9))
    stop(served)
    assert events().keys() == set(range(1, 9))

    served = serve(old)  # a rollback: 1.3.0 serves the upgraded database
    assert listed_ids(*served.address) == list(range(1, 9))
    create(served, range(9, 11))
    stop(served)
    kept = events()
    assert kept.keys() == set(range(1, 11))
    assert kept[9] is kept[10] is None  # 1.3.0 writes no `created`
    assert kept[1] == upgraded and all(kept[n] > upgraded for n in (6, 7, 8))

    served = serve(new)  # forward again: no second upgrade
    waiting, age, asked = metrics(served)
    assert waiting == {origin: 10}, "1.3.0's events count in waiting"
    assert asked - upgraded - 0.001 <= age <= time.time() - upgraded + 0.001
    assert events() == kept
    stop(served)

    hook = receiver(down)  # 1.3.0 again, its receiver up: every event arrives
    served = serve(old)
    delivered = hook.wait_for(10)
    assert sorted(payload["id"] for payload in delivered) == list(range(1, 11))
    wait_until(lambda: not events(), "1.3.0 deleted the events it delivered")
    assert listed_ids(*served.address) == list(range(1, 11))
    stop(served)


# ---- Webhooks: a receiver on loopback verifies each with the reference library ----


SECRET = "whsec_" + base64.b64encode(b"plantstore-test-webhook-secret-32").decode()


class Receiver:
    """A webhook receiver on a loopback port of its own: verifies each delivery, answers
    as told."""

    def __init__(self, port=0):
        # statuses: answered in turn
        self.deliveries, self.statuses, self.delay, self.hold = [], [], 0, None
        self.arrivals = []  # (time.time() of its answer, webhook-id, status), in turn
        self.refused = set()  # the ids of plants whose event it answers 422, every time
        import standardwebhooks

        self.verifier = standardwebhooks.Webhook(SECRET)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                # raises unless signed right
                payload = receiver.verifier.verify(body, dict(self.headers.items()))
                if receiver.hold:
                    receiver.hold.wait(WAIT)
                time.sleep(receiver.delay)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                # this event, always: an answer all the same
                if payload["id"] in receiver.refused:
                    status = 422
                receiver.deliveries.append(
                    (self.headers["webhook-id"], payload, status)
                )
                receiver.arrivals.append(
                    (time.time(), self.headers["webhook-id"], status)
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/plant/webhook"
        threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
        ).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def delivered(self):
        """The payloads answered 2xx, in the order they came."""
        return [
            payload for _, payload, status in self.deliveries if 200 <= status < 300
        ]

    def wait_for(self, count):
        deadline = time.monotonic() + WAIT
        while len(self.delivered()) < count:
            assert time.monotonic() < deadline, (
                f"{len(self.delivered())} of {count} deliveries came"
            )
            time.sleep(0.05)
        return self.delivered()


@pytest.fixture
def receiver():
    receivers = []

    def start(port=0):
        receivers.append(Receiver(port))
        return receivers[-1]

    yield start
    for started in receivers:
        with contextlib.suppress(Exception):
            started.stop()


# ---- README.md and docs/, read as written ----


def doc_text(name):
    """A Markdown file of the repository (README.md, docs/...)."""
    return (HERE / name).read_text()


def doc_table(name, above):
    """The rows of the table that starts at, or below, the first line holding `above`:
    each (name:line, cells)."""
    lines = doc_text(name).splitlines()
    start = [n for n, line in enumerate(lines) if above in line]
    assert start, f"{name} has no line {above!r} any more: update this test"
    rows = []
    for number, line in enumerate(lines[start[0] :], start[0] + 1):
        if line.startswith("|"):
            cells = [cell.strip() for cell in line[1:-1].split("|")]
            rows.append((f"{name}:{number}", cells))
        elif rows:
            break
    return rows[2:]  # past the header and its |---| line


# ---- docs/operations.md's commands, run as written ----


OPERATIONS = HERE / "docs" / "operations.md"


class Runbook:
    """docs/operations.md's blocks of commands, run as written by bash, with the test's
    own settings.

    Each block under a `<!-- run: NAME -->` comment runs after the doc's settings block,
    in which only the values are the test's: its `export`s stay as written, so a name
    pgloader needs from the environment and the doc forgot to export fails here too.
    """

    def __init__(self, folder, **settings):
        text = OPERATIONS.read_text()
        self.blocks = dict(
            re.findall(r"<!-- run: ([\w-]+) -->\n```sh\n(.*?)```\n", text, re.S)
        )
        block = re.search(r"<!-- settings -->\n```sh\n(.*?)```\n", text, re.S)[1]
        assignment = re.compile(r"(export )?([A-Z_]+)=\S+( +#.*)?")
        lines = block.splitlines()
        assert all(assignment.fullmatch(line) for line in lines), (
            "the settings block holds assignments alone"
        )
        assert sorted(assignment.fullmatch(line)[2] for line in lines) == sorted(
            settings
        ), "names the tests set"
        self.settings_block = "".join(
            f"{m[1] or ''}{m[2]}={shlex.quote(str(settings[m[2]]))}\n"
            for m in map(assignment.fullmatch, lines)
        )
        self.folder, self.settings = folder, settings
        self.env = {
            k: v for k, v in environ_without_tokens().items() if not k.startswith("PG")
        }

    def script(self, name, **settings):
        chosen = "".join(
            f"{key}={shlex.quote(str(value))}\n" for key, value in settings.items()
        )
        return f"set -euo pipefail\n{self.settings_block}{chosen}{self.blocks[name]}"

    # Debian's
    PACKAGES = {
        "sqlite3": "sqlite3",
        "pgloader": "pgloader",
        "psql": "postgresql-client",
        "pg_dump": "postgresql-client",
        "pg_restore": "postgresql-client",
    }

    def run(self, name, **settings):
        """Run the block; return what it printed. It must exit 0."""
        missing = {
            package
            for program, package in self.PACKAGES.items()
            if re.search(rf"(?<![\w./-]){program} ", self.blocks[name])
            and not shutil.which(program)
        }
        assert not missing, (
            f"docs/operations.md's block {name} needs: apt-get install "
            f"{' '.join(sorted(missing))}"
        )
        done = subprocess.run(
            ["bash", "-c", self.script(name, **settings)],
            cwd=self.folder,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WAIT * 2,
        )
        assert done.returncode == 0, (
            f"docs/operations.md, block {name}: {done.stdout}{done.stderr}"
        )
        return done.stdout

    def start(self, spawn, name):
        """Start the block, to be stopped with Ctrl-C (SIGINT): bash outlives it, as an
        interactive shell does."""
        return spawn(["bash", "-c", "trap : INT\n" + self.script(name)], self.env)


@pytest.fixture
def runbook(tmp_path):
    """docs/operations.md's settings, for an SQLite file in tmp_path and the suite's
    PostgreSQL (if used)."""
    # as pip installs it: a command that runs plantstore
    command = tmp_path / "plantstore"
    command.write_text(
        f"#!/bin/sh\nexec {shlex.join([sys.executable, str(HERE / 'plantstore.py')])} "
        f'"$@"\n'
    )
    command.chmod(0o755)
    port = free_port()  # a PostgreSQL that a test without one never reaches
    settings = {
        "SQLITE": tmp_path / "plants.sqlite3",
        "PG": f"postgresql://plantstore@127.0.0.1:{port}/plantstore",
        "PGPASSFILE": tmp_path / "pgpass",
        "BACKUPS": tmp_path / "backups",
        "PLANTSTORE": command,
        "OLD_URL": "http://127.0.0.1:1/old",
        "NEW_URL": "http://127.0.0.1:1/new",
    }
    return Runbook(tmp_path, **settings)


# ---- Secrets that never show ----


# The password in the six spellings; the last one cannot be read, the others are
# served.
SECRET_SPELLINGS = {
    "user-info": "postgresql://plant:s3cr3t-pw@db.example:5432/plants",
    "query": "postgresql://plant@db.example:5432/plants?password=s3cr3t-pw",
    "sslpassword": "postgresql://plant@db.example:5432/plants?sslpassword=s3cr3t-pw",
    "keyword-value": (
        "host=db.example port=5432 user=plant password=s3cr3t-pw dbname=plants"
    ),
    "percent-encoded": "postgresql://plant:%73%33cr3t-pw@db.example:5432/plants",
    "malformed": "postgresql://plant:s3cr3t-pw%zz@db.example:5432/plants",
}


def assert_secret_kept(text):
    assert "s3cr3t" not in text and "%73%33cr3t" not in text


# ---- Separate hosts: network namespaces a test (or the nemesis) makes and removes
# As root, the way CI runs the tests.


class Hosts:
    """Machines on a private network: a network namespace per host, one veth pair per
    link.

    The test process is the host None (the root namespace). Every name carries this
    process's id, and each link is a /30 of 10.213.<block>.0/24, a block no other
    interface here holds: packets go only between the two ends of a link, never anywhere
    else. remove() ends every process on the hosts and deletes the namespaces and links;
    a run killed before it did is swept by the next one.
    """

    prefix = "plantstore-"

    def __init__(self):
        self.namespaces, self.devices, self.cleanups, self.links = [], [], [], 0
        self._sweep()
        # held with a lock file until remove(): no concurrent run takes it
        for block in range(256):
            self._lock = open(
                Path(tempfile.gettempdir()) / f"plantstore-netns-10.213.{block}.lock",
                "w",
            )
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock.close()
                continue
            if f" 10.213.{block}." not in ip("-4", "-o", "address", "show"):
                self.block = block
                return
            self._lock.close()
        raise AssertionError("no free block of addresses in 10.213.0.0/16")

    def host(self, name):
        """A new host: a namespace with its loopback up."""
        namespace = f"{self.prefix}{os.getpid()}-{name}"
        ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        return namespace

    def link(self, one, other):
        """Join two hosts with a veth pair, a /30 of the block between them; return
        {host: (address, device)}."""
        n, self.links = self.links, self.links + 1
        assert n < 64, "a block holds 64 links"
        ends = {
            one: (f"10.213.{self.block}.{4 * n + 1}", f"ps{os.getpid()}l{n}a"),
            other: (f"10.213.{self.block}.{4 * n + 2}", f"ps{os.getpid()}l{n}b"),
        }
        (_, first), (_, second) = ends[one], ends[other]
        ip(
            "link",
            "add",
            first,
            *self._netns(one),
            "type",
            "veth",
            "peer",
            "name",
            second,
            *self._netns(other),
        )
        if one is None:
            self.devices.append(first)
        for host, (address, device) in ends.items():
            # no IPv6 either
            ip(*self._n(host), "link", "set", device, "addrgenmode", "none")
            ip(*self._n(host), "address", "add", f"{address}/30", "dev", device)
            ip(*self._n(host), "link", "set", device, "up")
        return ends

    def silent(self, host):
        """An address that `host` sends packets to and never hears from, as a host that
        died: no answer, no refusal. A /30 of the block on one end of a veth pair whose
        other end is never up, the far address's MAC address set, so that not even ARP
        fails."""
        n, self.links = self.links, self.links + 1
        near = f"10.213.{self.block}.{4 * n + 1}"
        far = f"10.213.{self.block}.{4 * n + 2}"
        device = f"ps{os.getpid()}l{n}s"
        ip("-n", host, "link", "add", device, "type", "veth", "peer", f"{device}x")
        ip("-n", host, "address", "add", f"{near}/30", "dev", device)
        ip("-n", host, "link", "set", device, "up")
        ip("-n", host, "neigh", "add", far, "dev", device, "lladdr", "2:0:0:0:0:2")
        return far

    def resolver(self, host, nameserver):
        """Give `host` a resolv.conf of its own that names `nameserver` alone: ip netns
        exec mounts /etc/netns/NAME/resolv.conf on /etc/resolv.conf."""
        folder = Path("/etc/netns") / host
        folder.mkdir(parents=True)
        (folder / "resolv.conf").write_text(f"nameserver {nameserver}\n")

    def set_link(self, host, device, state):
        """Set a host's end of a link "down" (the host goes silent: no reset, no error,
        nothing) or "up"."""
        ip(*self._n(host), "link", "set", "dev", device, state)

    def inside(self, host):
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", host] if host else []

    def remove(self):
        for namespace in self.namespaces:
            self._kill_all(namespace)
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        for device in self.devices:  # deleting one end deletes its peer
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "delete", device)
        for namespace in self.namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "delete", namespace)
            shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        self._lock.close()

    def _netns(self, host):
        return ["netns", host] if host else []

    def _n(self, host):
        return ["-n", host] if host else []

    def _kill_all(self, namespace):
        """SIGKILL every process in the namespace and wait until none is left."""
        deadline = time.monotonic() + WAIT
        while pids := ip("netns", "pids", namespace, check=False).split():
            for pid in map(int, pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert time.monotonic() < deadline, (
                f"processes outlive SIGKILL in {namespace}: {pids}"
            )
            time.sleep(0.05)

    def _sweep(self):
        """Remove the namespaces of runs that were killed before they could (their
        process is gone)."""
        for line in ip("netns", "list").splitlines():
            namespace = line.split()[0] if line.strip() else ""
            if match := re.fullmatch(rf"{self.prefix}(\d+)-.*", namespace):
                if not os.path.exists(f"/proc/{match[1]}"):
                    self._kill_all(namespace)
                    ip("netns", "delete", namespace, check=False)
                    shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)


def ip(*args, check=True):
    """Run ip(8) and return what it printed."""
    return subprocess.run(
        ["ip", *args], check=check, capture_output=True, text=True, timeout=WAIT
    ).stdout
