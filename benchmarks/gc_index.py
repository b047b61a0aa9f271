"""What the in-memory store costs the garbage collector; an id index it would not walk.

    python benchmarks/gc_index.py collect 1000000 10000000  # gc.collect() per size
    python benchmarks/gc_index.py layouts          # creates and listing, per id index

Standard library only, so that any Python runs it as is (a Debian chroot's python3.14
included): no venv needed.

1. collect: a store filled with PlantStore.add in a loop (each size in a fresh process),
   then the median of 7 full collections, against the same process's collection before
   the store was filled, and how many more objects the collector tracks.
2. layouts: PlantStore's dict of id to seq against an open-addressing table in two
   array('q'), which no collector walks (an array's contents are not objects): creates
   through the application (bench_plantstore's interleaved rounds), creates straight
   into the store with sequential and with scattered ids, and a whole listing.
"""

import argparse
import array
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_plantstore  # noqa: E402 (after sys.path: this repository's)
import plantstore  # noqa: E402 (after sys.path: this repository's)
import plantstore_accelerators  # noqa: E402 (as plantstore)

# ---- 1. A full collection, with a store of n plants ----


def full_collection(plants):
    """{plants, tracked, empty_ms, store_ms}: a full collection with no store, with a
    store of `plants`; the objects the collector tracks beyond the empty process's."""

    def median_collect():
        times = []
        for _ in range(7):
            begin = time.perf_counter()
            gc.collect()
            times.append(time.perf_counter() - begin)
        return statistics.median(times) * 1e3

    gc.collect()
    empty_ms, tracked = median_collect(), len(gc.get_objects())
    store = plantstore.PlantStore()
    for plant_id in range(plants):
        store.add(plant_id, f"plant {plant_id}", "indoor")
    gc.collect()  # the first meets the full chunks' tuples and stops tracking them
    store_ms = median_collect()
    return {
        "plants": plants,
        "tracked": len(gc.get_objects()) - tracked,
        "empty_ms": empty_ms,
        "store_ms": store_ms,
    }


# ---- 2. An id index the collector does not walk ----

EMPTY, DELETED = 0, -1  # in _at: a free slot, or a deleted plant's (probing goes on)


class ArrayIndexStore(plantstore.PlantStore):
    """PlantStore with the id index in two array('q'), keys and seq + 1, probed as
    CPython's dict probes (i = id & mask, then perturbed by the id's higher bits)."""

    def __init__(self, bits=10):
        super().__init__()
        del self._seq
        self._mask = (1 << bits) - 1
        self._ids = array.array("q", bytes(8 << bits))
        self._at = array.array("q", bytes(8 << bits))  # seq + 1, EMPTY or DELETED
        self._live = self._used = 0  # plants held; slots not EMPTY

    def _find(self, plant_id):
        """The slot of plant_id, or the slot where it would go (~slot if a DELETED)."""
        ids, at, mask = self._ids, self._at, self._mask
        slot, perturb, reuse = plant_id & mask, plant_id & 0xFFFFFFFFFFFFFFFF, None
        while (value := at[slot]) != EMPTY:
            if value > 0 and ids[slot] == plant_id:
                return slot, True
            if value == DELETED and reuse is None:
                reuse = slot
            perturb >>= 5
            slot = (slot * 5 + perturb + 1) & mask
        return (slot if reuse is None else reuse), False

    def add(self, plant_id, name, tag):
        with self._lock:
            slot, found = self._find(plant_id)
            if found:
                return False
            if self._at[slot] == EMPTY:
                self._used += 1
            self._ids[slot], self._at[slot] = plant_id, self._next + 1
            self._live += 1
            self._names[-1].append(name)
            self._tags[-1].append(tag)
            self._next += 1
            if self._next % plantstore_accelerators.CHUNK == 0:
                self._names[-1], self._tags[-1] = (
                    tuple(self._names[-1]),
                    tuple(self._tags[-1]),
                )
                self._names.append([])
                self._tags.append([])
            if self._used * 3 > self._mask * 2:  # two thirds full, as a dict
                self._rebuild()
            return True

    def delete(self, plant_id):
        with self._lock:
            slot, found = self._find(plant_id)
            if not found:
                return False
            seq, self._at[slot] = self._at[slot] - 1, DELETED
            self._live -= 1
            number, index = divmod(seq, plantstore_accelerators.CHUNK)
            if number == len(self._names) - 1:
                self._names[number][index] = self._tags[number][index] = None
            else:
                names, tags = list(self._names[number]), list(self._tags[number])
                names[index] = tags[index] = None
                emptied = names.count(None) == plantstore_accelerators.CHUNK
                self._names[number] = None if emptied else tuple(names)
                self._tags[number] = None if emptied else tuple(tags)
            while self._first < self._next and not self._holds(self._first):
                self._first += 1
            return True

    def _rebuild(self):
        """Slots for three times the live plants: twice as many, or as many if deleted
        plants' slots filled it."""
        bits = max(10, (self._live * 3).bit_length())
        old = [(i, a) for i, a in zip(self._ids, self._at, strict=True) if a > 0]
        self._mask = (1 << bits) - 1
        self._ids = array.array("q", bytes(8 << bits))
        self._at = array.array("q", bytes(8 << bits))
        self._used = 0
        for plant_id, value in old:
            slot, _ = self._find(plant_id)
            self._ids[slot], self._at[slot] = plant_id, value
            self._used += 1
        self._live = self._used


LAYOUTS = {"dict": plantstore.PlantStore, "array": ArrayIndexStore}


def store_creates(ids, rounds=9):
    """{layout: median ns per add} of `ids` into a fresh store, layouts in turn."""
    samples = {name: [] for name in LAYOUTS}
    for turn in range(rounds):
        for name in list(LAYOUTS)[turn % 2 :] + list(LAYOUTS)[: turn % 2]:
            store = LAYOUTS[name]()
            add = store.add
            begin = time.perf_counter()
            for plant_id in ids:
                add(plant_id, "Fern", "indoor")
            samples[name].append((time.perf_counter() - begin) / len(ids) * 1e9)
            assert len(store.page(None, len(ids))) == len(ids)
    return {name: statistics.median(values) for name, values in samples.items()}


def app_creates(rounds, per_round):
    """{layout: median us per create through the application}, as bench_plantstore."""
    apps = {
        name: plantstore.make_app([bench_plantstore.TOKEN], store=layout())
        for name, layout in LAYOUTS.items()
    }
    bench_plantstore.time_round(apps, 10**12, 200)  # warm up; each must answer 200
    samples = [
        bench_plantstore.time_round(apps, n * per_round, per_round)
        for n in range(rounds)
    ]
    return bench_plantstore.summarize(samples, "dict")


def whole_listing(plants, rounds=5):
    """{layout: median ms for GET /plants of `plants`}, layouts in turn."""
    environ = bench_plantstore.request_environs(0, 1)[0]
    environ.update(REQUEST_METHOD="GET", QUERY_STRING="", CONTENT_LENGTH="")
    apps = {}
    for name, layout in LAYOUTS.items():
        store = layout()
        for plant_id in range(plants):
            store.add(plant_id, f"plant {plant_id}", "indoor")
        apps[name] = plantstore.make_app([bench_plantstore.TOKEN], store=store)
    samples = {name: [] for name in LAYOUTS}
    for _ in range(rounds):
        for name, application in apps.items():
            begin = time.perf_counter()
            for _chunk in application(environ, lambda *_: None):
                pass
            samples[name].append((time.perf_counter() - begin) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def layouts(args):
    version = platform.python_version()
    print(f"Python {version}: the id index as a dict (today's), or as two arrays")
    sequential = range(args.plants)
    # scattered: ids as a client might pick them, spread over the int64 range
    scattered = [(n * 0x9E3779B97F4A7C15) % 2**63 for n in range(args.plants)]
    for label, ids in (("sequential", sequential), ("scattered", scattered)):
        ns = store_creates(ids)
        print(
            f"  store.add, {args.plants:,} {label} ids: dict {ns['dict']:.0f} ns, "
            f"array {ns['array']:.0f} ns ({ns['array'] / ns['dict']:.2f}x)"
        )
    figures = app_creates(args.rounds, args.per_round)
    print(
        f"  create through the app: dict {figures['dict'][0]:.3f} us, "
        f"array {figures['array'][0]:.3f} us ({figures['array'][1]:.3f}x, median of "
        f"{args.rounds} rounds' ratios)"
    )
    ms = whole_listing(args.plants)
    print(
        f"  GET /plants of {args.plants:,}: dict {ms['dict']:.1f} ms, "
        f"array {ms['array']:.1f} ms ({ms['array'] / ms['dict']:.2f}x)"
    )
    for name, layout in LAYOUTS.items():
        store = layout()
        for plant_id in range(args.plants):
            store.add(plant_id, "Fern", "indoor")
        gc.collect()
        begin = time.perf_counter()
        gc.collect()
        print(
            f"  a full collection with {args.plants:,} plants, {name}: "
            f"{(time.perf_counter() - begin) * 1e3:.1f} ms"
        )
        del store


def collect(args):
    print(f"Python {platform.python_version()}: a full gc.collect()")
    for plants in args.sizes:
        # a fresh process per size: one size's garbage and arenas do not reach the next
        worker = [sys.executable, __file__, "--worker", str(plants)]
        result = json.loads(
            subprocess.run(worker, stdout=subprocess.PIPE, check=True).stdout
        )
        print(
            f"  {plants:>11,} plants: {result['store_ms']:8.2f} ms "
            f"(no store: {result['empty_ms']:.2f} ms), "
            f"{result['tracked']:+,} objects tracked"
        )


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--worker"]:
        print(json.dumps(full_collection(int(argv[1]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(required=True)
    one = commands.add_parser("collect", help="a full collection per store size")
    one.add_argument("sizes", type=int, nargs="+")
    one.set_defaults(run=collect)
    two = commands.add_parser("layouts", help="the id index as a dict or as arrays")
    two.add_argument("--plants", type=int, default=1_000_000)
    two.add_argument("--rounds", type=int, default=11)
    two.add_argument("--per-round", type=int, default=20_000)
    two.set_defaults(run=layouts)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
