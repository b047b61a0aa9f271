"""What a create costs in process, through `plantstore.app`, in microseconds.

    python benchmarks/create_cost.py [--processes 5] [--rounds 7] [--per-round 20000]

The plantstore.py measured is the one in the current directory, so that one copy of this
file measures two trees in turns (../shared/tools/against-release.sh REF 3 -- python
$NEW_TREE/benchmarks/create_cost.py). `plantstore.app` is built from the environment as
gunicorn and granian build it: PLANTSTORE_TOKENS set, nothing else, so the in-memory
store and no webhook. Each round times `--per-round` valid creates with unique ids, each
environ built just before its batch of 100, outside the clock; each process runs its
rounds after a warm-up, and several fresh processes run in turn, since a process's
memory layout and hash seed move the figure a little. It prints every process's median
round, and the median and range of those.
"""

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

TOKEN = "bench-token-0123456789abcdef"


def environs(first_id, count, token=TOKEN):
    """Environs of `count` valid creates with unique ids, as a server makes them."""
    made = []
    for plant_id in range(first_id, first_id + count):
        body = b'{"id": %d, "name": "Fern", "tag": "indoor"}' % plant_id
        made.append(
            {
                "REQUEST_METHOD": "POST",
                "SCRIPT_NAME": "",
                "PATH_INFO": "/plants",
                "QUERY_STRING": "",
                "SERVER_NAME": "localhost",
                "SERVER_PORT": "80",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "CONTENT_TYPE": "application/json",
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_AUTHORIZATION": f"Bearer {token}",
                "wsgi.version": (1, 0),
                "wsgi.url_scheme": "http",
                "wsgi.input": io.BytesIO(body),
                "wsgi.errors": sys.stderr,
                "wsgi.multithread": True,
                "wsgi.multiprocess": False,
                "wsgi.run_once": False,
                "wsgi.input_terminated": True,
            }
        )
    return made


def one_round(application, first_id, count, batch=100):
    """Microseconds per create over `count` creates; fails unless each answered 200."""
    statuses, elapsed = [], 0.0

    def start_response(status, _headers, _exc_info=None):
        statuses.append(status)

    for start in range(first_id, first_id + count, batch):
        made = environs(start, batch)
        begin = time.perf_counter()
        for environ in made:
            b"".join(application(environ, start_response))
        elapsed += time.perf_counter() - begin
    if set(statuses) != {"200 OK"}:
        raise SystemExit(f"a create answered {sorted(set(statuses))}")
    return elapsed / count * 1e6


def worker(rounds, per_round):
    sys.path.insert(0, os.getcwd())
    os.environ["PLANTSTORE_TOKENS"] = TOKEN
    import plantstore  # noqa: PLC0415 (the copy in the current directory)

    application = plantstore.app
    one_round(application, 10**12, 2000)  # warm-up
    times = [one_round(application, n * per_round, per_round) for n in range(rounds)]
    print(json.dumps(statistics.median(times)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=20_000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.rounds, args.per_round)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PLANTST")}
    medians = []
    for _ in range(args.processes):
        command = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds)]
        command += ["--per-round", str(args.per_round)]
        done = subprocess.run(
            command, env=environment, stdout=subprocess.PIPE, text=True, check=True
        )
        medians.append(json.loads(done.stdout))
    shown = ", ".join(f"{median:.2f}" for median in medians)
    print(
        f"plantstore {open('plantstore.py').read().split('__version__ = ')[1][:7]}"
        f" in {os.getcwd()}: a create costs {statistics.median(medians):.2f} µs"
        f" (processes' medians {shown}; range {min(medians):.2f} to {max(medians):.2f})"
    )


if __name__ == "__main__":
    main()
