"""Nothing lost, measured (issues 54 and 59): plantstore under a production recipe,
clients that create, delete and walk the pages, two webhook receivers, a stream of
faults (power cuts among them); then a checker that reads the run's files alone and
says what, if anything, was lost or changed.

    python benchmarks/nemesis.py                                # SQLite, gunicorn, 60 s
    python benchmarks/nemesis.py --store postgres --seconds 600 --seed 7
    python benchmarks/nemesis.py --server granian --faults kill-worker,receiver-503
    python benchmarks/nemesis.py --list-faults                  # the faults, and which
                                                                # run by default
    python benchmarks/nemesis_check.py RUN_FOLDER               # the verdicts again

Needs the test extra (pip install -e '.[test]'): PostgreSQL is started as the tests
start it (initdb and pg_ctl in a temporary folder, on a free port), the receivers check
each delivery with the reference library, standardwebhooks, and power-loss puts the
store's files on benchmarks/lazyfs.py (FUSE: Debian's fuse3). power-loss, disk-full and
log-full mount filesystems and partition makes network namespaces: they need root, as
CI has.

What runs:
- the servers, a recipe of the README: `gunicorn -w 2 --threads 4` (-w 1 --threads 8
  for the in-memory store), or granian with the flags of
  deploy/plantstore-granian.service for the store; on an SQLite file, on a PostgreSQL
  of its own (fsync on) that two app hosts share (the second one's clock is
  clock-step's), or in memory. Every secret (the
  token, the webhook secret, the database's URL) is in a file of the run's, named by
  PLANTSTORE_*_FILE, never on a command line.
- --clients clients, each in a thread. A client creates plants, each id once, the id
  written in the plant's name ("nemesis 1000000007 café ✓"), since the listing has no
  ids: a 503, a cut connection, a refusal or a timeout is retried with the same id until
  the answer is 200 or 409. It deletes some of the plants it made, retrying likewise
  until 204 or 404, and walks 1 to 3 pages of the listing from its start. It waits
  Retry-After after a 503. Each sends its next operation once it has its answer, or at
  --rate operations a second for all of them together.
- two receivers, a and b, each on a port of its own: each checks a delivery as it comes
  (its signature, and its timestamp), answers as the nemesis says, and logs it whole.
- the nemesis: from --seed alone, it draws each episode, so that the same seed gives the
  same faults in the same order: a calm of 1 to 5 s, then one fault, or two together
  (a third of the time; the second 0 to 3 s after the first) on different targets, each
  for a drawn duration (--max-fault-seconds caps them). --list-faults says what each
  does.

After --seconds (or --creates), the faults stop: every fault is undone (every receiver
is up: the final phase), the clients start nothing new and get an answer to each
operation under way (within 60 s), and the service settles: the run waits until GET
/metrics says the database is up and no webhook event waits, for as long as the backlog
keeps falling; it gives up once --settle seconds (420) pass without a new low: the
schedule's 300 s step with its jitter, a lease (17 s) and an attempt (15 s).

Then it reads the whole listing through the HTTP API and the plants' rows from the
database itself, writes its files in --out (docs/reliability.md gives their fields:
run.json, operations.jsonl, listing.jsonl, rows.jsonl, deliveries.jsonl, faults.jsonl,
the servers' logs), and hands them to the checker, benchmarks/nemesis_check.py, which
imports nothing of plantstore: its docstring says what it counts. It prints a report (a
table to paste in docs/reliability.md) and writes report.json. The exit status is 0
when every verdict is 0 and the service settled; else 1.
"""

import argparse
import base64
import contextlib
import datetime
import hmac
import http.client
import http.server
import json
import math
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
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import standardwebhooks  # noqa: E402 (after sys.path, as the rest)

import lazyfs  # noqa: E402
from nemesis_check import (  # noqa: E402
    FINAL,
    RECEIVER_VERDICTS,
    VERDICTS,
    check,
    count,
    plant_of,
)

# testbed's servers are the runner's, loaded where it needs them: testbed imports
# plantstore, and the checker must be readable with nothing of plantstore loaded

WAIT = 60  # seconds a server may take to start, or to stop on SIGTERM
CLIENT_TIMEOUT = 30  # seconds a client waits for an answer; past it, a timeout
RESOLVE_SECONDS = 60  # after the faults, for each operation under way to get its answer
GRANIAN_CRASH_LOOP = 6  # granian exits if a respawned worker dies within 5.5 s
CALM = (1, 5)  # seconds of calm before each episode
TOGETHER = 1 / 3  # the share of episodes with two faults at once
SECOND_AFTER = (0, 3)  # seconds from the first fault of two to the second
MIX = {"create": 0.75, "delete": 0.15, "list": 0.10}  # what a client does next
PAGE = 100  # plants a page, when a client reads the listing
ID_BLOCK = 10**9  # client n's ids are n * ID_BLOCK + 1, + 2, ...
# a plant's name: its id is its second word, then words that JSON escapes or UTF-8
# writes in several bytes, so that a name changed on its way is seen
NAME = "nemesis {} {}"
WORDS = ("fern", "Monstera «deliciosa»", "café ✓", 'say "hi"', "back\\slash", "日本")
TAGS = (None, "indoor", "outdoor", "rare", "ÉTÉ")
RECEIVERS = ("a", "b")  # a: the receiver faults' target; b: down for long stretches
CLOCK_STEP = 3600  # seconds clock-step moves the second app host's clock, ahead or back


class Fault(SimpleNamespace):
    """A kind of fault: its target (two faults at once never share one), the stores it
    applies to, the range of its duration (s), whether it needs root, whether it runs
    by default, and what it does."""


STORES = {"sqlite", "postgres"}
ALL = {"memory", *STORES}  # the in-memory store: its webhooks, under gunicorn -w 1
FAULTS = {
    "kill-worker": Fault(
        target="server",
        stores=STORES,
        seconds=(0, 0),
        root=False,
        default=True,
        does="SIGKILL one worker of the server; its master starts another",
    ),
    "restart-server": Fault(
        target="server",
        stores=ALL,
        seconds=(0, 3),
        root=False,
        default=True,
        does="SIGTERM the whole server (its master: gunicorn's or granian's), wait "
        "for it to stop, leave it down for the duration, start it again on the same "
        "port",
    ),
    "reload-server": Fault(
        target="server",
        stores=ALL,
        seconds=(0, 0),
        root=False,
        default=True,
        does="gunicorn's reload, SIGHUP to its master (kill -HUP by hand: the units "
        "ship no ExecReload, which emptied the in-memory store); not under granian",
    ),
    "power-loss": Fault(
        target="server",
        stores=STORES,
        seconds=(0, 3),
        root=True,
        default=True,
        does="the host of the store's files loses power: every process using their "
        "filesystem (benchmarks/lazyfs.py) SIGKILLed, what was not fsynced dropped "
        "(file data, and folder entries whose folder was not synced); then it starts "
        "again. SQLite's: the app host, the server with it; PostgreSQL's: the "
        "database's host, its data directory",
    ),
    "log-full": Fault(
        target="log",
        stores=ALL,
        seconds=(1, 15),
        root=True,
        default=True,
        does="the filesystem of the server's log (stdout and stderr, a tmpfs of 4 MB) "
        "filled to the last byte, so that every write of a line fails; then freed",
    ),
    "clock-step": Fault(
        target="clock",
        stores={"postgres"},
        seconds=(5, 30),
        root=False,
        default=True,
        does="the second app host's wall clock (time.time and time.time_ns, shifted "
        f"by a sitecustomize) stepped {CLOCK_STEP} s ahead or back (drawn), then "
        "back to true; with --app-hosts 2",
    ),
    "pg-stop": Fault(
        target="database",
        stores={"postgres"},
        seconds=(1, 40),
        root=False,
        default=True,
        does="every process of PostgreSQL stopped (SIGSTOP), then continued: a "
        "database that accepts and answers nothing",
    ),
    "pg-restart": Fault(
        target="database",
        stores={"postgres"},
        seconds=(0, 3),
        root=False,
        default=True,
        does="pg_ctl stop -m fast or -m immediate (drawn), down for the duration, "
        "then pg_ctl start (after immediate: crash recovery)",
    ),
    "pg-read-only": Fault(
        target="database",
        stores={"postgres"},
        seconds=(1, 20),
        root=False,
        default=True,
        does="default_transaction_read_only on, reloaded, as a demoted primary; then "
        "off",
    ),
    "partition": Fault(
        target="database",
        stores={"postgres"},
        seconds=(1, 40),
        root=True,
        default=True,
        does="the link between the app's host and the database's host down (network "
        "namespaces, as the partition tests): silence, no reset; then up",
    ),
    "sqlite-held": Fault(
        target="database",
        stores={"sqlite"},
        seconds=(1, 15),
        root=False,
        default=True,
        does="another process holds the SQLite file in an exclusive transaction "
        "(BEGIN EXCLUSIVE), then rolls back",
    ),
    "disk-full": Fault(
        target="database",
        stores={"sqlite"},
        seconds=(1, 15),
        root=True,
        default=True,
        does="the SQLite file's filesystem (a tmpfs of --tmpfs-mb) filled to the last "
        "byte, then freed",
    ),
    "receiver-b-down": Fault(
        target="receiver-b",
        stores=ALL,
        seconds=(10, 60),
        root=False,
        default=True,
        does="receiver b closes its port for a long stretch: every delivery to it is "
        "refused (its events wait, or, in memory, are dropped past the bound)",
    ),
    "receiver-down": Fault(
        target="receiver",
        stores=ALL,
        seconds=(1, 20),
        root=False,
        default=True,
        does="receiver a closes its port: every delivery is refused",
    ),
    "receiver-slow": Fault(
        target="receiver",
        stores=ALL,
        seconds=(2, 20),
        root=False,
        default=True,
        does="receiver a waits 0.5 to 5 s (drawn) before each answer",
    ),
    "receiver-503": Fault(
        target="receiver",
        stores=ALL,
        seconds=(1, 20),
        root=False,
        default=True,
        does="receiver a answers 503 to every delivery",
    ),
    "receiver-500": Fault(
        target="receiver",
        stores=ALL,
        seconds=(0.5, 2),
        root=False,
        default=False,
        does="receiver a answers 500: not retried for 5 s, then 300 s, so a spell "
        "is kept short; an event that meets two waits 300 s: --settle covers it",
    ),
}


# ---- Processes: the servers and a holder of the SQLite file ----


def children(pid):
    """The process ids whose parent is pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return sorted(found)


def kill_tree(pid):
    """SIGKILL a process and its children (a server's master and its workers)."""
    for each in [*children(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


class Server:
    """plantstore under gunicorn or granian, started again on the same address after a
    stop; its output appended to one log file. A master that exits by itself (not
    stopped by the nemesis) is noted and started again, as systemd would."""

    def __init__(self, run, port, env, log):
        self.run, self.process, self.lock = run, None, threading.Lock()
        self.port, self.env, self.log = port, env, log
        self.last_kill = -math.inf
        options = run.options
        if options.server == "gunicorn":  # the in-memory store lives in one process
            self.workers, threads = (1, 8) if options.store == "memory" else (2, 4)
            self.command = [
                sys.executable,
                "-m",
                "gunicorn",
                "-w",
                str(self.workers),
                "--threads",
                str(threads),
                "-b",
                f"{run.app_address}:{port}",
                "plantstore:app",
            ]
            self.recipe = f"gunicorn -w {self.workers} --threads {threads}"
        else:
            from testbed import granian_recipe  # noqa: PLC0415 (the runner's)

            flags = granian_recipe(options.store)
            flags[flags.index("--host") + 1] = run.app_address
            flags[flags.index("--port") + 1] = str(port)
            self.workers = int(flags[flags.index("--workers") + 1])
            self.command = [sys.executable, "-m", "granian", *flags, "plantstore:app"]
            shown = " ".join(flags)
            shown = re.sub(r" --(host|port) \S+", "", shown)
            self.recipe = f"granian {shown}"

    def start(self):
        """Start it; return True once it listens with all its workers, False if it
        exited first (it cannot boot: the watch says so and tries again)."""
        with open(self.log, "a") as log:
            with contextlib.suppress(OSError):  # its filesystem full: said nowhere
                log.write(f"==== nemesis: start at {self.run.clock():.3f} s\n")
                log.flush()
            self.process = subprocess.Popen(
                [*self.run.inside_app, *self.command],
                cwd=self.run.plantstore,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + WAIT
        while True:  # its socket listens: requests wait in its backlog for a worker
            with contextlib.suppress(OSError):
                socket.create_connection(
                    (self.run.app_address, self.port), timeout=WAIT
                ).close()
                break
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: see {self.log}")
            time.sleep(0.05)
        while len(children(self.process.pid)) < self.workers:
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server's workers did not start: see {self.log}"
                )
            time.sleep(0.05)
        return True

    def stop(self, seconds=WAIT):
        """SIGTERM its master and wait for it to end; SIGKILL what is left after
        `seconds`. Return the master's exit status, or None when it was killed."""
        process = self.process
        workers = children(process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(seconds)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            process.wait()
            status = None
        for pid in workers:  # a worker its master left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return status

    def restart(self, down=0.0, cut=None):
        """Stop it, leave it down `down` seconds, start it again; or, for a power
        loss, cut(process) in place of the stop."""
        with self.lock:
            if cut:
                cut(self.process)
                status = 0
            else:
                status = self.stop()
            time.sleep(down)
            self.run.note(
                "restart-server",
                f"the server's master ended with status {status} after SIGTERM"
                if status not in (0,)
                else None,
            )
            self.start()  # if it cannot boot, the watch says so, and starts it again

    def reload(self):
        """gunicorn's reload, SIGHUP to its master; return once the master has as many
        workers as before, none of them an old one."""
        with self.lock:
            before = set(children(self.process.pid))
            os.kill(self.process.pid, signal.SIGHUP)
            deadline = time.monotonic() + WAIT
            while not (
                len(now := set(children(self.process.pid))) >= self.workers
                and not now & before
            ):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    break  # the watch notes it, and starts it again
                time.sleep(0.05)

    def kill_worker(self, which):
        """SIGKILL worker number `which` (modulo their number), once the master has all
        its workers; under granian, not within its crash-loop window of the last."""
        with self.lock:
            if self.run.options.server == "granian":
                wait = self.last_kill + GRANIAN_CRASH_LOOP - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            workers = children(self.process.pid)
            if not workers:
                return
            victim = workers[which % len(workers)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            self.last_kill = time.monotonic()
            deadline = time.monotonic() + WAIT
            while not (
                victim not in (now := children(self.process.pid))
                and len(now) >= self.workers
            ):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    break  # the watch notes it, and starts it again
                time.sleep(0.05)

    def watch(self, stop):
        """Until `stop`, note a master that ended by itself, with plantstore's last
        lines, and start it again every second until it serves (systemd would not,
        after the statuses its RestartPreventExitStatus= lists: a bad setting's)."""
        down = None  # since when it has been down, and its tries
        while not stop.wait(0.5):
            with self.lock:
                status = self.process.poll()
                if status is None:
                    if down:
                        self.run.note(
                            "server-exit",
                            f"the server serves again, {self.run.clock() - down[0]:.1f}"
                            f" s and {down[1]} starts later",
                        )
                        down = None
                    continue
                if not down:
                    said = [
                        line.strip()
                        for line in self.log.read_text(errors="replace").splitlines()[
                            -200:
                        ]
                        if line.startswith("plantstore:") or "Halt" in line
                    ]
                    self.run.note(
                        "server-exit",
                        f"the server's master exited by itself, status {status}; its "
                        f"last lines: {said[-3:]}",
                    )
                    down = [self.run.clock(), 0]
                kill_tree(self.process.pid)
                down[1] += 1
                self.start()


SQLITE_LOCKER = (  # python -c SQLITE_LOCKER FILE SECONDS: another process's transaction
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
    "db.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "db.execute('ROLLBACK')\n"
)


# ---- PostgreSQL, and its host apart: network namespaces ----


def nemesis_hosts():
    """Two hosts beside this one, testbed's Hosts (those of the partition tests, which
    take a block of addresses no run or test shares): the app's (the server), linked to
    this one (clients, receiver), and the database's, linked to the app's. remove() ends
    every process on them and deletes them; a run killed before it could is swept by
    the next one."""
    from testbed import Hosts  # noqa: PLC0415 (the runner's)

    class NemesisHosts(Hosts):
        prefix = "plantstore-nemesis-"

        def __init__(self):
            super().__init__()
            self.app, self.db = self.host("app"), self.host("db")
            self.front = self.link(None, self.app)
            self.data = self.link(self.app, self.db)

        def set_data_link(self, state):
            """The database host's end of its link "down" (silence) or "up"."""
            self.set_link(self.db, self.data[self.db][1], state)

    return NemesisHosts()


def postgres_on(hosts, lazy=False):
    """testbed's PostgreSQL (durable: fsync on), on the database's host when there is
    one, listening on its address there and taking passwords from the test network;
    with `lazy`, its data directory on lazyfs, for power-loss."""
    from testbed import Postgres  # noqa: PLC0415 (the runner's)

    class PostgresOn(Postgres):
        lazy = None

        def __init__(self, hosts):
            if hosts:
                self.inside = hosts.inside(hosts.db)
                self.listen = hosts.data[hosts.db][0]
            super().__init__(durable=True)
            if hosts:
                with (self.folder / "data" / "pg_hba.conf").open("a") as hba:
                    hba.write("host all all 10.213.0.0/16 scram-sha-256\n")
                with self.local() as db:
                    db.execute("SELECT pg_reload_conf()")
                self.url = self.url.replace("127.0.0.1", self.listen)
            if lazy:
                self.on_lazyfs()

        def on_lazyfs(self):
            """Its data directory moved under lazyfs, seen there through a link."""
            self.stop()
            live = self.folder / "live"
            live.mkdir()
            (self.folder / "data").rename(live / "data")
            self.lazy = lazyfs.LazyFS(self.folder / "lazyfs", live=live)
            self.lazy.__enter__()
            (self.folder / "data").symlink_to(self.lazy.mount / "data")
            self.start()

        def power_loss(self, seconds):
            """Every process of it killed, what it had not fsynced dropped, and its
            socket's lock file gone, as a reboot leaves them; then started again."""
            self.lazy.cut()
            for lock in self.folder.glob(".s.PGSQL.*"):
                lock.unlink()
            time.sleep(seconds)
            self.start()

        def stop_now(self, mode):
            folder = self.folder / "data"
            self._pg("pg_ctl", "-D", folder, "-w", "-t", WAIT, "-m", mode, "stop")

        def remove(self):
            if not self.lazy:
                return super().remove()
            with contextlib.suppress(Exception):
                self.stop_now("immediate")
            self.lazy.__exit__()  # before the folder it is mounted in goes
            shutil.rmtree(self.folder, ignore_errors=True)
            return None

    return PostgresOn(hosts)


# ---- The webhook receiver ----


class Receiver:
    """A webhook receiver on a port of its own: verifies each delivery with the
    reference library as it comes, answers as the nemesis says (`mode`: "up", "503",
    "500", "slow", or "down", its port closed), and logs every delivery, its headers
    and body, to the log it shares with the other receiver."""

    def __init__(self, name, address, secret, log):
        self.name, self.verifier = name, standardwebhooks.Webhook(secret)
        self.mode, self.delay, self.deliveries = "up", 0.0, []
        self.log, self.lock = log, log.lock
        self.address, self.server = address, None
        self._listen(0)
        self.port = self.server.server_address[1]
        self.url = f"http://{address}:{self.port}/plant/webhook"

    def _listen(self, port):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                receiver.received(self, body, complete=len(body) == length)

            def log_message(self, *args):
                pass

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a sender that cut its attempt: nothing to say

        deadline = time.monotonic() + WAIT
        while True:  # its port again, after a spell down: wait while another holds it
            try:
                self.server = Quiet((self.address, port), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
        ).start()

    def received(self, handler, body, complete):
        """Log a delivery; answer it, unless its sender cut it before its body ended
        (then it is a failed attempt: no answer goes anywhere)."""
        headers = {key.lower(): value for key, value in handler.headers.items()}
        try:  # as a receiver checks it: its signature, and a timestamp within 5 min
            fresh = complete and self.verifier.verify(body, headers) is not None
        except standardwebhooks.webhooks.WebhookVerificationError:
            fresh = False
        signed = fresh or (complete and self.signed(body, headers))
        mode, delay = self.mode, self.delay
        if complete:  # receiver-slow's delay, or every answer's (--receiver-delay)
            time.sleep(delay if mode == "slow" else self.log.delay)
        status = {"503": 503, "500": 500}.get(mode, 200) if fresh else 400
        entry = {
            "t": round(time.monotonic() - self.log.started, 3),
            "receiver": self.name,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "complete": complete,
            "signed": signed,
            "fresh": fresh,
            "status": status if complete else None,
        }
        with self.lock:
            self.deliveries.append(entry)
            self.log.file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        if not complete:
            handler.close_connection = True
            return
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def signed(self, body, headers):
        """Whether the signature is the secret's, whatever the timestamp (a sender
        whose clock is off signs truly, and is refused for the time alone)."""
        try:
            when = int(headers["webhook-timestamp"])
            expected = self.verifier.sign(
                headers["webhook-id"],
                datetime.datetime.fromtimestamp(when, datetime.timezone.utc),
                body.decode(),
            )
        except (
            KeyError,
            ValueError,
            OverflowError,
        ):  # UnicodeDecodeError: a ValueError
            return False
        given = headers.get("webhook-signature", "").split()
        return any(hmac.compare_digest(expected, each) for each in given)

    def set(self, mode, delay=0.0):
        """Answer as `mode` says from now on; "down" closes the port, and any other
        mode opens it again."""
        if mode == "down" and self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        elif mode != "down" and not self.server:
            self._listen(self.port)
        self.mode, self.delay = mode, delay

    def close(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


class DeliveryLog:
    """deliveries.jsonl, which every receiver writes, a line at a time."""

    def __init__(self, path, started, delay):
        self.file = open(path, "a", 1, "utf-8")  # noqa: SIM115 (a line at a time)
        self.lock, self.started, self.delay = threading.Lock(), started, delay

    def close(self):
        with self.lock:
            self.file.close()


# ---- Clients ----


def ask(host, port, token, method, path, body=None):
    """One request on a connection of its own: (outcome, headers, body), the outcome
    the status or "refused", "cut", "timeout"."""
    connection = http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT)
    try:
        connection.request(
            method,
            path,
            body,
            {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Connection": "close",
            },
        )
        response = connection.getresponse()
        data = response.read()
        return response.status, response.headers, data  # headers: any case
    except ConnectionRefusedError:
        return "refused", http.client.HTTPMessage(), b""
    except TimeoutError:
        return "timeout", http.client.HTTPMessage(), b""
    except (OSError, http.client.HTTPException):
        return "cut", http.client.HTTPMessage(), b""
    finally:
        connection.close()


class Client(threading.Thread):
    """Creates, deletes and lists until told to start nothing new; then finishes the
    operation under way, each request sent to an app host drawn at random. Each
    operation is a line of operations.jsonl (docs/reliability.md), its times from the
    run's start."""

    def __init__(self, number, run):
        super().__init__(name=f"client-{number}", daemon=True)
        self.run_, self.number = run, number
        self.rng = random.Random(f"{run.options.seed}-client-{number}")
        self.ids = iter(range(number * ID_BLOCK + 1, (number + 1) * ID_BLOCK))
        self.operations, self.mine, self.walks = [], [], 0

    def run(self):
        run = self.run_
        # --rate: this client's share, an operation every `interval` seconds at most
        interval = run.options.clients / run.options.rate if run.options.rate else 0
        due = time.monotonic()
        while not run.stop_new.wait(max(0, due - time.monotonic())):
            due = max(due + interval, time.monotonic() - interval)  # no burst after
            kind = self.rng.choices(list(MIX), weights=list(MIX.values()))[0]
            if kind == "create" or (kind == "delete" and not self.mine):
                self.create()
            elif kind == "delete":
                self.delete()
            else:
                self.list()

    def operation(self, kind, plant_id=None, **more):
        operation = {"client": self.number, "kind": kind, "id": plant_id, **more}
        operation["attempts"] = []
        self.operations.append(operation)
        return operation

    def attempt(self, operation, method, path, body=None):
        host = self.rng.choice(self.run_.app_hosts)
        sent = self.run_.clock()
        outcome, headers, data = ask(*host, self.run_.token, method, path, body)
        answered = self.run_.clock()
        operation["attempts"].append([round(sent, 4), round(answered, 4), outcome])
        return outcome, headers, data

    def until_final(self, operation, method, path, body=None):
        """Send until a final answer (or one no retry can change), waiting Retry-After
        after a 503 and a moment after a cut; past RESOLVE_SECONDS after the faults
        stopped, give up (the operation is then unresolved)."""
        while True:
            outcome, headers, _ = self.attempt(operation, method, path, body)
            if outcome in FINAL[operation["kind"]] or not (
                outcome in ("refused", "cut", "timeout") or outcome >= 500
            ):
                return outcome
            stopped = self.run_.stopped_at
            if stopped is not None and time.monotonic() > stopped + RESOLVE_SECONDS:
                return None
            try:
                pause = min(float(headers.get("Retry-After", "")), 2.0)
            except ValueError:
                pause = self.rng.uniform(0.1, 0.3)
            time.sleep(pause)

    def create(self):
        plant_id = next(self.ids)
        name = NAME.format(plant_id, self.rng.choice(WORDS))
        document = {"id": plant_id, "name": name}
        if tag := self.rng.choice(TAGS):
            document["tag"] = tag
        body = json.dumps(document, ensure_ascii=self.rng.random() < 0.5)
        operation = self.operation("create", plant_id, body=body)
        outcome = self.until_final(operation, "POST", "/plants", body.encode())
        if outcome in (200, 409):
            self.mine.append(plant_id)
        self.run_.answered_create()

    def delete(self):
        plant_id = self.mine.pop(self.rng.randrange(len(self.mine)))
        operation = self.operation("delete", plant_id)
        self.until_final(operation, "DELETE", f"/plants/{plant_id}")

    def list(self):
        """A walk: 1 to 3 pages from the oldest, following each Link; each page's
        plants by the id in their names."""
        path, self.walks = f"/plants?limit={PAGE}", self.walks + 1
        for page in range(self.rng.randint(1, 3)):
            walk = f"{self.number}-{self.walks}"
            operation = self.operation("list", walk=walk, page=page, path=path)
            outcome, headers, data = self.attempt(operation, "GET", path)
            if outcome == 200:
                operation["ids"] = [plant_of(p["name"]) for p in json.loads(data)]
            link = re.fullmatch(r'<([^>]+)>; rel="next"', headers.get("Link", ""))
            if outcome != 200 or not link:
                return
            path = link[1]


# ---- What the run reads at its end, for the checker's files ----


def read_listing(host, port, token):
    """Every plant as the HTTP API lists it, [name, tag], a page of 1,000 at a time; a
    503 or a cut is asked again (the service has settled), for WAIT seconds at most."""
    plants, path, deadline = [], "/plants?limit=1000", time.monotonic() + WAIT
    while path:
        outcome, headers, data = ask(host, port, token, "GET", path)
        if outcome != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the listing could not be read: {outcome}")
            time.sleep(0.5)
            continue
        plants += [[plant["name"], plant.get("tag")] for plant in json.loads(data)]
        link = re.fullmatch(r'<([^>]+)>; rel="next"', headers.get("Link", ""))
        path = link and link[1]
    return plants


def read_rows(run):
    """The plants as the database holds them, read with its own driver, not through
    plantstore: [[seq, id, name, tag], ...]; None for the in-memory store."""
    query = "SELECT seq, id, name, tag FROM plants ORDER BY seq"
    if run.postgres:
        with run.postgres.local() as db:
            found = db.execute(query).fetchall()
    elif run.options.store == "sqlite":
        uri = f"file:{run.sqlite}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            found = db.execute(query).fetchall()
    else:
        return None

    def text(value):
        return None if value is None else bytes(value).decode("utf-8", "replace")

    return [
        [seq, plant_id, text(name), text(tag)] for seq, plant_id, name, tag in found
    ]


# ---- The run ----


CLOCK = """\
# Written by benchmarks/nemesis.py: this host's wall clock, time.time and time.time_ns,
# shifted by the seconds in the file NEMESIS_CLOCK_FILE names, read again every 0.2 s
# (a step). libfaketime would do it from outside, but hangs Python 3.11's timed waits.
import os
import time

_file, _time, _time_ns = os.environ.get("NEMESIS_CLOCK_FILE"), time.time, time.time_ns
_shift = [0.0, -1.0]  # the seconds, and when (time.monotonic) they were read


def _seconds():
    if time.monotonic() - _shift[1] > 0.2:
        _shift[1] = time.monotonic()
        try:
            with open(_file) as file:
                _shift[0] = float(file.read() or 0)
        except (OSError, ValueError):
            pass
    return _shift[0]


if _file:
    time.time = lambda: _time() + _seconds()
    time.time_ns = lambda: _time_ns() + int(_seconds() * 1e9)
"""


class Run:
    def __init__(self, options):
        self.options = options
        self.out = Path(options.out or tempfile.mkdtemp(prefix="plantstore-nemesis-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.plantstore = Path(options.plantstore).resolve()
        self.started = time.monotonic()
        self.stop_new, self.stopped_at = threading.Event(), None
        self.creates_answered, self.creates_lock = 0, threading.Lock()
        self.creates_done = threading.Event()
        self.faults, self.notes, self.backlog = [], [], []
        self.cleanups = []  # run last first, always
        self.inside_app, self.hosts, self.postgres, self.mount = [], None, None, None
        self.lazy, self.servers, self.logs = None, [], self.out

    def clock(self):
        return time.monotonic() - self.started

    def note(self, kind, text):
        if text:
            self.notes.append({"t": round(self.clock(), 3), "kind": kind, "text": text})
            print(f"nemesis: {self.clock():7.1f} s  NOTE {text}", flush=True)

    def answered_create(self):
        with self.creates_lock:
            self.creates_answered += 1
            if self.options.creates and self.creates_answered >= self.options.creates:
                self.creates_done.set()

    def say(self, text):
        print(f"nemesis: {self.clock():7.1f} s  {text}", flush=True)

    # -- setting up: secrets in files, the store, the receivers, the servers --

    def setup(self):
        options, kinds = self.options, set(self.options.faults)
        scratch = Path(
            tempfile.mkdtemp(prefix=f"plantstore-nemesis-scratch-{os.getpid()}-")
        )
        scratch.chmod(0o755)
        self.cleanups.append(lambda: shutil.rmtree(scratch, ignore_errors=True))
        self.scratch = scratch
        self.token = secrets.token_urlsafe(24)
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        files = {}
        for name, value in (("tokens", self.token), ("webhook-secret", secret)):
            files[name] = scratch / name
            files[name].write_text(value + "\n")
            files[name].chmod(0o600)
        if options.store == "postgres" and "partition" in kinds:
            self.hosts = nemesis_hosts()
            self.cleanups.append(self.hosts.remove)
            self.inside_app = self.hosts.inside(self.hosts.app)
            self.app_address = self.hosts.front[self.hosts.app][0]
            receiver_address = self.hosts.front[None][0]
        else:
            self.app_address = receiver_address = "127.0.0.1"
        deliveries = DeliveryLog(
            self.out / "deliveries.jsonl", self.started, options.receiver_delay
        )
        self.cleanups.append(deliveries.close)
        self.receivers = {
            name: Receiver(name, receiver_address, secret, deliveries)
            for name in RECEIVERS
        }
        for receiver in self.receivers.values():
            self.cleanups.append(receiver.close)
        self.receiver = self.receivers["a"]
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PLANTSTORE_", "GRANIAN_")) and k != "WEB_CONCURRENCY"
        }
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(self.plantstore),
            PLANTSTORE_TOKENS_FILE=str(files["tokens"]),
            PLANTSTORE_WEBHOOK_SECRET_FILE=str(files["webhook-secret"]),
            PLANTSTORE_WEBHOOK_URL=",".join(r.url for r in self.receivers.values()),
        )
        env.update(self.set_up_store(files, kinds))
        if "log-full" in kinds:  # the servers' logs on a filesystem of their own
            self.logs = scratch / "logs"
            self.logs.mkdir()
            self.mount_tmpfs(self.logs, 4)
        self.start_servers(env)

    def mount_tmpfs(self, folder, megabytes):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=755", "tmpfs"]
            + [str(folder)],
            check=True,
            timeout=WAIT,
        )
        self.cleanups.append(lambda: umount(folder))

    def set_up_store(self, files, kinds):
        """The store's settings; PostgreSQL started, or SQLite's folder made (a tmpfs
        for disk-full, under lazyfs for power-loss)."""
        options = self.options
        if options.store == "memory":
            self.store_shown = "the in-memory store"
            return {}
        if options.store == "postgres":
            self.postgres = postgres_on(self.hosts, lazy="power-loss" in kinds)
            self.cleanups.append(self.postgres.remove)
            files["db"] = self.scratch / "db"
            files["db"].write_text(self.postgres.url + "\n")
            files["db"].chmod(0o600)
            self.store_shown = "PostgreSQL (fsync on)"
            return {"PLANTSTORE_DB_FILE": str(files["db"])}
        folder = self.scratch / ("live" if "power-loss" in kinds else "db")
        folder.mkdir()
        if "disk-full" in kinds:
            self.mount_tmpfs(folder, options.tmpfs_mb)
            self.mount = folder
        shown = f" on a tmpfs of {options.tmpfs_mb} MB" if self.mount else ""
        if "power-loss" in kinds:  # the file seen through lazyfs, over that folder
            self.lazy = lazyfs.LazyFS(self.scratch / "lazyfs", live=folder)
            self.lazy.__enter__()
            self.cleanups.append(self.lazy.__exit__)
            folder, shown = self.lazy.mount, f" on lazyfs{shown}"
        self.sqlite = folder / "plants.sqlite3"
        self.store_shown = f"SQLite{shown}"
        return {"PLANTSTORE_DB": str(self.sqlite)}

    def start_servers(self, env):
        """One server a host; the second one's clock shifted by the clock file."""
        from testbed import free_port  # noqa: PLC0415 (the runner's)

        for number in range(1, self.options.app_hosts + 1):
            own = dict(env)
            if number == 2:
                clock = self.scratch / "clock"
                clock.mkdir()
                (clock / "sitecustomize.py").write_text(CLOCK)
                self.clock_file = clock / "seconds"
                self.clock_file.write_text("0")
                own["PYTHONPATH"] = f"{clock}{os.pathsep}{own['PYTHONPATH']}"
                own["NEMESIS_CLOCK_FILE"] = str(self.clock_file)
            suffix = "" if number == 1 else f"-{number}"
            server = Server(self, free_port(), own, self.logs / f"server{suffix}.log")
            self.servers.append(server)
            self.cleanups.append(lambda server=server: server.stop(seconds=5))
            if not server.start():
                raise RuntimeError(f"the server did not start: see {server.log}")
        self.server = self.servers[0]
        self.app_hosts = [(self.app_address, server.port) for server in self.servers]

    def cleanup(self):
        while self.cleanups:
            with contextlib.suppress(Exception):
                self.cleanups.pop()()

    # -- the faults --

    def episodes(self):
        """Each episode, drawn from the seed alone: (calm, [(kind, seconds, detail,
        offset), ...]), the second fault of two starting `offset` seconds after the
        first."""
        rng, kinds = random.Random(self.options.seed), sorted(self.options.faults)
        while True:
            calm = rng.uniform(*CALM)
            first = rng.choice(kinds)
            chosen = [first]
            others = [k for k in kinds if self.target(k) != self.target(first)]
            if others and rng.random() < TOGETHER:
                chosen.append(rng.choice(others))
            drawn = []
            for kind in chosen:
                low, high = FAULTS[kind].seconds
                seconds = rng.uniform(low, max(low, min(high, self.options.max_fault)))
                detail = {
                    "kill-worker": lambda: rng.randrange(64),
                    "pg-restart": lambda: rng.choice(["fast", "immediate"]),
                    "receiver-slow": lambda: round(rng.uniform(0.5, 5), 1),
                    "clock-step": lambda: rng.choice(["ahead", "back"]),
                }.get(kind, lambda: None)()
                offset = round(rng.uniform(*SECOND_AFTER), 1) if drawn else 0
                drawn.append((kind, round(seconds, 1), detail, offset))
            yield calm, drawn

    def nemesis(self):
        """Episodes until --seconds (or --creates); every fault undone at its end."""
        for calm, drawn in self.episodes():
            # --seconds of load: the servers' start, slow on a loaded machine, is not
            # counted (at load 16 it took them all, and no fault came)
            done = self.creates_done.wait(calm)
            if done or time.monotonic() - self.load_begun >= self.options.seconds:
                return
            said = " + ".join(
                (f"{offset} s later " if offset else "")
                + f"{kind} {seconds} s"
                + (f" ({detail})" if detail is not None else "")
                for kind, seconds, detail, offset in drawn
            )
            self.say(f"fault: {said}")
            threads = [
                threading.Thread(target=self.fault, args=fault) for fault in drawn
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def fault(self, kind, seconds, detail, offset):
        time.sleep(offset)
        start = self.clock()
        try:
            getattr(self, "fault_" + kind.replace("-", "_"))(seconds, detail)
        except Exception as error:  # the fault could not be made: noted, not hidden
            self.note(kind, f"{kind} failed: {type(error).__name__}: {error}")
        entry = {
            "kind": kind,
            "target": self.target(kind),
            "seconds": seconds,
            "detail": detail,
            "start": round(start, 3),
            "end": round(self.clock(), 3),
        }
        if FAULTS[kind].target.startswith("receiver"):
            entry["receiver"] = "b" if kind == "receiver-b-down" else "a"
        self.faults.append(entry)

    def target(self, kind):
        """What a fault acts on; two at once act on different ones. PostgreSQL's power
        loss is the database's host: drawn with pg-restart, each stopped and started
        PostgreSQL under the other, and pg_ctl failed ("could not start server")."""
        if kind == "power-loss" and self.options.store == "postgres":
            return "database"
        return FAULTS[kind].target

    def fault_kill_worker(self, _seconds, which):
        self.server.kill_worker(which)

    def fault_restart_server(self, seconds, _detail):
        self.server.restart(seconds)

    def fault_reload_server(self, _seconds, _detail):
        self.server.reload()

    def fault_power_loss(self, seconds, _detail):
        if self.postgres:  # the database's host
            self.postgres.power_loss(seconds)
            return

        def cut(process):  # the app host: the master first, or it starts new workers
            kill_tree(process.pid)
            process.wait()
            self.lazy.cut()

        self.server.restart(seconds, cut=cut)

    def fault_clock_step(self, seconds, way):
        self.clock_file.write_text(str(CLOCK_STEP if way == "ahead" else -CLOCK_STEP))
        try:
            time.sleep(seconds)
        finally:
            self.clock_file.write_text("0")

    def fault_pg_stop(self, seconds, _detail):
        from testbed import frozen_postgres  # noqa: PLC0415 (the runner's)

        with frozen_postgres(self.postgres):
            time.sleep(seconds)

    def fault_pg_restart(self, seconds, mode):
        try:
            self.postgres.stop_now(mode)
            time.sleep(seconds)
        finally:
            self.postgres.start()

    def fault_pg_read_only(self, seconds, _detail):
        with self.postgres.local() as admin:
            admin.execute("SET default_transaction_read_only = off")  # its own
            admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            admin.execute("SELECT pg_reload_conf()")
            try:
                time.sleep(seconds)
            finally:
                admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
                admin.execute("SELECT pg_reload_conf()")

    def fault_partition(self, seconds, _detail):
        self.hosts.set_data_link("down")
        try:
            time.sleep(seconds)
        finally:
            self.hosts.set_data_link("up")

    def fault_sqlite_held(self, seconds, _detail):
        holder = subprocess.Popen(
            [sys.executable, "-c", SQLITE_LOCKER, str(self.sqlite), str(seconds)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            said = holder.stdout.readline()
            if said != "locked\n" and holder.wait() != -signal.SIGKILL:
                raise RuntimeError("the holder did not take the lock")  # not a cut
            holder.wait(seconds + WAIT)
        finally:
            holder.kill()
            holder.wait()
            holder.stdout.close()

    def fault_disk_full(self, seconds, _detail):
        fill(self.mount, seconds)

    def fault_log_full(self, seconds, _detail):
        fill(self.logs, seconds, padded=[server.log for server in self.servers])

    def receiver_fault(self, mode, seconds, delay=0.0, name="a"):
        self.receivers[name].set(mode, delay)
        try:
            time.sleep(seconds)
        finally:
            self.receivers[name].set("up")

    def fault_receiver_b_down(self, seconds, _detail):
        self.receiver_fault("down", seconds, name="b")

    def fault_receiver_down(self, seconds, _detail):
        self.receiver_fault("down", seconds)

    def fault_receiver_slow(self, seconds, delay):
        self.receiver_fault("slow", seconds, delay)

    def fault_receiver_503(self, seconds, _detail):
        self.receiver_fault("503", seconds)

    def fault_receiver_500(self, seconds, _detail):
        self.receiver_fault("500", seconds)

    # -- settling, and the whole run --

    def metrics(self):
        """(database up, events waiting for every receiver) from one GET /metrics."""
        outcome, _, data = ask(*self.app_hosts[0], self.token, "GET", "/metrics")
        if outcome != 200:
            return False, None
        text = data.decode()
        up = re.search(r"^plantstore_database_up (\S+)$", text, re.M)
        waiting = re.findall(
            r'^plantstore_webhook_events_waiting\{receiver="[^"]*"\} (\S+)$', text, re.M
        )
        up = self.options.store == "memory" or bool(up and float(up[1]) == 1)
        return up, sum(map(float, waiting))

    def sample(self, stop):
        """Until `stop`, GET /metrics every 5 s: the outbox's backlog as it goes."""
        while not stop.wait(5):
            up, waiting = self.metrics()
            self.backlog.append((round(self.clock(), 1), up, waiting))

    def settle(self):
        """Seconds until /metrics says the database is up and no event waits; or None
        once --settle seconds pass with the backlog at no new low (a backlog that
        keeps falling is waited for, however large: the sender drains it at its
        pace)."""
        start = last_low = time.monotonic()
        low = math.inf
        while time.monotonic() < last_low + self.options.settle:
            up, waiting = self.metrics()
            if up and waiting == 0:
                return time.monotonic() - start
            if up and waiting is not None and waiting < low:
                low, last_low = waiting, time.monotonic()
            time.sleep(1)
        return None

    def go(self):
        options = self.options
        self.setup()
        self.say(
            f"seed {options.seed}: {self.store_shown} under {self.server.recipe}"
            + (f" on {options.app_hosts} app hosts" if options.app_hosts > 1 else "")
            + f", {options.clients} clients"
            + (f" at {options.rate:g} operations/s" if options.rate else "")
            + f", faults: {', '.join(options.faults) or 'none'}"
        )
        stop_watch = threading.Event()
        watches = [
            threading.Thread(target=server.watch, args=(stop_watch,))
            for server in self.servers
        ]
        watches.append(threading.Thread(target=self.sample, args=(stop_watch,)))
        for watch in watches:
            watch.start()
        self.cleanups.append(lambda: (stop_watch.set(), [w.join() for w in watches]))
        clients = [Client(n, self) for n in range(1, options.clients + 1)]
        for client in clients:
            client.start()
        begun = self.load_begun = time.monotonic()
        if options.faults:
            self.nemesis()
        else:
            self.creates_done.wait(options.seconds)
        load_seconds = time.monotonic() - begun
        self.stopped_at = time.monotonic()
        self.stop_new.set()
        self.say(f"faults stopped after {load_seconds:.1f} s; clients finish")
        for client in clients:
            client.join(RESOLVE_SECONDS + CLIENT_TIMEOUT + 5)
        stop_watch.set()
        for watch in watches:
            watch.join()
        settled = self.settle()
        self.say(
            "settled: the outbox drained "
            + (f"in {settled:.1f} s" if settled is not None else "NOT within the bound")
            + f" (--settle {options.settle} s)"
        )
        self.write(
            [op for client in clients for op in client.operations],
            read_listing(*self.app_hosts[0], self.token),
            read_rows(self),
        )
        report = check(self.out)
        report.update(
            seed=options.seed,
            store=options.store,
            server=self.server.recipe,
            store_shown=self.store_shown,
            clients=options.clients,
            rate=options.rate,
            seconds=round(load_seconds, 1),
            settled=None if settled is None else round(settled, 1),
            settle_bound=options.settle,
            notes=self.notes,
            backlog=self.backlog,
            backlog_max=max((w or 0 for _, _, w in self.backlog), default=0),
            ok=not report["failed"] and settled is not None,
        )
        (self.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        return report

    def write(self, operations, listing, rows):
        """The checker's files (docs/reliability.md gives their fields), but
        deliveries.jsonl, which the receivers write as deliveries come."""
        options = self.options
        run = {
            "store": options.store,
            "server": self.server.recipe,
            "seed": options.seed,
            "app_hosts": options.app_hosts,
            "receivers": {name: r.url for name, r in self.receivers.items()},
            "faults": options.faults,
            "seconds": options.seconds,
        }
        (self.out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
        for name, lines in (
            ("operations", operations),
            ("faults", self.faults),
            ("listing", listing),
            ("rows", rows),
        ):
            if lines is not None:
                with open(self.out / f"{name}.jsonl", "w", encoding="utf-8") as file:
                    for line in lines:
                        file.write(json.dumps(line, ensure_ascii=False) + "\n")
        for server in self.servers:  # from the logs' own filesystem, if it had one
            if server.log.parent != self.out:
                shutil.copyfile(server.log, self.out / server.log.name)


def fill(folder, seconds, padded=()):
    """Fill folder's filesystem to its last byte for `seconds`, then free it. The
    files `padded` are written to the end of their last block (with newlines): a
    write to them then needs a block too."""
    filler = folder / "filler"
    try:
        with open(filler, "wb", buffering=0) as file:
            free = os.statvfs(folder)
            with contextlib.suppress(OSError):
                os.posix_fallocate(file.fileno(), 0, free.f_bavail * free.f_frsize)
            file.seek(0, os.SEEK_END)
            with contextlib.suppress(OSError):  # the last bytes, to ENOSPC
                for _ in range(1 << 20):
                    file.write(b"\0" * 512)
        for path in padded:
            with contextlib.suppress(OSError), open(path, "ab", buffering=0) as file:
                file.write(b"\n" * (-file.tell() % free.f_bsize))
        time.sleep(seconds)
    finally:
        filler.unlink(missing_ok=True)


def umount(folder):
    subprocess.run(["umount", "-l", str(folder)], check=False, timeout=WAIT)


def sweep_mounts():
    """Unmount the tmpfs and lazyfs of a run that was killed before it could (its
    process is gone), and remove its scratch folder."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            point = line.split()[1]
            found = re.search(
                r"^(.*/plantstore-nemesis-scratch-(\d+)-[^/]*)/(db|live|logs|lazyfs/mount)$",
                point,
            )
            if found and not os.path.exists(f"/proc/{found[2]}"):
                umount(point)
                shutil.rmtree(found[1], ignore_errors=True)


def table(report):
    """The report as text: a summary, then the counts as a Markdown table."""
    ops, attempts, lat = report["operations"], report["attempts"], report["latency"]

    def counts(counter):
        return ", ".join(f"{key} x {value}" for key, value in sorted(counter.items()))

    def ms(value):
        return "-" if value is None else f"{value * 1000:.0f} ms"

    lines = [
        f"seed {report['seed']}, {report['store_shown']} under {report['server']}, "
        f"{report['clients']} clients"
        + (f" at {report['rate']:g} operations/s" if report["rate"] else "")
        + f", {report['seconds']} s of load and faults",
        f"creates: {counts(ops['create'])}",
        f"deletes: {counts(ops['delete'])}",
        f"pages read: {report['pages_read']}",
        f"requests by answer: create {counts(attempts['create'])}; "
        f"delete {counts(attempts['delete'])}; list {counts(attempts['list'])}",
        "faults: "
        + (
            ", ".join(
                f"{kind} x {figures['count']} ({figures['seconds']} s)"
                for kind, figures in report["faults"].items()
            )
            or "none"
        ),
        "settled: "
        + (f"{report['settled']} s" if report["settled"] is not None else "no")
        + f" (bound {report['settle_bound']} s); the outbox held at most "
        f"{report['backlog_max']:.0f} events; stored {report['stored']}, "
        f"listed {report['listed']}, rows {report['rows_read']}, "
        f"removed {report['removed']}",
        f"latency of a request: calm p50 {ms(lat['calm']['p50'])}, p99 "
        f"{ms(lat['calm']['p99'])} ({lat['calm']['requests']}); in fault p50 "
        f"{ms(lat['fault']['p50'])}, p99 {ms(lat['fault']['p99'])} "
        f"({lat['fault']['requests']})",
    ]
    for note in report["notes"]:
        lines.append(f"note at {note['t']} s: {note['text']}")
    if report["flagged_409_after_503"]:
        lines.append(
            f"flagged: a 409 after an SQLite 503, {report['flagged_409_after_503']}"
        )
    if report["missing_best_effort"]:
        lines.append(
            "missing at a receiver the in-memory outbox may drop (best effort): "
            f"{report['missing_best_effort']}"
        )
    lines += ["", "| check | count |", "|---|---|"]
    for name in VERDICTS:
        shown = name.replace("_", " ")
        if name in RECEIVER_VERDICTS:
            each = report[name] or {}
            by = ", ".join(f"{r}: {len(v)}" for r, v in sorted(each.items()))
            lines.append(f"| {shown} | {count(report, name)} ({by or 'each 0'}) |")
        else:
            lines.append(f"| {shown} | {count(report, name)} |")
    for name in report["failed"]:
        found = report[name]
        lines.append(f"{name}: {str(found)[:600]}")
    lines.append("OK: nothing lost" if report["ok"] else "FAILED")
    return "\n".join(lines)


def faults_help():
    lines = []
    for kind, fault in FAULTS.items():
        low, high = fault.seconds
        length = f", {low}-{high} s" if high else ""
        flags = ("" if fault.default else ", not by default") + (
            ", needs root" if fault.root else ""
        )
        stores = "/".join(sorted(fault.stores))
        lines.append(f"{kind} ({fault.target}, {stores}{length}{flags}): {fault.does}")
    return "\n".join(lines)


def parse(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The faults:\n" + faults_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=1, help="draws the faults (1)")
    parser.add_argument(
        "--store", choices=["sqlite", "postgres", "memory"], default="sqlite"
    )
    parser.add_argument("--server", choices=["gunicorn", "granian"], default="gunicorn")
    parser.add_argument(
        "--seconds", type=float, default=60, help="of load and faults (60)"
    )
    parser.add_argument(
        "--faults",
        default="default",
        help="comma-separated kinds, 'default' (every kind that runs by default and "
        "applies to the store) or 'none'",
    )
    parser.add_argument("--list-faults", action="store_true", help="and exit")
    parser.add_argument("--clients", type=int, default=8, help="(8)")
    parser.add_argument(
        "--app-hosts",
        type=int,
        choices=[1, 2],
        help="servers sharing the database, each client request sent to one drawn "
        "at random; the second one's clock is clock-step's (2 with PostgreSQL, else "
        "1)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="operations a second, all clients together, at most (0: each client "
        "sends its next as soon as it has its answer)",
    )
    parser.add_argument(
        "--receiver-delay",
        type=float,
        default=0,
        help="seconds each receiver takes to answer, always (0): a backlog of a few "
        "events at each moment, as a receiver across a network gives",
    )
    parser.add_argument(
        "--max-fault-seconds",
        dest="max_fault",
        type=float,
        default=40,
        help="caps each fault's drawn duration (40)",
    )
    parser.add_argument(
        "--creates",
        type=int,
        default=0,
        help="end the load once this many creates are answered, or after --seconds",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=420,
        help="after the faults, the longest the outbox may go without draining further "
        "(420 s: the schedule's 300 s step, its jitter, a lease and an attempt)",
    )
    parser.add_argument(
        "--tmpfs-mb", type=int, default=256, help="the SQLite tmpfs, for disk-full"
    )
    parser.add_argument("--out", help="the folder for the run's files (a new one)")
    parser.add_argument(
        "--plantstore",
        default=str(ROOT),
        help="the folder of the plantstore.py to serve (this repository's)",
    )
    parser.add_argument("--json", help="also write the report there")
    options = parser.parse_args(argv)
    if options.list_faults:
        print(faults_help())
        sys.exit(0)
    if options.app_hosts is None:
        options.app_hosts = 2 if options.store == "postgres" else 1
    if options.app_hosts == 2 and options.store != "postgres":
        parser.error("two app hosts share a PostgreSQL: --store postgres")
    if options.faults == "none":
        options.faults = []
    elif options.faults == "default":
        options.faults = [
            kind
            for kind, fault in FAULTS.items()
            if fault.default
            and options.store in fault.stores
            and not (kind == "reload-server" and options.server == "granian")
            and not (kind == "clock-step" and options.app_hosts == 1)
        ]
    else:
        options.faults = options.faults.split(",")
        for kind in options.faults:
            if kind not in FAULTS:
                parser.error(f"no fault {kind!r}: --list-faults lists them")
            if options.store not in FAULTS[kind].stores:
                parser.error(f"{kind} is a fault of {'/'.join(FAULTS[kind].stores)}")
        if "reload-server" in options.faults and options.server == "granian":
            parser.error("reload-server is gunicorn's SIGHUP, not granian's")
        if "clock-step" in options.faults and options.app_hosts == 1:
            parser.error("clock-step steps the second app host's clock: --app-hosts 2")
    rooted = [kind for kind in options.faults if FAULTS[kind].root]
    if rooted and os.geteuid() != 0:
        parser.error(f"{', '.join(rooted)} need root; --faults without them")
    return options


def main(argv=None):
    options = parse(argv)
    sweep_mounts()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    run = Run(options)
    try:
        report = run.go()
    finally:
        run.cleanup()
        signal.signal(signal.SIGTERM, previous)
    print(table(report))
    print(f"nemesis: the run's files are in {run.out}")
    if options.json:
        Path(options.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
