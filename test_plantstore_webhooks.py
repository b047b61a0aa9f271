"""Tests for the webhooks of plantstore.py ("Webhooks: each new plant, signed and
retried, from threads of its own") and the background work they run on ("Background
work: plantstore's threads, by one rule"): each create delivered, signed, to receivers
on loopback that verify it with the reference library, retried on schedule, on every
store; the promises at the edges (issue 29): receiver URLs and answers of every kind,
events that wait through a restart, a stop or a fork; and what a process's start, a
fork and a stop may do to waiting events and to requests (issue 43), in real processes
under each server."""

import concurrent.futures
import collections
import contextlib
import http.client
import http.server
import importlib.util
import io
import itertools
import json
import os
import re
import select
import signal
import socket
import sqlite3
import sys
import threading
import time
import types

import psycopg
import pytest
import standardwebhooks
import webtest

import plantstore_webhooks
import plantstore_app
from plantstore_postgres import PostgresStore, _pyformat
from plantstore_accelerators import ChunkedStore
from plantstore_app import make_app
from plantstore_sqlite import SQLiteStore
from testbed import (
    AUTH,
    HERE,
    Lines,
    OUTAGE_CREATE_BOUND,
    SECRET,
    SQLITE_LOCKER,
    TOKEN,
    WAIT,
    environ_without_tokens,
    first_retry_after,
    free_port,
    left_by_1_5_0,
    made_by_1_5_0,
    over_http,
    post,
    post_over_http,
    processes_in_group,
    read_database,
    read_metrics,
    serve_plantstore,
    sqlite_held,
    start_a_server,
    start_gunicorn,
    stored_plants,
    timed_exchange,
    wait_until,
)


# ---- Webhooks: a receiver on loopback verifies each with the reference library ----


def test_each_create_is_delivered_signed_and_a_409_is_not(
    any_store, webhook_app, receiver
):
    hook = receiver()
    application = webhook_app(any_store, hook.url)
    plants = [
        {"id": n, "name": f"p{n}", **({"tag": "indoor"} if n % 2 else {})}
        for n in range(20)
    ]
    for plant in plants:
        post(application, plant, 200)
    post(application, {"id": 3, "name": "a duplicate"}, 409)
    # exactly the NewPlant created
    assert sorted(hook.wait_for(20), key=lambda plant: plant["id"]) == plants
    time.sleep(0.5)
    assert (
        len(hook.deliveries) == 20
        and len({webhook_id for webhook_id, _, _ in hook.deliveries}) == 20
    )


def test_a_failed_delivery_is_retried_with_the_same_webhook_id(
    any_store, webhook_app, receiver
):
    hook = receiver()
    hook.statuses = [500, 503]
    post(webhook_app(any_store, hook.url), {"id": 1, "name": "Fern"}, 200)
    assert hook.wait_for(1) == [{"id": 1, "name": "Fern"}]
    assert [status for _, _, status in hook.deliveries] == [500, 503, 200]
    assert len({webhook_id for webhook_id, _, _ in hook.deliveries}) == 1


def test_an_empty_tag_stays_an_empty_tag_with_webhooks_on_every_store(
    any_store, webhook_app, receiver
):
    """A tag of "" is a tag: answered, listed and delivered as "", never as no tag (nor
    as a 500)."""
    hook = receiver()
    application = webhook_app(any_store, hook.url)
    assert post(application, {"id": 1, "name": "Fern", "tag": ""}, 200).json == {
        "name": "Fern",
        "tag": "",
    }
    assert application.get("/plants", headers=AUTH, status=200).json == [
        {"name": "Fern", "tag": ""}
    ]
    assert hook.wait_for(1) == [{"id": 1, "name": "Fern", "tag": ""}]


def test_no_redirect_is_followed(store, webhook_app, receiver):
    hook, elsewhere = receiver(), receiver()
    hook.statuses = [307]
    post(webhook_app(store, hook.url), {"id": 1, "name": "Fern"}, 200)
    # retried at the URL it was given
    assert hook.wait_for(1) == [{"id": 1, "name": "Fern"}]
    assert elsewhere.deliveries == []


def test_a_slow_receiver_holds_up_no_create(store, webhook_app, receiver):
    hook = receiver()
    # the receiver answers nothing until the creates are done
    hook.hold = threading.Event()
    application = webhook_app(store, hook.url)
    try:
        for plant_id in range(10):
            post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
        # every create answered while the receiver still held its first delivery
        assert hook.deliveries == []
    finally:
        hook.hold.set()
    assert len(hook.wait_for(10)) == 10


def test_creates_made_while_the_receiver_is_down_arrive_when_it_is_back(
    any_store, webhook_app, receiver, monkeypatch
):
    # Retried once, then waiting on a long step: the probe must bring them as soon as
    # the receiver is back.
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (0.2, 60))
    hook = receiver()
    port, application = hook.server.server_address[1], webhook_app(any_store, hook.url)
    hook.stop()
    for plant_id in range(10):
        post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    time.sleep(0.5)  # refused, retried and refused again meanwhile
    back = receiver(port)
    assert sorted(plant["id"] for plant in back.wait_for(10)) == list(range(10))


def test_a_webhook_receiver_back_but_refusing_its_oldest_event_gets_the_others(
    store, webhook_app, receiver, monkeypatch
):
    """A probe that gets an answer, even a 4xx, ends the probing: the other events are
    not held."""
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (0.2, 60))
    hook = receiver()
    port, application = hook.server.server_address[1], webhook_app(store, hook.url)
    hook.stop()
    for plant_id in range(5):
        post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    # refused, retried and refused again: the receiver is probed with the oldest
    time.sleep(0.5)
    back = receiver(port)
    back.refused = {0}
    assert sorted(plant["id"] for plant in back.wait_for(4)) == [1, 2, 3, 4]


class TricklingReceiver:
    """A receiver that sends its status line, then one byte at a time, never ending its
    headers."""

    def __init__(self, every):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/plant/webhook"
        self.every, self.attempts, self.ids, self.stopped = (
            every,
            [],
            [],
            threading.Event(),
        )
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                threading.Thread(
                    target=self._trickle, args=(connection,), daemon=True
                ).start()

    def _trickle(self, connection):
        attempt = [time.monotonic(), None]  # opened, and closed by the sender
        self.attempts.append(attempt)
        with connection:
            self.ids += re.findall(rb"webhook-id: (\S+)", connection.recv(65536))
            with contextlib.suppress(OSError):
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                while not self.stopped.wait(self.every):
                    connection.sendall(b"X")  # a header that never ends
                    if select.select([connection], [], [], 0)[
                        0
                    ] and not connection.recv(65536):
                        break  # the sender hung up
        attempt[1] = time.monotonic()

    def stop(self):
        self.stopped.set()
        self.listener.close()


def test_a_trickling_receiver_holds_up_no_other_and_each_attempt_ends_at_its_deadline(
    store, webhook_app, receiver, monkeypatch
):
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "TIMEOUT", 1.5)
    slow, healthy = TricklingReceiver(every=0.3), receiver()
    try:
        application = webhook_app(store, slow.url, healthy.url)
        # more than PER_URL: the healthy receiver's are not held up by the slow one's,
        # and the probes try each untried event (due longest) before one a second time
        for plant_id in range(6):
            post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
        assert sorted(plant["id"] for plant in healthy.wait_for(6)) == list(range(6))
        deadline = time.monotonic() + WAIT
        # a cut attempt is no delivery: it is tried again
        while len(set(slow.ids)) == len(slow.ids):
            assert time.monotonic() < deadline, (
                "no event to the trickling receiver was tried again"
            )
            time.sleep(0.1)
        # sent at once, then cut
        first = slow.attempts[: plantstore_webhooks.WebhookSender.PER_URL]
        while any(closed is None for _, closed in first):
            assert time.monotonic() < deadline, (
                "an attempt to the trickling receiver stayed open"
            )
            time.sleep(0.1)
        # TIMEOUT, and a poll
        assert all(closed - opened < 1.5 + 1 for opened, closed in first)
    finally:
        slow.stop()


def test_webhook_events_of_a_url_no_longer_configured_are_dropped_after_a_restart(
    tmp_path, webhook_app, receiver, caplog
):
    removed, kept = receiver(), receiver()
    ports = [r.server.server_address[1] for r in (removed, kept)]
    removed.stop()
    kept.stop()
    path = tmp_path / "plants.sqlite3"
    before = webhook_app(SQLiteStore(path), removed.url, kept.url)
    for plant_id in range(3):
        # both receivers are down
        post(before, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    before.app.webhook_sender.close()
    removed, kept = receiver(ports[0]), receiver(ports[1])
    # the restart, with one URL taken out
    after = webhook_app(SQLiteStore(path), kept.url)
    after.get("/health", status=200)  # the first request starts the sender
    assert sorted(plant["id"] for plant in kept.wait_for(3)) == [0, 1, 2]
    time.sleep(0.5)
    assert removed.deliveries == []
    logged = caplog.text
    assert (
        logged.count("3 waiting webhook events are dropped") == 1
        and "/plant/webhook" not in logged
    )


def test_webhook_events_waiting_in_memory_are_bounded_in_bytes(
    store, webhook_app, receiver, monkeypatch, caplog
):
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "MAX_WAITING_BYTES", 2**20)
    # none is given up while the receiver is down: a slow machine takes seconds here
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (0.2,) * 100)
    hook = receiver()
    port = hook.server.server_address[1]
    hook.stop()
    application = webhook_app(store, hook.url)
    name = "x" * 60_000
    for plant_id in range(40):  # 2.4 MB of events, while the receiver is down
        post(application, {"id": plant_id, "name": name}, 200)
        application.delete(f"/plants/{plant_id}", headers=AUTH, status=204)
        time.sleep(0.01)
    logged = caplog.text
    assert logged.count("webhook events are dropped") == 1
    back = receiver(port)

    def waiting():
        text = application.get("/metrics", headers=AUTH).text
        return read_metrics(text)["plantstore_webhook_events_waiting"]

    # until none waits, /metrics says: none is under way either, and none comes later
    wait_until(lambda: set(waiting().values()) == {0}, lambda: f"waiting: {waiting()}")
    delivered = sorted(plant["id"] for plant in back.delivered())
    # the first MB
    assert 10 <= len(delivered) <= 17 and delivered == list(range(len(delivered)))


def raw_creates(application, ids):
    """Create a plant for each id by calling the application as a server does, with no
    test client between; return the seconds they took."""
    started, statuses = time.perf_counter(), []

    def start_response(status, _headers, _exc_info=None):
        statuses.append(status)

    for plant_id in ids:
        body = b'{"id": %d, "name": "Fern", "tag": "indoor"}' % plant_id
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/plants",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
        }
        b"".join(application(environ, start_response))
        time.sleep(0)  # as a server waits for the next request: other threads run
    assert set(statuses) == {"200 OK"}, statuses
    return time.perf_counter() - started


def fill_outbox(store, url, count):
    """count events waiting for url, as the senders of earlier creates leave them."""
    if store is None:
        return  # the in-memory outbox: filled by creates, below
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:
        db.executemany(
            "INSERT INTO plant_events (url, webhook_id, body, next_at, created)"
            " VALUES (?, ?, x'7b7d', 0, ?)",
            [(url, f"msg_{n}", time.time()) for n in range(count)],
        )


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_a_create_costs_what_it_costs_with_none_waiting_when_the_outbox_is_full(
    store_kind, tmp_path, webhook_app
):
    """A receiver down, and WebhookSender.MAX_WAITING events waiting for it (the
    in-memory outbox's bound; as many in SQLite's, as a guard): a create costs at
    most twice what it costs with none waiting, at the bound and just under it. (In
    1.4.0 every create woke a count of the whole outbox, under the lock that a create
    takes: at 10,000 events each create waited for it.)"""
    down = f"http://127.0.0.1:{free_port()}/plant/webhook"
    bound = plantstore_webhooks.WebhookSender.MAX_WAITING
    applications = []
    for name in "empty", "full":
        store = SQLiteStore(tmp_path / f"{name}.sqlite3")
        if store_kind == "memory":
            store = None
        applications.append(webhook_app(store, down).app)
        if name == "full":  # just under the bound: the next creates are written
            fill_outbox(store, down, bound - 1000)
            if store is None:
                raw_creates(applications[-1], range(10**6, 10**6 + bound - 1000))
    batches = {"empty": [], "full": []}
    for batch in range(10):  # in turns, so that a busy moment hits both alike
        ids = range(batch * 100, batch * 100 + 100)
        for name, application in zip(batches, applications, strict=True):
            batches[name].append(raw_creates(application, ids))
    if store_kind == "memory":  # at the bound: each create's event is refused
        raw_creates(applications[1], range(2 * 10**6, 2 * 10**6 + 1000))
        at_bound = [
            raw_creates(applications[1], range(n, n + 100))
            for n in range(3 * 10**6, 3 * 10**6 + 1000, 100)
        ]
        assert min(at_bound) <= 2 * min(batches["empty"]), (at_bound, batches)
    print(
        f"{store_kind}: creates/s with none waiting {100 / min(batches['empty']):.0f},"
        f" with {bound - 1000}+ waiting {100 / min(batches['full']):.0f}"
    )
    assert min(batches["full"]) <= 2 * min(batches["empty"]), batches


def test_the_outbox_in_memory_holds_max_waiting_events_and_says_once_it_drops_more(
    store, webhook_app, receiver, monkeypatch, caplog
):
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "MAX_WAITING", 50)
    hook = receiver()
    port = hook.server.server_address[1]
    hook.stop()
    application = webhook_app(store, hook.url)
    for plant_id in range(60):
        post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    dropped = [line for line in caplog.messages if "events are dropped" in line]
    assert len(dropped) == 1 and "50 events" in dropped[0], dropped
    read = read_metrics(application.get("/metrics", headers=AUTH).text)
    assert read["plantstore_webhook_events_waiting"] == {hook.url[:-14]: 50}
    back = receiver(port)
    assert sorted(plant["id"] for plant in back.wait_for(50)) == list(range(50))
    post(application, {"id": 60, "name": "p60"}, 200)  # room again: it goes
    assert back.wait_for(51)[-1]["id"] == 60


def test_a_failing_receiver_is_said_once_and_once_more_when_it_takes_events_again(
    store, webhook_app, receiver, caplog
):
    """Refused attempt after attempt: one line, with its origin and what waits; back:
    one more. Never a line an attempt, nor the URL's path or query."""
    hook = receiver()
    port = hook.server.server_address[1]
    hook.stop()
    url = f"http://127.0.0.1:{port}/in/SECRET-PATH?key=SECRET-QUERY"
    application = webhook_app(store, url)
    for plant_id in range(3):
        post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    origin = f"http://127.0.0.1:{port}"
    wait_until(lambda: "fails" in caplog.text, "the failing receiver was not said")
    time.sleep(1)  # probes and retries meanwhile: each refused, none said
    back = receiver(port)
    back.wait_for(3)
    wait_until(lambda: "again" in caplog.text, "the receiver's return was not said")
    lines = [line for line in caplog.messages if "webhook receiver" in line]
    assert len(lines) == 2, lines
    # what waits as each is said: the creates come as the first attempt fails, and the
    # other events go, from threads, as the first delivery is said
    said = f"the webhook receiver {re.escape(origin)}"
    assert re.fullmatch(f"{said} fails \\(no answer\\); [1-3] events wait", lines[0])
    assert re.fullmatch(f"{said} takes events again; [0-2] events wait", lines[1])
    assert "SECRET" not in caplog.text


def test_close_delivers_the_events_waiting_in_memory_first(store, receiver, caplog):
    """A host that ends right after its creates: close() waits, within
    WebhookSender.CLOSE_SECONDS, for a receiver that is up; for one that fails, not."""
    hook = receiver()
    hook.delay = 0.2  # each delivery takes a moment
    application = make_app(
        [TOKEN], store=store, webhook_urls=[hook.url], webhook_secret=SECRET
    )
    client = webtest.TestApp(application)
    for plant_id in range(6):
        post(client, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    application.webhook_sender.close()
    assert sorted(plant["id"] for plant in hook.delivered()) == list(range(6))
    hook.stop()  # now down: close() waits for no receiver that fails
    application = make_app(
        [TOKEN], store=ChunkedStore(), webhook_urls=[hook.url], webhook_secret=SECRET
    )
    post(webtest.TestApp(application), {"id": 1, "name": "Fern"}, 200)
    wait_until(lambda: "fails" in caplog.text, "the receiver was never tried")
    closing = time.monotonic()
    application.webhook_sender.close()
    assert time.monotonic() - closing < plantstore_webhooks.WebhookSender.CLOSE_SECONDS


def test_a_410_ends_deliveries_to_that_url_only(store, webhook_app, receiver, caplog):
    gone, kept = receiver(), receiver()
    gone.statuses = [410]
    application = webhook_app(store, gone.url, kept.url)
    post(application, {"id": 1, "name": "Fern"}, 200)
    kept.wait_for(1)
    time.sleep(0.5)
    for plant_id in range(2, 6):
        post(application, {"id": plant_id, "name": "later"}, 200)
    assert len(kept.wait_for(5)) == 5
    time.sleep(0.5)
    # one attempt, then nothing more
    assert [status for _, _, status in gone.deliveries] == [410]
    logged = caplog.text
    # the host only
    assert logged.count("answered 410 Gone") == 1 and "/plant/webhook" not in logged


def test_a_delivery_is_given_up_after_the_schedule(
    store, webhook_app, receiver, caplog
):
    hook = receiver()
    hook.statuses = [500] * 10
    post(webhook_app(store, hook.url), {"id": 1, "name": "Fern"}, 200)
    deadline = time.monotonic() + WAIT
    while "is given up after 4 attempts" not in caplog.text:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)  # and no attempt after that
    # the first, then the schedule's three
    assert [status for _, _, status in hook.deliveries] == [500] * 4


@pytest.mark.parametrize(
    "urls, secret, message",
    [
        (["http://127.0.0.1:9/hook"], None, "PLANTSTORE_WEBHOOK_SECRET is required"),
        (["http://127.0.0.1:9/hook"], "whsec_c2hvcnQ=", "at least 24 random bytes"),
        (
            ["http://127.0.0.1:9/hook"],
            "not-even-whsec-prefixed-secret-value",
            "must be whsec_",
        ),
        (["ftp://127.0.0.1/hook"], SECRET, "must be http:// or https://"),
    ],
    ids=["no-secret", "short-secret", "not-whsec", "not-http"],
)
def test_make_app_refuses_bad_webhook_settings_without_quoting_the_secret(
    urls, secret, message
):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        make_app([TOKEN], webhook_urls=urls, webhook_secret=secret)
    assert not secret or secret.removeprefix("whsec_") not in str(raised.value)


@pytest.mark.parametrize("database", ["memory", "sqlite"])
def test_webhooks_under_gunicorn_preload_every_create_answers_and_every_event_arrives(
    spawn, receiver, tmp_path, database
):
    """--preload builds the app in gunicorn's master, then forks: nothing may start, or
    hold a lock, before."""
    # fresh starts: a lock held at the fork hung creates in some starts, not all
    stopping = []  # each stops (in a second or two) while the next one starts
    for start in range(3):
        hook = receiver()
        db = (
            {"PLANTSTORE_DB": str(tmp_path / f"plants-{start}.sqlite3")}
            if database == "sqlite"
            else {}
        )
        env = environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_WEBHOOK_URL=hook.url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            **db,
        )
        workers = 2 if database == "sqlite" else 1
        process, host, port, _ = start_gunicorn(spawn, env, workers, 4, "--preload")
        for plant_id in range(5):
            # the bar: 5 s
            connection = http.client.HTTPConnection(host, int(port), timeout=5)
            connection.request(
                "POST",
                "/plants",
                json.dumps({"id": plant_id, "name": f"p{plant_id}"}),
                {"Content-Type": "application/json", **AUTH},
            )
            assert connection.getresponse().status == 200
            connection.close()
        assert sorted(plant["id"] for plant in hook.wait_for(5)) == list(range(5))
        os.killpg(process.pid, signal.SIGTERM)
        stopping.append(process)
        hook.stop()
    for process in stopping:
        process.wait(WAIT)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_kill_9_between_creates_and_their_delivery_loses_no_event(
    spawn, receiver, tmp_path, database, request
):
    """The event is in the plant's own transaction: a 200 means a delivery, even across
    kill -9. The events tried before the kill are retried a second after their attempt
    rather than the schedule's 5 s (first_retry_after): the test is of the delivery,
    not of the schedule."""
    hook = receiver()
    port = hook.server.server_address[1]
    hook.stop()  # the receiver is down while the plants are created
    db = (
        str(tmp_path / "plants.sqlite3")
        if database == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
        PYTHONPATH=str(first_retry_after(tmp_path / "schedule", 1)),
    )
    process, host, port_, err = start_gunicorn(spawn, env, workers=2, threads=4)
    for plant_id in range(30):
        assert (
            post_over_http(
                host, port_, TOKEN, {"id": plant_id, "name": f"p{plant_id}"}
            )[0]
            == 200
        )

    def outbox(where):
        query = f"SELECT count(*) FROM plant_events WHERE {where}"
        return read_database(db, query)[0][0]

    # each first attempt refused and settled, so no event is held by a sender that dies
    # now
    wait_until(
        lambda: outbox("attempts > 0") and not outbox("lease > 0"),
        "no first attempt ended",
    )
    os.killpg(process.pid, signal.SIGKILL)  # every process, at once
    process.wait(WAIT)
    logged = err.rest()
    back = receiver(port)
    process, host, port_, err = start_gunicorn(spawn, env, workers=2, threads=4)
    # senders start on a request
    assert over_http(host, port_, TOKEN, "GET", "/plants?limit=0")[0] == 200
    assert sorted(plant["id"] for plant in back.wait_for(30)) == list(range(30))
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(WAIT)
    assert SECRET.removeprefix("whsec_") not in logged + err.rest()


# ---- Promises at the edges (issue 29) ----


class RawReceiver:
    """A webhook receiver on a raw socket: records each request's target and verified
    payload, then sends `answer` as it is (HTTP or not) and closes; with answer=None,
    it sends nothing and holds the connection until the sender closes it."""

    def __init__(
        self,
        answer=b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        host="127.0.0.1",
        port=0,
    ):
        self.listener = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self.port, self.answer, self.requests = (
            self.listener.getsockname()[1],
            answer,
            [],  # (target, payload)
        )
        self.verifier = standardwebhooks.Webhook(SECRET)
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path="/hook"):
        host = self.listener.getsockname()[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}{path}"

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                threading.Thread(
                    target=self._answer, args=(connection,), daemon=True
                ).start()

    def _answer(self, connection):
        with connection, contextlib.suppress(OSError):
            connection.settimeout(WAIT)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := connection.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:])
            while len(body) < int(headers["Content-Length"]) and (
                chunk := connection.recv(65536)
            ):
                body += chunk
            self.requests.append(
                (lines[0].split(" ")[1], self.verifier.verify(body, headers))
            )
            if self.answer is None:
                while connection.recv(65536):
                    pass
            else:
                connection.sendall(self.answer)

    def stop(self):
        # close() alone leaves the port listening while accept() waits in its thread
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@pytest.fixture
def raw_receiver():
    receivers = []

    def start(*args, **kwargs):
        receivers.append(RawReceiver(*args, **kwargs))
        return receivers[-1]

    yield start
    for started in receivers:
        started.stop()


def test_edges_a_webhook_url_with_a_non_ascii_path_is_delivered_percent_encoded_utf_8(
    store, webhook_app, raw_receiver
):
    hook = raw_receiver()
    url = hook.url("/réception")
    settings = {"PLANTSTORE_WEBHOOK_URL": url, "PLANTSTORE_WEBHOOK_SECRET": SECRET}
    # accepted, not refused
    application = plantstore_app.app_from_environ(settings, [TOKEN])
    assert len(application.webhook_sender.urls) == 1
    application.webhook_sender.close()
    post(webhook_app(store, url), {"id": 1, "name": "Fern"}, 200)
    wait_until(lambda: hook.requests, "the event never came", 10)
    assert hook.requests == [("/r%C3%A9ception", {"id": 1, "name": "Fern"})]


def test_edges_a_webhook_url_on_ipv6_loopback_is_delivered_to_its_port_or_else_to_80(
    store, webhook_app, raw_receiver
):
    with_port = raw_receiver(host="::1")
    # root may bind it; if it cannot, the test fails
    on_80 = raw_receiver(host="::1", port=80)
    application = webhook_app(store, with_port.url(), "http://[::1]/hook")
    post(application, {"id": 1, "name": "Fern"}, 200)
    wait_until(
        lambda: with_port.requests and on_80.requests,
        lambda: (
            f"events to [::1]: {with_port.requests} with its port, "
            f"{on_80.requests} on port 80"
        ),
        10,
    )
    assert (
        with_port.requests == on_80.requests == [("/hook", {"id": 1, "name": "Fern"})]
    )


def test_edges_a_garbage_receiver_is_retried_on_schedule_given_up_and_holds_up_no_other(
    store, webhook_app, raw_receiver, receiver, caplog
):
    # not HTTP at all
    garbage, healthy = raw_receiver(b"SSH-2.0-OpenSSH_9.2p1\r\n"), receiver()
    application = webhook_app(store, garbage.url(), healthy.url)
    post(application, {"id": 1, "name": "Fern"}, 200)
    wait_until(
        lambda: len(garbage.requests) >= 2, "a garbage answer was not retried", 10
    )
    for plant_id in (2, 3):  # created while the garbage receiver's events are retried
        post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
    assert sorted(plant["id"] for plant in healthy.wait_for(3)) == [1, 2, 3]
    logged = []
    wait_until(
        lambda: logged.append(caplog.text) or logged[-1].count("is given up") == 3,
        "a delivery to the garbage receiver was never given up",
        10,
    )
    time.sleep(0.5)  # and no attempt after that
    attempts = 1 + len(plantstore_webhooks.WebhookSender.SCHEDULE)
    assert collections.Counter(payload["id"] for _, payload in garbage.requests) == {
        1: attempts,
        2: attempts,
        3: attempts,
    }
    assert caplog.text.count(f"is given up after {attempts} attempts") == 3


def test_edges_a_receiver_that_sends_103_early_hints_then_200_gets_the_event_once(
    webhook_app, raw_receiver, tmp_path, caplog
):
    hints = raw_receiver(
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    )
    path = tmp_path / "plants.sqlite3"
    post(webhook_app(SQLiteStore(path), hints.url()), {"id": 1, "name": "Fern"}, 200)

    def outbox():
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute("SELECT count(*) FROM plant_events").fetchone()[0]

    wait_until(
        lambda: hints.requests and outbox() == 0, "the event never left the outbox", 10
    )
    time.sleep(0.5)  # two steps of the schedule: a retry would have come
    assert hints.requests == [("/hook", {"id": 1, "name": "Fern"})]
    assert "given up" not in caplog.text


@pytest.mark.parametrize(
    ("kind", "database"),
    [
        (kind, database)
        for kind in ("python-plantstore-py", "gunicorn", "gunicorn-preload", "granian")
        for database in ("sqlite", "postgres")
    ]
    # the other servers on SQLite alone: PostgreSQL's outbox is the same SQL, run above
    + [(kind, "sqlite") for kind in ("uwsgi", "waitress", "cheroot", "werkzeug")],
)
def test_edges_events_waiting_in_the_outbox_go_out_after_a_restart_with_no_request(
    kind, database, spawn, receiver, tmp_path, request
):
    """50 creates while the receiver is down, kill -9, the receiver back, and a start
    with no request: every event arrives within 20 s. The events each process tried
    once before the kill are due after the start, a second after their attempt rather
    than the schedule's 5 s (first_retry_after: the wait is what the test is about, not
    its length), so the new process must send them on its own, with no request, once
    due. Under --preload each worker's sender is a fork's child, whose first round comes
    CHILD_DELAY after the fork: there they are due a second after that."""
    hook = receiver()
    hook_port = hook.server.server_address[1]
    hook.stop()  # the receiver is down while the plants are created
    db = (
        str(tmp_path / "plants.sqlite3")
        if database == "sqlite"
        else request.getfixturevalue("pg_url")
    )

    def outbox(query, *args):
        """One number from the outbox, read as the operator would."""
        if database == "sqlite":
            with contextlib.closing(sqlite3.connect(db)) as connection:
                return connection.execute(query.replace("%s", "?"), args).fetchone()[0]
        with psycopg.connect(db, autocommit=True) as connection:
            return connection.execute(query, args).fetchone()[0]

    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=db,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    schedule = first_retry_after(
        tmp_path / "schedule",
        1
        + (
            plantstore_webhooks.WebhookSender.CHILD_DELAY
            if kind == "gunicorn-preload"
            else 0
        ),
    )
    server = start_a_server(kind, spawn, env, database, [schedule])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = pool.map(
            lambda n: post_over_http(
                server.host, server.port, TOKEN, {"id": n, "name": f"p{n}"}
            )[0],
            range(50),
        )
        assert list(statuses) == [200] * 50
    assert outbox("SELECT count(*) FROM plant_events") == 50  # each waits in the outbox
    # else its event waits out its lease
    wait_until(
        lambda: (
            outbox("SELECT count(*) FROM plant_events WHERE lease > %s", time.time())
            == 0
        ),
        "an attempt to a receiver that is down never ended",
    )
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(WAIT)
    back = receiver(hook_port)
    start_a_server(kind, spawn, env, database, [schedule])  # and no request, from here
    wait_until(
        lambda: len(back.delivered()) >= 50,
        lambda: f"{len(back.delivered())} of 50 events came",
        20,
    )
    assert sorted({plant["id"] for plant in back.delivered()}) == list(range(50))


# A program that lists the modules its first delivery imports.
DELIVERY_IMPORTS = """
app = build("memory", sys.argv[1])
before = set(sys.modules)
assert create(app, 1) == "200 OK"
app.webhook_sender.close()  # once what waits is sent
say(imported=sorted(set(sys.modules) - before))
"""


def test_a_delivery_imports_nothing_so_no_fork_waits_on_an_import_lock(
    spawn, receiver, tmp_path
):
    """Under gunicorn --preload the master's sender may have attempts under way as it
    forks the workers. A module that an attempt's thread was importing then has its
    import lock held in the child, by a thread the child does not have: each attempt
    of the child's that imports it waits for ever. The first connect imported
    encodings.idna (for the host), and a restart with events waiting left a worker
    whose every attempt hung, its events late by their lease or a retry's 300 s (the
    test above, once in two or three runs). So a delivery imports nothing: what it
    needs comes with the module."""
    hook = receiver()
    process, out, _ = start_embedding(
        spawn, tmp_path, "imports", DELIVERY_IMPORTS, hook.url
    )
    assert json.loads(out.until("imported").string) == {"imported": []}
    assert hook.wait_for(1)[0]["id"] == 1
    assert process.wait(WAIT) == 0


@pytest.mark.parametrize(
    ("kind", "stop"),
    [
        ("python-plantstore-py", signal.SIGTERM),
        ("python-plantstore-py", signal.SIGINT),
        ("gunicorn", signal.SIGTERM),
        ("granian", signal.SIGTERM),
        ("uwsgi", signal.SIGTERM),
    ],
    ids=[
        "python-plantstore-py",
        "python-plantstore-py-ctrl-c",
        "gunicorn",
        "granian",
        "uwsgi",
    ],
)
def test_edges_a_stop_with_deliveries_in_flight_is_clean_and_frees_their_events(
    kind, stop, spawn, raw_receiver, receiver, tmp_path
):
    silent = raw_receiver(answer=None)  # takes each delivery, and never answers
    db = tmp_path / "plants.sqlite3"

    def outbox(query):
        with contextlib.closing(sqlite3.connect(db)) as connection:
            return connection.execute(query).fetchone()[0]

    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=str(db),
        PLANTSTORE_WEBHOOK_URL=silent.url(),
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    server = start_a_server(kind, spawn, env, "sqlite")
    plants, workers = 12, 1 if kind == "python-plantstore-py" else 2
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # to each worker, likely
        statuses = pool.map(
            lambda n: post_over_http(
                server.host, server.port, TOKEN, {"id": n, "name": f"p{n}"}
            )[0],
            range(plants),
        )
        assert list(statuses) == [200] * plants
    # each worker sends as many at once as it may; the others wait
    in_flight = plantstore_webhooks.WebhookSender.PER_URL * workers
    wait_until(
        lambda: len(silent.requests) >= in_flight,
        lambda: f"{len(silent.requests)} of {in_flight} attempts came",
    )
    assert outbox("SELECT count(*) FROM plant_events WHERE lease > 0") == in_flight
    if stop == signal.SIGINT:  # Ctrl-C: the terminal signals its foreground group
        os.killpg(server.process.pid, stop)
    else:  # as systemd's KillMode=mixed stops a service: its main process alone
        server.process.send_signal(stop)
    wait_until(
        lambda: (
            server.process.poll() is not None
            and not processes_in_group(server.process.pid)
        ),
        lambda: (
            f"running 10 s after the stop: {processes_in_group(server.process.pid)}"
        ),
        10,
    )
    printed = server.output()
    assert not re.search("Traceback|Exception", printed), printed
    assert server.process.returncode == 0, printed
    # nothing lost, and the cut attempts' events free at once, not when a lease ends
    assert outbox("SELECT count(*) FROM plant_events") == plants, printed
    assert outbox("SELECT count(*) FROM plant_events WHERE lease != 0") == 0, printed
    silent.stop()
    back = receiver(silent.port)  # the same URL, answering now
    start_a_server(kind, spawn, env, "sqlite")  # and no request, from here on
    wait_until(
        lambda: len(back.delivered()) >= plants,
        lambda: f"{len(back.delivered())} of {plants} events came",
        10,
    )
    assert sorted(plant["id"] for plant in back.delivered()) == list(range(plants))


FORK_HAND_OVER = """
import io, json, os, sqlite3, sys, threading, time
from wsgiref.util import setup_testing_defaults

import plantstore, plantstore_app, plantstore_sqlite, plantstore_webhooks

db, url = sys.argv[1:]


def say(who, **what):  # one write: parent and child share the pipe
    sys.stdout.write(json.dumps({"who": who, **what}) + "\\n")
    sys.stdout.flush()


def threads():
    \"\"\"The threads of this process: Python's, and the system's.\"\"\"
    with open("/proc/self/status") as status:
        system = next(int(line.split()[1]) for line in status if line[:8] == "Threads:")
    return {"python": threading.active_count(), "system": system}


def senders():
    return sum(t.name == "plantstore-webhooks" for t in threading.enumerate())


def outbox(query):
    with sqlite3.connect(db) as connection:
        return connection.execute(query).fetchone()[0]


def wait(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


# registered before the app's: run after its own, as the process forks
forking = []
os.register_at_fork(before=lambda: forking.append(threads()))
# a failed attempt retried 2 s later rather than 5 s: due before the child's sender
# starts (CHILD_DELAY after the fork), which sends it in its first round
Sender = plantstore_webhooks.WebhookSender
Sender.SCHEDULE = (2, *Sender.SCHEDULE[1:])
app = plantstore_app.make_app(
    [os.environ["PLANTSTORE_TOKENS"]],
    store=plantstore_sqlite.SQLiteStore(db),
    webhook_urls=[url],
    webhook_secret=os.environ["PLANTSTORE_WEBHOOK_SECRET"],
)
body = b'{"id": 1, "name": "Fern"}'
environ = {
    "REQUEST_METHOD": "POST",
    "PATH_INFO": "/plants",
    "CONTENT_TYPE": "application/json",
    "CONTENT_LENGTH": str(len(body)),
    "HTTP_AUTHORIZATION": "Bearer " + os.environ["PLANTSTORE_TOKENS"],
    "wsgi.input": io.BytesIO(body),
}
setup_testing_defaults(environ)
statuses = []
b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
assert statuses == ["200 OK"], statuses
# the receiver is down: its first attempt ends at once, and the next is 2 s away
assert wait(
    lambda: outbox("SELECT attempts > 0 AND lease = 0 FROM plant_events"), 10
), "the first attempt never ended"
pid = os.fork()
if pid:
    say("parent", senders=senders(), forking=forking[-1])
    app.webhook_sender.close()
    say("parent", closed=senders())
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
# the child: its sender tries again soon, once the receiver is up
plantstore_webhooks.WebhookSender.PROBE_SECONDS = 0.2
say("child", senders=senders())
emptied = wait(lambda: not outbox("SELECT count(*) FROM plant_events"), 20)
say("child", delivered=emptied)
"""


def test_edges_a_fork_stops_the_sender_and_starts_one_in_each_process(
    spawn, receiver, tmp_path
):
    hook = receiver()
    hook_port = hook.server.server_address[1]
    hook.stop()  # down until the parent has stopped sending: the child alone sends
    script = tmp_path / "fork_hand_over.py"
    script.write_text(FORK_HAND_OVER)
    process = spawn(
        # always: an error would be cleared unseen in os.fork (3.12 and later)
        [sys.executable, "-W", "always::DeprecationWarning", script]
        + [tmp_path / "plants.sqlite3", hook.url],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            PYTHONPATH=str(HERE),
        ),
    )
    out, err, messages = Lines(process.stdout), Lines(process.stderr), []

    def heard(who, what):
        """What `who` said of `what`, once said: parent and child speak by turns."""
        while not (
            said := [m[what] for m in messages if m["who"] == who and what in m]
        ):
            messages.append(json.loads(out.until(".").string))
        return said[0]

    # the fork saw one thread: the sender had stopped before it (joined: the system
    # may count it a moment longer, as CPython's join returns before the thread's end)
    assert heard("parent", "forking")["python"] == 1
    assert heard("parent", "senders") == heard("child", "senders") == 1
    assert heard("parent", "closed") == 0
    back = receiver(hook_port)
    assert heard("child", "delivered") is True
    assert process.wait(WAIT) == 0
    assert back.delivered() == [{"id": 1, "name": "Fern"}]
    printed = err.rest()  # 3.12+ may warn of a fork with that thread, seen as above
    assert not re.search("Traceback|Exception", printed), printed


def test_a_create_after_the_sender_closed_is_still_a_200(store):
    """close() stops the sending, not the service: an embedding app may serve on."""
    application = make_app(
        [TOKEN],
        store=store,
        webhook_urls=["http://127.0.0.1:9/h"],
        webhook_secret=SECRET,
    )
    application.webhook_sender.close()
    post(webtest.TestApp(application), {"id": 1, "name": "Fern"}, 200)


def test_importing_starts_nothing_and_an_app_starts_its_sender_alone(tmp_path, pg_url):
    def started():  # but PostgreSQL's connects, each a thread that ends with it
        return sorted(
            thread.name
            for thread in threading.enumerate()
            if thread not in before and thread.name != "plantstore-connect"
        )

    before = set(threading.enumerate())
    spec = importlib.util.spec_from_file_location(
        "plantstore_imported_again", HERE / "plantstore.py"
    )
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert started() == []  # importing starts nothing
    stores = [None, SQLiteStore(tmp_path / "plants.sqlite3"), PostgresStore(pg_url)]
    for store in stores:
        make_app([TOKEN], store=store, cors_origins=["https://example.org"])
    assert started() == []  # no webhooks, no thread
    apps = [
        make_app(
            [TOKEN],
            store=store,
            webhook_urls=["http://127.0.0.1:9/hook"],
            webhook_secret=SECRET,
        )
        for store in stores
    ]
    assert started() == ["plantstore-webhooks"] * 3  # one sender each, from its build
    for application in apps:
        application.webhook_sender.close()
        getattr(application.store, "close", lambda: None)()
    assert started() == []  # and PostgreSQL's watchdog ended with its store


# ---- Restarts, forks and stops (issue 43) ----
#
# What a process's start, a fork and a stop may do to waiting events and to requests,
# by the rule of plantstore.py's "Background work" section, each in real processes.


# The start of an embedding program's script: a store from its first argument ("memory",
# an SQLite file's path, or a PostgreSQL URL), creates through the WSGI callable itself.
EMBEDDING = """
import io, json, multiprocessing, os, sys, threading, time
from wsgiref.util import setup_testing_defaults

import plantstore, plantstore_app, plantstore_server, plantstore_sqlite
import plantstore_webhooks


def say(**what):  # one write: a parent and its children share the pipe
    sys.stdout.write(json.dumps(what) + "\\n")
    sys.stdout.flush()


def build(db, url):
    if db.startswith("postgresql://"):
        from plantstore_postgres import PostgresStore

        store = PostgresStore(db)
    else:
        store = None if db == "memory" else plantstore_sqlite.SQLiteStore(db)
    return plantstore_app.make_app(
        [os.environ["PLANTSTORE_TOKENS"]],
        store=store,
        webhook_urls=[url],
        webhook_secret=os.environ["PLANTSTORE_WEBHOOK_SECRET"],
    )


def create(app, plant_id):
    # the program's own: another test's sender may find a receiver's port
    body = json.dumps({"id": plant_id, "name": f"p{plant_id} of {os.getpid()}"})
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/plants",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": "Bearer " + os.environ["PLANTSTORE_TOKENS"],
        "wsgi.input": io.BytesIO(body.encode()),
    }
    setup_testing_defaults(environ)
    statuses = []
    b"".join(app(environ, lambda status, *_: statuses.append(status)))
    return statuses[0]
"""


def start_embedding(spawn, tmp_path, name, script, *args):
    """Run an embedding program (EMBEDDING, then `script`) with these arguments; return
    the process, its stdout's lines and its stderr's."""
    path = tmp_path / f"{name}.py"
    path.write_text(EMBEDDING + script)
    process = spawn(
        # always: an error would be cleared unseen in os.fork (3.12 and later)
        [sys.executable, "-W", "always::DeprecationWarning", path, *map(str, args)],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            PYTHONPATH=str(HERE),
        ),
    )
    return process, Lines(process.stdout), Lines(process.stderr)


# The schedule's first steps, 3 s and 4 s rather than 5 s and 300 s, so that the third
# attempt comes within a test: set in gunicorn's master by a config file (the workers
# inherit the module) and by an embedding program itself, before any app is built.
SHORT_SCHEDULE = """
Sender = plantstore_webhooks.WebhookSender
Sender.SCHEDULE = (3, 4, *Sender.SCHEDULE[2:])
"""

FORKS_12_CHILDREN = (
    SHORT_SCHEDULE
    + """
db, url, stop = sys.argv[1:]
app = build(db, url)
assert [create(app, n) for n in range(10)] == ["200 OK"] * 10
say(created=10)
fork = multiprocessing.get_context("fork")
children = []
for n in range(12):  # one every 0.6 s, living 3.5 s (its sender starts) or 0.5 s
    children.append(fork.Process(target=time.sleep, args=(0.5 if n % 2 else 3.5,)))
    children[-1].start()
    time.sleep(0.6)
for child in children:
    child.join()
say(children=[child.exitcode for child in children])
while not os.path.exists(stop):
    time.sleep(0.05)
app.webhook_sender.close()
"""
)


def outbox_rows(db):
    """{webhook-id: (attempts, next_at)} of the events waiting in an SQLite file or a
    PostgreSQL database, read as an operator would."""
    rows = read_database(
        str(db), "SELECT webhook_id, attempts, next_at FROM plant_events"
    )
    return {webhook_id: (attempts, next_at) for webhook_id, attempts, next_at in rows}


def tries_of(hook, webhook_ids):
    """{webhook-id: [(time, status) of each attempt that reached the receiver]} of the
    events given: another test's sender may find the receiver's port."""
    tries = collections.defaultdict(list)
    for moment, webhook_id, status in hook.arrivals:
        if webhook_id in webhook_ids:
            tries[webhook_id].append((moment, status))
    return dict(tries)


def test_restarts_no_number_of_process_starts_spends_the_retry_schedule(
    spawn, receiver, tmp_path, pg_url
):
    """Issue 43's first item, in its three setups at once, 10 plants each: gunicorn
    `-w 2 --threads 4 --max-requests 2` on SQLite with a receiver answering 500, the
    same on PostgreSQL with a receiver refusing connections (workers start all along: a
    steady GET /health recycles a worker every 2 requests), and an embedding program on
    SQLite that forks 12 multiprocessing children. The schedule (3 s, then 4 s, here:
    SHORT_SCHEDULE) holds whatever starts: read from each outbox every moment, no
    attempt comes before its event is due, and none is given up. Each setup's receiver
    is back once one of its events has had its second attempt; each event then
    arrives at its next attempt, no sooner (a receiver that answered is not probed),
    or, after a silence, when a probe gets through."""
    config = tmp_path / "schedule.py"
    config.write_text("import plantstore_webhooks\n" + SHORT_SCHEDULE)
    failing = {"sqlite": receiver(), "forks": receiver()}  # each answering 500
    for hook in failing.values():
        hook.statuses = [500] * 1000
    refusing = receiver()
    refusing_port = refusing.server.server_address[1]
    refusing.stop()  # its port refuses connections until it is back
    sqlite_db, forks_db = tmp_path / "gunicorn.sqlite3", tmp_path / "forks.sqlite3"
    gunicorns = {}
    for name, db, url in (
        ("sqlite", sqlite_db, failing["sqlite"].url),
        ("postgres", pg_url, refusing.url),
    ):
        env = environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB=str(db),
            PLANTSTORE_WEBHOOK_URL=url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            PYTHONPATH=str(HERE),
        )
        gunicorns[name] = start_gunicorn(
            spawn, env, 2, 4, "--max-requests", "2", "-c", str(config)
        )
    stop = tmp_path / "stop"
    forks, forks_out, forks_err = start_embedding(
        spawn,
        tmp_path,
        "forks",
        FORKS_12_CHILDREN,
        forks_db,
        failing["forks"].url,
        stop,
    )
    churning = threading.Event()

    def churn(host, port):
        while not churning.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException):
                over_http(host, port, TOKEN, "GET", "/health")

    churns = []
    for _, host, port, _ in gunicorns.values():
        for plant_id in range(10):
            assert post_over_http(
                host, port, TOKEN, {"id": plant_id, "name": f"p{plant_id}"}
            ) == (200, {"name": f"p{plant_id}"})
        churns.append(threading.Thread(target=churn, args=(host, port)))
        churns[-1].start()
    databases = {"sqlite": sqlite_db, "postgres": pg_url, "forks": forks_db}
    hooks = {**failing, "postgres": None}  # the refusing one is back later
    seen = {name: {} for name in databases}  # webhook-id: (attempts, next_at) last seen
    early = []  # an attempt seen before its event was due: the schedule spent

    def watch():
        """Read each outbox; bring a setup's receiver back once one of its events has
        had its second attempt (a receiver on probation, refusing, gets one event
        every 5 s: the others' attempts lag); say whether every event was
        delivered."""
        for name, db in databases.items():
            rows = outbox_rows(db)
            now = time.time()  # after the read: each attempt it shows came before
            for webhook_id, (attempts, due) in rows.items():
                before = seen[name].get(webhook_id)
                if before and attempts > before[0] and now < before[1]:
                    early.append((name, webhook_id, before, attempts, now))
                seen[name][webhook_id] = attempts, due
            second = len(rows) == 10 and max(row[0] for row in rows.values()) >= 2
            if second and name == "postgres" and not hooks[name]:
                hooks[name] = receiver(refusing_port)
            elif second and name in failing:
                failing[name].statuses = []  # 200 from now on
        return all(
            hook
            and len(seen[name]) == 10
            and not outbox_rows(databases[name])
            and all(
                200 in [status for _, status in tries]
                for tries in tries_of(hook, seen[name]).values()
            )
            for name, hook in hooks.items()
        )

    try:
        assert json.loads(forks_out.until("created").string) == {"created": 10}
        wait_until(watch, lambda: (seen, early))
    finally:
        churning.set()
        for thread in churns:
            thread.join(WAIT)
        stop.touch()
    assert not early, early
    # What the receivers saw. A worker's stop frees the events of its attempts under
    # way, and the next process sends them at once (docs/webhooks.md): such a try is
    # not one of the schedule's, and a receiver may see it, or an event twice.
    for name, hook in hooks.items():
        tries_of_each = tries_of(hook, seen[name])
        assert len(tries_of_each) == 10, name
        for webhook_id, tries in tries_of_each.items():
            statuses = [status for _, status in tries]
            failed = statuses.index(200)
            assert set(statuses[failed:]) == {200}, (name, tries)
            if name == "postgres":  # refused until it was back
                assert failed == 0, (name, tries)
            else:  # answered 500, and then 200 when due, no sooner
                assert failed >= 1 and set(statuses[:failed]) == {500}, (name, tries)
                assert tries[failed][0] >= seen[name][webhook_id][1], (name, tries)
    for process, *_ in gunicorns.values():
        os.killpg(process.pid, signal.SIGTERM)
    for name, (process, *_, err) in gunicorns.items():
        process.wait(WAIT)
        logged = err.rest()
        # the workers that started, each to stop a moment later
        assert logged.count("Booting worker") >= 8, (name, logged)
        assert "given up" not in logged and "Traceback" not in logged, (name, logged)
    assert forks.wait(WAIT) == 0
    assert json.loads(forks_out.until("children").string) == {"children": [0] * 12}
    logged = forks_err.rest()
    assert "given up" not in logged and "Traceback" not in logged, logged


def create_on_a_connection(host, port, plant_id):
    """One create on a connection of its own, read to its end: its status, or "refused"
    (nothing listens: the server closed its socket), "reset" (a reset before any byte
    of an answer) or "cut" (a close, or a reset, before a whole answer)."""
    try:
        sock = socket.create_connection((host, port), timeout=WAIT)
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:  # the listen queue dropped as the server closed it
        return "reset"
    body = json.dumps({"id": plant_id, "name": f"p{plant_id}"}).encode()
    data = b""
    with sock:
        try:
            sock.sendall(
                b"POST /plants HTTP/1.1\r\nHost: plantstore\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\n"
                + f"Authorization: Bearer {TOKEN}\r\n".encode()
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            return "cut" if data else "reset"
    head, _, rest = data.partition(b"\r\n\r\n")
    status = re.match(rb"HTTP/1\.[01] (\d{3}) ", head)
    length = re.search(rb"(?im)^content-length: *(\d+)\r?$", head)
    whole = status and length and len(rest) == int(length[1])
    return int(status[1]) if whole else "cut"


def a_stop_under_load(spawn, tmp_path, stop, clients):
    """python plantstore.py on a new SQLite file, stopped by `stop` while `clients`
    threads create (none: nothing in flight); return each create's (id, outcome), the
    seconds from the signal to the process's end, the ids stored and what it logged."""
    db = tmp_path / f"stop-{time.monotonic_ns()}.sqlite3"
    process, host, port, err = serve_plantstore(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(db))
    )
    ids, outcomes = itertools.count(), []

    def create():  # until the server is gone
        while (outcome := create_on_a_connection(host, port, n := next(ids))) != (
            "refused"
        ):
            outcomes.append((n, outcome))

    threads = [threading.Thread(target=create) for _ in range(clients)]
    for thread in threads:
        thread.start()
    # the stop comes while creates come and go
    wait_until(lambda: len(outcomes) >= clients, "no create was answered")
    signalled = time.monotonic()
    process.send_signal(stop)
    exit_code = process.wait(WAIT)
    ended = time.monotonic() - signalled
    for thread in threads:
        thread.join(WAIT)
    logged = err.rest()
    assert exit_code == 0 and "Traceback" not in logged, logged
    return outcomes, ended, set(stored_plants(str(db))), logged


def test_restarts_a_stop_answers_every_connection_it_accepted(spawn, tmp_path):
    """Issue 43's second item: the embedded server stopped by SIGTERM (systemd) and by
    SIGINT (Ctrl-C) while 16 clients create, 12 times each (the two in turns of their
    own, side by side), each on a new SQLite file.

    A client cannot see accept(); what it sees tells it anyway. Each create is a new
    connection, its request sent whole, read to the end: a whole answer (status line,
    headers, the body its Content-Length says); a refused connect (the server had
    closed its socket); a reset before any byte of an answer, which is what the kernel
    sends to a connection still in the listen queue when the socket closes (one the
    server never accepted, and so never read: its plant is not stored); or a close, or
    a reset, before a whole answer: a connection accepted and cut, the defect. The
    rule: no create is cut, and the plants stored are exactly those answered 200 (a
    200 is stored; a plant stored without its 200 was read and cut). And a stop with
    nothing in flight ends within 1 s of its signal."""

    def stops(stop):
        for _ in range(12):
            outcomes, _, stored, logged = a_stop_under_load(spawn, tmp_path, stop, 16)
            seen = collections.Counter(outcome for _, outcome in outcomes)
            assert "cut" not in seen, (stop, seen, logged)
            assert stored == {n for n, outcome in outcomes if outcome == 200}, seen

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(stops, [signal.SIGTERM, signal.SIGINT]))
    for stop in signal.SIGTERM, signal.SIGINT:  # alone, as the bound is the server's
        ended = a_stop_under_load(spawn, tmp_path, stop, 0)[1]
        assert ended < 1, (stop, ended)


MAIN_RETURNS = """
db, url, stop = sys.argv[1:]
app = build(db, url)
server = plantstore_server.make_server("127.0.0.1", 0, app)


def serve():  # a thread of the program's own, no daemon: the program goes on in it
    while threading.main_thread().is_alive():  # until the main thread has returned
        time.sleep(0.01)
    say(port=server.server_address[1])
    server.timeout = 0.05
    while not os.path.exists(stop):
        server.handle_request()
    server.server_close()


threading.Thread(target=serve).start()
"""


def test_restarts_creates_do_not_depend_on_the_thread_that_serves_them(
    spawn, receiver, tmp_path
):
    """Issue 43's third item: a program that builds the app, serves it from a thread of
    its own and returns from its main thread; on the in-memory store and SQLite, every
    create with a webhook is a 200 and its event is delivered, and once the serving
    thread ends, so does the program, by itself."""

    def serve_and_create(db):
        hook, stop = receiver(), tmp_path / f"stop-{db != 'memory'}"
        process, out, err = start_embedding(
            spawn, tmp_path, "main_returns", MAIN_RETURNS, db, hook.url, stop
        )
        port = json.loads(out.until("port").string)["port"]
        plants = [{"id": n, "name": f"p{n} of {process.pid}"} for n in range(5)]
        for plant in plants:
            assert post_over_http("127.0.0.1", port, TOKEN, plant) == (
                200,
                {"name": plant["name"]},
            ), (db, err.so_far())

        def delivered():  # to this program: another test's sender may find the port
            return [plant for plant in hook.delivered() if plant in plants]

        wait_until(
            lambda: len(delivered()) >= 5,
            lambda: f"{db}: {len(delivered())} of 5 events came",
            10,
        )
        stop.touch()
        assert process.wait(WAIT) == 0
        assert "Traceback" not in err.rest(), db
        assert sorted(delivered(), key=lambda plant: plant["id"]) == plants
        if db != "memory":
            assert read_database(str(db), "SELECT count(*) FROM plant_events") == [(0,)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # side by side
        list(pool.map(serve_and_create, ["memory", tmp_path / "plants.sqlite3"]))


SHORT_FORKS = """
db, url = sys.argv[1:]
app = build(db, url)
# The receiver holds each delivery 0.5 s: while the children live, events are due, or
# under way in this process (4 at a time), and a sender that ran in a child would take
# them.
assert [create(app, n) for n in range(10)] == ["200 OK"] * 10
children = []
for end in "os._exit", "sys.exit":
    pid = os.fork()
    if not pid:  # a child that serves nothing and soon ends
        time.sleep(0.3)
        os._exit(0) if end == "os._exit" else sys.exit(0)
    children.append(pid)
fork = multiprocessing.get_context("fork")
child = fork.Process(target=time.sleep, args=(0.3,))
child.start()
for pid in children:
    assert os.waitpid(pid, 0)[1] == 0
child.join()
assert child.exitcode == 0
say(children="ended")
wait = lambda: plantstore_webhooks.WebhookSender.LEASE_SECONDS / 2  # noqa: E731
deadline = time.monotonic() + wait()
while app.webhook_sender._execute("SELECT count(*) FROM plant_events")[0][0]:
    assert time.monotonic() < deadline, "events are still waiting, or leased"
    time.sleep(0.05)
say(outbox="empty")
app.webhook_sender.close()
"""


def test_restarts_a_short_lived_fork_takes_no_event(spawn, receiver, tmp_path, pg_url):
    """Issue 43's sixth item, on SQLite and PostgreSQL at once: a program that has built
    the app, with events waiting, forks three children that serve nothing and end 0.3 s
    later: by os._exit, by sys.exit, and multiprocessing's. None takes an event: every
    event arrives once, from the program itself, and the outbox is empty within half a
    lease (a child that took events and ended would have left them leased, to be sent
    again when their lease ends)."""
    programs = []
    for db in tmp_path / "plants.sqlite3", pg_url:
        hook = receiver()
        hook.delay = 0.5
        name = f"short_forks_{len(programs)}"
        programs.append(
            (hook, *start_embedding(spawn, tmp_path, name, SHORT_FORKS, db, hook.url))
        )
    for _, process, out, err in programs:
        assert json.loads(out.until("children").string) == {"children": "ended"}
        said = json.loads(out.until("outbox").string)
        assert said == {"outbox": "empty"}, err.so_far()
        assert process.wait(WAIT) == 0
        assert "Traceback" not in err.rest()
    time.sleep(0.5)  # an attempt of a child's would be under way
    for hook, process, _, _ in programs:
        mine = [
            (plant["id"], status)
            for _, plant, status in hook.deliveries
            if plant["name"] == f"p{plant['id']} of {process.pid}"
        ]
        assert sorted(mine) == [(plant_id, 200) for plant_id in range(10)]


CHILD_ENDS = """
db, url = sys.argv[1:]
app = build(db, url)
started = time.monotonic()
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0.2,))
child.start()
if not os.fork():
    time.sleep(0.2)
    sys.exit(0)  # as a script's child ends, its threads waited for
os.wait()
say(fork=time.monotonic() - started)
child.join()
say(multiprocessing=time.monotonic() - started)
app.webhook_sender.close()
"""


def test_restarts_a_forked_child_ends_when_its_work_does(spawn, receiver, tmp_path):
    """A child forked by an embedding program, its work 0.2 s, ends within 2 s of its
    fork, the bound issue 43's sixth item puts on a short-lived fork: its sender, which
    waits CHILD_DELAY before its first round, must not hold the child's end that long
    (Python's end waits for every thread that is no daemon)."""
    process, out, err = start_embedding(
        spawn,
        tmp_path,
        "child_ends",
        CHILD_ENDS,
        tmp_path / "plants.sqlite3",
        receiver().url,
    )
    took = [json.loads(out.until("multiprocessing|fork").string) for _ in range(2)]
    assert process.wait(WAIT) == 0, err.rest()
    assert all(seconds < 2 for child in took for seconds in child.values()), took


ANSWERED_AT_THE_END = """
db, url = sys.argv[1:]
app = build(db, url)
assert create(app, 1) == "200 OK"
time.sleep(0.2)  # its attempt under way: the receiver answers 0.5 s after it came
"""  # and the main thread returns, while it is


def test_restarts_an_attempt_answered_as_the_process_ends_counts(
    spawn, receiver, tmp_path
):
    """An attempt under way when the program's main thread returns, answered 500 before
    the sender ends (which it does at its next wake): that answer is the schedule's
    first attempt, and the event's next comes 5 s later. Freed as if never tried, it is
    due at once, and the next process to start tries it again (issue 43's first item:
    the schedule holds whatever starts, and ends; seen under gunicorn --max-requests as
    a second try 0.08 s after the first)."""
    hook = receiver()
    hook.statuses, hook.delay = [500] * 10, 0.5
    db = tmp_path / "plants.sqlite3"
    process, _, err = start_embedding(
        spawn, tmp_path, "answered", ANSWERED_AT_THE_END, db, hook.url
    )
    assert process.wait(WAIT) == 0, err.rest()
    ((webhook_id, attempts, next_at, lease),) = read_database(
        str(db), "SELECT webhook_id, attempts, next_at, lease FROM plant_events"
    )
    tries = tries_of(hook, {webhook_id})[webhook_id]
    assert [status for _, status in tries] == [500]
    assert (attempts, lease) == (1, 0) and next_at >= tries[0][0] + 5


LEAKS = """
import gc

db, rounds = sys.argv[1], int(sys.argv[2])


def one_round():
    app = build(db, "http://127.0.0.1:9/hook")
    assert b"".join(
        app(
            {"REQUEST_METHOD": "GET", "PATH_INFO": "/health", "SERVER_NAME": "x",
             "SERVER_PORT": "80", "wsgi.url_scheme": "http"},
            lambda *_: None,
        )
    )
    app.webhook_sender.close()
    getattr(app.store, "close", lambda: None)()


def system_threads():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line[:8] == "Threads:")


def held():
    # a thread joined is gone from the system a moment later
    deadline = time.monotonic() + 1
    while system_threads() > threading.active_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    system = system_threads()
    gc.collect()
    return {
        "descriptors": sorted(os.listdir("/proc/self/fd")),
        "threads": [thread.name for thread in threading.enumerate()],
        "system threads": system,
    }


one_round()  # what a first round loads for good: modules, the interpreter's own
before = held()
for _ in range(rounds):
    one_round()
say(before=before, after=held())
"""


def test_restarts_nothing_leaks_from_200_apps_built_and_closed(spawn, tmp_path, pg_url):
    """Issue 43's seventh item: 200 rounds of make_app (webhooks on), a request, and
    closing its sender and its store leave no descriptor open and no thread running,
    on each store (50 on PostgreSQL). The fork hooks each one registers stay, as
    os.register_at_fork keeps them, each holding a weak reference alone."""
    runs = {
        db: start_embedding(spawn, tmp_path, f"leaks-{n}", LEAKS, db, rounds)
        for n, (db, rounds) in enumerate(
            # PostgreSQL's rounds cost a connection and the schema's statements each,
            # 50 ms: what a round leaks, 50 show as well as 200
            [("memory", 200), (tmp_path / "plants.sqlite3", 200), (pg_url, 50)]
        )
    }
    for db, (process, out, err) in runs.items():
        said = json.loads(out.until("before").string)
        assert process.wait(WAIT) == 0, err.rest()
        assert said["after"] == said["before"], db
        assert said["after"]["threads"] == ["MainThread"], db
        assert said["after"]["system threads"] == 1, db


def test_restarts_a_locked_sqlite_holds_up_no_fork_and_no_stop(
    spawn, receiver, tmp_path
):
    """Issue 44: a writer waits for SQLite in naps and for the writers' turn on a
    bell, each to a deadline, never in a call that nothing cuts short. Under gunicorn
    --preload, with the file held by another process's transaction for as long as the
    test runs, and the events due (their first retry 1 s after their attempt, by
    first_retry_after): the master's sender, which stops before each fork, is then in
    such a wait to claim them, and a killed worker's replacement boots within its bound
    (BACKGROUND_WAIT, 1 s) and a second for the boot, never the lock's length. Then 8
    creates wait in the workers, and SIGTERM ends gunicorn once they are answered,
    each 503 with Retry-After within its bound; no event is left leased."""
    hook = receiver()
    hook.statuses = [500] * 1000  # events wait, none due for 5 s after their first try
    path = str(tmp_path / "plants.sqlite3")
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=path,
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
        PYTHONPATH=str(first_retry_after(tmp_path / "schedule", 1)),
    )
    process, host, port, err = start_gunicorn(spawn, env, 2, 4, "--preload")
    for plant_id in range(5):
        document = {"id": plant_id, "name": f"p{plant_id}"}
        assert post_over_http(host, port, TOKEN, document)[0] == 200
    wait_until(lambda: len(hook.arrivals) >= 5, "the first tries never came")
    workers = [pid for pid in processes_in_group(process.pid) if pid != process.pid]
    with sqlite_held(path, SQLITE_LOCKER):
        # the events due, and every sender, the master's too, in a wait to claim them
        time.sleep(1 + plantstore_webhooks.WebhookSender.POLL_SECONDS + 0.2)
        killed = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        err.until(r"Booting worker")
        booted = time.monotonic() - killed
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            creates = [
                pool.submit(timed_exchange, (host, port), "POST", "/plants", document)
                for document in ({"id": n, "name": "held"} for n in range(100, 108))
            ]
            time.sleep(1)  # each one in its wait
            stopped = time.monotonic()
            os.killpg(process.pid, signal.SIGTERM)
            assert process.wait(WAIT) == 0
            stop = time.monotonic() - stopped
    # BACKGROUND_WAIT (1 s) and a second for the boot
    assert booted < 2, f"the new worker booted {booted:.1f} s after the kill"
    answers = [create.result() for create in creates]
    assert [status for _, status, _, _ in answers] == [503] * 8, answers
    assert all("Retry-After" in headers for _, _, headers, _ in answers)
    assert max(seconds for seconds, *_ in answers) < OUTAGE_CREATE_BOUND
    assert stop < OUTAGE_CREATE_BOUND, f"gunicorn took {stop:.1f} s to stop"
    leased = f"SELECT count(*) FROM plant_events WHERE lease > {time.time()}"
    assert read_database(path, leased) == [(0,)]
    assert "Traceback" not in err.rest()


# ---- Issue 57: each receiver's bounds, a stop's drain, a recovery said everywhere ----


def test_the_outbox_in_memory_bounds_each_receiver_and_says_each_drop_twice(
    store, webhook_app, receiver, monkeypatch, caplog
):
    """Issue 57's item 3: MAX_WAITING counts each receiver's events apart. With one
    receiver down and one that takes an event only when the test lets it, a healthy one
    gets every event; the others' dropping is said once as it starts, and once as it
    ends, with how many were lost, though the slow one's outbox has room for one event
    again and again meanwhile. In 1.5.0 the bound counted every receiver's events
    together: the healthy one lost events too, and the line came again at each room."""
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "MAX_WAITING", 20)
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (0.2,) * 100)
    healthy, slow, down = receiver(), receiver(), receiver()
    turns = threading.Semaphore(0)  # each release lets one delivery through
    slow.hold = types.SimpleNamespace(
        wait=lambda seconds: turns.acquire(timeout=seconds)
    )
    port = down.server.server_address[1]
    down.stop()
    application = webhook_app(store, healthy.url, slow.url, down.url)
    sender, created = application.app.webhook_sender, itertools.count()

    def create(count):  # as fast as the healthy receiver takes them
        for plant_id in itertools.islice(created, count):
            post(application, {"id": plant_id, "name": f"p{plant_id}"}, 200)
            healthy.wait_for(plant_id + 1)

    def waiting(url):
        return sum(count for each, count, *_ in sender.backlog() if each == url)

    create(30)  # 20 kept for each of the other two, 10 dropped
    for _ in range(5):  # the slow one has room for one: 1 kept, 1 dropped
        turns.release()
        wait_until(lambda: waiting(slow.url) == 19, lambda: sender.backlog())
        create(2)
    assert sorted(plant["id"] for plant in healthy.delivered()) == list(range(40))
    turns.release(100)
    back = receiver(port)  # the same URL, answering now
    wait_until(lambda: sender.backlog() == [], lambda: sender.backlog())
    create(1)  # kept for each
    slow.wait_for(26), back.wait_for(21)
    said = [line for line in caplog.messages if "webhook events are" in line]
    assert len(said) == 4, said
    for url, lost in (slow.url, 15), (down.url, 20):
        origin = url.removesuffix("/plant/webhook")
        assert [line.split(" (request")[0] for line in said if origin in line] == [
            f"webhook events are dropped for {origin}: the outbox in memory holds the "
            "most it keeps for one receiver (20 events, 33554432 bytes)",
            f"webhook events are kept again for {origin}: {lost} lost",
        ]


# A host program that ends once its creates are answered: its main thread returns.
HOST_ENDS = """
app = plantstore.make_app(
    [os.environ["PLANTSTORE_TOKENS"]],
    webhook_urls=sys.argv[1:],
    webhook_secret=os.environ["PLANTSTORE_WEBHOOK_SECRET"],
)
assert [create(app, n) for n in range(40)] == ["200 OK"] * 40
say(created=40)
"""


@pytest.mark.parametrize(
    "kind, stop",
    [
        ("gunicorn", signal.SIGTERM),
        ("gunicorn", signal.SIGHUP),
        ("granian", signal.SIGTERM),
        ("python-plantstore-py", signal.SIGTERM),
        ("host-program", None),
    ],
    ids=["gunicorn-sigterm", "gunicorn-sighup", "granian-sigterm", "embedded", "host"],
)
def test_a_stop_sends_what_waits_in_memory_first_for_5_s_at_most(
    kind, stop, spawn, receiver, raw_receiver, tmp_path
):
    """Issue 57's item 4: 40 events wait in memory for a receiver that holds each
    delivery until 2 s after the stop (a server's stop, a reload, a host program's
    end), for one that never answers, and for one that is down. The process sends the
    first one's every event before it ends, within WebhookSender.CLOSE_SECONDS of the
    end, and ends by itself. In 1.5.0 the embedded server alone sent them; under the
    others, 4 of 40 arrived (those under way), the process ended in under a second."""
    hook, silent = receiver(), raw_receiver(answer=None)
    hook.hold = threading.Event()
    urls = [hook.url, silent.url(), f"http://127.0.0.1:{free_port()}/down"]
    if kind == "host-program":
        process, out, err = start_embedding(spawn, tmp_path, "host", HOST_ENDS, *urls)
        out.until("created")
        output = err.rest
    else:
        env = environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_WEBHOOK_URL=",".join(urls),
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
        )
        server = start_a_server(kind, spawn, env, "memory")
        for plant_id in range(40):
            document = {"id": plant_id, "name": f"p{plant_id}"}
            assert post_over_http(server.host, server.port, TOKEN, document)[0] == 200
        process, output = server.process, server.output
        process.send_signal(stop)  # the main process alone, as systemd signals it
    time.sleep(2)  # every sender has seen its end meanwhile: 1.5.0's were gone
    hook.hold.set()
    released = time.monotonic()
    wait_until(
        lambda: len({plant["id"] for plant in hook.delivered()}) == 40,
        lambda: f"{len(hook.delivered())} of 40 events came",
    )
    if stop == signal.SIGHUP:  # the old workers are gone; the new ones serve on
        # the master alone: signalled with its workers, it may replace one that ended
        # first, and the new one, not yet handling SIGTERM, serves on
        process.send_signal(signal.SIGTERM)
    wait_until(
        lambda: process.poll() is not None and not processes_in_group(process.pid),
        lambda: f"running: {processes_in_group(process.pid)}",
    )
    ended = time.monotonic() - released
    printed = output()
    assert process.returncode == 0 and "Traceback" not in printed, printed
    # the sender's bound, and the process's end (a reload's old workers: not timed)
    bound = plantstore_webhooks.WebhookSender.CLOSE_SECONDS + 3
    assert stop == signal.SIGHUP or ended < bound, ended


def test_each_worker_that_said_a_receiver_fails_says_when_it_takes_events_again(
    spawn, receiver, tmp_path
):
    """Issue 57's item 13, its first point: under gunicorn -w 2 on SQLite, each worker
    tries a receiver that is down, 2.5 s apart, and says it fails; each then probes it
    every 5 s. Once it is back, the first probe that gets through brings every event
    forward, and that worker sends them all; the other still says, at its own probe,
    that the receiver takes events again. In 1.5.0 it never did."""
    hook = receiver()
    port = hook.server.server_address[1]
    hook.stop()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=str(tmp_path / "plants.sqlite3"),
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    # the shipped logging configuration: each line names its process
    logging = ("--log-config", str(HERE / "deploy" / "gunicorn-logging.conf"))
    process, host, port_served, err = start_gunicorn(spawn, env, 2, 4, *logging)

    def said(what):  # the workers that said it
        return set(
            re.findall(rf"\[(\d+)\] \[\w+\] plantstore: .* {what}", err.so_far())
        )

    for plant_id in range(5):
        document = {"id": plant_id, "name": f"p{plant_id}"}
        assert post_over_http(host, port_served, TOKEN, document)[0] == 200
        if plant_id == 0:  # its worker fails, then only probes: the other takes 1-4
            wait_until(lambda: len(said("fails")) == 1, err.so_far)
            time.sleep(2.5)  # their probes, each every 5 s, come 1.5 s apart or more
    wait_until(lambda: len(said("fails")) == 2, err.so_far)
    back = receiver(port)
    assert sorted(plant["id"] for plant in back.wait_for(5)) == list(range(5))
    wait_until(lambda: said("takes events again") == said("fails"), err.so_far)


# ---- The outbox at a large backlog, and its clock (issue 57, items 6 and 7) ----


def measuring(store, reads):
    """Have each statement the store runs on the outbox say what it reads, as it
    runs, in reads: on PostgreSQL, the rows its plan's scans gave and set aside
    (EXPLAIN ANALYZE, just before it, rolled back); on SQLite, its virtual machine's
    steps."""
    execute = store.execute

    def plan_reads(node):
        own = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        own *= node["Actual Loops"] if "Scan" in node["Node Type"] else 0
        return own + sum(plan_reads(child) for child in node.get("Plans", []))

    def measured(db, sql, parameters, deadline):
        if "plant_event" not in sql:
            return execute(db, sql, parameters, deadline)
        if isinstance(store, SQLiteStore):
            steps = [0]
            db.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 1)
            try:
                rows = execute(db, sql, parameters, deadline)
                fetched = rows.fetchall()
            finally:
                db.set_progress_handler(None, 1)
            reads.append((sql, steps[0]))
            return types.SimpleNamespace(
                description=rows.description, fetchall=lambda: fetched
            )
        within = db.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        db.execute("SAVEPOINT measured" if within else "BEGIN")
        explain = "EXPLAIN (ANALYZE, FORMAT JSON) "
        if parameters:
            explained = db.execute(explain + _pyformat(sql), parameters)
        else:  # psycopg reads no placeholder then, as the store runs it
            explained = db.execute(explain + sql)
        reads.append((sql, plan_reads(explained.fetchone()[0][0]["Plan"])))
        db.execute("ROLLBACK TO SAVEPOINT measured" if within else "ROLLBACK")
        return execute(db, sql, parameters, deadline)

    store.execute = measured


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_outbox_each_claim_and_scrape_reads_a_few_rows_of_100_000_waiting_events(
    kind, request, tmp_path, receiver
):
    """Issue 57, item 6: a receiver down for a day, 100,000 events waiting for it, in a
    database made and filled by 1.5.0, and another receiver that takes its events.
    Upgraded in place at start, the service delivers the second one's events and
    answers a scrape, and each statement it ran on the outbox, run again, reads a few
    rows, not the backlog: 1.5.0's scrape counted every event, and on PostgreSQL
    each claim of the healthy receiver walked the other's backlog (1.6 s and 2.3 s at
    10M, where /metrics then said the database was down)."""
    db = request.getfixturevalue("pg_url") if kind == "postgres" else tmp_path / "db"
    made_by_1_5_0(tmp_path / "1.5.0", db)
    down, hook = f"http://127.0.0.1:{free_port()}/plant/webhook", receiver()
    left_by_1_5_0(db, down, 100_000, ago=86400)
    left_by_1_5_0(db, hook.url, 20, ago=1)
    store = PostgresStore(db) if kind == "postgres" else SQLiteStore(db)
    reads = []
    measuring(store, reads)
    served = make_app(
        [TOKEN], store=store, webhook_urls=[down, hook.url], webhook_secret=SECRET
    )
    waiting = {
        down.rpartition("/plant")[0]: 100_000,
        hook.url.rpartition("/plant")[0]: 0,
    }

    def scraped(family="plantstore_webhook_events_waiting"):
        text = webtest.TestApp(served).get("/metrics", headers=AUTH, status=200).text
        return read_metrics(text)[family]

    try:
        assert len(hook.wait_for(20)) == 20
        wait_until(lambda: scraped() == waiting, scraped)  # each delivery settled
        assert scraped("plantstore_database_up") == 1
    finally:
        served.webhook_sender.close()
    most = {}  # the most each statement read
    for sql, count in reads:
        most[sql[:40]] = max(count, most.get(sql[:40], 0))
    assert max(most.values()) < (1000 if kind == "postgres" else 5000), most


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_clock_a_step_back_of_an_hour_leaves_no_event_waiting_an_hour(
    kind, request, tmp_path, webhook_app, receiver, monkeypatch
):
    """Issue 57, item 7: a host's wall clock an hour ahead while 8 events are tried
    once each, their receiver down; then the clock set right, an hour back; then the
    receiver back: every event arrives in seconds, as its schedule says. 1.5.0 read
    when each was due, and when to probe the receiver again, on the wall clock: they
    waited an hour."""
    wall, wall_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: wall() + 3600)
    monkeypatch.setattr(time, "time_ns", lambda: wall_ns() + 3600 * 10**9)
    store = {
        "memory": ChunkedStore,
        "sqlite": lambda: SQLiteStore(tmp_path / "plants.sqlite3"),
        "postgres": lambda: PostgresStore(request.getfixturevalue("pg_url")),
    }[kind]()
    port = free_port()
    app = webhook_app(store, f"http://127.0.0.1:{port}/plant/webhook")
    monkeypatch.setattr(plantstore_webhooks.WebhookSender, "SCHEDULE", (1, 300))
    for plant_id in range(8):
        post(app, {"id": plant_id, "name": "Fern"}, 200)

    def failing():
        read = read_metrics(app.get("/metrics", headers=AUTH, status=200).text)
        return read["plantstore_webhook_events_failing"][f"http://127.0.0.1:{port}"]

    wait_until(lambda: failing() == 8, "every event was tried once")
    monkeypatch.setattr(time, "time", wall)  # set right: receivers check the time
    monkeypatch.setattr(time, "time_ns", wall_ns)
    hook = receiver(port)
    assert sorted(event["id"] for event in hook.wait_for(8)) == list(range(8))
