"""The nemesis's checker (issue 59): its verdicts from a run's files alone.

    python benchmarks/nemesis_check.py RUN_FOLDER      # the report again, from --out

It imports nothing of plantstore, asks nothing of the service, and reads only the files
the run wrote in its folder (docs/reliability.md gives their fields): run.json,
operations.jsonl (every request, with the body sent and what came back), listing.jsonl
(the final listing), rows.jsonl (the plants as read from the database itself after the
run; none for the in-memory store), deliveries.jsonl (every delivery each receiver
got, its headers and body) and faults.jsonl. What it trusts: the clients' record of
what they sent and were answered, and what the receivers were sent. What it counts
(each list holds the plant ids, or the deliveries, at fault):

- lost: a create answered 200, or 409 after a 503 or a cut of our own, that no delete
  of ours removed (204, or 404 after a 503 or a cut of its own), and that is not listed;
- phantom: a listed plant that no create of ours stored;
- resurrected: a listed plant that a delete of ours removed;
- contents: a listed plant whose name or tag is not exactly the one sent;
- rows: the same four, read from the database's rows rather than the listing;
- pages: a plant a client's walk through the pages skipped, or showed twice;
- wrong 409: a 409 to a create that no earlier attempt of ours can have stored;
- wrong 404: a 404 to a delete of ours whose plant is still listed;
- unexpected: an answer the contract never gives (a 500);
- unresolved: an operation that never got a final answer;
- for each receiver: missing, a stored plant whose exact body it never kept (a receiver
  keeps the first body it took of each webhook-id, as docs/webhooks.md advises);
  forged, a delivery whose signature fails; wrong body, a signed delivery that is not
  exactly a stored plant's body, id included; split, a webhook-id that carried two
  bodies. A delivery cut before its body ended is a failed attempt, not a forgery, and
  so is one signed but refused for its timestamp (stale: the sender's clock is off by
  more than the receivers' 5 minutes), counted beside the verdicts.

Flagged, not failing: a 409 that follows an SQLite 503 (which promises no commit).
"""

import collections
import json
import math
import sys
from pathlib import Path

EXPECTED = {"create": {200, 409, 503}, "delete": {204, 404, 503}, "list": {200, 503}}
FINAL = {"create": {200, 409}, "delete": {204, 404}, "list": {200}}
# the faults after which a process's memory is gone: the in-memory store's plants with
# it; and those that end it with no chance to deliver what its outbox holds (a clean
# stop, SIGTERM or a reload, gives the sender up to 5 s)
ENDS_PROCESSES = {"kill-worker", "restart-server", "reload-server", "power-loss"}
KILLS_PROCESSES = {"kill-worker", "power-loss"}
VERDICTS = (
    "lost",
    "phantom",
    "resurrected",
    "contents",
    "rows",
    "pages",
    "wrong_409",
    "wrong_404",
    "unexpected",
    "unresolved",
    "missing",
    "forged",
    "wrong_body",
    "split",
)
RECEIVER_VERDICTS = ("missing", "forged", "wrong_body", "split")


def read_lines(path):
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def plant_of(name):
    """The id a plant's name carries: its second word ("nemesis 1000000007 fern")."""
    words = name.split() if isinstance(name, str) else []
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else None


def may_have_acted(outcome):
    """Whether a create or a delete with this outcome may have been done: a 5xx, a cut,
    a timeout (a refused connection reached no server; a 4xx did nothing)."""
    return outcome in ("cut", "timeout") or (type(outcome) is int and outcome >= 500)


def percentile(values, share):
    """The nearest-rank percentile of sorted values; None when there are none."""
    if not values:
        return None
    return values[max(0, math.ceil(share * len(values)) - 1)]


def check(folder):
    """The report of the run whose files are in `folder`."""
    folder = Path(folder)
    run = json.loads((folder / "run.json").read_text())
    rows_file = folder / "rows.jsonl"
    return judge(
        run,
        read_lines(folder / "operations.jsonl"),
        read_lines(folder / "listing.jsonl"),
        read_lines(rows_file) if rows_file.exists() else None,
        read_lines(folder / "deliveries.jsonl"),
        read_lines(folder / "faults.jsonl"),
    )


def judge(run, operations, listing, rows, deliveries, faults):
    """The report, from what the files hold (see check)."""
    told = read_answers(operations, run["store"] == "sqlite")
    excused = gone_with_processes(run, told, faults)
    listed = [plant_of(name) for name, _ in listing]
    report = {
        **against(told, listing, excused),
        "rows": rows_against(told, rows) if rows is not None else [],
        "pages": pages_against(told, operations, excused),
        "wrong_404": sorted(set(told.unexplained_404) & set(listed)),
        **receivers_against(run, told, deliveries, faults),
    }
    report.update(figures(told, operations, faults, listing, rows))
    report["failed"] = sorted(name for name in VERDICTS if report[name])
    return report


class Told:
    """What the clients sent and were told, by plant."""


def read_answers(operations, sqlite):
    told = Told()
    told.sent, told.stored, told.removed = {}, set(), set()
    told.acknowledged, told.first_sent, told.delete_sent = {}, {}, {}
    told.wrong_409, told.unexplained_404, told.flagged_409_after_503 = [], [], []
    told.unresolved, told.unexpected = [], collections.Counter()
    told.attempts = {kind: collections.Counter() for kind in EXPECTED}
    told.finals = {kind: collections.Counter() for kind in EXPECTED}
    for operation in operations:
        kind, plant_id, attempts = (
            operation["kind"],
            operation["id"],
            operation["attempts"],
        )
        for _, _, outcome in attempts:
            told.attempts[kind][str(outcome)] += 1
            if type(outcome) is int and outcome not in EXPECTED[kind]:
                told.unexpected[f"{kind} {outcome}"] += 1
        if kind == "list":
            continue
        final = attempts[-1][2] if attempts else None
        explained = any(may_have_acted(outcome) for _, _, outcome in attempts[:-1])
        if final not in FINAL[kind]:
            told.unresolved.append(plant_id)
            told.finals[kind]["unresolved"] += 1
        else:
            retried = " after a retry" if len(attempts) > 1 else ""
            told.finals[kind][f"{final}{retried}"] += 1
        if kind == "create":
            told.sent[plant_id] = json.loads(operation["body"])
            told.first_sent[plant_id] = attempts[0][0] if attempts else math.inf
            if final == 200 or (final == 409 and explained):
                told.stored.add(plant_id)
                told.acknowledged[plant_id] = attempts[-1][1]
            if final == 409 and not explained:
                told.wrong_409.append(plant_id)
            earlier = {outcome for _, _, outcome in attempts[:-1]}
            if (
                sqlite
                and final == 409
                and 503 in earlier
                and not earlier
                & {
                    "cut",
                    "timeout",
                }
            ):
                told.flagged_409_after_503.append(plant_id)
        else:
            if attempts:
                told.delete_sent[plant_id] = attempts[0][0]
            if final == 204 or (final == 404 and explained):
                told.removed.add(plant_id)
            elif final == 404:
                told.unexplained_404.append(plant_id)
    return told


def gone_with_processes(run, told, faults, kinds=ENDS_PROCESSES):
    """The in-memory store's plants (or events) that a process's end took: those
    acknowledged before the end of the last fault of those kinds (none for a SQL
    store)."""
    if run["store"] != "memory":
        return set()
    ends = [fault["end"] for fault in faults if fault["kind"] in kinds]
    if not ends:
        return set()
    return {n for n, t in told.acknowledged.items() if t <= max(ends)}


def as_sent(document):
    return document["name"], document.get("tag")


def against(told, listing, excused):
    """lost, phantom, resurrected and contents from the final listing."""
    listed, contents = [], []
    for name, tag in listing:
        plant_id = plant_of(name)
        listed.append(plant_id)
        if plant_id in told.stored and (name, tag) != as_sent(told.sent[plant_id]):
            contents.append(plant_id)
    shown = set(listed)
    return {
        "lost": sorted(told.stored - shown - told.removed - excused),
        "phantom": sorted(shown - told.stored, key=lambda n: (n is None, n or 0)),
        "resurrected": sorted(shown & told.removed),
        "contents": sorted(contents),
        "listed_twice": sorted(
            n for n, times in collections.Counter(listed).items() if times > 1
        ),
    }


def rows_against(told, rows):
    """The database's rows against what was acknowledged: [{"id", "what"}, ...]."""
    found, held = [], set()
    for _seq, plant_id, name, tag in rows:
        held.add(plant_id)
        if plant_id not in told.stored:
            found.append({"id": plant_id, "what": "phantom"})
        elif plant_id in told.removed:
            found.append({"id": plant_id, "what": "resurrected"})
        elif (name, tag) != as_sent(told.sent[plant_id]):
            found.append({"id": plant_id, "what": "contents"})
    for plant_id in sorted(told.stored - told.removed - held):
        found.append({"id": plant_id, "what": "lost"})
    return sorted(found, key=lambda entry: (entry["what"], entry["id"]))


def pages_against(told, operations, excused):
    """Each walk through the pages, from the first: a plant acknowledged before it
    began, not deleted before it ended, and older than a plant it showed (acknowledged
    before that plant's create was first sent) was skipped if not shown; one shown
    twice, listed twice. [{"walk", "id", "what"}, ...]"""
    walks = collections.defaultdict(list)
    for operation in operations:
        if operation["kind"] == "list" and operation["attempts"]:
            walks[operation["walk"]].append(operation)
    by_ack = sorted((t, n) for n, t in told.acknowledged.items() if n not in excused)
    found = []
    for walk, pages in walks.items():
        read = [page for page in pages if page["attempts"][-1][2] == 200]
        if not read:
            continue
        began, ended = pages[0]["attempts"][0][0], pages[-1]["attempts"][-1][1]
        shown = [n for page in read for n in page["ids"]]
        for plant_id, times in collections.Counter(shown).items():
            if times > 1:
                found.append({"walk": walk, "id": plant_id, "what": "twice"})
        newest = max((told.first_sent.get(n, -math.inf) for n in shown), default=0)
        bound, seen = min(began, newest), set(shown)
        for acknowledged, plant_id in by_ack:
            if acknowledged >= bound:
                break
            deleted = told.delete_sent.get(plant_id, math.inf) <= ended
            if plant_id not in seen and not deleted:
                found.append({"walk": walk, "id": plant_id, "what": "skipped"})
    return found


def receivers_against(run, told, deliveries, faults):
    """Each receiver's missing, forged, wrong bodies and split webhook-ids."""
    verdicts = {name: {} for name in RECEIVER_VERDICTS}
    best_effort, stale = {}, {}
    for receiver in run["receivers"]:
        got = [d for d in deliveries if d["receiver"] == receiver and d["complete"]]
        forged = [d for d in got if not d["signed"]]
        stale[receiver] = sum(d["signed"] and not d["fresh"] for d in got)
        kept, bodies, wrong = {}, collections.defaultdict(set), []
        for delivery in got:
            if not delivery["signed"]:
                continue
            webhook_id = delivery["headers"].get("webhook-id")
            bodies[webhook_id].add(delivery["body"])
            if not exact(told, delivery["body"]):
                wrong.append(delivery)
            if delivery["fresh"] and 200 <= delivery["status"] < 300:
                kept.setdefault(webhook_id, delivery["body"])  # the first one taken
        delivered = {exact(told, body) for body in kept.values()} - {None}
        missing = sorted(told.stored - delivered)
        if run["store"] == "memory":  # best effort: lost with a process, or dropped
            excused = gone_with_processes(run, told, faults, KILLS_PROCESSES)
            downs = {f["kind"] for f in faults if f.get("receiver") == receiver}
            if downs:
                best_effort[receiver] = len(missing)
                missing = []
            missing = sorted(set(missing) - excused)
        verdicts["missing"][receiver] = missing
        verdicts["forged"][receiver] = forged
        verdicts["wrong_body"][receiver] = wrong
        verdicts["split"][receiver] = sorted(
            w for w, seen in bodies.items() if len(seen) > 1
        )
    for name in RECEIVER_VERDICTS:  # empty, unless some receiver's is not
        if not any(verdicts[name].values()):
            verdicts[name] = {}
    return {**verdicts, "missing_best_effort": best_effort, "stale": stale}


def exact(told, body):
    """The stored plant whose body this is, exactly (id, name and tag), or None."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    plant_id = document.get("id") if isinstance(document, dict) else None
    if plant_id in told.stored and document == told.sent[plant_id]:
        return plant_id
    return None


def figures(told, operations, faults, listing, rows):
    """What the table shows beside the verdicts."""
    calm, in_fault = [], []
    spans = sorted((fault["start"], fault["end"]) for fault in faults)
    for operation in operations:
        for sent, answered, _ in operation["attempts"]:
            overlaps = any(start <= answered and sent <= end for start, end in spans)
            (in_fault if overlaps else calm).append(answered - sent)
    calm.sort()
    in_fault.sort()
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for fault in faults:
        by_kind[fault["kind"]][0] += 1
        by_kind[fault["kind"]][1] += fault["end"] - fault["start"]
    return {
        "unexpected": dict(told.unexpected),
        "unresolved": sorted(told.unresolved),
        "wrong_409": sorted(told.wrong_409),
        "flagged_409_after_503": sorted(told.flagged_409_after_503),
        "stored": len(told.stored),
        "listed": len(listing),
        "rows_read": None if rows is None else len(rows),
        "removed": len(told.removed),
        "attempts": {kind: dict(counts) for kind, counts in told.attempts.items()},
        "operations": {kind: dict(counts) for kind, counts in told.finals.items()},
        "pages_read": told.attempts["list"]["200"],
        "faults": {
            kind: {"count": n, "seconds": round(s, 1)}
            for kind, (n, s) in sorted(by_kind.items())
        },
        "latency": {
            name: {
                "requests": len(values),
                "p50": percentile(values, 0.5),
                "p99": percentile(values, 0.99),
            }
            for name, values in (("calm", calm), ("fault", in_fault))
        },
    }


def count(report, name):
    """How many a verdict holds: a receiver's are added up."""
    found = report[name]
    if isinstance(found, dict) and name in RECEIVER_VERDICTS:
        return sum(len(each) for each in found.values())
    return len(found) if not isinstance(found, dict) else sum(found.values())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    verdict = check(sys.argv[1])
    for name in VERDICTS:
        print(f"{name}: {count(verdict, name)}")
    sys.exit(1 if verdict["failed"] else 0)
