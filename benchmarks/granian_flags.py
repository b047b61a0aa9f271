"""Choose granian's flags by measurement: unique creates with wrk -t1 -c16 on loopback,
in interleaved rounds.

    python benchmarks/granian_flags.py memory  # the in-memory store: one worker process
    python benchmarks/granian_flags.py sql     # the SQL stores (durable): workers > 1

Every candidate server runs at once (idle but for its turn); each round runs every
candidate in an order that rotates, and the figure is the median round. The figures
behind docs/granian.md.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_plantstore as bench  # noqa: E402 (after sys.path, which finds it)

GRANIAN = [
    sys.executable,
    "-m",
    "granian",
    "--interface",
    "wsgi",
    "--no-ws",
    "--log-level",
    "warning",
]

MEMORY = {  # label: extra flags (one worker: the store lives in one process)
    "bt1 st": "--blocking-threads 1 --runtime-mode st",
    "bt2 st": "--blocking-threads 2 --runtime-mode st",
    "bt4 st": "--blocking-threads 4 --runtime-mode st",
    "bt8 st": "--blocking-threads 8 --runtime-mode st",
    "bt1 mt rt2": "--blocking-threads 1 --runtime-mode mt --runtime-threads 2",
    "bt1 st bp16": "--blocking-threads 1 --runtime-mode st --backpressure 16",
    # granian's own: 512 blocking threads, backpressure 1024, runtime mode auto
    "defaults": "",
}

SQL_BASE = "w2 bt4 st"  # each SQL row's ratio is to this row of its own store
SQL = {  # label: (extra flags, the stores it runs with)
    "w2 bt4 st": (
        "--workers 2 --blocking-threads 4 --runtime-mode st",
        ["SQLite", "PostgreSQL"],
    ),
    "w2 bt2 st": ("--workers 2 --blocking-threads 2 --runtime-mode st", ["SQLite"]),
    "w1 bt4 st": ("--workers 1 --blocking-threads 4 --runtime-mode st", ["SQLite"]),
    "w2 bt8 st": (
        "--workers 2 --blocking-threads 8 --runtime-mode st",
        ["SQLite", "PostgreSQL"],
    ),
    "w2 bt16 st": (
        "--workers 2 --blocking-threads 16 --runtime-mode st",
        ["SQLite", "PostgreSQL"],
    ),
    "w1 bt8 st": ("--workers 1 --blocking-threads 8 --runtime-mode st", ["SQLite"]),
    "w1 bt16 st": (
        "--workers 1 --blocking-threads 16 --runtime-mode st",
        ["SQLite", "PostgreSQL"],
    ),
    "w2 bt8 mt rt2": (
        "--workers 2 --blocking-threads 8 --runtime-mode mt --runtime-threads 2",
        ["PostgreSQL"],
    ),
    "w2 bt8 st bp8": (
        "--workers 2 --blocking-threads 8 --runtime-mode st --backpressure 8",
        ["PostgreSQL"],
    ),
}


def start(flags, db, port):
    env = {**os.environ, "PLANTSTORE_TOKENS": bench.TOKEN}
    for name in ("PLANTSTORE_DB", "WEB_CONCURRENCY"):
        env.pop(name, None)
    if db:
        env["PLANTSTORE_DB"] = db
    args = [
        *GRANIAN,
        *flags.split(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "plantstore:app",
    ]
    process = subprocess.Popen(
        args,
        cwd=HERE.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bench.wait_for_port(port, process)
    return process


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["memory", "sql"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    workdir = tempfile.TemporaryDirectory(prefix="granian-flags-")
    postgres = None
    if args.which == "memory":
        candidates = {label: (flags, None) for label, flags in MEMORY.items()}
    else:
        from testbed import Postgres

        postgres = Postgres(durable=True)
        candidates = {}
        for label, (flags, stores) in SQL.items():
            if "SQLite" in stores:
                db = os.path.join(workdir.name, f"{label.replace(' ', '-')}.db")
                candidates[f"SQLite {label}"] = (flags, db)
            if "PostgreSQL" in stores:
                candidates[f"PostgreSQL {label}"] = (flags, postgres.url)
    script = os.path.join(workdir.name, "creates.lua")
    Path(script).write_text(bench.WRK_SCRIPT)
    servers = {}
    try:
        for label, (flags, db) in candidates.items():
            port = bench.free_port()
            servers[label] = port, start(flags, db, port)
        samples = {label: [] for label in candidates}
        worst = {label: [0.0, 0] for label in candidates}
        names = list(candidates)
        for round_number in range(args.rounds):
            for label in (
                names[round_number % len(names) :] + names[: round_number % len(names)]
            ):
                latencies = {}
                # unique across one database
                id_base = (round_number + 1) * 10**12 + names.index(label) * 10**10
                rps, non_2xx, errors = bench.run_wrk(
                    servers[label][0],
                    script,
                    args.seconds,
                    16,
                    id_base=id_base,
                    latencies=latencies,
                )
                samples[label].append(rps)
                worst[label] = [
                    max(worst[label][0], latencies["p99"]),
                    worst[label][1] + non_2xx + errors,
                ]
        print(
            f"wrk -t1 -c16 -d{args.seconds}s, unique creates, {args.rounds} "
            f"interleaved rounds; median round, the median within-round ratio to the "
            f"first row's, worst p99"
        )
        first = names[0] if args.which == "memory" else None
        for label in candidates:
            base = samples[first or label.split()[0] + " " + SQL_BASE]
            ratio = statistics.median(
                r / b for r, b in zip(samples[label], base, strict=True)
            )
            print(
                f"  {label:<28} {statistics.median(samples[label]):>9.0f}/s  "
                f"{ratio:>5.2f}x  p99 {worst[label][0]:>6.1f} ms  bad {worst[label][1]}"
            )
    finally:
        for _, process in servers.values():
            process.terminate()
            process.wait(30)
        if postgres:
            postgres.remove()


if __name__ == "__main__":
    main()
