"""Webhooks: each new plant POSTed to every receiver, signed as Standard Webhooks says,
and retried, from threads of the sender's own (plantstore_background.py's rule).
"""

import base64
import contextlib

# a webhook attempt's connect imports encodings.idna for its host name: imported
# now, so that a fork during an attempt cannot leave that import's lock held
import encodings.idna  # noqa: F401 (imported for that alone)
import hmac
import http.client
import math
import random
import re
import secrets
import socket
import sqlite3
import threading
import time
import traceback
import types
from urllib.parse import quote, urlsplit

from plantstore import JSON_TYPE, HTTPError, plant_json
from plantstore_background import BACKGROUND_WAIT, Background, this_process
from plantstore_cors import receiver_origin
from plantstore_log import log_line
from plantstore_sql import HEALTH_WAIT_SECONDS, RETRY_AFTER, SQLStore
from plantstore_sqlite import SQLiteStore


class WebhookSender:
    """Delivers the sample's new-plant webhook to each receiver, signed as Standard
    Webhooks says.

    Every event waits in an outbox, the plant_events table, until its receiver answers
    2xx. With a SQL store that table is written in the plant's own transaction, so a 200
    means at least one delivery, across crashes and restarts; several workers may
    deliver one event, and receivers deduplicate by webhook-id. With the in-memory store
    the table is in an SQLite database in the memory of the process: best effort, lost
    with the process, and at most MAX_WAITING events and MAX_WAITING_BYTES of bodies
    for each receiver; there, what waits is counted as events come and go (IN_MEMORY),
    so that no create waits on a count of them; at the process's end, what waits for a
    receiver that is not failing is sent first, for CLOSE_SECONDS at most.

    It starts when it is made (plantstore_background.py's rule). Its thread claims due
    events, at most PER_URL at once for each receiver, and hands each to a thread that
    POSTs it; each attempt is cut after TIMEOUT seconds, whatever the receiver does, so
    a slow receiver holds up no other, and no create waits for any. A failed attempt is
    retried on SCHEDULE, with jitter. While a receiver gives no answer (or its gateway
    answers 502-504), its first event in CLAIM's order (the one due longest) alone is
    tried, every PROBE_SECONDS, and once one gets through, the others follow at once. A
    probe of an event not yet due spends none of its attempts, and a process that starts
    sends what is due alone, so no number of processes starting spends the schedule. A
    URL no longer configured gets nothing more: its events are dropped. One that answers
    410 gets nothing more from this process, which drops the events waiting for it; the
    other processes stop at their own 410.
    """

    # seconds before a retry
    SCHEDULE = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
    PROBE_SECONDS, POLL_SECONDS, TIMEOUT, PER_URL = 5, 1, 15, 4
    # the in-memory outbox's bounds, for each receiver
    MAX_WAITING, MAX_WAITING_BYTES = 10000, 32 * 2**20
    # an event taken by a sender killed mid-attempt is free after it
    LEASE_SECONDS = TIMEOUT + 2
    # a fork's child sends this long after the fork, or at its first create: a child
    # that serves nothing and ends sooner has taken nothing
    CHILD_DELAY = 3
    CLOSE_SECONDS = 5  # the longest the outbox in memory is sent from at the end

    # The outbox's times (when an event is due, when its lease ends) are all read and
    # written at :now, the outbox's clock: PostgreSQL's own, which every host shares
    # (plantstore_postgres), else this process's (_now), which never steps back.
    # An event is due from its making on: its next_at is its birth, not 0, so that the
    # claim's order below (next_at, then seq) is an index's order even where the only
    # index is on next_at (a PostgreSQL role granted 1.5.0's tables: plant_events_due).
    EVENT = (
        "INSERT INTO plant_events (url, webhook_id, body, next_at, created)"
        " VALUES (:url, :webhook_id, :body, :now, :now)"
    )
    # A sender leases the events it takes, so that no other sender takes them meanwhile:
    # the URL's events due (or up to :ahead seconds ahead), those due longest first
    # (the oldest of those due together), read in the order of an index
    # (plant_events_claims), however many wait; with the time its signature gives,
    # :wall (a receiver refuses one 5 min off: PostgreSQL's clock, else the host's),
    # and whether each is due.
    CLAIM = (
        "UPDATE plant_events SET lease = :now + :lease"
        " WHERE lease <= :now AND seq IN (SELECT seq FROM plant_events"
        " WHERE url = :url AND next_at <= :now + :ahead AND lease <= :now"
        " ORDER BY next_at, seq LIMIT :free)"
        " RETURNING seq, url, webhook_id, body, :wall, attempts, next_at <= :now"
    )
    RETRY = (
        "UPDATE plant_events SET attempts = :attempts, next_at = :now + :delay,"
        " lease = 0 WHERE seq = :seq"
    )
    RELEASE = "UPDATE plant_events SET lease = 0 WHERE seq = :seq"
    DUE_NOW = (
        "UPDATE plant_events SET next_at = :now WHERE url = :url AND next_at > :now"
    )
    DONE = "DELETE FROM plant_events WHERE seq = :seq"
    FORGET = "DELETE FROM plant_events WHERE url = :url"
    NEWEST = "SELECT created FROM plant_events ORDER BY seq DESC LIMIT 1"
    # The outbox in memory: SQLiteStore's table, indexes and counts (by receiver, the
    # events waiting, those failing and their bytes, kept by triggers as events come and
    # go), so that neither a create nor /metrics counts them.
    IN_MEMORY = (SQLiteStore.OUTBOX, *SQLiteStore.INDEXES)
    HELD = "SELECT total(waiting), total(bytes) FROM plant_event_counts WHERE url = ?"
    # an event of the URL whose last attempt failed: none once a process delivered them
    FAILED = "SELECT 1 FROM plant_events WHERE url = :url AND attempts > 0 LIMIT 1"
    # by receiver: the events waiting, those whose last attempt failed, and since when
    # the oldest's plant was made, as the outbox's counts say, and one index entry
    RECEIVERS = (
        "SELECT url, sum(waiting), sum(failing), :now - (SELECT min(created) FROM"
        " plant_events WHERE url = c.url) FROM plant_event_counts AS c GROUP BY url"
        " HAVING sum(waiting) > 0"
    )

    def __init__(self, urls, secret, store):
        self._key = webhook_secret_key(secret)
        self.urls = [check_webhook_url(url) for url in urls]  # a 410 takes its URL out
        # None: the outbox in memory
        self._store = store if isinstance(store, SQLStore) else None
        if self._store:
            store.write_event = lambda run, *plant: self._write(
                run, event_json(*plant), self.urls
            )
        self._closed, self._ahead = False, -math.inf  # see _now()
        self._background = Background(
            "plantstore-webhooks",
            self._loop,
            lambda: this_process(self, self._new_state),
            # SQLite's threads stop, and the outbox in memory is SQLite's too
            stops_for_fork=getattr(self._store, "STOPS_FOR_FORK", True),
            child_delay=self.CHILD_DELAY,
            unfinished=self._unfinished,
        )
        self._background.start()

    def _new_state(self):
        """This process's attempts (their events, and whether each is a probe, keyed by
        seq; their statuses come in `done`), the receivers on probation (to when each
        was last tried), those said to fail, and, with no SQL store, its outbox in
        memory."""
        state = types.SimpleNamespace(
            in_flight={}, done=[], connections={}, probation={}, failing=set()
        )
        state.first_round = True
        state.stalled = False  # whether it said that it waits for the database
        state.ended = 0  # when the process ended, as the sender saw it
        if not self._store:  # used by the sender and by notify(), in turn
            state.memory = sqlite3.connect(
                ":memory:", isolation_level=None, check_same_thread=False
            )
            for statement in self.IN_MEMORY:
                state.memory.execute(statement)
            state.lock, state.dropping = threading.Lock(), {}  # URL: events dropped
        return state

    def _now(self, least=0.0):
        """The outbox's clock where no database keeps one (SQLite, the outbox in
        memory): time.monotonic(), as far ahead of it as the wall clock (or `least`)
        has been. It never steps back: after a step back of the wall clock it goes on
        from where it was, so that no event waits out the step."""
        now = time.monotonic()
        self._ahead = max(self._ahead, time.time() - now, least - now)
        return now + self._ahead

    def _execute(self, sql, **parameters):
        """Run one statement on the outbox, at the outbox's :now: this process's in
        memory, or the store's in a transaction of its own, so that a statement cut
        short leaves nothing done, within BACKGROUND_WAIT and outside the requests'
        breaker."""
        parameters["now"] = self._now()
        if self._store:
            return self._store.on_connection(
                lambda run: run(sql, **parameters),
                write=True,  # its reads too, a few a process, wait their turn
                transaction=True,
                wait=BACKGROUND_WAIT,
                background=True,
            )
        state = this_process(self, self._new_state)
        with state.lock:
            return state.memory.execute(sql, parameters).fetchall()

    def backlog(self):
        """For each URL with events waiting: how many, how many of them failed their
        last attempt, and since when the oldest one's plant was made (RECEIVERS, or
        the store's own count), within the bound of a health check, outside the
        requests' breaker: a count cut short is no database away."""
        sql = getattr(self._store, "counting", None) or self.RECEIVERS
        if self._store:
            return self._store.on_connection(
                lambda run: run(sql, now=self._now()),
                wait=HEALTH_WAIT_SECONDS,
                background=True,
            )
        return self._execute(sql)

    def notify(self, plant_id, name, tag):
        """After a create: write its events in memory, or wake for those SQL wrote."""
        if not (self._store or self._closed):  # closed: its memory is gone
            self._keep(event_json(plant_id, name, tag))
        self._background.wake()

    def _keep(self, body):
        """Write an event for each URL in memory, within that receiver's bounds. Its
        first event dropped is said, and so is the end, with how many were dropped,
        once one is kept with its outbox down to half: not a line each time it fills."""
        state, kept, said = this_process(self, self._new_state), [], []
        with state.lock:
            for url in self.urls:
                waiting, size = state.memory.execute(self.HELD, [url]).fetchone()
                # how full its outbox would be with this event
                fill = max(
                    (waiting + 1) / self.MAX_WAITING,
                    (size + len(body)) / self.MAX_WAITING_BYTES,
                )
                dropped = state.dropping.get(url, 0)
                if fill > 1:
                    state.dropping[url] = dropped + 1
                    if not dropped:
                        said.append(
                            (
                                f"webhook events are dropped for {receiver_origin(url)}"
                                ": the outbox in memory holds the most it keeps for one"
                                f" receiver ({self.MAX_WAITING} events,"
                                f" {self.MAX_WAITING_BYTES} bytes)",
                                "warning",
                            )
                        )
                    continue
                kept.append(url)
                if dropped and fill <= 0.5:
                    del state.dropping[url]
                    said.append(
                        (
                            f"webhook events are kept again for {receiver_origin(url)}:"
                            f" {dropped} lost",
                            "info",
                        )
                    )
            self._write(lambda sql, **row: state.memory.execute(sql, row), body, kept)
        for line in said:
            log_line(*line)

    def close(self):
        """Stop sending, in this process, and free the events of the attempts under
        way: a SQL outbox keeps them, and a sender takes them at once. The outbox in
        memory, lost with the process, is sent from first, as at the process's end."""
        self._background.stop(finish=True)

    def _unfinished(self):
        """At the end, for CLOSE_SECONDS at most: whether events wait in memory for a
        receiver that is not failing. A SQL outbox keeps its events for the next
        start."""
        state = this_process(self, self._new_state)
        state.ended = state.ended or time.monotonic()
        return (
            not self._store
            and time.monotonic() - state.ended < self.CLOSE_SECONDS
            and any(url not in state.failing for url, *_ in self.backlog())
        )

    def _write(self, run, body, urls):
        for url in urls:
            run(
                self.EVENT,
                url=url,
                webhook_id=f"msg_{secrets.token_urlsafe(18)}",
                body=body,
                now=self._now(),
            )

    def _loop(self):
        state, wait = this_process(self, self._new_state), 0  # the first round at once
        while self._background.go_on_after(wait):
            wait = RETRY_AFTER  # unless the round goes well
            try:
                if state.first_round:
                    self._drop_unconfigured()
                    # started after a step back: the clock goes on from the newest event
                    for (created,) in self._execute(self.NEWEST):
                        self._now(created or 0)
                    state.first_round = False
                self._settle_ended(state)
                self._claim(state)
                self._cut_late_attempts(state)
            except HTTPError as error:  # the database is away, or busy elsewhere
                if not state.stalled:  # said once, until it answers again
                    state.stalled = True
                    log_line(
                        f"webhook delivery waits for the {self._store.name}: "
                        f"{self._store.describe(error.__cause__)}",
                        "warning",
                    )
            except Exception:
                log_line(
                    f"webhook delivery failed, and goes on in {RETRY_AFTER} s:\n"
                    f"{traceback.format_exc()}",
                    "error",
                )
            else:
                wait = self.POLL_SECONDS
                if state.stalled:
                    state.stalled = False
                    log_line("webhook delivery goes on")
        if not self._background.stopping:  # not a fork's pause: the end
            self._closed = True
            self._free(state)

    def _free(self, state):
        """At the end: the attempts that ended are settled, and the events of those
        still under way are free for the next sender."""
        with contextlib.suppress(HTTPError):
            self._settle_ended(state)
            for seq in list(state.in_flight):
                self._execute(self.RELEASE, seq=seq)
        state.in_flight.clear()
        if not self._store:
            state.memory.close()

    def _settle_ended(self, state):
        while state.done:  # each attempt that ended
            seq, status = state.done.pop()
            self._settle(state, *state.in_flight.pop(seq), status)

    def _drop_unconfigured(self):
        """Drop the events of URLs no longer configured, once a process."""
        for url, count, *_ in self.backlog():
            if url not in self.urls:
                self._execute(self.FORGET, url=url)
                log_line(
                    f"{count} waiting webhook events are dropped: their receiver "
                    f"{receiver_origin(url)} is no longer in PLANTSTORE_WEBHOOK_URL",
                    "warning",
                )

    def _claim(self, state):
        """Start an attempt for each URL's due events, up to PER_URL in flight each; on
        probation, one for the URL's first event in CLAIM's order, due or not, every
        PROBE_SECONDS."""
        now = time.monotonic()
        for url in self.urls:
            busy = sum(event[1] == url for event, _ in state.in_flight.values())
            probe = state.probation.get(url)  # when it was last tried; None: not on it
            if probe and (busy or now - probe < self.PROBE_SECONDS):
                continue
            events = self._execute(
                self.CLAIM,
                lease=self.LEASE_SECONDS,
                url=url,
                ahead=math.inf if probe else 0,
                free=1 if probe else self.PER_URL - busy,
                wall=time.time(),
            )
            if probe:  # tried now; with no event, there is none to probe
                state.probation[url] = now
                if not events:
                    del state.probation[url]
            # failing here, idle here, and no event of it failed: another process
            # sent them (with a SQL store)
            if url in state.failing and not (
                busy or events or self._execute(self.FAILED, url=url)
            ):
                self._say_failing(state, url, None)
            for event in events:
                state.in_flight[event[0]] = event, probe
                threading.Thread(
                    target=self._attempt,
                    args=(state, event),
                    daemon=True,  # a stop waits for no receiver
                ).start()

    def _attempt(self, state, event):
        state.done.append((event[0], self._post(state, *event[1:5])))
        self._background.wake()

    def _cut_late_attempts(self, state):
        """Close the connection of each attempt past its TIMEOUT: http.client's timeouts
        bound each read, which a receiver that trickles bytes would never reach."""
        for connection, deadline in list(state.connections.items()):
            if time.monotonic() > deadline:
                with contextlib.suppress(AttributeError, OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)

    def _post(self, state, url, webhook_id, body, now):
        """One attempt: the receiver's status, or None when no answer came."""
        timestamp = str(int(now))
        signed = f"{webhook_id}.{timestamp}.".encode() + body
        signature = base64.b64encode(hmac.digest(self._key, signed, "sha256"))
        parts = urlsplit(url)
        https = parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        # the port given, always: from the host alone, http.client reads [::1] as 1
        port = parts.port or kind.default_port
        connection = kind(parts.hostname, port, timeout=self.TIMEOUT)
        connection.response_class = _FinalResponse
        state.connections[connection] = deadline = time.monotonic() + self.TIMEOUT
        try:
            connection.request(
                "POST",
                (parts.path or "/") + (parts.query and f"?{parts.query}"),
                body,
                {
                    "Content-Type": JSON_TYPE,
                    "webhook-id": webhook_id,
                    "webhook-timestamp": timestamp,
                    "webhook-signature": f"v1,{signature.decode()}",
                },
            )
            status = connection.getresponse().status  # no redirect followed: 3xx fails
            return status if time.monotonic() < deadline else None  # else it was cut
        except Exception:  # refused, cut, garbled: no answer, retried on schedule
            return None
        finally:
            del state.connections[connection]
            connection.close()

    def _settle(self, state, event, probe, status):
        """Act on an attempt's outcome: delivered, gone, or failed, and then retried on
        SCHEDULE unless it was a probe ahead of its event's schedule. `probe`: None, or
        when the receiver was last probed before it."""
        seq, url, webhook_id, _, _, attempts, due = event
        now = time.monotonic()
        if status == 410 and url in self.urls:  # gone: this process sends it no more
            # a new list, not this one changed: a request may be iterating it
            self.urls = [other for other in self.urls if other != url]
            self._execute(self.FORGET, url=url)
            log_line(
                f"the webhook receiver {receiver_origin(url)} answered 410 Gone: "
                "it gets no more events",
                "warning",
            )
            return
        if url not in self.urls or (status and 200 <= status < 300):  # or its URL went
            self._execute(self.DONE, seq=seq)
            state.probation.pop(url, None)
            if probe:  # through after a silence: the others follow now
                self._execute(self.DUE_NOW, url=url)
            return self._say_failing(state, url, None)
        # no answer from the receiver itself: it is probed until one gets through
        if status in (None, 502, 503, 504):
            state.probation.setdefault(url, now)
        else:  # its answer, if no 2xx: it is back, its events go as usual
            state.probation.pop(url, None)
        if probe and not due:  # a probe ahead of the event's schedule
            self._execute(self.RELEASE, seq=seq)
        elif attempts < len(self.SCHEDULE):
            delay = self.SCHEDULE[attempts] * random.uniform(1, 1.2)
            self._execute(self.RETRY, attempts=attempts + 1, delay=delay, seq=seq)
        else:
            self._execute(self.DONE, seq=seq)
            log_line(
                f"webhook {webhook_id} to {receiver_origin(url)} is given up "
                f"after {attempts + 1} attempts",
                "warning",
            )
        self._say_failing(state, url, status or "no answer")

    def _say_failing(self, state, url, failure):
        """Say once when a receiver starts failing (`failure`: its status, or "no
        answer"), and once when it takes events again (None), with how many wait."""
        if url in self.urls and (failure is None) == (url in state.failing):
            state.failing ^= {url}
            waiting = sum(row[1] for row in self.backlog() if row[0] == url)
            said = f"fails ({failure})" if failure else "takes events again"
            origin = receiver_origin(url)
            log_line(
                f"the webhook receiver {origin} {said}; {waiting} events wait",
                "warning" if failure else "info",
            )


def check_webhook_url(url):
    """Return url as it is sent, its path and query in ASCII (/r%C3%A9ception), if it
    can be delivered to: http(s), a host in ASCII, a port that parses, no user-info."""
    try:
        # scheme, host and port as a browser's origin: no user-info
        receiver_origin(url)
        good = not re.search(r"[\x00-\x20\x7f]", url)
    except ValueError:
        good = False
    if not good:  # the URL is not repeated: its query may hold a secret
        raise ValueError(
            "each URL in PLANTSTORE_WEBHOOK_URL must be http:// or https://, with a "
            "host in ASCII (xn-- for others), a port from 1 to 65535 if any, and no "
            "user:password@ (never sent)"
        )
    # UTF-8 %-escapes, ASCII as it is
    return quote(url, safe="".join(map(chr, range(33, 127))))


class _FinalResponse(http.client.HTTPResponse):
    """The answer past any interim 1xx (103 Early Hints); http.client skips only 100."""

    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if status >= 200:
                return version, status, reason
            # the interim answer's headers: nothing to keep
            http.client.parse_headers(self.fp)


def event_json(plant_id, name, tag):
    """The webhook's body: the NewPlant as created, id first."""
    return b'{"id": %d, ' % plant_id + plant_json(name, tag)[1:]


def webhook_secret_key(secret):
    """Check a Standard Webhooks secret: whsec_, base64 of 24+ bytes; never quote it."""
    if not secret:
        raise ValueError(
            "PLANTSTORE_WEBHOOK_SECRET is required when PLANTSTORE_WEBHOOK_URL is "
            "set: receivers check every webhook's signature"
        )
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        key = b""
    if not secret.startswith("whsec_") or len(key) < 24:
        raise ValueError(
            "PLANTSTORE_WEBHOOK_SECRET must be whsec_ followed by base64 of at "
            "least 24 random bytes: make one with "
            'python -c "import base64, secrets; '
            "print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\""
        )
    return key
