"""Reading the settings that are more than a list: a setting from its variable or from
the file NAME_FILE names (read_setting_file: bounded, whatever the file is), the tokens,
and the store PLANTSTORE_DB names, told apart by its form. plantstore_app.py reads the
others, and checks all of them before anything opens.
"""

import contextlib
import os
import re
import time

from plantstore import MAKE_A_TOKEN
from plantstore_sql import DB_FORMS, readable
from plantstore_sqlite import SQLiteStore

SETTING_FILE_BYTES = 65536  # the largest file a _FILE setting reads: a secret, a URL
SETTING_FILE_SECONDS = 5  # the longest a _FILE setting's file or pipe may take to read
# What makes PLANTSTORE_DB none of its forms, each with what its refusal says (it never
# quotes the value), looked for before its form is read
DB_MISTAKES = (
    (
        "^\ufeff",
        "starts with a byte-order mark: save the file that sets it without one",
    ),
    # docker --env-file and systemd keep them
    ("^['\"]", "starts with a quote: remove the quotes around it"),
    (r"[\x00-\x1f\x7f]", "holds a control character"),
    (r"^[A-Za-z][\w+.-]*//", "looks like a URL without the ':' after its scheme"),
)


def setting(environ, name):
    """A setting's value from its variable, or from the file that NAME_FILE names
    (systemd's LoadCredential=, a mounted secret), without one line end; or None."""
    path = environ.get(f"{name}_FILE")
    if path is None:
        return environ.get(name)
    if name in environ:
        raise ValueError(f"{name}_FILE ({path}) and {name} are both set: set one")
    try:
        data = read_setting_file(path)
        if data.startswith(b"SQLite format 3\0"):  # the database, not its address
            problem = f"is an SQLite database: set {name} to its path instead"
        elif len(data) > SETTING_FILE_BYTES:
            problem = f"is over {SETTING_FILE_BYTES // 1024} KiB, more than any setting"
        else:
            problem = "is empty" if not data.strip() else None
            # utf-8-sig: the byte-order mark Notepad writes first is no part of it
            value = re.sub(r"\r?\n\Z", "", data.decode("utf-8-sig"))
    except TimeoutError:
        problem = f"gave nothing to read within {SETTING_FILE_SECONDS} s"
    except OSError as error:
        problem = f"cannot be read: {error.strerror}"
    except UnicodeDecodeError:
        problem = "is not UTF-8 text"
    if problem:
        raise ValueError(f"{name}_FILE: {path} {problem}")
    return value


def read_setting_file(path):
    """A _FILE setting's first SETTING_FILE_BYTES + 1 bytes, all read within
    SETTING_FILE_SECONDS: a pipe (bash's <(pass show ...)) as its writer writes it, and
    a FIFO that no one writes never holds up the start."""
    deadline = time.monotonic() + SETTING_FILE_SECONDS
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO's open waits for no writer
    try:
        data = b""
        while len(data) <= SETTING_FILE_BYTES:
            if not readable(fd, max(0, deadline - time.monotonic())):
                raise TimeoutError
            chunk = os.read(fd, SETTING_FILE_BYTES + 1 - len(data))
            if not chunk:  # its end
                break
            data += chunk
        return data
    finally:
        os.close(fd)


def tokens_from_environ(environ=os.environ):
    """The tokens of PLANTSTORE_TOKENS, one a line or comma-separated, or None when it
    is unset; set, it must hold one."""
    value = setting(environ, "PLANTSTORE_TOKENS")
    if value is None:
        return None
    tokens = [token.strip() for token in re.split("[,\n]", value) if token.strip()]
    if not tokens:
        raise ValueError(
            f"PLANTSTORE_TOKENS is set but holds no token: set it to the bearer "
            f"tokens to accept, comma-separated (make one with {MAKE_A_TOKEN}), "
            "or unset it"
        )
    return tokens


def store_from_environ(environ=os.environ):
    """The store PLANTSTORE_DB names, told apart by its form, never by a guess: a
    PostgreSQL URL, a libpq string, an SQLite file's path; or None (in memory). The
    value is never quoted."""
    value = (setting(environ, "PLANTSTORE_DB") or "").strip()
    for mistake, said in DB_MISTAKES:
        if re.search(mistake, value):
            raise ValueError(f"PLANTSTORE_DB {said}; it takes {DB_FORMS}")
    if re.match("(?i)postgres(ql)?://", value) or re.match(r"\w+\s*=", value):
        try:  # the module beside this file, with psycopg: the postgres extra
            from plantstore_postgres import PostgresStore
        except ImportError as error:  # one of the two is missing, or psycopg's libpq
            raise ValueError(
                "PLANTSTORE_DB names a PostgreSQL database, which needs "
                f"{error.name or 'psycopg'}: pip install 'psycopg[binary]' (or "
                "'.[postgres]' in plantstore's folder)"
            ) from None
        return PostgresStore(value)
    # SQLAlchemy's sqlite:///relative/path, but not :memory: nor ?mode=
    if path := re.fullmatch("(?i)sqlite:///([^:?][^?]*)", value):
        value = path[1]
    elif re.match(r"[A-Za-z][\w+.-]*:|:", value):  # mysql://, file:, :memory:: no
        raise ValueError(
            f"PLANTSTORE_DB takes {DB_FORMS}; unset it to keep the plants in memory"
        )
    return SQLiteStore(value) if value else None


@contextlib.contextmanager
def naming_setting(environ, name):
    """A refusal of setting `name`'s value names the setting as it was given: NAME, or
    NAME_FILE and the file's path, which holds the value."""
    try:
        yield
    except ValueError as error:
        said, path = str(error), environ.get(f"{name}_FILE")
        if said.startswith(f"{name}_FILE"):  # about the file itself: named already
            raise
        given = name if path is None else f"{name}_FILE ({path})"
        said = said[len(name) :] if re.match(rf"{name}\b", said) else f": {said}"
        raise ValueError(given + said) from None
