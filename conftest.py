"""The fixtures several test files use, registered here once for the whole suite: each
is defined in testbed.py, beside the components it starts and stops, and imported here
as it is (pytest finds a fixture among the names of a conftest.py). `postgres`: the
suite's PostgreSQL, one server for the session; `pg_url`: its database, emptied for the
test; `spawn`: subprocesses, their process groups killed when the test ends;
`receiver`: webhook receivers on loopback, shut down when it ends; `runbook`:
docs/operations.md's commands, with the test's settings. In process: `store`, an
in-memory store; `app`, the whole service as make_app builds it, in WebTest
(test_plantstore.py overrides it with the core alone); `any_store`, each store in turn
(the in-memory one, SQLite, PostgreSQL); `webhook_app`, make_app with webhooks on a
short schedule. A fixture one test file alone uses is in that file."""

import collections

import pytest

from testbed import (
    any_store as any_store,
    app as app,
    pg_url as pg_url,
    postgres as postgres,
    receiver as receiver,
    runbook as runbook,
    spawn as spawn,
    store as store,
    webhook_app as webhook_app,
)


def pytest_collection_modifyitems(items):
    """pytest-xdist (the README's -n 2) schedules tests by node id, and of tests that
    share one it runs the first alone: stop before a test is silently left out."""
    ids = collections.Counter(item.nodeid for item in items)
    if shared := sorted(nodeid for nodeid, count in ids.items() if count > 1):
        raise pytest.UsageError(f"tests share a node id: {', '.join(shared)}")
