"""The nemesis of issues 54 and 59 (benchmarks/nemesis.py) in the suite: its short form
loses nothing, on SQLite under gunicorn with power cuts, two receivers and the faults
that need no second host; its checker (benchmarks/nemesis_check.py), which reads only
the run's files, can fail: it finds each defect planted in a copy of the modules, and
each of the audit's webhook defects (issue 57, items 3, 4, 5 and 7) in its condition;
and the power cuts' filesystem (benchmarks/lazyfs.py) loses what was not synced, and
nothing else. docs/reliability.md has the long form, and the files' fields."""

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

import plantstore_webhooks
import plantstore_sqlite

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
# The short form: SQLite on lazyfs under gunicorn, two receivers; its seed draws every
# kind below within 45 s (power-loss twice, once while receiver b is down), each fault
# 6 s at most (receiver-b-down 10); 150 operations a second, which the webhook sender
# outpaces, so that the outbox drains in seconds once the faults stop. log-full waits
# for the fix of issue 57's item 5 (its own test below)
SHORT_FAULTS = (
    "power-loss",
    "kill-worker",
    "restart-server",
    "reload-server",
    "sqlite-held",
    "disk-full",
    "receiver-down",
    "receiver-slow",
    "receiver-503",
    "receiver-b-down",
)
SHORT = (
    *("--seed", "12657", "--seconds", "52", "--max-fault-seconds", "6"),
    "--rate",
    "150",
    *("--settle", "120", "--tmpfs-mb", "64", "--faults", ",".join(SHORT_FAULTS)),
)
# the longest a run may take before the test gives up on it: a hang, not a speed
RUN_BOUND = 400


def load(name):
    """A module of benchmarks/ by its path: they are scripts, not a package."""
    path = HERE / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lazyfs = load("lazyfs")
nemesis_check = load("nemesis_check")
VERDICTS = nemesis_check.VERDICTS


def run_nemesis(spawn, tmp_path, *args):
    """Run benchmarks/nemesis.py to its end, as an operator does; return its report,
    all it printed, and its folder. Past RUN_BOUND it is stopped with SIGTERM, on
    which it undoes its faults and stops what it started."""
    report, out = tmp_path / "report.json", tmp_path / "run"
    process = spawn(
        [sys.executable, str(NEMESIS), "--out", str(out)]
        + ["--json", str(report), *args],
        environ_without_tokens(),
    )
    try:
        printed, err = process.communicate(timeout=RUN_BOUND)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        printed, err = process.communicate(timeout=WAIT * 2)
        raise AssertionError(
            f"the nemesis ran past {RUN_BOUND} s:\n{printed}{err}"
        ) from None
    said = printed + err
    assert process.returncode in (0, 1), said  # 1: it found something
    assert "Traceback" not in said, said
    return json.loads(report.read_text()), said, out


def failed(report):
    """Each verdict that failed, with its count (a receiver's, each)."""
    return {name: nemesis_check.count(report, name) for name in report["failed"]}


def test_nemesis_short_form_loses_nothing(spawn, tmp_path):
    """The short form: 40 s of creates, deletes and pages from 8 clients, while the
    app host loses power (SQLite on lazyfs), workers are killed, the server restarted
    and reloaded, the SQLite file held and its filesystem filled, receiver a down, slow
    or answering 503 and receiver b down for long stretches; then, by the run's files
    alone, every acknowledged plant is listed and in the rows, as sent, or deleted,
    nothing else is, no walk through the pages skipped one, and each receiver kept
    every stored plant's exact body, signed."""
    report, said, out = run_nemesis(spawn, tmp_path, *SHORT)
    assert failed(report) == {}, said
    assert report["settled"] is not None, said
    assert report["notes"] == [], said  # every fault made; no server ended by itself
    assert set(report["faults"]) == set(SHORT_FAULTS), said
    assert report["faults"]["power-loss"]["count"] >= 2, said
    retried = sum(
        count
        for outcome, count in report["operations"]["create"].items()
        if "after a retry" in outcome
    )
    assert retried, f"no fault reached a client: {said}"
    assert report["ok"], said
    # the verdicts, derived again from the files alone, are the run's
    again = nemesis_check.check(out)
    assert {name: again[name] for name in VERDICTS} == {
        name: report[name] for name in VERDICTS
    }


# ---- The checker can fail: defects planted in a copy of the modules ----
#
# A defect is a small replacement in one module, (file, old text, new text), applied to
# a copy of every plantstore*.py, and refused when its old text is not found exactly
# once: when a module is split or changed, the defect is planted anew, in one line.
# Most touch only the plants whose id, less its client's block, is N modulo 50 (a class
# of their own, so that one run holds several, each counted apart).

CLASS = 50  # a planted defect touches the plants whose id % 10**9 % CLASS is its own


def in_class(residue):
    return f"% 10**9 % {CLASS} == {residue}"


ADD = "        if not self.store.add(plant_id, name, tag):\n"
DEFECTS = {
    "delete answers 204 without deleting": (
        "plantstore.py",
        "    def deletePlant(self, _environ, id_text):\n",
        "    def deletePlant(self, _environ, id_text):\n"
        f'        if url_integer(id_text, "id") {in_class(11)}:  # planted\n'
        '            return 204, b"", []\n',
    ),
    "a 409 for a fresh id": (
        "plantstore.py",
        ADD,
        f"        if plant_id {in_class(13)}:  # planted\n"
        "            raise HTTPError(409, \"a plant with this 'id' already exists\")\n"
        + ADD,
    ),
    "a 200 sent before the commit, written 5 s later": (
        "plantstore.py",
        ADD,
        f"        if plant_id {in_class(17)}:  # planted\n"
        "            later = (plant_id, name, tag)\n"
        "            threading.Timer(5, self.store.add, later).start()\n"
        "            return 200, plant_json(name, tag), JSON_HEADERS\n" + ADD,
    ),
    "a webhook body with the wrong id": (
        "plantstore_webhooks.py",
        "    return b'{\"id\": %d, ' % plant_id + plant_json(name, tag)[1:]\n",
        f"    plant_id += plant_id {in_class(19)}  # planted\n"
        "    return b'{\"id\": %d, ' % plant_id + plant_json(name, tag)[1:]\n",
    ),
    "a name truncated": (
        "plantstore.py",
        ADD,
        f"        if plant_id {in_class(21)}:  # planted\n"
        "            name = name[:-1]\n" + ADD,
    ),
    "a name upper-cased and the tag changed": (
        "plantstore.py",
        ADD,
        f"        if plant_id {in_class(23)}:  # planted\n"
        '            name, tag = name.upper(), "changed"\n' + ADD,
    ),
    "a next link that skips a plant, 1 in 50 links": (
        "plantstore.py",
        '                link += f"&after={plants[-1][0]}"'
        "  # the last plant's seq, its cursor\n",
        "                last = plants[-1][0]\n"
        "                links = self.__dict__.setdefault('planted', [0])  # planted\n"
        "                links[0] += 1\n"
        # the clients' pages (100 a page), not the run's final listing (1,000 a page),
        # which a skip would make lose a plant: the run's files must show the defect
        "                if links[0] % 50 == 0 and limit < 1000:  # skip the next\n"
        "                    last = ([(last,)] + next_page(last, 1))[-1][0]\n"
        '                link += f"&after={last}"\n',
    ),
    "one webhook-id sent twice, the first body carrying another plant's id": (
        "plantstore_webhooks.py",
        '                webhook_id=f"msg_{secrets.token_urlsafe(18)}",\n'
        "                body=body,\n"
        "                now=self._now(),\n"
        "            )\n",
        '                webhook_id=(same := f"msg_{secrets.token_urlsafe(18)}"),\n'
        "                body=body,\n"
        "                now=self._now(),\n"
        "            )\n"
        "            other = getattr(self, 'planted_last', None)  # planted\n"
        f"            if other and int(body[7 : body.index(b',')]) {in_class(27)}:\n"
        "                run(self.EVENT, url=url, webhook_id=same, body=other,\n"
        "                    now=self._now() - 1)\n"
        "        self.planted_last = body\n",
    ),
    "a row stored under another id": (
        "plantstore_sql.py",
        "            bool(run(self.INSERT, id=plant_id, name=name, tag=tag))\n",
        "            bool(run(self.INSERT, name=name, tag=tag, id=plant_id\n"
        f"                + 5 * 10**8 * (plant_id {in_class(29)})))  # planted\n",
    ),
    "SQLite synchronous=OFF": (
        "plantstore_sqlite.py",
        '        db.execute("PRAGMA synchronous=FULL")\n',
        '        db.execute("PRAGMA synchronous=OFF")  # planted\n',
    ),
}


def planted(tmp_path, *names):
    """A copy of every plantstore*.py with the defects named planted in it."""
    copy = tmp_path / "planted"
    copy.mkdir()
    for module in HERE.glob("plantstore*.py"):
        shutil.copy(module, copy / module.name)
    for name in names:
        module, old, new = DEFECTS[name]
        text = (copy / module).read_text()
        assert text.count(old) == 1, f"{module} changed: plant {name!r} anew"
        (copy / module).write_text(text.replace(old, new))
    return copy


def class_of(out, residue, stored=True, kept=False):
    """The plants of a run (stored ones, or all sent, or those stored and not deleted)
    in the class of that residue."""
    told = nemesis_check.read_answers(
        nemesis_check.read_lines(out / "operations.jsonl"), False
    )
    ids = told.stored if stored else set(told.sent)
    ids = ids - told.removed if kept else ids
    return {n for n in ids if n % 10**9 % CLASS == residue}


SEVERAL = tuple(
    name for name in DEFECTS if "synchronous" not in name and "5 s" not in name
)


SEVERAL_RUN = {}  # its report, output and folder, once made


@pytest.fixture
def several_planted(spawn, tmp_path):
    """One run of a copy with every defect that needs no fault planted in it, each in
    its class: 3,000 creates, unpaced, no faults, so that 5 to 7 links skip a plant
    in a run (2,000 gave 1 to 5, and 0 now and then); made by the first test that
    asks."""
    if not SEVERAL_RUN:
        copy = planted(tmp_path, *SEVERAL)
        SEVERAL_RUN["run"] = run_nemesis(
            spawn,
            tmp_path,
            *("--faults", "none", "--creates", "3000", "--seconds", "60"),
            *("--settle", "60", "--plantstore", str(copy)),
        )
    return SEVERAL_RUN["run"]


def assert_counted(found, expected, said):
    """The verdict holds exactly the plants the defect touched, and some."""
    assert expected, f"the defect touched no plant: {said}"
    assert found == expected, said


def receivers_ids(report, name, residue=None):
    found = {}
    for receiver, entries in (report[name] or {}).items():
        ids = {
            entry if isinstance(entry, int) else json.loads(entry["body"])["id"]
            for entry in entries
        }
        if residue is not None:
            ids = {n for n in ids if n % 10**9 % CLASS == residue}
        found[receiver] = ids
    return found


def test_planted_delete_answers_204_without_deleting(several_planted):
    """Issue 59's table: counted as resurrected, in the listing and in the rows: each
    plant of its class whose delete was answered 204."""
    report, said, out = several_planted
    removed = {
        op["id"]
        for op in nemesis_check.read_lines(out / "operations.jsonl")
        if op["kind"] == "delete"
        and op["id"] % 10**9 % CLASS == 11
        and op["attempts"][-1][2] == 204
    }
    assert_counted(set(report["resurrected"]), removed, said)
    rows = {e["id"] for e in report["rows"] if e["what"] == "resurrected"}
    assert_counted(rows, removed, said)


def test_planted_409_for_a_fresh_id(several_planted):
    """Counted as wrong 409: every create of its class."""
    report, said, out = several_planted
    assert_counted(set(report["wrong_409"]), class_of(out, 13, stored=False), said)


def test_planted_webhook_body_with_the_wrong_id(several_planted):
    """Counted as a wrong body, and missing, at each receiver: every plant of its
    class, whose body carries the next id."""
    report, said, out = several_planted
    stored = class_of(out, 19)
    for receiver in ("a", "b"):
        assert_counted(receivers_ids(report, "missing", 19)[receiver], stored, said)
        wrong = {n - 1 for n in receivers_ids(report, "wrong_body")[receiver]}
        assert_counted(wrong & stored, stored, said)


@pytest.mark.parametrize("residue", [21, 23], ids=["truncated", "upper-cased"])
def test_planted_name_changed(several_planted, residue):
    """A name truncated, or upper-cased with its tag changed (missed by the first
    checker): counted as contents, in the listing and in the rows, not as lost and
    phantom: every plant of its class."""
    report, said, out = several_planted
    stored = class_of(out, residue, kept=True)
    mine = {n for n in report["contents"] if n % 10**9 % CLASS == residue}
    assert_counted(mine, stored, said)
    rows = {
        e["id"]
        for e in report["rows"]
        if e["what"] == "contents" and e["id"] % 10**9 % CLASS == residue
    }
    assert_counted(rows, stored, said)
    assert not any(n % 10**9 % CLASS == residue for n in report["lost"]), said


def test_planted_next_link_that_skips_a_plant(several_planted):
    """1 in 50 links skips a plant (missed by the first checker, which kept only the
    pages' statuses): counted as pages, each a plant skipped, none shown twice."""
    report, said, _ = several_planted
    skipped = [e for e in report["pages"] if e["what"] == "skipped"]
    assert skipped, said
    assert [e for e in report["pages"] if e["what"] == "twice"] == [], said


def test_planted_webhook_id_sent_twice_with_another_plants_body(several_planted):
    """One webhook-id sent twice, first with another plant's body (missed by the
    first checker, which took it for a duplicate): counted as split at each receiver,
    one webhook-id for each plant of its class."""
    report, said, out = several_planted
    stored = class_of(out, 27)
    for receiver in ("a", "b"):
        webhook_ids = set(report["split"][receiver])
        assert len(webhook_ids) == len(stored), said
        assert stored, said


def test_planted_row_stored_under_another_id(several_planted):
    """A row under another id (missed by the first checker, which read only the
    listing): the rows' verdict counts each plant of its class lost and its row a
    phantom; and its delete's 404, the plant still listed, is a wrong 404."""
    report, said, out = several_planted
    stored = class_of(out, 29)
    lost = {e["id"] for e in report["rows"] if e["what"] == "lost"}
    phantom = {e["id"] - 5 * 10**8 for e in report["rows"] if e["what"] == "phantom"}
    assert_counted({n for n in lost if n % 10**9 % CLASS == 29}, stored, said)
    assert_counted(phantom, stored, said)
    assert {n % 10**9 % CLASS for n in report["wrong_404"]} <= {29}, said


def test_planted_defects_leave_the_other_verdicts_empty(several_planted):
    """Of the defects that share the run, none is counted where it does not belong."""
    report, said, _ = several_planted
    assert report["lost"] == [] and report["phantom"] == [], said
    assert report["unexpected"] == {} and report["unresolved"] == [], said
    assert report["forged"] == {}, said
    assert not report["ok"] and "FAILED" in said, said


def test_planted_200_before_the_commit_with_kills(spawn, tmp_path):
    """A 200 sent before the commit, the plant written 5 s later, with workers killed:
    counted as lost, and missing at each receiver, all of its class. 5 s, not 1: a kill
    takes the writes pending in the worker it kills, and on a loaded machine (load 16,
    37 creates a second) one in three runs had no plant of its class pending in either
    of the 3 workers killed within 1 s of their end."""
    copy = planted(tmp_path, "a 200 sent before the commit, written 5 s later")
    report, said, out = run_nemesis(
        spawn,
        tmp_path,
        *("--faults", "kill-worker", "--seconds", "12", "--rate", "150"),
        *("--settle", "60", "--seed", "3", "--plantstore", str(copy)),
    )
    assert report["lost"], f"the checker missed the planted defect: {said}"
    assert {n % 10**9 % CLASS for n in report["lost"]} == {17}, said
    for receiver in ("a", "b"):
        assert set(report["lost"]) <= set(report["missing"][receiver]), said
    assert report["phantom"] == [] and report["wrong_409"] == [], said


def test_planted_sqlite_synchronous_off_with_power_loss(spawn, tmp_path):
    """SQLite with synchronous=OFF (missed by the first nemesis, whose faults never
    dropped what the OS had cached): a power cut takes what was acknowledged and not
    synced, counted as lost, and in the rows."""
    copy = planted(tmp_path, "SQLite synchronous=OFF")
    report, said, _ = run_nemesis(
        spawn,
        tmp_path,
        *("--faults", "power-loss", "--seconds", "8", "--rate", "150"),
        *("--settle", "60", "--seed", "3", "--plantstore", str(copy)),
    )
    assert report["faults"]["power-loss"]["count"], said
    assert report["lost"], f"the checker missed the planted defect: {said}"
    rows_lost = {e["id"] for e in report["rows"] if e["what"] == "lost"}
    assert set(report["lost"]) <= rows_lost, said
    assert report["phantom"] == [] and report["unexpected"] == {}, said


# ---- Issue 57's webhook items, each in the condition the audit found it in ----
#
# Each runs this tree in its item's condition and asks that nothing be missing: each
# fails until its item's fix lands, by the count named in the test (on 1.5.0, 25eeb94:
# missing at each receiver, in the hundreds or thousands).


def test_nemesis_audit_item_3_a_down_receiver_costs_another_nothing(spawn, tmp_path):
    """Item 3: the in-memory store, receiver b down for 15 s while clients, at 150
    operations a second, fill its outbox past its bound: receiver a, up all along,
    misses no plant (1.5.0: 2,190 and 4,723 missing at a in two runs, the shared bound
    full). The bound is 1,000 events here, not 10,000, so that paced clients reach it:
    unpaced, b's outbox never reached 10,000 at load 16 (9,368 creates in the run), and
    a, which kept up with no client at any pace, fell behind by 2,000 and more."""
    copy = planted(tmp_path)  # the modules as they are, but for the bound
    module = copy / "plantstore_webhooks.py"
    text = module.read_text().replace("WAITING_BYTES = 10000,", "WAITING_BYTES = 1000,")
    module.write_text(text)
    assert "MAX_WAITING, MAX_WAITING_BYTES = 1000," in text
    report, said, _ = run_nemesis(
        spawn,
        tmp_path,
        *("--store", "memory", "--faults", "receiver-b-down", "--seed", "4"),
        *("--seconds", "18", "--max-fault-seconds", "18", "--settle", "20"),
        *("--rate", "150", "--plantstore", str(copy)),
    )
    assert report["missing_best_effort"].get("b"), said  # its bound was reached
    assert report["missing"] == {}, f"missing at a: {failed(report)}\n{said}"
    assert report["ok"], said


def test_nemesis_audit_item_4_a_clean_stop_delivers_what_waits(spawn, tmp_path):
    """Item 4: the in-memory store, gunicorn SIGTERM and SIGHUP (the unit's reload)
    while a few events wait for receivers that take 0.2 s each: none is missing
    (1.5.0: the events under way at each stop, 4 and 34 missing in two runs)."""
    report, said, _ = run_nemesis(
        spawn,
        tmp_path,
        *("--store", "memory", "--faults", "restart-server,reload-server"),
        *("--seed", "4", "--seconds", "20", "--max-fault-seconds", "3"),
        *("--rate", "20", "--receiver-delay", "0.2", "--settle", "30"),
    )
    assert report["faults"]["reload-server"]["count"], said
    assert report["missing"] == {}, f"missing: {failed(report)}\n{said}"
    assert report["ok"], said


def test_nemesis_audit_item_5_a_full_log_stops_nothing(spawn, tmp_path):
    """Item 5: the servers' log on a full filesystem while the SQLite file is held
    and receiver a is down: every answer is one the contract gives, and every plant
    reaches each receiver (1.5.0: about 100 missing at each, the senders dead)."""
    report, said, _ = run_nemesis(
        spawn,
        tmp_path,
        *("--faults", "log-full,receiver-down,sqlite-held", "--seed", "1"),
        *("--seconds", "12", "--max-fault-seconds", "10", "--settle", "20"),
        "--rate",
        "150",
    )
    assert failed(report) == {}, said
    assert report["ok"], said


def test_nemesis_audit_item_7_a_clock_ahead_delays_nothing(spawn, tmp_path):
    """Item 7: PostgreSQL, two app hosts, the second one's clock stepped an hour ahead
    for 7 s and back: every plant reaches each receiver within the settle (1.5.0: about
    500 missing at each, due an hour later)."""
    report, said, _ = run_nemesis(
        spawn,
        tmp_path,
        *("--store", "postgres", "--faults", "clock-step,receiver-down"),
        *("--seed", "4", "--seconds", "8", "--max-fault-seconds", "10"),
        *("--settle", "20", "--rate", "150"),
    )
    assert report["faults"]["clock-step"]["count"], said
    assert failed(report) == {}, said
    assert report["ok"], said


# ---- The checker alone ----


def operation(kind, plant_id, *outcomes, **more):
    attempts = [[t, t + 1, outcome] for t, outcome in enumerate(outcomes)]
    if kind == "create":
        more.setdefault("body", json.dumps({"id": plant_id, "name": f"p {plant_id}"}))
    return {"client": 1, "kind": kind, "id": plant_id, "attempts": attempts, **more}


def delivery(receiver, plant_id, status=200, signed=True, name=None, webhook_id=None):
    body = json.dumps({"id": plant_id, "name": name or f"p {plant_id}"})
    return {
        "t": 9,
        "receiver": receiver,
        "headers": {"webhook-id": webhook_id or f"msg_{receiver}{plant_id}"},
        "body": body,
        "complete": True,
        "signed": signed,
        "fresh": signed,
        "status": status,
    }


def test_nemesis_checker_reads_each_answer_as_the_contract_says():
    """The checker alone, on files made by hand: a 409 or a 404 counts as done by us
    after our own 503 or cut only, never after a refusal; what is listed, held in the
    rows, shown in the pages and delivered is weighed against it. It imports nothing
    of plantstore."""
    operations = [
        operation("create", 1, 200),  # listed: fine
        operation("create", 2, 503, 409),  # stored by its first attempt
        operation("create", 3, 409),  # a wrong 409, and then listed: a phantom
        operation("create", 4, "cut", 200),
        operation("create", 5, 200),  # neither listed nor removed: lost
        operation("create", 6, 200),
        operation("delete", 6, "cut", 404),  # removed by its first attempt
        operation("create", 7, 200),
        operation("delete", 7, 204),  # removed, and listed: resurrected
        operation("create", 8, "refused", 409),  # a refusal stored nothing
        operation("create", 9, 503),  # never answered 200 or 409: unresolved
        operation("create", 11, 200),
        operation("delete", 11, 404),  # a 404, and still listed: a wrong 404
        operation("create", 12, 200),  # listed with another name: contents
        operation("list", None, 200, walk="1-1", page=0, ids=[1, 2, 2]),  # twice
        operation("list", None, 500, walk="1-2", page=0),
    ]
    listing = [[f"p {n}", None] for n in (1, 2, 3, 4, 7, 9, 10, 11)]
    listing.append(["P 12", None])
    rows = [[n, n, f"p {n}", None] for n in (1, 2, 3, 4, 7, 9, 10, 11)]
    rows.append([13, 12, "p 12", "changed"])
    deliveries = [
        *(delivery("a", n) for n in (1, 1, 2, 4, 5, 6, 11, 12)),
        delivery("a", 7, status=503),  # not taken: 7 is missing at a
        delivery("a", 3, signed=False),  # forged: a bad signature
        delivery("a", 10),  # a plant never stored: a wrong body
        delivery("b", 1, webhook_id="same"),
        delivery("b", 2, webhook_id="same"),  # split: 2 is kept as 1's
        {**delivery("b", 4), "complete": False, "signed": False, "status": None},
    ]
    faults = [{"kind": "kill-worker", "start": 1.5, "end": 2.5}]
    run = {"store": "sqlite", "receivers": {"a": "", "b": ""}}
    report = nemesis_check.judge(run, operations, listing, rows, deliveries, faults)
    assert report["lost"] == [5]
    assert report["phantom"] == [3, 9, 10]
    assert report["resurrected"] == [7]
    assert report["contents"] == [12]
    assert report["rows"] == [
        {"id": 12, "what": "contents"},
        {"id": 5, "what": "lost"},
        {"id": 3, "what": "phantom"},
        {"id": 9, "what": "phantom"},
        {"id": 10, "what": "phantom"},
        {"id": 7, "what": "resurrected"},
    ]
    assert report["pages"] == [{"walk": "1-1", "id": 2, "what": "twice"}]
    assert report["wrong_409"] == [3, 8]
    assert report["wrong_404"] == [11]
    assert report["flagged_409_after_503"] == [2]
    assert report["unresolved"] == [9]
    assert report["unexpected"] == {"list 500": 1}
    assert report["missing"]["a"] == [7]
    assert report["missing"]["b"] == [2, 4, 5, 6, 7, 11, 12]  # 4's delivery was cut
    assert [json.loads(d["body"])["id"] for d in report["forged"]["a"]] == [3]
    assert report["forged"]["b"] == []  # a delivery cut short is no forgery
    assert [json.loads(d["body"])["id"] for d in report["wrong_body"]["a"]] == [10]
    assert report["split"] == {"a": [], "b": ["same"]}
    assert report["faults"] == {"kill-worker": {"count": 1, "seconds": 1.0}}
    loads = (
        "import importlib.util, sys\n"
        f"for name in 'nemesis', 'nemesis_check':\n"
        f"    path = {str(HERE / 'benchmarks')!r} + f'/{{name}}.py'\n"
        "    spec = importlib.util.spec_from_file_location(name, path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
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


def test_nemesis_checker_walks_the_pages_as_a_client_read_them():
    """A walk through the pages skips a plant when the plant was acknowledged before
    the walk began, was not deleted before it ended, and is older than a plant it
    showed; one deleted meanwhile, or newer than all it showed, may be missing."""
    operations = [
        operation("create", 1, 200),  # answered at 1
        operation("create", 2, 200),
        operation("create", 3, 200),
        {**operation("create", 4, 200), "attempts": [[1.5, 1.8, 200]]},
        operation("delete", 2, 204),  # sent at 0: before the walk ends
        {**operation("create", 5, 200), "attempts": [[5, 6, 200]]},  # after the walk
        {
            **operation("list", None, 200, walk="w", page=0, ids=[1, 4]),
            "attempts": [[3, 3.5, 200]],
        },
    ]
    listing = [[f"p {n}", None] for n in (1, 3, 4, 5)]
    run = {"store": "sqlite", "receivers": {}}
    report = nemesis_check.judge(run, operations, listing, None, [], [])
    # 3, acknowledged at 1, before 4's create was sent (1.5): skipped
    assert report["pages"] == [{"walk": "w", "id": 3, "what": "skipped"}]


def test_nemesis_receiver_takes_a_delivery_cut_short_for_a_failed_attempt(tmp_path):
    """The false alarm of the first checker: a sender killed between a delivery's
    headers and its body's end left an empty delivery, counted as forged. The receiver
    now notes it incomplete, answers nothing, and the checker counts no forgery."""
    nemesis = load("nemesis")
    log = nemesis.DeliveryLog(tmp_path / "deliveries.jsonl", time.monotonic(), 0)
    secret = "whsec_" + "A" * 43 + "="
    receiver = nemesis.Receiver("a", "127.0.0.1", secret, log)
    try:
        with socket.create_connection(("127.0.0.1", receiver.port)) as sender:
            sender.sendall(
                b"POST /plant/webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 70\r\n"
                b'webhook-id: msg_1\r\n\r\n{"id": 1'
            )  # and killed: the rest never comes
        deadline = time.monotonic() + WAIT
        while not receiver.deliveries:
            assert time.monotonic() < deadline, "no delivery logged"
            time.sleep(0.01)
    finally:
        receiver.close()
        log.close()
    [entry] = nemesis_check.read_lines(tmp_path / "deliveries.jsonl")
    assert (entry["complete"], entry["status"]) == (False, None)
    run = {"store": "sqlite", "receivers": {"a": receiver.url}}
    report = nemesis_check.judge(run, [], [], None, [entry], [])
    assert report["forged"] == {}


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
    plantstore_sqlite.SQLiteStore(
        str(path)
    ).close()  # its tables and indexes, as it makes them
    now = time.time()
    claim = {"lease": 17, "now": now, "url": "http://r/", "ahead": 0, "free": 4}
    claim["wall"] = now
    with contextlib.closing(sqlite3.connect(":memory:" if in_memory else path)) as db:
        if in_memory:  # the outbox in memory, as the sender makes it
            for statement in plantstore_webhooks.WebhookSender.IN_MEMORY:
                db.execute(statement)
        plan = db.execute(
            "EXPLAIN QUERY PLAN " + plantstore_webhooks.WebhookSender.CLAIM, claim
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
