"""What make_app's in-memory store costs at size: memory per plant at 1,000,000 plants,
a page of 10 at 2,000,000, and a full collection of the garbage collector at 1,000,000.

    python benchmarks/store_at_size.py [--plants 1000000] [--page-plants 2000000]

The plantstore.py measured is the one in the current directory, so that one copy of this
file measures two trees in turns (../shared/tools/against-release.sh ab8de6f 3 -- python
$NEW_TREE/benchmarks/store_at_size.py): the store is `make_app([token]).store`,
whatever class that release gives it. Each figure comes from a fresh process: memory is
the growth of the process's resident set while the store is filled with short names and
tags (each name made before the count starts); a page is the median of 2,001 reads of 10
plants from the middle of the store; a collection is the median of 7 `gc.collect()`.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

TOKEN = "bench-token-0123456789abcdef"


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def filled(count):
    sys.path.insert(0, os.getcwd())
    import plantstore  # noqa: PLC0415 (the copy in the current directory)

    store = plantstore.make_app([TOKEN]).store
    names = [f"p{n}" for n in range(count)]
    gc.collect()
    before = resident_bytes()
    for plant_id, name in enumerate(names):
        store.add(plant_id, name, "indoor")
    return store, before


def measure(what, count):
    store, before = filled(count)
    if what == "memory":
        return (resident_bytes() - before) / count
    if what == "page":
        middle = count // 2
        times = []
        for _ in range(2001):
            started = time.perf_counter()
            store.page(middle, 10)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6
    times = []
    for _ in range(7):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plants", type=int, default=1_000_000)
    parser.add_argument("--page-plants", type=int, default=2_000_000)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker[0], int(args.worker[1]))))
        return
    figures = {}
    for what, count, unit in (
        ("memory", args.plants, "bytes a plant"),
        ("page", args.page_plants, "µs a page of 10"),
        ("collect", args.plants, "ms a full collection"),
    ):
        command = [sys.executable, __file__, "--worker", what, str(count)]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        figures[what] = f"{json.loads(done.stdout):.2f} {unit} at {count:,} plants"
    version = open("plantstore.py").read().split("__version__ = ")[1][:7]
    print(f"plantstore {version}: " + "; ".join(figures.values()))


if __name__ == "__main__":
    main()
