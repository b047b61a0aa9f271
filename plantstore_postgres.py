"""PostgreSQL for plantstore: the SQL store's overrides for psycopg 3.

The one module of plantstore with a dependency, psycopg, imported only when
PLANTSTORE_DB names PostgreSQL: `pip install '.[postgres]'` in its folder installs both.
The SQL itself is SQLStore's, written once in plantstore_sql.py; here are PostgreSQL's
differences: connecting through libpq with bounds on every wait, its DDL, a batch in one
statement, and a watchdog that cuts a statement at its request's deadline.
"""

import collections
import concurrent.futures
import contextlib
import functools
import os
import re
import socket
import threading
import time
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from plantstore_background import Background
from plantstore_log import log_line
from plantstore_sql import (
    CONNECT_SECONDS,
    DB_FORMS,
    DB_WAIT_SECONDS,
    SQLStore,
    readable,
)

__all__ = ["PostgresStore", "postgres_settings"]


class PostgresStore(SQLStore):
    """Plants in PostgreSQL, through psycopg 3: every instance on every machine shares
    them.

    No request waits on the database past DB_WAIT_SECONDS: libpq's TCP user timeout and
    keepalives notice a silent host, and a watchdog shuts the connection of a statement
    still running at its request's deadline (a commit held by a synchronous standby that
    is gone, say). That request answers 503, even if PostgreSQL went on to commit it:
    retried, the create answers 200 or 409.
    """

    OUTBOX = (
        "CREATE TABLE IF NOT EXISTS plant_events"
        " (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " url TEXT NOT NULL, webhook_id TEXT NOT NULL, body BYTEA NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, next_at DOUBLE PRECISION NOT NULL,"
        " lease DOUBLE PRECISION NOT NULL DEFAULT 0, created DOUBLE PRECISION)"
    )
    # Workers on several machines start together: CREATE TABLE IF NOT EXISTS alone races
    # in PostgreSQL, so they make the tables one at a time, under a lock. It also asks
    # for CREATE on the schema even when the table exists: a role given the tables must
    # not try to make them.
    schema = (
        "BEGIN",
        "SELECT pg_advisory_xact_lock(7274)",
        "DO $$ BEGIN IF to_regclass('plant_events_due') IS NULL THEN"
        " CREATE TABLE IF NOT EXISTS plants (seq BIGINT GENERATED ALWAYS AS IDENTITY"
        " PRIMARY KEY, id BIGINT NOT NULL UNIQUE, name BYTEA NOT NULL, tag BYTEA);"
        f" {OUTBOX}; CREATE INDEX plant_events_due ON plant_events (next_at);"
        " END IF; END $$",
        "COMMIT",
    )
    # 1.3.0's outbox had no `created`: its events' age counts from the upgrade. Only the
    # table's owner may add a column; workers that add it together wait in turn.
    ADD_CREATED = (
        "ALTER TABLE plant_events ADD COLUMN IF NOT EXISTS created DOUBLE PRECISION",
        "UPDATE plant_events SET created = extract(epoch FROM now())"
        " WHERE created IS NULL",
    )
    UPGRADE = ("BEGIN", "SELECT pg_advisory_xact_lock(7274)", *ADD_CREATED, "COMMIT")
    # What 1.5.0's outbox lacks, which only the tables' owner may add: an index for
    # each receiver's claim, one for its oldest event, built while writes go on (one
    # that a build cut short left unusable, none building it, is made again); and each
    # receiver's events counted, as they come and go, by triggers that run as the
    # owner (so that a role granted 1.5.0's tables writes on), a statement's changes
    # added up in one row a receiver (a 410's thousands of deletes are one change), in
    # the transaction's slot of 64: creates of two processes seldom take turns on one,
    # and rows of one slot are locked in one order (no deadlock).
    COUNT = (
        "INSERT INTO plant_event_counts SELECT url, sum(n), sum(failed), sum(size),"
        " txid_current() % 64 FROM ({}) AS event (url, n, failed, size) GROUP BY url"
        f" HAVING sum(n) <> 0 OR sum(failed) <> 0 ORDER BY url {SQLStore.ADD}"
    )
    CAME = "SELECT url, 1, sign(attempts), length(body) FROM came"
    WENT = "SELECT url, -1, -sign(attempts), -length(body) FROM went"
    FOR_EACH = "FOR EACH STATEMENT EXECUTE FUNCTION plant_event_count()"
    COUNTS = (
        "DO $$ DECLARE invalid regclass; BEGIN FOR invalid IN SELECT indexrelid"
        " FROM pg_index WHERE NOT indisvalid AND indexrelid IN"
        " (to_regclass('plant_events_claims'), to_regclass('plant_events_age'))"
        " AND NOT EXISTS (SELECT FROM pg_stat_progress_create_index"
        " WHERE relid = indrelid) LOOP EXECUTE format('DROP INDEX %s', invalid);"
        " END LOOP; END $$",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS plant_events_claims"
        " ON plant_events (url, next_at, seq)",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS plant_events_age"
        " ON plant_events (url, created)",
        "BEGIN",
        # one start at a time; a table lock, not an advisory one, whose wait would
        # leave to_regclass() saying no counts after another start made them
        "LOCK TABLE plant_events IN SHARE ROW EXCLUSIVE MODE",
        "DO $do$ BEGIN IF to_regclass('plant_event_counts') IS NULL THEN"
        f" {SQLStore.COUNTS_TABLE}; CREATE OR REPLACE FUNCTION plant_event_count()"
        " RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM"
        " CURRENT AS $$ BEGIN IF TG_OP = 'TRUNCATE' THEN"
        " DELETE FROM plant_event_counts;"
        f" ELSIF TG_OP = 'INSERT' THEN {COUNT.format(CAME)};"
        f" ELSIF TG_OP = 'DELETE' THEN {COUNT.format(WENT)};"
        f" ELSE {COUNT.format(f'{CAME} UNION ALL {WENT}')}; END IF; RETURN NULL;"
        " END $$; CREATE OR REPLACE TRIGGER plant_event_came AFTER INSERT ON"
        f" plant_events REFERENCING NEW TABLE AS came {FOR_EACH}; CREATE OR REPLACE"
        " TRIGGER plant_event_moved AFTER UPDATE ON plant_events REFERENCING OLD TABLE"
        f" AS went NEW TABLE AS came {FOR_EACH}; CREATE OR REPLACE TRIGGER"
        " plant_event_went AFTER DELETE ON plant_events REFERENCING OLD TABLE AS went"
        f" {FOR_EACH}; CREATE OR REPLACE TRIGGER plant_event_truncated AFTER TRUNCATE"
        f" ON plant_events {FOR_EACH};"
        # what waits already, counted once: writes wait for it (the triggers' lock)
        " INSERT INTO plant_event_counts SELECT url, count(*), count(*) FILTER (WHERE"
        " attempts > 0), sum(length(body)), 0 FROM plant_events GROUP BY url; END IF;"
        " END $do$",
        "COMMIT",
    )
    # whether the outbox has its counts, and this role may read them; and the role
    COUNTED = (
        "SELECT has_table_privilege(to_regclass('plant_event_counts'), 'SELECT'),"
        " quote_ident(current_user)"
    )
    # each receiver's events counted one by one, as 1.5.0 did, where there are no counts
    EACH_EVENT = (
        "SELECT url, count(*), count(*) FILTER (WHERE attempts > 0),"
        " :now - min(created) FROM plant_events GROUP BY url"
    )
    # the outbox's clock, :now and :wall (WebhookSender.CLAIM): PostgreSQL's, which
    # hosts share
    CLOCK = "CAST(extract(epoch FROM statement_timestamp()) AS DOUBLE PRECISION)"
    # libpq's settings unless the URL gives its own: a host that goes silent fails in
    # seconds. connect_timeout is each host's: libpq's least, 2 s, so that a URL's
    # second host is tried within CONNECT_SECONDS.
    BOUNDS = {
        "connect_timeout": 2,
        "keepalives": 1,
        "keepalives_idle": 2,
        "keepalives_interval": 1,
        "keepalives_count": 2,
        "tcp_user_timeout": DB_WAIT_SECONDS * 1000,
    }
    # away, or taking no writes (a standby, a demoted primary: SQLSTATE 25006)
    outages = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        psycopg.errors.ReadOnlySqlTransaction,
    )

    def __init__(self, conninfo):
        self.parameters, name = postgres_settings(conninfo)
        self._watchdog = Background(
            "plantstore-watchdog", self._watch, stops_for_fork=False
        )
        super().__init__(name)
        try:
            self.open_at_start()
        except psycopg.errors.InsufficientPrivilege as error:  # SQLSTATE 42501
            raise ValueError(
                f"PLANTSTORE_DB: {name}: {error.diag.message_primary}: the "
                "role needs CREATE on the schema to make plantstore's tables or, "
                "once their owner made them, SELECT, INSERT, UPDATE and DELETE on "
                "them"
            ) from None
        except psycopg.Error as error:
            if refusal := self.refusal(error):
                raise ValueError(f"PLANTSTORE_DB: {name}: {refusal}") from None
            if not isinstance(error, self.outages):
                raise
            # else the database is away at start: waited for, as any outage is

    # A connection refused for good, which no wait would mend, as the server says it
    # (libpq gives no SQLSTATE for it): in English, PostgreSQL's lc_messages by default.
    # A role without LOGIN, or without CONNECT on the database, is refused as one that
    # does not exist: only an administrator mends either.
    REFUSED = re.compile(
        r"FATAL: +((password authentication failed"
        r"|role .* (does not exist|is not permitted to log in)"
        r"|database .* does not exist|permission denied for database"
        r"|no pg_hba\.conf entry|pg_hba\.conf rejects).*)"
    )

    def refusal(self, error):
        """What stops the start, said without the value of any setting: a value libpq
        refuses, or a connection refused for good (a password, a role, a database,
        pg_hba.conf)."""
        # libpq checks its options' values before it connects
        option = (
            re.search(r'option "(\w+)"', str(error))  # libpq's for a number
            or re.search(r"invalid (\w+) value|bad value for (\w+)", str(error))
        )
        if option:  # named, never quoted: the value may be a password's neighbour
            return f"libpq refuses the value of its option {option[1] or option[2]}"
        refused = self.REFUSED.search(str(error))
        return refused and f"PostgreSQL refuses the connection: {refused[1]}"

    # What plantstore's own tables hold (pgloader or psql may make others): seq and id
    # are unique and never NULL, and so a name is never NULL.
    COLUMNS = (
        "SELECT attname, attnotnull, EXISTS (SELECT FROM pg_index WHERE indisunique AND"
        " indrelid = attrelid AND indnkeyatts = 1 AND indkey[0] = attnum)"
        " FROM pg_attribute"
        " WHERE attrelid = 'plants'::regclass AND attname IN ('seq', 'id', 'name')"
    )
    # A table filled with its seq values (a move with pgloader, a restore by hand)
    # leaves its identity behind them, and each create would collide: moved past them,
    # never back.
    MOVE = (
        "SELECT setval(q.name, greatest(max, last_value)), max"
        " FROM (SELECT max(seq) FROM {0})"
        " t, (SELECT pg_get_serial_sequence('{0}', 'seq') AS name) q, pg_sequences"
        " WHERE format('%I.%I', schemaname, sequencename) = q.name"
        " AND max > coalesce(last_value, 0)"
    )

    ONE_STATEMENT = True
    # its background threads wait on sockets alone, which a fork's child never touches
    STOPS_FOR_FORK = False
    # A batch in one statement, one round trip: rows take their seq in the order they
    # came.
    INSERT_MANY = (
        "INSERT INTO plants (id, name, tag) SELECT id, name, tag FROM unnest("
        "CAST(:ids AS BIGINT[]), CAST(:names AS BYTEA[]), CAST(:tags AS BYTEA[]))"
        " WITH ORDINALITY AS batch (id, name, tag, n) ORDER BY n"
        " ON CONFLICT (id) DO NOTHING RETURNING id"
    )

    def insert(self, run, plants):
        if len(plants) == 1:
            return super().insert(run, plants)
        ids, names, tags = map(list, zip(*plants, strict=True))
        created = collections.Counter(
            row[0] for row in run(self.INSERT_MANY, ids=ids, names=names, tags=tags)
        )
        # each id is new once, for the first of the batch that has it
        return [created.pop(plant_id, 0) > 0 for plant_id in ids]

    def setup(self, run_sql):
        super().setup(run_sql)
        for name, not_null, unique in run_sql(self.COLUMNS).fetchall():
            if not not_null or name != "name" and not unique:
                raise ValueError(
                    f"the {self.name} has a 'plants' table that plantstore did not "
                    f"make: its {name} column may hold "
                    + ("NULL" if not not_null else "duplicates")
                )
        for table in "plants", "plant_events":
            # only the table's owner may move its identity; another role leaves it
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                for _, largest in run_sql(self.MOVE.format(table)).fetchall():
                    log_line(
                        f"the identity of {table} was behind its largest seq, "
                        f"{largest}: moved past it"
                    )
        counted, role = run_sql(self.COUNTED).fetchone()
        try:
            for statement in () if counted else self.COUNTS:
                run_sql(statement)
        except psycopg.errors.InsufficientPrivilege:  # a role the owner granted them
            run_sql("ROLLBACK")
            self.counting = self.EACH_EVENT
            log_line(
                f"the webhook outbox of the {self.name} lacks its counts and indexes,"
                " which only the tables' owner may add: until then a scrape of"
                " /metrics counts every waiting event, and a receiver's claim may read"
                " the events of others; as the owner, run once in psql:"
                f" {'; '.join(self.COUNTS)}; GRANT SELECT ON plant_event_counts TO"
                f" {role}; then restart plantstore",
                "warning",
            )

    def upgrade(self, run_sql):
        try:
            super().upgrade(run_sql)
        except psycopg.errors.InsufficientPrivilege:  # a role the owner granted them
            raise ValueError(
                f"PLANTSTORE_DB: {self.name}: this version needs the column `created`"
                " in plant_events, which only the tables' owner may add: as the owner,"
                f" run once: {'; '.join(self.ADD_CREATED)}"
            ) from None

    def connect(self, deadline):
        """A new connection within CONNECT_SECONDS and the deadline, made by a thread of
        its own: libpq bounds each host of a URL apart, and a host name's lookup not at
        all. One given up on is closed once made; at most POOL_SIZE are made at once."""
        until = min(deadline, time.monotonic() + CONNECT_SECONDS)
        making, made = self._state().making, concurrent.futures.Future()
        if not making.acquire(timeout=until - time.monotonic()):
            raise psycopg.OperationalError("no connection in time")

        def make():
            try:
                made.set_result(
                    psycopg.connect(
                        **{**self.BOUNDS, **self.parameters}, autocommit=True
                    )
                )
            except Exception as error:
                made.set_exception(error)
            finally:
                making.release()  # the place taken above, once the connect is over

        maker = threading.Thread(target=make, name="plantstore-connect", daemon=True)
        maker.start()
        try:
            db = made.result(until - time.monotonic())
        except TimeoutError:
            made.add_done_callback(lambda _: made.exception() or made.result().close())
            raise psycopg.OperationalError("no connection in time") from None
        maker.join()  # made: a thread outlives no connect but one given up
        return db

    def _new_state(self):
        state = super()._new_state()
        state.making = threading.Semaphore(self.POOL_SIZE)  # connections being made
        state.busy = {}  # connections running a statement, to its deadline (state.lock)
        return state

    def execute(self, db, sql, parameters, deadline):
        """Run one statement; the watchdog cuts it at the deadline."""
        state = self._state()
        with state.lock:  # the watchdog sees each statement, with its deadline
            state.busy[db] = deadline
            self._watchdog.start()
        try:
            # psycopg reads no placeholder then: '::' and '%' stay as they are
            if not parameters:
                return db.execute(sql)
            return db.execute(_pyformat(sql), parameters)
        finally:
            with state.lock:
                del state.busy[db]

    def _watch(self):
        """Shut the connection of each statement past its deadline: a 503 answers."""
        while self._watchdog.go_on_after(0.25):
            state = self._state()
            # held, so that no statement ends, and its socket closes, meanwhile
            with state.lock:
                for db, deadline in state.busy.items():
                    if deadline < time.monotonic():
                        with (
                            contextlib.suppress(OSError),
                            socket.socket(fileno=os.dup(db.fileno())) as connection,
                        ):
                            connection.shutdown(socket.SHUT_RDWR)

    def close(self):
        self._watchdog.stop()
        return super().close()

    def usable(self, db):
        # An idle connection has nothing to read: if it has, the server said goodbye.
        return not readable(db.fileno(), 0)


def postgres_settings(conninfo):
    """libpq's parameters from a PostgreSQL URL or libpq string, and the database as
    messages name it: a URL made anew from those parameters, without the password."""
    check_url(conninfo)
    try:
        parameters = conninfo_to_dict(  # the scheme in lower case: libpq's only one
            re.sub("^postgres(ql)?://", "postgresql://", conninfo, flags=re.IGNORECASE)
        )
    except Exception:  # libpq's message quotes the setting, password and all: not shown
        raise ValueError(
            f"PLANTSTORE_DB cannot be read: look for a %-escape that is not two hex "
            "digits, an option libpq does not know, or a word without =value; it "
            f"takes {DB_FORMS}"
        ) from None
    hosts = parameters.get("host", parameters.get("hostaddr", "")).split(",")
    ports = parameters.get("port", "").split(",")
    if len(ports) == 1:  # one port for all the hosts
        ports *= len(hosts)
    if len(ports) != len(hosts) or not all(
        re.fullmatch("[0-9]{1,5}", port) and 0 < int(port) < 65536
        for port in ports
        if port
    ):
        raise ValueError(
            "PLANTSTORE_DB: each port must be a number from 1 to 65535, "
            "one for every host or one for all"
        )
    where = ",".join(
        (f"[{host}]" if ":" in host else quote(host, safe="")) + (port and f":{port}")
        for host, port in zip(hosts, ports, strict=True)
    )
    user = parameters.get("user", "") and f"{parameters['user']}@"
    return (
        parameters,
        f"PostgreSQL postgresql://{user}{where}/{parameters.get('dbname', '')}",
    )


def check_url(conninfo):
    """Refuse a URL libpq would read otherwise than its writer meant: libpq's user-info
    ends at the first @ before a /, and it would read a part of the password as the
    host, and show it."""
    if re.match("(?i)postgres(ql)?://", conninfo):
        authority, _, path = conninfo.partition("://")[2].partition("/")
        user_info = authority.rpartition("@")[0]
        database = path.partition("?")[0]
        if (
            authority.count("@") > 1
            or "?" in user_info
            or "@" in database
            or "#" in conninfo
        ):
            raise ValueError(
                "PLANTSTORE_DB is not a well-formed PostgreSQL URL: in the user name "
                "and password, write @ as %40, / as %2F, ? as %3F and # as %23; "
                f"it takes {DB_FORMS}"
            )


@functools.cache
def _pyformat(sql):
    """The SQL in psycopg's placeholders: :name becomes %(name)s, and :now and :wall
    PostgreSQL's clock."""
    return re.sub(
        r":(\w+)",
        lambda name: (
            PostgresStore.CLOCK if name[1] in ("now", "wall") else f"%({name[1]})s"
        ),
        sql,
    )
