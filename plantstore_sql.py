"""The SQL store, written once for two engines: SQLite (plantstore_sqlite.py) and
PostgreSQL (plantstore_postgres.py) override what differs. A 200 means committed; a
database that is away is a 503 within a bound, said once in the log, and left behind
with no restart once it is back.
"""

import collections
import concurrent.futures
import contextlib
import select
import threading
import time

from plantstore import HTTPError, Store
from plantstore_background import this_process
from plantstore_log import log_line

RETRY_AFTER = 2  # seconds a 503 asks the client to wait before trying again
DB_WAIT_SECONDS = 5  # the longest a request waits on its database; past it, a 503
# the longest GET /health waits: within a load balancer's own timeout
HEALTH_WAIT_SECONDS = 2
CONNECT_SECONDS = 3  # the longest a SQL store waits to connect, within DB_WAIT_SECONDS
DB_FORMS = (  # what PLANTSTORE_DB takes, as its refusals say
    "a postgresql:// URL, a libpq string (host=... dbname=...), "
    "or an SQLite file's path (or sqlite:///path)"
)


def unavailable(what):
    """The 503 of a database that is away: the client may try again shortly."""
    return HTTPError(
        503, f"{what} is unavailable", headers=[("Retry-After", str(RETRY_AFTER))]
    )


def readable(fd, seconds):
    """Whether fd has something to read, or its end, within `seconds`: by poll(2), as
    select(2) refuses a descriptor past 1023, which a process holding many reaches."""
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    return bool(waiting.poll(seconds * 1000))


class SQLStore(Store):
    """Plants in a SQL database that every worker shares: a 200 means committed.

    One class over two DB-API drivers (peewee's way): the SQL is written once, with
    named parameters, and each engine's differences (connecting, its DDL, its
    placeholders, the errors that mean "the database is away") are the few lines of its
    subclass. Each process holds at most POOL_SIZE connections, whatever the number of
    its threads or clients; a connection is made when none is free and dropped on its
    first error. While the database cannot be reached, requests answer 503 with
    Retry-After, and once it is back they succeed again, with no restart. The outage is
    logged once, and so is its end.

    The creates that wait at one moment in a process share one transaction and one flush
    to disk (group commit), where each create alone would pay its own: one of them
    writes them, up to BATCH creates and BATCH_BYTES a commit. No timer gathers them: a
    create that comes alone is written at once, by its own request's thread.
    """

    INSERT = (
        "INSERT INTO plants (id, name, tag) VALUES (:id, :name, :tag)"
        " ON CONFLICT (id) DO NOTHING RETURNING seq"
    )
    PAGE = (
        "SELECT seq, name, tag FROM plants WHERE seq > :after ORDER BY seq LIMIT :limit"
    )
    DELETE = "DELETE FROM plants WHERE id = :id RETURNING seq"
    BEGIN = "BEGIN"
    # connections a process holds at most; a request waits for one, within its bound
    POOL_SIZE = 8
    # the most creates, and bytes of names and tags, in one commit
    BATCH, BATCH_BYTES = 64, 2**20
    ONE_STATEMENT = False  # whether insert() writes a batch in one statement
    # whether a background thread using it stops before a fork (see Background work)
    STOPS_FOR_FORK = True
    schema = ()  # the statements that make the tables, in the engine's own DDL
    UPGRADE = INDEXES = ()  # what 1.3.0's tables lack, and the indexes made after it
    # the outbox's counts, kept by the engine's triggers: a receiver's are the sum of
    # its rows, one a slot (SQLite's, one; PostgreSQL's, as many as a transaction can
    # take apart from another, which would wait for its commit on a shared row); and
    # the change a row of events makes to them
    COUNTS_TABLE = (
        "CREATE TABLE IF NOT EXISTS plant_event_counts (url TEXT, waiting BIGINT NOT"
        " NULL, failing BIGINT NOT NULL, bytes BIGINT NOT NULL, slot INTEGER NOT NULL,"
        " PRIMARY KEY (url, slot))"
    )
    ADD = (
        "ON CONFLICT (url, slot) DO UPDATE SET"
        " waiting = plant_event_counts.waiting + excluded.waiting,"
        " failing = plant_event_counts.failing + excluded.failing,"
        " bytes = plant_event_counts.bytes + excluded.bytes"
    )
    # the statement that counts each receiver's events where the outbox has no counts
    # (WebhookSender.RECEIVERS)
    counting = None
    outages = ()  # the driver's exceptions that mean "the database is away"

    def __init__(self, name):
        self.name = name  # the database as messages name it: never with a password
        # write_event(run, plant_id, name, tag), if set: in the plant's transaction
        self.write_event = None
        self._ready = False  # whether the tables are made: not if it was away at start
        self._outage_of = None  # "reads" or "writes": those that found it away, said

    def _state(self):
        """This process's pool, queue and locks (plantstore_background.py's rule)."""
        return this_process(self, self._new_state)

    def _new_state(self):
        return _ProcessState(self.POOL_SIZE)

    def _writer_lock(self, _deadline):
        """What a writer holds while it writes: an engine that queues writers says."""
        return contextlib.nullcontext()

    def open_at_start(self):
        """Make the tables now: a database plantstore cannot use stops the start. No
        connection is kept: a server may fork next, and a fork must not carry one."""
        db = self.connect(time.monotonic() + DB_WAIT_SECONDS)
        try:
            # db.execute: an engine's execute may start a thread, and a server's master,
            # which forks after this, must have none
            self.setup(db.execute)
            self._ready = True
        finally:
            self._close(db)

    def add(self, plant_id, name, tag):
        """Store a plant; return True, or False if its id is taken: never overwrite.

        The creates waiting at one moment share a commit: the first that finds no batch
        being written writes the oldest queued then, up to BATCH creates and BATCH_BYTES
        of names and tags, and writes the next while its own is in none; the others wait
        for their batch's answer, or for their turn. A 200 means committed, within
        DB_WAIT_SECONDS; a 503, that the create is in no batch, or in one that failed.
        """
        state, create = self._state(), _PendingCreate(plant_id, name, tag)
        with state.turn:
            state.queue.append(create)
        while True:
            with state.turn:
                batch = self._turn(state, create)
            if batch is None:  # this create is in a batch, written or being written
                return create.result()  # a failed batch raises its 503 here
            try:
                self._write_batch(batch)
            finally:
                with state.turn:
                    state.batching = False
                    # its creates are answered; another may write
                    state.turn.notify_all()

    def _turn(self, state, create):
        """With state.turn held: wait while another thread writes a batch, then take the
        next batch to write, or None once this create is in one. A create still queued
        at its deadline, or while a write found the database away (see _Breaker), is a
        503 at once: it will never be written."""
        while state.batching and not create.done():  # another thread writes a batch
            known_away = state.writes.opened is not None
            if known_away or not state.turn.wait(create.deadline - time.monotonic()):
                if create.cancel():  # still queued, so taken out: never written
                    raise unavailable("the database")
                return None  # in the batch being written: its answer will come
        if create.done() or create.running():  # answered, or in a batch being written
            return None
        state.batching = True  # this thread writes the next batch
        return self._next_batch(state.queue)

    def _next_batch(self, queue):
        """The creates queued now, oldest first, within the bounds, still waited for."""
        batch, size = [], 0
        while (
            queue
            and len(batch) < self.BATCH
            and (not batch or size + queue[0].size <= self.BATCH_BYTES)
        ):
            size += queue[0].size
            batch.append(queue.popleft())
        return [create for create in batch if create.set_running_or_notify_cancel()]

    def _write_batch(self, batch):
        """Write a batch, its plants and events, in one commit; answer each create."""
        if not batch:  # every create of it was given up
            return

        def insert(run):
            created = self.insert(run, [create.row for create in batch])
            for create, new in zip(batch, created, strict=True):
                if new and self.write_event:
                    self.write_event(run, *create.plant)
            return created

        # A transaction makes several statements one: the inserts of several plants
        # (unless the engine writes a batch in one statement, atomic itself), or a
        # plant's insert and its events'.
        several = len(batch) > 1 and not self.ONE_STATEMENT
        wait = min(create.deadline for create in batch) - time.monotonic()
        try:
            created = self.on_connection(
                insert,
                write=True,
                wait=wait,
                transaction=bool(self.write_event) or several,
            )
        except Exception as error:  # nothing of the batch is acknowledged
            for create in batch:
                create.set_exception(error)
        else:
            for create, new in zip(batch, created, strict=True):
                create.set_result(new)

    def insert(self, run, plants):
        """Insert (id, name, tag) rows in order: whether each is new (first id wins)."""
        return [
            bool(run(self.INSERT, id=plant_id, name=name, tag=tag))
            for plant_id, name, tag in plants
        ]

    def ping(self):
        """The health check's question, within HEALTH_WAIT_SECONDS: on a connection of
        the pool, so that a flood of checks holds no more than it."""
        self.on_connection(lambda run: run("SELECT 1"), wait=HEALTH_WAIT_SECONDS)

    def page(self, after, limit):
        rows = self.one_statement(self.PAGE, after=after or 0, limit=limit)
        return [
            (seq, _text(name), None if tag is None else _text(tag))
            for seq, name, tag in rows
        ]

    def delete(self, plant_id):
        return bool(self.one_statement(self.DELETE, id=plant_id))

    def one_statement(self, sql, **parameters):
        """Run one statement and return its rows; a write unless it is a SELECT."""
        return self.on_connection(
            lambda run: run(sql, **parameters), write=not sql.startswith("SELECT")
        )

    def on_connection(
        self,
        work,
        *,
        write=False,
        transaction=False,
        wait=DB_WAIT_SECONDS,
        background=False,
    ):
        """Return work(run) on a connection of this process, in one transaction if
        asked, where run(sql, **parameters) runs one statement and returns its rows.
        All of it, connecting included, ends within `wait` seconds, or answers 503.

        A request's call passes this process's breaker for reads, or for writes
        (_Breaker), and an outage it finds is logged once. A background thread's
        (background=True) does neither: it must not turn requests away, and it says
        what it waits for itself."""
        if background:
            return self._bounded(work, write, transaction, wait)
        kind = "writes" if write else "reads"
        with getattr(self._state(), kind).guard():
            try:
                result = self._bounded(work, write, transaction, wait)
            except HTTPError as error:
                cause = error.__cause__  # None: every connection was busy, no outage
                if cause is not None and self._outage_of is None:
                    self._outage_of = kind
                    log_line(
                        f"the {self.name} is unavailable: {self.describe(cause)}",
                        "warning",
                    )
                raise
        if self._outage_of == kind:  # reads that work end no outage of writes
            self._outage_of = None
            log_line(f"the {self.name} is reachable again")
        return result

    def _bounded(self, work, write, transaction, wait):
        deadline = time.monotonic() + wait
        try:
            turn = self._writer_lock(deadline) if write else contextlib.nullcontext()
            with turn, self._connection(deadline) as db:
                return self._work(db, work, transaction, deadline)
        except self.outages as error:
            # cut at its bound, whatever cut it: the log says so instead
            cut = time.monotonic() >= deadline
            cause = TimeoutError(f"no answer in {wait} s") if cut else error
            raise unavailable("the database") from cause

    @contextlib.contextmanager
    def _connection(self, deadline):
        """A connection of this process's pool; an error drops it, and a fork never uses
        its parent's connections."""
        state = self._state()
        if not state.slots.acquire(timeout=max(0, deadline - time.monotonic())):
            raise unavailable("the database")  # every connection busy past the deadline
        try:
            with state.lock:
                db = state.idle.pop() if state.idle else None
            if db is None or not self.usable(db):
                if db is not None:
                    self._close(db)
                db = self.connect(deadline)
            try:
                if not self._ready:  # the database was away at start: make the tables
                    self.setup(lambda sql: self.execute(db, sql, {}, deadline))
                    self._ready = True
                yield db
            except BaseException:
                self._close(db)  # a connection is dropped on its first error
                raise
            else:
                with state.lock:
                    state.idle.append(db)
        finally:
            state.slots.release()

    def _work(self, db, work, transaction, deadline):
        def run(sql, **parameters):
            rows = self.execute(db, sql, parameters, deadline)
            # read whole, so that the statement is over before the next one
            return rows.fetchall() if rows.description else []

        if transaction:  # one that fails is rolled back: its connection is dropped
            run(self.BEGIN)
        result = work(run)
        if transaction:
            run("COMMIT")
        self.check(db)
        return result

    def execute(self, db, sql, parameters, _deadline):
        """Run one statement, to be cut at the deadline where the engine can."""
        return db.execute(sql, parameters)

    def setup(self, run_sql):
        """Make the tables unless they exist, upgrade those of 1.3.0, and refuse a
        'plants' table plantstore did not make. run_sql(sql) runs one statement and
        returns its cursor."""
        for statement in self.schema:
            run_sql(statement)
        events = run_sql("SELECT * FROM plant_events LIMIT 0").description
        if "created" not in [column[0] for column in events]:
            self.upgrade(run_sql)
        for statement in self.INDEXES:  # on columns an upgrade may have added
            run_sql(statement)
        rows = run_sql("SELECT * FROM plants LIMIT 0")
        if [column[0] for column in rows.description] != ["seq", "id", "name", "tag"]:
            raise ValueError(
                f"the {self.name} has a 'plants' table that plantstore did not make"
            )

    def upgrade(self, run_sql):
        """Give 1.3.0's outbox its column `created`."""
        for statement in self.UPGRADE:
            run_sql(statement)

    def usable(self, _db):
        """Whether a connection that served before may serve again."""
        return True

    def check(self, db):
        """Raise one of self.outages if what was just done cannot be trusted."""

    def _close(self, db):
        with contextlib.suppress(Exception):
            db.close()

    def describe(self, error):
        return str(error).splitlines()[0] if str(error) else type(error).__name__

    def close(self):
        """Close what this process holds idle, its connections; a later use opens them
        anew."""
        state, self._process = self._state(), (None, None)
        for db in state.idle:  # at the end: no request takes one meanwhile
            self._close(db)
        return state


class _PendingCreate(concurrent.futures.Future):
    """A create waiting for its batch: the plant, its row as stored, the row's size in
    bytes, when its request stops waiting; its result is whether it was created."""

    def __init__(self, plant_id, name, tag):
        super().__init__()
        self.plant = plant_id, name, tag
        self.row = plant_id, _utf8(name), None if tag is None else _utf8(tag)
        self.size = len(self.row[1]) + len(self.row[2] or b"")
        self.deadline = time.monotonic() + DB_WAIT_SECONDS


class _Breaker:
    """A circuit breaker for the requests of one process, for reads or for writes (a
    table locked elsewhere stops writes only). Once a wait found the database away
    (silent, or locked past the bound; a refusal comes at once anyway), the others do
    not wait for it too: for RETRY_AFTER seconds no request tries it, then one at a
    time does, while the others answer 503 at once, until one finds it back."""

    def __init__(self):
        self.opened = None  # when a wait last found the database away; None: closed
        self.trier = threading.Lock()  # held by the one request that tries it then

    @contextlib.contextmanager
    def guard(self):
        """Run the block; or, while the database is known away, raise a 503 at once,
        but in the one request that tries it again, RETRY_AFTER seconds on."""
        opened = self.opened
        if opened is not None and (
            time.monotonic() < opened + RETRY_AFTER
            or not self.trier.acquire(blocking=False)
        ):
            raise unavailable("the database")
        started = time.monotonic()
        try:
            yield
            self.opened = None
        except HTTPError:
            if time.monotonic() - started > 1:  # a wait, not a refusal at once
                self.opened = time.monotonic()
            raise
        finally:
            if opened is not None:
                self.trier.release()


class _ProcessState:
    """What a SQL store holds in one process: its connections, creates and locks."""

    def __init__(self, pool_size):
        self.lock = threading.Lock()  # guards idle
        self.slots = threading.Semaphore(pool_size)  # connections left to make
        self.idle = []  # connections free
        self.turn = threading.Condition()  # guards queue and batching
        self.queue, self.batching = collections.deque(), False  # creates; one written
        self.reads, self.writes = _Breaker(), _Breaker()  # the requests'


def _utf8(text):
    # any JSON string, a lone surrogate too
    return text.encode("utf-8", "surrogatepass")


def _text(data):
    return bytes(data).decode("utf-8", "surrogatepass")
