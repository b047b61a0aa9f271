"""Plants in an SQLite file on this machine, shared by every process that opens it:
SQLStore's SQL, with SQLite's DDL, its connections and the writers' turn across
processes.
"""

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from urllib.parse import quote

from plantstore_log import log_line
from plantstore_sql import SQLStore, readable


class SQLiteStore(SQLStore):
    """Plants in an SQLite file on this machine, shared by the workers that open it."""

    # the webhooks' outbox; also the table of the sender's outbox in memory
    OUTBOX = (
        "CREATE TABLE IF NOT EXISTS plant_events"
        " (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " url TEXT NOT NULL, webhook_id TEXT NOT NULL, body BLOB NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,"
        " lease REAL NOT NULL DEFAULT 0, created REAL)"
    )
    schema = (
        "PRAGMA journal_mode=WAL",  # readers and a writer at once; kept in the file
        "CREATE TABLE IF NOT EXISTS plants (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " id INTEGER NOT NULL UNIQUE, name BLOB NOT NULL, tag BLOB)",
        OUTBOX,
    )
    # the events a sender claims, read in its order (WebhookSender.CLAIM)
    CLAIMS = (
        "CREATE INDEX IF NOT EXISTS plant_events_claims ON plant_events (url, next_at)"
    )
    # Each receiver's events waiting, those of them failing, and their bytes, counted
    # by triggers as events come, go, fail, or move to another URL (an operator's
    # UPDATE), so that neither a scrape nor a create counts them (WebhookSender.
    # RECEIVERS); the oldest's birth is read from an index. The outbox in memory has
    # them too; a file of 1.5.0 gets them at its first start, its events counted then.
    CAME = (
        "INSERT INTO plant_event_counts VALUES (NEW.url, 1, NEW.attempts > 0,"
        f" length(NEW.body), 0) {SQLStore.ADD};"
    )
    WENT = (
        "INSERT INTO plant_event_counts VALUES (OLD.url, -1, -(OLD.attempts > 0),"
        f" -length(OLD.body), 0) {SQLStore.ADD};"
    )
    COUNTS = (
        "BEGIN IMMEDIATE",
        SQLStore.COUNTS_TABLE,
        # what waits already, counted once: as the triggers that count the rest come
        "INSERT INTO plant_event_counts SELECT url, count(*), total(attempts > 0),"
        " total(length(body)), 0 FROM (SELECT 1 WHERE NOT EXISTS (SELECT * FROM"
        " sqlite_master WHERE name = 'plant_event_came')) CROSS JOIN plant_events"
        " GROUP BY url",
        "CREATE TRIGGER IF NOT EXISTS plant_event_came AFTER INSERT ON plant_events"
        f" BEGIN {CAME} END",
        "CREATE TRIGGER IF NOT EXISTS plant_event_went AFTER DELETE ON plant_events"
        f" BEGIN {WENT} END",
        "CREATE TRIGGER IF NOT EXISTS plant_event_moved"
        f" AFTER UPDATE OF attempts, url ON plant_events BEGIN {WENT} {CAME} END",
        "CREATE INDEX IF NOT EXISTS plant_events_age ON plant_events (url, created)",
        # 1.5.0's, now only a cost to each create: its claim's, and its count's
        "DROP INDEX IF EXISTS plant_events_due",
        "DROP INDEX IF EXISTS plant_events_receivers",
        "COMMIT",
    )
    INDEXES = (CLAIMS, *COUNTS)
    BEGIN = "BEGIN IMMEDIATE"  # the write lock at once: no deadlock upgrading a read
    outages = (sqlite3.DatabaseError, OSError)  # read-only, disk I/O, the file gone
    # 1.3.0's outbox had no `created`: its events' age counts from the upgrade
    UPGRADE = (
        "BEGIN IMMEDIATE",
        "ALTER TABLE plant_events ADD COLUMN created REAL",
        "UPDATE plant_events SET created = (julianday('now') - 2440587.5) * 86400",
        "COMMIT",
    )

    def __init__(self, path):
        self.path = os.path.abspath(path)
        super().__init__(f"SQLite file {self.path}")
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise ValueError(
                f"{folder}: no such directory, so {self.path} cannot be created"
            )
        # SQLite writes its journal beside the file
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(
                f"{folder}: this user cannot write in this directory, "
                f"which {self.path} needs"
            )
        try:  # made for its owner alone (and so are -wal and -shm, which take its mode)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            # workers starting together make it in turn, waiting a minute at most: no
            # request waits, and the upgrade of a 1.3.0 file takes seconds at millions
            with self._writer_lock(time.monotonic() + 60):
                self.open_at_start()
        except sqlite3.OperationalError as error:  # locked, no room: no bad setting
            log_line(
                f"the {self.name} is unavailable: {self.describe(error)}", "warning"
            )
        except (sqlite3.Error, OSError) as error:
            raise ValueError(
                f"{self.path} cannot be opened as a plantstore database: "
                f"{self.describe(error)}"
            ) from None

    def _new_state(self):
        state = super()._new_state()
        state.writers = (
            None  # the lock a writer holds, with other processes: made at need
        )
        return state

    def _writer_lock(self, deadline):
        state = self._state()
        state.writers = state.writers or _WriterLock(self.path + "-writers")
        return state.writers.held(deadline)

    def close(self):
        """SQLStore's, and the writers' lock file."""
        state = super().close()
        if state.writers:
            state.writers.close()

    def execute(self, db, sql, parameters, deadline):
        db.deadline = deadline  # the statement's wait for a lock ends there (_SQLite)
        return db.execute(sql, parameters)

    def connect(self, deadline):
        """A connection to the file, which must exist: a deleted file is not remade."""
        db = sqlite3.connect(
            f"file:{quote(self.path)}?mode=rw",
            uri=True,
            factory=_SQLite,
            timeout=0,  # SQLite never sleeps: _SQLite waits, a step at a time
            check_same_thread=False,
            # autocommit, but for BEGIN ... COMMIT
            isolation_level=None,
        )
        db.deadline = deadline  # for the statements that make the tables at start
        # each commit reaches the disk before the 200
        db.execute("PRAGMA synchronous=FULL")
        db.identity = self._identity()
        return db

    def _identity(self):
        with contextlib.suppress(OSError):
            found = os.stat(self.path)
            return found.st_dev, found.st_ino
        return None

    def check(self, db):
        # a file deleted or replaced while in use: no one will read what is written
        if self._identity() != db.identity:
            raise sqlite3.OperationalError(
                f"{self.path} was deleted or replaced while in use"
            )


class _SQLite(sqlite3.Connection):
    """A connection that waits for a lock held by another program (a migration's BEGIN
    IMMEDIATE) in steps of WAKE_SECONDS at most, to its statement's deadline: SQLite's
    own wait, its busy handler's sleep, nothing could cut short. A statement that finds
    the file locked outside a transaction has done nothing, and is tried again."""

    identity = None  # its file's (device, inode) when opened: SQLiteStore.check
    deadline = 0.0  # when its statement stops waiting for a lock (time.monotonic())

    def execute(self, sql, parameters=()):
        nap = 0.0005
        while True:
            try:
                return super().execute(sql, parameters)
            except sqlite3.OperationalError as error:
                busy = error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or self.in_transaction or time.monotonic() > self.deadline:
                    raise
            time.sleep(nap)
            nap = min(2 * nap, _WriterLock.WAKE_SECONDS)


class _WriterLock:
    """Writers of every process take turns here, each woken as soon as the one before
    it is done.

    SQLite's own busy handler sleeps and polls (up to 100 ms a nap), so under load a
    writer could wait far longer than the others. A lock per process, then an flock(2)
    on a file beside the database, queue them instead. flock(2) either waits without
    end or not at all, and a writer's wait must end at its request's bound: so it asks
    without waiting, and while a writer of another process holds the lock, it sleeps
    on a FIFO beside it (the bell), which the holder rings as it lets go, and asks
    again, then or after WAKE_SECONDS at most (a holder that died rings nothing). One
    that napped instead would leave the lock idle while the holder's process took it
    again at once: one process's creates waited 100 ms and more.
    """

    WAKE_SECONDS = 0.005  # the longest a waiter sleeps before it asks again

    def __init__(self, path):
        self._thread_lock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path + "-bell", 0o600)
        # both ends at once: the open waits for no other, and a ring finds a reader
        self._bell = os.open(path + "-bell", os.O_RDWR | os.O_NONBLOCK)

    @contextlib.contextmanager
    def held(self, deadline):
        """Hold the writers' turn: this process's lock, then the file's, by the
        deadline; past it, an outage (SQLStore.outages), as a lock SQLite waited for."""
        late = sqlite3.OperationalError("the writers' turn did not come in time")
        if not self._thread_lock.acquire(timeout=max(0, deadline - time.monotonic())):
            raise late
        try:
            while not self._flock(fcntl.LOCK_EX | fcntl.LOCK_NB):  # another's, for now
                if (left := deadline - time.monotonic()) <= 0:
                    raise late
                # asleep until the holder rings, or WAKE_SECONDS (it may have died)
                readable(self._bell, min(left, self.WAKE_SECONDS))
                with contextlib.suppress(BlockingIOError):  # the rings so far: one try
                    os.read(self._bell, 65536)
            try:
                yield
            finally:
                self._flock(fcntl.LOCK_UN)
                with contextlib.suppress(BlockingIOError):  # full: rung already
                    os.write(self._bell, b"\0")
        finally:
            self._thread_lock.release()

    def close(self):
        os.close(self._fd)
        os.close(self._bell)

    def _flock(self, operation):
        try:
            fcntl.flock(self._fd, operation)
        except BlockingIOError:  # held by a writer of another process
            return False
        return True
