"""The nemesis of issue 54 (benchmarks/nemesis.py) in the suite: its short form, about a
minute on SQLite under gunicorn with the faults that need no second host, loses nothing;
and its checker, which imports nothing of plantstore, can fail: it finds what a copy of
plantstore with a defect planted in it loses. docs/reliability.md has the long form."""

import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import plantstore

from testbed import (
    HERE,
    TOKEN,
    WAIT,
    environ_without_tokens,
    granian_recipe,
    listed_ids,
    post_over_http,
    start_granian,
)

NEMESIS = HERE / "benchmarks" / "nemesis.py"
# The short form: its seed draws every kind below within its first four episodes
# (about 30 s of them), and no restart of the server in a spell of the receiver's or
# just after (a restart then leaves the receiver's oldest events on their schedule, up
# to 6 min: docs/reliability.md); the SQLite file on a tmpfs for disk-full; each fault
# 8 s at most; 150 operations a second, which the webhook sender outpaces, so that the
# outbox drains in seconds once the faults stop (unpaced, it grows: 40 s to drain)
SHORT_FAULTS = (
    "kill-worker",
    "restart-server",
    "sqlite-held",
    "disk-full",
    "receiver-down",
    "receiver-slow",
    "receiver-503",
)
SHORT = (
    *("--seed", "1644", "--seconds", "40", "--max-fault-seconds", "8", "--rate", "150"),
    *("--settle", "120", "--tmpfs-mb", "64", "--faults", ",".join(SHORT_FAULTS)),
)
# the longest a run may take before the test gives up on it: a hang, not a speed
RUN_BOUND = 400
VERDICTS = ("lost", "phantom", "resurrected", "wrong_409", "missing", "forged")


def run_nemesis(spawn, tmp_path, *args):
    """Run benchmarks/nemesis.py to its end, as an operator does; return its report
    and all it printed. Past RUN_BOUND it is stopped with SIGTERM, on which it undoes
    its faults and stops what it started."""
    report = tmp_path / "report.json"
    process = spawn(
        [sys.executable, str(NEMESIS), "--out", str(tmp_path / "run")]
        + ["--json", str(report), *args],
        environ_without_tokens(),
    )
    try:
        out, err = process.communicate(timeout=RUN_BOUND)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAIT * 2)
        raise AssertionError(
            f"the nemesis ran past {RUN_BOUND} s:\n{out}{err}"
        ) from None
    said = out + err
    assert process.returncode in (0, 1), said  # 1: it found something
    assert "Traceback" not in said, said
    return json.loads(report.read_text()), said


def test_nemesis_short_form_loses_nothing(spawn, tmp_path):
    """Issue 54's short form: 40 s of creates, deletes and pages from 8 clients, while
    workers are killed, the server restarted, the SQLite file held and its filesystem
    filled, and the receiver down, slow or answering 503; then every create answered
    200 (or 409 after our own 503 or cut) is listed or deleted, nothing else is listed,
    and every stored plant's webhook came, signed."""
    report, said = run_nemesis(spawn, tmp_path, *SHORT)
    for verdict in (*VERDICTS, "unresolved"):
        assert report[verdict] == [], f"{verdict}: {report[verdict]}\n{said}"
    assert report["settled"] is not None, said
    assert report["unexpected"] == {}, said  # never a 500, nor an answer unpromised
    assert report["notes"] == [], said  # every fault made; no server ended by itself
    assert set(report["faults"]) == set(SHORT_FAULTS), said
    retried = sum(
        count
        for outcome, count in report["operations"]["create"].items()
        if "after a retry" in outcome
    )
    assert retried, f"no fault reached a client: {said}"
    assert report["ok"], said


# A defect planted in a copy of plantstore.py, by a textual replacement: (the line it
# goes before, the defect). PLANTED counts in each process, so 1,000 creates answered
# by 2 workers plant at least one.
PLANTS = {
    "lost": (
        "        if not self.store.add(plant_id, name, tag):\n",
        "        if next(PLANTED) % 500 == 0:  # planted: answered 200, never stored\n"
        "            return 200, plant_json(name, tag), []\n",
    ),
    "missing": (
        "        for url in self.urls:\n            run(\n",
        "        if next(PLANTED) % 500 == 0:  # planted: the event is never written\n"
        "            return\n",
    ),
}


@pytest.mark.parametrize("defect", PLANTS)
def test_nemesis_checker_finds_a_planted_defect(spawn, tmp_path, defect):
    """A copy of plantstore that answers 200 to one create in 500 without storing it
    ("lost"), or that never writes one event in 500 ("missing"): a few seconds of load
    without faults, and the checker counts it."""
    before, planted = PLANTS[defect]
    text = (HERE / "plantstore.py").read_text()
    assert text.count(before) == 1, f"plantstore.py changed: plant {defect} anew"
    copy = tmp_path / "planted"
    copy.mkdir()
    (copy / "plantstore.py").write_text(
        text.replace(before, planted + before)
        + "\nimport itertools  # noqa: E402\n\nPLANTED = itertools.count(1)\n"
    )
    report, said = run_nemesis(
        spawn,
        tmp_path,
        *("--faults", "none", "--creates", "1000", "--seconds", "60"),
        *("--settle", "60", "--plantstore", str(copy)),
    )
    assert report[defect], f"the checker missed the planted {defect}: {said}"
    assert not report["ok"] and "FAILED" in said, said
    if defect == "missing":  # the plant is stored; its event alone is gone
        assert report["lost"] == [], said
    else:  # nothing stored, so no event either
        assert set(report["lost"]) <= set(report["missing"]), said
    for verdict in ("phantom", "resurrected", "wrong_409", "forged"):
        assert report[verdict] == [], said


def test_nemesis_checker_reads_each_answer_as_the_contract_says():
    """The checker alone, on a history made by hand: a 409 or a 404 counts as done by
    us after our own 503 or cut only, never after a refusal; what is listed, removed
    and delivered is weighed against it. And it imports nothing of plantstore."""
    spec = importlib.util.spec_from_file_location("nemesis", NEMESIS)
    nemesis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nemesis)
    operations = [
        ["create", 1, [(0, 1, 200)]],  # listed: fine
        ["create", 2, [(0, 1, 503), (1, 2, 409)]],  # stored by its first attempt
        ["create", 3, [(0, 1, 409)]],  # a wrong 409, and then listed: a phantom
        ["create", 4, [(0, 1, "cut"), (1, 2, 200)]],
        ["create", 5, [(0, 1, 200)]],  # neither listed nor removed: lost
        ["create", 6, [(0, 1, 200)]],
        ["delete", 6, [(2, 3, "cut"), (3, 4, 404)]],  # removed by its first attempt
        ["create", 7, [(0, 1, 200)]],
        ["delete", 7, [(2, 3, 204)]],  # removed, and listed: resurrected
        ["create", 8, [(0, 1, "refused"), (1, 2, 409)]],  # a refusal stored nothing
        ["create", 9, [(0, 1, 503)]],  # never answered 200 or 409: unresolved
        ["create", 11, [(0, 1, 200)]],
        ["delete", 11, [(2, 3, 404)]],  # a plant gone before its delete: lost
        ["list", None, [(0, 1, 200), (1, 2, 500)]],
    ]
    listing = [1, 2, 3, 4, 7, 9, 10]  # 10: never sent

    def delivery(plant_id, status=200, verified=True):
        return {"id": plant_id, "status": status, "verified": verified, "t": 5}

    deliveries = [
        *map(delivery, [1, 1, 2, 4, 5, 6, 11]),
        delivery(7, status=503),  # not taken: 7 is missing
        delivery(3, verified=False),  # forged: a bad signature
        delivery(10),  # forged: a plant never stored
    ]
    faults = [{"kind": "kill-worker", "start": 1.5, "end": 2.5}]
    report = nemesis.check(operations, listing, deliveries, faults)
    assert report["lost"] == [5, 11]
    assert report["phantom"] == [3, 9, 10]
    assert report["resurrected"] == [7]
    assert report["wrong_409"] == [3, 8]
    assert report["wrong_404"] == [11]
    assert report["missing"] == [7]
    assert [entry["id"] for entry in report["forged"]] == [3, 10]
    assert report["unresolved"] == [9]
    assert report["duplicates"] == {0: 1, 1: 5, 2: 1}
    assert report["unexpected"] == {"list 500": 1}
    assert report["faults"] == {"kill-worker": {"count": 1, "seconds": 1.0}}
    assert report["latency"]["fault"]["requests"] == 7  # under way in [1.5, 2.5]
    # from the create's answer (1, or 2 after a retry) to the delivery (5)
    assert report["delivery_delay"] == {"p50": 4, "p99": 4, "max": 4}
    loads = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('nemesis', {str(NEMESIS)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print({'plantstore', 'plantstore_postgres'} & set(sys.modules))\n"
    )
    imported = subprocess.run(
        [sys.executable, "-c", loads],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=HERE,
    )
    assert (imported.returncode, imported.stdout) == (0, "set()\n"), imported.stderr


# ---- What the nemesis found, each with a test of its own ----


def test_nemesis_found_granian_replaces_a_killed_worker(spawn, tmp_path):
    """The nemesis's kill-worker under granian: with the SQL recipes as they were, one
    worker killed ended granian whole, exit status 1, which the unit does not restart.
    With --respawn-failed-workers, in both SQL recipes, the worker is replaced, and
    creates go on."""
    for store in ("sqlite", "postgres"):
        assert "--respawn-failed-workers" in granian_recipe(store), store
    db = tmp_path / "plants.sqlite3"
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(db))
    server = start_granian(spawn, env, "sqlite")
    os.kill(server.pids[0], signal.SIGKILL)
    server.log.until(r"Respawning worker-1")
    server.log.until(r"Started worker-1 runtime")
    for plant_id in range(1, 11):  # each worker answers some of them
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http("127.0.0.1", server.port, TOKEN, document)[0] == 200
    assert listed_ids("127.0.0.1", server.port) == list(range(1, 11))
    assert server.process.poll() is None, server.log.so_far()


# What the nemesis found in plantstore.py has its tests beside the part it is in: an
# SQLite file full at start, test_plantstore_sqlite.py's; the sender's claim, below.


@pytest.mark.parametrize("in_memory", [False, True], ids=["sqlite", "memory"])
def test_nemesis_found_the_sender_claims_without_sorting_the_backlog(
    tmp_path, in_memory
):
    """The long run on SQLite (docs/reliability.md), on 1.4.0's code: 208,562 creates
    in 10 minutes left 187,192 events waiting when the load stopped, and 15 minutes
    later the sender still drained the last 138,671 at 68 a second, where it drains
    10,000 at 350: each claim of at most 4 events sorted every waiting event of its
    receiver by seq (30 to 45 ms at 130,000), holding SQLite's write lock meanwhile, so
    the larger the backlog, the slower it drains: 36 minutes in all. Its query walks
    an index in the order it takes events (plant_events_claims, on (url, next_at)) and
    stops at its limit: its plan sorts nothing, in the file and in memory. A plan, not
    a time: the same on any machine."""
    path = tmp_path / "plants.sqlite3"
    plantstore.SQLiteStore(
        str(path)
    ).close()  # its tables and indexes, as it makes them
    now = time.time()
    claim = {"lease": now + 17, "now": now, "url": "http://r/", "due": now, "free": 4}
    with contextlib.closing(sqlite3.connect(":memory:" if in_memory else path)) as db:
        if in_memory:  # the outbox in memory, as the sender makes it
            for statement in plantstore.WebhookSender.IN_MEMORY:
                db.execute(statement)
        plan = db.execute(
            "EXPLAIN QUERY PLAN " + plantstore.WebhookSender.CLAIM, claim
        ).fetchall()
    assert not any("TEMP B-TREE" in step[-1] for step in plan), plan


# ---- The power cuts' filesystem (benchmarks/lazyfs.py) ----


def load(name):
    """A module of benchmarks/ by its path: they are scripts, not a package."""
    spec = importlib.util.spec_from_file_location(
        name, HERE / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lazyfs = load("lazyfs")


@pytest.fixture
def lazy(tmp_path):
    """A lazyfs mount for the test, always unmounted."""
    with lazyfs.LazyFS(tmp_path / "lazyfs") as mounted:
        yield mounted
    assert not os.path.ismount(mounted.mount)


def write(path, text, sync):
    with open(path, "a") as file:
        file.write(text)
        file.flush()
        if sync:
            os.fsync(file.fileno())


def sync_folder(path):
    folder = os.open(path, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def test_lazyfs_a_cut_keeps_what_was_synced_and_drops_the_rest(lazy):
    """What a power cut leaves: a file's content as of its last fsync, a folder's
    entries as of the folder's; every process using the filesystem is killed."""
    mount = lazy.mount
    write(mount / "kept", "synced", sync=True)
    write(mount / "renamed", "its old name is synced", sync=True)
    write(mount / "unlinked", "synced, and its unlink is not", sync=True)
    (mount / "folder").mkdir()
    sync_folder(mount)
    write(mount / "kept", " and this not", sync=False)
    write(mount / "created", "synced, its entry not", sync=True)
    write(mount / "folder" / "inside", "its folder's entry synced, its own not", True)
    os.rename(mount / "renamed", mount / "new name")
    os.unlink(mount / "unlinked")
    sleeper = subprocess.Popen(  # a process that holds a file open: killed
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1]); time.sleep(99)",
        ]
        + [str(mount / "kept")]
    )
    try:
        lazyfs_users = lazyfs.users(mount)
        while sleeper.pid not in lazyfs_users:  # its open(), under way
            time.sleep(0.02)
            lazyfs_users = lazyfs.users(mount)
        assert lazy.cut() == {sleeper.pid}
        assert sleeper.wait(WAIT) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(os.listdir(mount)) == ["folder", "kept", "renamed", "unlinked"]
    assert (mount / "kept").read_text() == "synced"
    assert (mount / "renamed").read_text() == "its old name is synced"
    assert os.listdir(mount / "folder") == []
    # and what is synced after the cut is kept by the next one
    write(mount / "kept", ", then this", sync=True)
    lazy.cut()
    assert (mount / "kept").read_text() == "synced, then this"


def test_lazyfs_a_cut_undoes_a_truncate_and_keeps_a_synced_one(lazy):
    path = lazy.mount / "file"
    write(path, "0123456789", sync=True)
    sync_folder(lazy.mount)
    os.truncate(path, 4)
    lazy.cut()
    assert path.read_text() == "0123456789"
    with open(path, "r+") as file:
        file.truncate(4)
        os.fsync(file.fileno())
    lazy.cut()
    assert path.read_text() == "0123"


def test_lazyfs_is_unmounted_after_a_failure(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with lazyfs.LazyFS(tmp_path / "lazyfs") as mounted:
            assert os.path.ismount(mounted.mount)
            1 / 0  # noqa: B018 (the failure)
    assert not os.path.ismount(mounted.mount)
    assert mounted.daemon.returncode is not None


SQLITE_WRITER = """\
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute(f"PRAGMA synchronous={sys.argv[2]}")
db.execute("CREATE TABLE plants (id INTEGER PRIMARY KEY)")
for plant_id in range(1, 301):
    db.execute("INSERT INTO plants VALUES (?)", (plant_id,))
    if plant_id == 150:
        db.execute("PRAGMA wal_checkpoint")
    print(plant_id, flush=True)  # committed: acknowledged
input()  # held open, as a server's worker, until the cut kills it
"""


@pytest.mark.parametrize("synchronous", ["FULL", "OFF"])
def test_lazyfs_sqlite_keeps_every_commit_with_synchronous_full(lazy, synchronous):
    """SQLite in WAL mode, as plantstore opens it (synchronous=FULL): every commit it
    acknowledged is there after a cut, a checkpoint's included. With synchronous=OFF,
    none is synced: the cut takes them, and the file's own entry with them."""
    path = lazy.mount / "plants.sqlite3"
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # as SQLiteStore makes it
    writer = subprocess.Popen(
        [sys.executable, "-c", SQLITE_WRITER, str(path), synchronous],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        acknowledged = [int(writer.stdout.readline()) for _ in range(300)]
        lazy.cut()
    finally:
        writer.kill()
        writer.wait()
        writer.stdin.close()
        writer.stdout.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            stored = [row[0] for row in db.execute("SELECT id FROM plants")]
        except sqlite3.OperationalError as error:  # no such table
            stored = str(error)
    if synchronous == "FULL":
        assert stored == acknowledged
    else:
        assert stored == "no such table: plants"
