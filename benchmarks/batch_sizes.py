"""plantstore:app, with the size of every batch its SQL store writes counted
(bench_plantstore.py).

    BENCH_BATCHES=DIR PYTHONPATH=benchmarks granian ... batch_sizes:app    (or gunicorn)

With group commit, the first create that finds no batch being written in its process
writes the creates waiting at that moment (up to SQLStore.BATCH and BATCH_BYTES) in
one transaction: one call of SQLStore._write_batch(batch), one commit. This module
wraps that method of SQLiteStore and PostgresStore to count len(batch) per call, and
each process writes its counts, {size: batches}, to DIR/<pid>.json every DUMP_SECONDS.
The app is plantstore's own object, so a request costs what it costs under
plantstore:app; the counting costs one call and a dict update per batch. A plantstore
without _write_batch (before group commit) is served as it is, and nothing is counted.
Each process also writes DIR/<pid>.module, the path of the plantstore.py it imported,
so that a benchmark serving several copies side by side (--against) can check that each
server runs its own; a plantstore with PostgresStore in the file itself (1.3.0 and
before) is counted there, without plantstore_postgres.
"""

import json
import os
import threading
import time
from collections import Counter

import plantstore

if hasattr(plantstore, "PostgresStore"):  # 1.3.0 and before: one file
    postgres_stores = [plantstore.PostgresStore]
else:
    import plantstore_postgres

    postgres_stores = [plantstore_postgres.PostgresStore]

DUMP_SECONDS = 0.1  # a benchmark reads the counts 0.25 s after its run
sizes, lock = Counter(), threading.Lock()
writer = None  # (the process id, its thread that writes the counts)


def dump_every(seconds):
    path = os.path.join(os.environ["BENCH_BATCHES"], f"{os.getpid()}.json")
    while True:
        time.sleep(seconds)
        with lock:
            text = json.dumps(sizes)
        with open(f"{path}.new", "w") as file:
            file.write(text)
        # a reader sees a whole count, never a half-written one
        os.replace(f"{path}.new", path)


def counting(write_batch):
    def _write_batch(self, batch):
        global writer
        with lock:
            sizes[len(batch)] += 1
            # the first batch here (servers fork)
            if writer is None or writer[0] != os.getpid():
                writer = (
                    os.getpid(),
                    threading.Thread(
                        target=dump_every, args=[DUMP_SECONDS], daemon=True
                    ),
                )
                writer[1].start()
        return write_batch(self, batch)

    return _write_batch


with open(os.path.join(os.environ["BENCH_BATCHES"], f"{os.getpid()}.module"), "w") as f:
    f.write(os.path.realpath(plantstore.__file__))

for store in plantstore.SQLiteStore, *postgres_stores:
    # on each class: a call of super()'s is not counted twice
    if hasattr(store, "_write_batch"):
        store._write_batch = counting(store._write_batch)

app = plantstore.app
