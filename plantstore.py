"""The Plant Store API in one file, on the Python standard library alone: a WSGI
application (PEP 3333) that keeps plants for the clients that hold a bearer token, and
answers every error in JSON.

It runs in three ways:

    python plantstore.py [--host H] [--port P]       # the embedded server, to try it
    gunicorn -w 1 --threads 8 plantstore:app         # production, behind nginx: deploy/
    make_app(tokens, store=..., max_body_bytes=...)  # inside another WSGI stack

Settings come from the environment (`python plantstore.py --help` lists them):
PLANTSTORE_TOKENS holds the accepted tokens (unset, `python plantstore.py` makes up one
and prints it, and `gunicorn plantstore:app` refuses to start); PLANTSTORE_DB keeps the
plants in an SQLite file or in PostgreSQL. Importing the module reads, prints and
starts nothing.

The one thing people get wrong: the in-memory store lives in the memory of one process.
Several gunicorn workers would each hold a store of their own, so run one worker with
threads, or set PLANTSTORE_DB and run several.
"""

# The file, top to bottom. The core, down to the banner "Optional parts", is a whole
# service: cut the file there and it runs (Application(tokens) is the WSGI app). It
# names nothing below it; each optional part uses the core and what its line names.
#
#   The core
#     Errors                HTTPError, raised anywhere, answered by Application
#     Reading a request     the token, the body, strict JSON, a NewPlant, a page's query
#     The store             Store, the interface; MemoryStore, a dict under a lock
#     Writing an answer     the Plant and Error shapes, a listing streamed page by page
#     The application       operation() declares a route; Application, its handlers
#   Optional parts
#     Accelerators          PlantStore and the usual body's fast read, for make_app
#     Operator lines        the logger "plantstore", which every part below writes to
#     Background work       plantstore's threads, by one rule
#     The SQL stores        SQLiteStore here, PostgreSQL beside; uses background work
#     Origins               browser_origin(): an origin as a browser writes it
#     Webhooks              WebhookSender and its outbox; uses the SQL stores, origins
#     Metrics and probes    GET /metrics and GET /livez; uses webhooks
#     CORS                  with_cors(), a WSGI wrapper; uses origins
#     The OpenAPI document  GET /openapi.json, each operation by its operationId
#     The embedded server   make_server(): wsgiref, threaded, with timeouts
#     The assembly          make_app(), the settings, `app`, main(); uses all of them

import base64
import json
import random
import re
import threading
import traceback
from decimal import Decimal
from hmac import compare_digest
from http import HTTPStatus
from itertools import islice
from urllib.parse import parse_qs, quote

__version__ = "1.5.0"
__all__ = ["Application", "HTTPError", "MemoryStore", "Store", "operation"]

MAX_BODY_BYTES = 65536  # the default limit of a request body; a larger one answers 413
MIN_TOKEN_LENGTH = 16  # characters; a shorter token can be guessed
MAKE_A_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
PAGE_MAX = 1000  # plants in a page; a listing without `limit` streams such pages
JSON_TYPE = "application/json"
JSON_HEADERS = (("Content-Type", JSON_TYPE),)  # those of an answer in JSON
INT64_MIN, INT64_MAX, INT32_MAX = -(2**63), 2**63 - 1, 2**31 - 1
# a client's X-Request-ID, kept if it is safe to echo and to log; else one is made
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Each final status's line, made once (HTTPStatus(status) per answer cost 5-10% of
# creates/s): HTTPStatus's reason phrase, or for a status it lacks, such as 499, the
# name of the status's class (RFC 9110, 15)
_CLASSES = {2: "Success", 3: "Redirection", 4: "Client Error", 5: "Server Error"}
_PHRASES = {status.value: status.phrase for status in HTTPStatus}
_STATUS_LINES = {
    status: f"{status} {_PHRASES.get(status) or _CLASSES[status // 100]}"
    for status in range(200, 600)
}


# ---- Errors: raised anywhere, answered by Application.error_answer ----


class HTTPError(Exception):
    """An error answer: a status, a message for the Error body, extra headers."""

    def __init__(self, status, message, *, headers=()):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, list(headers)


# ---- Reading a request, in the order the checks run ----


def check_bearer(environ, tokens):
    """Raise 401 unless Authorization is "Bearer <token>" with a known token."""
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    token = token.strip()
    if not token or scheme.lower() != "bearer":
        raise HTTPError(
            401,
            "a bearer token is required: send 'Authorization: Bearer <token>'",
            headers=[("WWW-Authenticate", 'Bearer realm="plantstore"')],
        )
    matched = False
    if token.isascii():  # compare_digest takes ASCII only; no other token could match
        for good in tokens:  # each one, in constant time: the time taken tells nothing
            matched |= compare_digest(token, good)
    if not matched:
        raise HTTPError(
            401,
            "the bearer token is not valid",
            headers=[
                ("WWW-Authenticate", 'Bearer realm="plantstore", error="invalid_token"')
            ],
        )


def read_body(environ, limit):
    """Return the body, refusing a wrong media type or a body over the limit unread."""
    media_type = environ.get("CONTENT_TYPE", "")
    # as clients send it, or once its parameters and case are set aside; whole:
    # text/plain;application/json is not JSON
    if media_type != JSON_TYPE and (
        media_type.partition(";")[0].strip().lower() != JSON_TYPE
    ):
        raise HTTPError(
            415, "send Content-Type: application/json", headers=[("Accept", JSON_TYPE)]
        )
    length = environ.get("CONTENT_LENGTH") or None
    if length is not None:
        if not (length.isdigit() and length.isascii()):  # int() takes "+7", "7_0"
            raise HTTPError(400, "Content-Length must be a non-negative integer")
        digits = length.lstrip("0") or "0"  # leading zeros are allowed (RFC 9110)
        length = int(digits[:19])  # 19 digits are past any limit: int() reads no more
        if length > limit:  # decided before a byte of the body is read
            raise HTTPError(413, f"request body is larger than {limit} bytes")
    elif not environ.get("wsgi.input_terminated"):  # no length, no end: read nothing
        if environ.get("HTTP_TRANSFER_ENCODING"):  # chunked, undecoded by the server
            raise HTTPError(411, "send a Content-Length; a chunked body cannot be read")
        return b""
    try:
        # no length: one byte past the limit tells a body that is over it
        body = environ["wsgi.input"].read(limit + 1 if length is None else length)
    except TimeoutError:  # the client stalled past the server's timeout
        raise HTTPError(408, "the request body did not arrive in time") from None
    except Exception:  # the stream failed on the client's bytes: a bad chunk, a hang-up
        raise HTTPError(400, "the request body could not be read") from None
    if length is None and len(body) > limit:
        raise HTTPError(413, f"request body is larger than {limit} bytes")
    if length is not None and len(body) < length:
        raise HTTPError(400, "request body is shorter than its Content-Length")
    return body


def read_new_plant(body):
    """Return (id, name, tag) from the body: UTF-8, then strict JSON, then NewPlant."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, "request body is not valid UTF-8") from None
    return parse_new_plant(decode_json(text))


def _json_object(pairs):
    """Build a JSON object, refusing duplicate keys, which RFC 8259 leaves undefined."""
    if len(obj := dict(pairs)) != len(pairs):
        raise HTTPError(400, "request body has a duplicate key in an object")
    return obj


def _json_number(text):
    """Keep a fraction or an exponent exact: 9223372036854775807.0 is an integer."""
    try:
        return Decimal(text)
    except ArithmeticError:  # an exponent beyond even Decimal's range
        raise HTTPError(400, "request body has a number too large to read") from None


def _json_constant(_name):
    """Refuse NaN, Infinity, -Infinity: Python's json takes them, RFC 8259 does not."""
    raise HTTPError(400, "request body is not valid JSON: it has NaN or Infinity")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_json_object,
    parse_float=_json_number,
    parse_constant=_json_constant,
)


def decode_json(text):
    """Parse text as strict RFC 8259 JSON; any failure is a 400."""
    if not text:
        raise HTTPError(400, "request body is empty: send a NewPlant JSON object")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as error:
        raise HTTPError(400, f"request body is not valid JSON: {error}") from None
    except RecursionError:
        raise HTTPError(400, "request body is nested too deeply") from None
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        raise HTTPError(400, "request body has an integer too long to read") from None


def parse_new_plant(document):
    """Return (id, name, tag) from a NewPlant; a 400 names the field and the rule."""
    if type(document) is not dict:
        raise HTTPError(400, "request body must be a JSON object (a NewPlant)")
    for field in "id", "name":
        if field not in document:
            raise HTTPError(400, f"'{field}' is required")
    plant_id, name = as_integer(document["id"], "id"), document["name"]
    if type(name) is not str:
        raise HTTPError(400, "'name' must be a string")
    tag = document.get("tag")
    if "tag" in document and type(tag) is not str:
        raise HTTPError(400, "'tag' must be a string")
    return plant_id, name, tag  # other fields are ignored, and not stored


def as_integer(value, name, low=INT64_MIN, high=INT64_MAX, kind="int64"):
    """Return value as an int from low to high, as JSON Schema has it: 7.0, not true."""
    if type(value) is not int:
        if not (type(value) is Decimal and value == value.to_integral_value()):
            raise HTTPError(400, f"'{name}' must be an integer")
        if low <= value <= high:  # compared first: 1e400 never becomes a huge int
            value = int(value)
    if not low <= value <= high:
        raise HTTPError(400, f"'{name}' must be an integer, {low} to {high} ({kind})")
    return value


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def url_integer(text, name, *limits):
    """Read an integer in the path or query as a JSON number, as in a body: 7 or 7.0."""
    try:
        value = Decimal(text) if _JSON_NUMBER.fullmatch(text) else None
    except ArithmeticError:  # an exponent beyond even Decimal's range
        value = None
    return as_integer(value, name, *limits)


_CURSOR = re.compile(r"[A-Za-z0-9_-]{11}")  # 8 bytes in base64url, unpadded


def query_page(environ):
    """Return `limit` (None, or 0 to INT32_MAX) and `after` (None, or a plant's seq)."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    for name in "limit", "after":
        if len(query.get(name, [])) > 1:
            raise HTTPError(400, f"'{name}' may be given once")
    limit, after = query.get("limit"), query.get("after")
    if limit is not None:
        limit = url_integer(limit[0], "limit", 0, INT32_MAX, "int32")
    if after is not None:
        if not _CURSOR.fullmatch(after[0]):
            raise HTTPError(400, "'after' must be a cursor from a Link header")
        after = int.from_bytes(
            base64.urlsafe_b64decode(after[0] + "="), "big", signed=True
        )
    return limit, after


def page_cursor(seq):
    """The opaque `after` of a next link: the last plant's seq, 8 bytes as base64url."""
    cursor = base64.urlsafe_b64encode(seq.to_bytes(8, "big", signed=True))
    return cursor.rstrip(b"=").decode()


# ---- The store: its interface, and the core's, a dict under a lock ----


class Store:
    """What the application asks of a store: subclass it, or give any object add, page
    and delete (or add, list and delete: PagesFromList reads that). `tag` is None for
    no tag. A store whose database is away raises HTTPError(503, ...). One may also
    have ping(), the health check's cheap question, which raises the same."""

    def add(self, plant_id, name, tag):
        """Store a plant; return True, or False if its id is taken: never overwrite."""
        raise NotImplementedError

    def page(self, after, limit):
        """Up to `limit` (seq, name, tag), oldest first, of the plants created after seq
        `after` (None: from the oldest); a seq is an int64, larger for newer plants."""
        raise NotImplementedError

    def delete(self, plant_id):
        """Remove the plant and return True, or return False if there was none."""
        raise NotImplementedError

    def list(self, limit=None):
        """Up to `limit` (None: all) (name, tag) pairs, oldest first."""
        plants = self.page(None, INT64_MAX if limit is None else limit)
        return [(name, tag) for _, name, tag in plants]


class PagesFromList(Store):
    """A store with list(limit) instead of page(): each page reads the whole list, and
    its seqs are positions, so a plant deleted between two pages shifts the next."""

    def __init__(self, store):
        self.store, self.delete = store, getattr(store, "delete", None)
        self.add = getattr(store, "add", None)

    def page(self, after, limit):
        start = max(after or 0, 0)  # seqs are list positions; any cursor may come
        plants = self.store.list(None)[start : start + limit]
        return [(start + n, name, tag) for n, (name, tag) in enumerate(plants, 1)]


class MemoryStore(Store):
    """The core's store: the plants in a dict, in the order they came, under a lock.

    A page walks past the plants before it, so its cost grows with where it starts:
    under a millisecond at 10,000 plants, tens of milliseconds at a million; past that,
    use a store whose pages cost what they hold (make_app's does)."""

    def __init__(self):
        self._plants = {}  # id: (seq, name, tag), oldest first
        self._next_seq = 0
        self._lock = threading.Lock()

    def add(self, plant_id, name, tag):
        with self._lock:
            if plant_id in self._plants:
                return False
            self._plants[plant_id] = self._next_seq, name, tag
            self._next_seq += 1
            return True

    def page(self, after, limit):
        after = -1 if after is None else after  # seqs start at 0
        with self._lock:
            newer = (plant for plant in self._plants.values() if plant[0] > after)
            return list(islice(newer, limit))

    def delete(self, plant_id):
        with self._lock:
            return self._plants.pop(plant_id, None) is not None


# ---- Writing an answer ----

# json's C routine, ASCII-escaped (a lone surrogate is safe): far faster than dumps()
_json_string = json.encoder.encode_basestring_ascii


def plant_json(name, tag):
    """The Plant shape: name, and tag if it has one; never the id, which Plant lacks."""
    if tag is None:
        return f'{{"name": {_json_string(name)}}}'.encode()
    return f'{{"name": {_json_string(name)}, "tag": {_json_string(tag)}}}'.encode()


def error_json(status, message):
    """The Error shape, with `error` the HTTP status."""
    return f'{{"error": {status}, "message": {_json_string(message)}}}'.encode()


def stream_plants(read_page, plants):
    """Yield one JSON array of `plants`, a first page, and every plant after them: each
    next page is read only once the one before is sent, so a store that fails after the
    200 makes the server cut the answer short: no client takes it for a whole list."""
    yield b"["
    comma = b""
    while plants:
        yield comma + b", ".join([plant_json(name, tag) for _, name, tag in plants])
        comma = b", "
        plants = read_page(plants[-1][0], PAGE_MAX) if len(plants) == PAGE_MAX else None
    yield b"]"


# ---- The application: routes by operationId, and the handlers ----


def operation(method, path, *, token=True):
    """Declare a handler's route. Its name is its operationId in the OpenAPI document,
    and `token` says whether it needs the bearer token."""

    def mark(handler):
        handler.route = method, path, token
        return handler

    return mark


def checked_tokens(tokens):
    """The tokens as a list, once each is one a client can send and no one can guess."""
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings, not one string")
    if not (tokens := list(tokens)):
        raise ValueError("tokens must not be empty: plantstore needs one")
    if not all(
        isinstance(token, str)
        and token.isascii()
        and token.isprintable()
        and " " not in token
        and len(token) >= MIN_TOKEN_LENGTH
        for token in tokens
    ):
        raise ValueError(
            f"each token must be at least {MIN_TOKEN_LENGTH} characters of "
            "printable ASCII without spaces, or it can be guessed or mangled; "
            f"make one with {MAKE_A_TOKEN}"
        )
    return tokens


class Application:
    """The Plant Store API as a WSGI application (PEP 3333), for the given tokens.

    Its operations are the methods declared with operation(); declare() adds another's.
    A handler takes (environ, id_text: the {id} of a path such as /plants/{id} as sent,
    or None) and returns (status, body, headers): the body's bytes, or an iterable of
    bytes (a stream), and headers that name its Content-Type (JSON_HEADERS; none on a
    204). on_create, if set, is called with (plant_id, name, tag) after each create."""

    def __init__(self, tokens, store=None, max_body_bytes=MAX_BODY_BYTES):
        self.tokens = checked_tokens(tokens)
        if type(max_body_bytes) is not int or max_body_bytes < 0:
            raise ValueError("max_body_bytes must be a non-negative integer")
        store = MemoryStore() if store is None else store
        if not hasattr(store, "page") and hasattr(store, "list"):
            store = PagesFromList(store)
        for method in "add", "page", "delete":
            if not callable(getattr(store, method, None)):
                raise TypeError(f"the store has no {method}() method: see Store")
        self.store, self.max_body_bytes, self.on_create = store, max_body_bytes, None
        # an attribute, which a faster reader may replace
        self.read_new_plant = read_new_plant
        self.routes = {}  # path: {method: (handler, whether it needs the token)}
        for name in dir(self):  # in the order of their names
            if hasattr(member := getattr(self, name), "route"):
                self.declare(member)

    def declare(self, handler):
        """Route to a handler declared with operation()."""
        method, path, token = handler.route
        self.routes.setdefault(path, {})[method] = handler, token

    def __call__(self, environ, start_response):
        """Answer a request; only a stream's exception escapes, once its 200 is sent."""
        request_id = environ.get("HTTP_X_REQUEST_ID")
        if not (request_id and _REQUEST_ID.fullmatch(request_id)):
            # random re-seeds in a fork's child: no two workers make the same ids
            request_id = random.getrandbits(64).to_bytes(8).hex()
        try:
            status, body, headers = self.respond(environ)
            status_line = _STATUS_LINES[status]  # 1xx, 600: no final answer, a 500
        except Exception as error:
            status, body, headers = self.error_answer(environ, error, request_id)
            status_line = _STATUS_LINES[status]
        headers = [*headers, ("X-Request-ID", request_id)]
        if status in (204, 304):  # answers that never have a body
            body = []
        elif type(body) is bytes:  # else a stream, of no length known before its end
            headers.append(("Content-Length", str(len(body))))
            body = [body]
        start_response(status_line, headers)
        if environ["REQUEST_METHOD"] == "HEAD":  # GET's headers, and no body
            getattr(body, "close", lambda: None)()  # a stream read its first page only
            return []
        return body

    def error_answer(self, environ, error, request_id):
        """An HTTPError's answer; any other error, or a status that is no final answer
        (1xx, 600), is a 500, logged to wsgi.errors: the request id, the traceback."""
        status = getattr(error, "status", None)
        if isinstance(error, HTTPError) and type(status) is int and 200 <= status < 600:
            headers = [*JSON_HEADERS, *error.headers]
            return status, error_json(status, error.message), headers
        print(f"plantstore: request {request_id} failed:", file=environ["wsgi.errors"])
        traceback.print_exception(error, file=environ["wsgi.errors"])
        return 500, error_json(500, "internal server error"), JSON_HEADERS

    def respond(self, environ):
        """Route, authenticate and run one request; return (status, body, headers)."""
        path, id_text = environ.get("PATH_INFO", ""), None
        methods = self.routes.get(path)
        if methods is None:  # /plants/7: the route /plants/{id}, its id "7"
            parent, _, id_text = path.rpartition("/")
            methods = self.routes.get(f"{parent}/{{id}}") if id_text else None
        if methods is None:
            mounted = environ.get("SCRIPT_NAME", "")
            routes = ", ".join(mounted + route for route in self.routes)
            raise HTTPError(404, f"not found: the routes are {routes}")
        method = environ["REQUEST_METHOD"]
        found = methods.get("GET" if method == "HEAD" else method)
        if found is None:
            allowed = {*methods, "OPTIONS", *(["HEAD"] if "GET" in methods else [])}
            allow = ", ".join(sorted(allowed))
            if method == "OPTIONS":  # no token: a browser's preflight has none
                return 204, b"", [("Allow", allow)]
            raise HTTPError(
                405, f"method not allowed; use {allow}", headers=[("Allow", allow)]
            )
        handler, token = found
        if token:
            check_bearer(environ, self.tokens)
        return handler(environ, id_text)

    @operation("POST", "/plants")
    def addPlant(self, environ, _id_text):
        plant_id, name, tag = self.read_new_plant(
            read_body(environ, self.max_body_bytes)
        )
        if not self.store.add(plant_id, name, tag):
            raise HTTPError(409, "a plant with this 'id' already exists")
        if self.on_create:
            self.on_create(plant_id, name, tag)
        return 200, plant_json(name, tag), JSON_HEADERS

    @operation("GET", "/plants")
    def listPlants(self, environ, _id_text):
        limit, after = query_page(environ)
        read_page, headers = self.store.page, JSON_HEADERS
        if limit is None:  # all, a page at a time: memory does not grow with the store
            return 200, stream_plants(read_page, read_page(after, PAGE_MAX)), headers
        size = min(limit, PAGE_MAX)
        plants = read_page(after, size + 1)  # one extra: is there more?
        if len(plants) > size:
            del plants[size:]
            if plants:  # a page of none would link to itself
                link = f"{quote(environ.get('SCRIPT_NAME', ''))}/plants?limit={limit}"
                cursor = page_cursor(plants[-1][0])
                headers = [*headers, ("Link", f'<{link}&after={cursor}>; rel="next"')]
        body = b", ".join([plant_json(name, tag) for _, name, tag in plants])
        return 200, b"[" + body + b"]", headers

    @operation("DELETE", "/plants/{id}")
    def deletePlant(self, _environ, id_text):
        if not self.store.delete(url_integer(id_text, "id")):
            raise HTTPError(404, "no plant has this 'id'")
        return 204, b"", []

    @operation("GET", "/health", token=False)
    def checkHealth(self, _environ, _id_text):
        """200 if the store answers a cheap question, else its 503, naming nothing."""
        if hasattr(self.store, "ping"):  # a store's own cheap question, if it has one
            self.store.ping()
        else:
            self.store.page(None, 1)
        return 200, b'{"status": "ok"}', JSON_HEADERS


# ==================================================================================
# ---- Optional parts: what make_app and the command line add to the core ----------
# ==================================================================================
# Each section below plugs into the core, which never names it; the list at the top
# says which other sections each one uses.

import argparse
import collections
import concurrent.futures
import contextlib
import difflib

# a webhook attempt's connect imports encodings.idna for its host name: imported
# now, so that a fork during an attempt cannot leave that import's lock held
import encodings.idna  # noqa: F401 (imported for that alone)
import fcntl
import hmac
import http.client
import logging
import math
import os
import secrets
import select
import signal
import socket
import socketserver
import sqlite3
import sys
import time
import types
import weakref
from urllib.parse import urlsplit
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

if sys.version_info < (3, 11):  # one line, not a traceback from code that needs 3.11
    raise SystemExit(
        "plantstore needs Python 3.11 or newer; this is Python "
        + sys.version.split()[0]
    )

# not `app`: it is built from the environment on first use
__all__ += "OPENAPI PlantStore SQLStore SQLiteStore make_app make_server main".split()

# the settings' names
TOKENS_VARIABLE, DB_VARIABLE = "PLANTSTORE_TOKENS", "PLANTSTORE_DB"
WEBHOOK_URL_VARIABLE = "PLANTSTORE_WEBHOOK_URL"
WEBHOOK_SECRET_VARIABLE = "PLANTSTORE_WEBHOOK_SECRET"
CORS_VARIABLE = "PLANTSTORE_CORS_ORIGINS"
# the settings that may be read from a file, NAME_FILE, to keep a secret out of the
# environment: every child process inherits it, and /proc/PID/environ shows it
FILE_SETTINGS = (TOKENS_VARIABLE, WEBHOOK_SECRET_VARIABLE, DB_VARIABLE)
DB_FORMS = (
    "a postgresql:// URL, a libpq string (host=... dbname=...), "
    "or an SQLite file's path (or sqlite:///path)"
)
RETRY_AFTER = 2  # seconds a 503 asks the client to wait before trying again
DB_WAIT_SECONDS = 5  # the longest a request waits on its database; past it, a 503
# the longest GET /health waits: within a load balancer's own timeout
HEALTH_WAIT_SECONDS = 2
CONNECT_SECONDS = 3  # the longest a SQL store waits to connect, within DB_WAIT_SECONDS
SETTING_FILE_BYTES = 65536  # the largest file a _FILE setting reads: a secret, a URL
SETTING_FILE_SECONDS = 5  # the longest a _FILE setting's file or pipe may take to read


# ---- Accelerators: what make_app serves fast, held to the core's answers by tests ----

CHUNK = 1024  # plants in one chunk of PlantStore


class PlantStore(Store):
    """make_app's store: MemoryStore's answers, at a cost that does not grow with it.

    Each plant gets a seq, its slot in creation order and the cursor of its page. Names
    and tags sit in chunks of CHUNK slots; a dict maps each id to its seq. A page starts
    at its seq's chunk and slot: it costs what it holds, however large the store. A full
    chunk becomes a tuple, which the garbage collector ignores; an empty one is dropped.
    """

    def __init__(self):
        self._seq = {}  # id: seq, for the plants that exist
        self._names, self._tags = [[]], [[]]  # chunks: last a list, else tuple or None
        self._first = self._next = 0  # seqs below _first are gone; the next is _next
        self._lock = threading.Lock()

    def add(self, plant_id, name, tag):
        with self._lock:
            if self._seq.setdefault(plant_id, self._next) != self._next:
                return False  # the id is taken, by the seq that setdefault found
            self._names[-1].append(name)
            self._tags[-1].append(tag)
            self._next += 1
            if self._next % CHUNK == 0:  # the last chunk full: sealed, a new one opened
                for chunks in self._names, self._tags:
                    chunks[-1] = tuple(chunks[-1])
                    chunks.append([])
            return True

    def page(self, after, limit):
        with self._lock:
            plants = []
            start = self._first if after is None else max(after + 1, self._first)
            number, first = divmod(start, CHUNK)  # the chunk and slot to start from
            while len(plants) < limit and number < len(self._names):
                names, tags = self._names[number], self._tags[number]
                for slot in range(first, len(names or ())):  # None: a chunk emptied
                    if names[slot] is not None:
                        plants.append((number * CHUNK + slot, names[slot], tags[slot]))
                        if len(plants) == limit:
                            break
                number, first = number + 1, 0
            return plants

    def delete(self, plant_id):
        with self._lock:
            seq = self._seq.pop(plant_id, None)
            if seq is None:
                return False
            number, slot = divmod(seq, CHUNK)
            for chunks in self._names, self._tags:  # made anew: a sealed one, a tuple
                chunk = list(chunks[number])
                chunk[slot] = None
                chunks[number] = chunk if number == len(chunks) - 1 else tuple(chunk)
            if self._names[number].count(None) == CHUNK:  # sealed, with no plant left
                self._names[number] = self._tags[number] = None
            while self._first < self._next and not self._holds(self._first):
                self._first += 1  # so that no page walks over the oldest, deleted
            return True

    def _holds(self, seq):
        names = self._names[seq // CHUNK]
        return names is not None and names[seq % CHUNK] is not None


# The usual body as JSON libraries write it, {"id": 7, "name": "Fern", "tag": "indoor"}
# with or without spaces, with no escape and an id of 18 digits at most, has one
# meaning: a regular expression reads it, never backtracking (possessive ?+ *+, 3.11).
_USUAL_NEWPLANT = re.compile(
    r"""\{"id":\ ?+(-?+(?:0|[1-9][0-9]{0,17}+)),\ ?+  # id: an int64
    "name":\ ?+"([^"\\\x00-\x1f]*+)"  # name: no escapes
    (?:\}|,\ ?+"tag":\ ?+"([^"\\\x00-\x1f]*+)"\})  # the end, or tag
    """,
    re.VERBOSE,
)


def read_usual_new_plant(body):
    """read_new_plant's answer, the usual body read by a regular expression rather than
    the JSON decoder: 15% more creates/s under granian."""
    try:
        usual = _USUAL_NEWPLANT.fullmatch(body.decode("utf-8"))
    except UnicodeDecodeError:  # read_new_plant says so
        usual = None
    if usual is None:
        return read_new_plant(body)
    plant_id, name, tag = usual.groups()
    return int(plant_id), name, tag  # 18 digits at most: always an int64


# ---- Operator lines: the logger "plantstore" ----
#
# A line for the operator (a start, an outage and its end, a receiver that fails) goes
# through logging, to the logger "plantstore", once for each change of state, never for
# each attempt. A host's own configuration (gunicorn's --log-config, an embedding
# program's dictConfig) routes and formats them; with none, they go to stderr as
# "plantstore: ...", each in one write, so that the lines of several processes never
# mix. A line that a request causes names its request id.

log = logging.getLogger("plantstore")
if log.level == logging.NOTSET:  # the start line is INFO; a host may say otherwise
    log.setLevel(logging.INFO)
answering = threading.local()  # the request each thread answers: its request_id


class _Stderr(logging.Handler):
    """Write plantstore's lines to stderr while no other handler takes them."""

    def emit(self, record):
        # the handlers the record meets: this one, and the root's if it goes there
        if log.handlers == [self] and not (log.propagate and logging.root.handlers):
            sys.stderr.write(f"plantstore: {self.format(record)}\n")
            sys.stderr.flush()


log.addHandler(_Stderr())


def _log(message, level="info"):
    """An operator's line, at the level named ("warning", "error")."""
    request_id = getattr(answering, "request_id", None)
    getattr(log, level)(f"{message} (request {request_id})" if request_id else message)


def naming_requests(application):
    """The application, with each line a request causes naming the request's id: the
    client's X-Request-ID if the core keeps it, else one made here and given to the
    core in its place, as nginx makes $request_id. make_app wraps the application so
    when its store or its webhook sender may write such a line."""

    def named(environ, start_response):
        request_id = environ.get("HTTP_X_REQUEST_ID")
        if not (request_id and _REQUEST_ID.fullmatch(request_id)):
            environ["HTTP_X_REQUEST_ID"] = request_id = (
                random.getrandbits(64).to_bytes(8).hex()
            )
        answering.request_id = request_id
        try:
            return application(environ, start_response)
        finally:
            answering.request_id = None

    return named


# ---- Background work: plantstore's threads, by one rule ----
#
# A thread of plantstore's (the webhook sender, PostgreSQL's watchdog) belongs to the
# process that started it, and so does all it uses: a process that finds no state of
# its own makes it anew (this_process), and never touches a thread, lock, socket or
# connection of the process it was forked from.
# - It starts when the app is built, so that it works with no request; in a fork's
#   child, child_delay seconds after the fork or at its first wake(), so that a child
#   that serves nothing and ends soon takes nothing.
# - A fork waits on no database. A thread that uses SQLite, whose open files' state a
#   child would inherit half-changed, stops before the fork and starts again after,
#   each of its waits ending within BACKGROUND_WAIT; one that waits on sockets alone
#   (PostgreSQL's) goes on.
# - It ends with the process it serves: once every thread left is plantstore's own or a
#   daemon (a server has stopped, an embedding program has ended), it frees what it
#   holds, within a second, and the process's exit waits for that.

BACKGROUND_WAIT = 1  # seconds a background thread waits on its database, at most
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP}


def this_process(owner, make):
    """owner's state in this process: what make() gave in it, or, if this process has
    none yet (a fork's child), what make() gives now."""
    pid, state = getattr(owner, "_process", (None, None))
    if pid != os.getpid():
        state = make()
        owner._process = os.getpid(), state
    return state


class Background:
    """A thread that runs loop() by the rule above; loop() goes round while
    go_on_after() says so. prepare() makes the process's state before the thread
    starts, so that a fork's child has its own before it serves a request. wake() ends
    a wait early; start() and stop() come in turn."""

    threads = weakref.WeakSet()  # the threads of every Background, alive or not

    def __init__(
        self, name, loop, prepare=lambda: None, *, stops_for_fork, child_delay=0
    ):
        self.name, self.loop, self.prepare = name, loop, prepare
        self.stops_for_fork, self.child_delay = stops_for_fork, child_delay
        self._thread, self.stopping, self._wake = None, False, threading.Event()
        self._resume = False  # whether it ran when a fork came
        # A fork's hooks cannot be taken back: they hold this object weakly, and do
        # nothing once it is gone.
        me = weakref.ref(self)
        os.register_at_fork(
            before=lambda: me() and me()._before_fork(),
            after_in_parent=lambda: me() and me()._after_fork(False),
            after_in_child=lambda: me() and me()._after_fork(True),
        )

    def running(self):
        return bool(self._thread and self._thread.is_alive())

    def start(self, delay=0):
        """Start the thread, its first round `delay` seconds late (or at a wake())."""
        if not self.running():
            self.prepare()  # before the thread, and before a fork's child serves
            self.stopping, self._wake = False, threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(delay,), name=self.name
            )
            self.threads.add(self._thread)
            # Signals that stop a server go to another thread, the main one: a
            # server's handler that ends the interpreter there (uWSGI's) would else
            # wait for this thread. The mask is the new thread's, and its threads'.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                self._thread.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def stop(self):
        if self.running():
            self.stopping = True
            self._wake.set()
            self._thread.join()

    def wake(self):
        self._wake.set()

    def go_on_after(self, seconds):
        """Wait up to `seconds`, or until wake(); then whether to go on: not after
        stop(), nor once the process ends. The wait looks for that every second, so
        that no end waits longer for it."""
        until = time.monotonic() + seconds
        while self._serving() and time.monotonic() < until:
            if self._wake.wait(min(1, until - time.monotonic())):
                self._wake.clear()
                break
        return self._serving()

    def _serving(self):
        """Not stopped, and the process it serves goes on: some thread is alive that
        is no daemon and not plantstore's."""
        return not self.stopping and any(
            thread.is_alive() and not thread.daemon and thread not in self.threads
            for thread in threading.enumerate()
        )

    def _run(self, delay):
        if self.go_on_after(delay):
            self.loop()

    def _before_fork(self):
        self._resume = self.running()
        if self.stops_for_fork:
            self.stop()

    def _after_fork(self, child):
        if self._resume and (child or self.stops_for_fork):
            self.start(self.child_delay if child else 0)


# ---- The SQL stores: the SQL once, SQLite here, PostgreSQL in plantstore_postgres.py


def unavailable(what):
    """The 503 of a database that is away: the client may try again shortly."""
    return HTTPError(
        503, f"{what} is unavailable", headers=[("Retry-After", str(RETRY_AFTER))]
    )


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
    outages = ()  # the driver's exceptions that mean "the database is away"

    def __init__(self, name):
        self.name = name  # the database as messages name it: never with a password
        # write_event(run, plant_id, name, tag), if set: in the plant's transaction
        self.write_event = None
        self._ready = False  # whether the tables are made: not if it was away at start
        self._outage_of = None  # "reads" or "writes": those that found it away, said

    def _state(self):
        """This process's pool, queue and locks (see "Background work" above)."""
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
            self.setup(db.execute)  # not self.execute: no watchdog in a server's master
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
        state, create = self._state(), _Create(plant_id, name, tag)
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
            created = self.session(
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
        self.session(lambda run: run("SELECT 1"), wait=HEALTH_WAIT_SECONDS)

    def page(self, after, limit):
        rows = self.query(self.PAGE, after=after or 0, limit=limit)
        return [
            (seq, _text(name), None if tag is None else _text(tag))
            for seq, name, tag in rows
        ]

    def delete(self, plant_id):
        return bool(self.query(self.DELETE, id=plant_id))

    def query(self, sql, **parameters):
        """Run one statement and return its rows; a write unless it is a SELECT."""
        return self.session(
            lambda run: run(sql, **parameters), write=not sql.startswith("SELECT")
        )

    def session(
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

        A request's session passes this process's breaker for reads, or for writes
        (_Breaker), and an outage it finds is logged once. A background thread's
        (background=True) does neither: it must not turn requests away, and it says
        what it waits for itself."""
        if background:
            return self._session(work, write, transaction, wait)
        kind = "writes" if write else "reads"
        with getattr(self._state(), kind).guard():
            try:
                result = self._session(work, write, transaction, wait)
            except HTTPError as error:
                cause = error.__cause__  # None: every connection was busy, no outage
                if cause is not None and self._outage_of is None:
                    self._outage_of = kind
                    _log(
                        f"the {self.name} is unavailable: {self.describe(cause)}",
                        "warning",
                    )
                raise
        if self._outage_of == kind:  # reads that work end no outage of writes
            self._outage_of = None
            _log(f"the {self.name} is reachable again")
        return result

    def _session(self, work, write, transaction, wait):
        deadline = time.monotonic() + wait
        try:
            turn = self._writer_lock(deadline) if write else contextlib.nullcontext()
            with turn, self._connection(deadline) as db:
                return self._work(db, work, transaction, deadline)
        except self.outages as error:
            # cut at its bound (a watchdog's shutdown, say): the log says so instead
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
        """Run one statement; PostgresStore's watchdog cuts it at the deadline."""
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
        """Close what this process holds idle: its connections, and SQLite's writers'
        lock file; a later use opens them anew."""
        state, self._process = self._state(), (None, None)
        for db in state.idle:  # at the end: no request takes one meanwhile
            self._close(db)
        if state.writers:
            state.writers.close()


class _Create(concurrent.futures.Future):
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
        self.lock = threading.Lock()  # guards idle and busy
        self.slots = threading.Semaphore(pool_size)  # connections left to make
        self.idle, self.busy = [], {}  # connections: free; running, to their deadline
        self.turn = threading.Condition()  # guards queue and batching
        self.queue, self.batching = collections.deque(), False  # creates; one written
        self.writers = None  # SQLite's: the lock a writer holds, with other processes
        self.reads, self.writes = _Breaker(), _Breaker()  # the requests'


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
    DUE = "CREATE INDEX IF NOT EXISTS plant_events_due ON plant_events (next_at)"
    schema = (
        "PRAGMA journal_mode=WAL",  # readers and a writer at once; kept in the file
        "CREATE TABLE IF NOT EXISTS plants (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " id INTEGER NOT NULL UNIQUE, name BLOB NOT NULL, tag BLOB)",
        OUTBOX,
        DUE,
    )
    # the events a sender claims, read in its order (WebhookSender.CLAIM)
    CLAIMS = (
        "CREATE INDEX IF NOT EXISTS plant_events_claims ON plant_events (url, next_at)"
    )
    INDEXES = (  # what /metrics counts, read from the first alone: fast at a million
        "CREATE INDEX IF NOT EXISTS plant_events_receivers"
        " ON plant_events (url, attempts, created)",
        CLAIMS,
    )
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
            _log(f"the {self.name} is unavailable: {self.describe(error)}", "warning")
        except (sqlite3.Error, OSError) as error:
            raise ValueError(
                f"{self.path} cannot be opened as a plantstore database: "
                f"{self.describe(error)}"
            ) from None

    def _writer_lock(self, deadline):
        state = self._state()
        state.writers = state.writers or _WriterLock(self.path + "-writers")
        return state.writers.held(deadline)

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
                select.select([self._bell], [], [], min(left, self.WAKE_SECONDS))
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


def _utf8(text):
    # any JSON string, a lone surrogate too
    return text.encode("utf-8", "surrogatepass")


def _text(data):
    return bytes(data).decode("utf-8", "surrogatepass")


# ---- Origins, as a browser writes them: CORS's, and a receiver's in a line ----


def browser_origin(origin):
    """The origin as a browser sends it: lower-case, no default port; or ValueError."""
    match = re.fullmatch(
        r"(https?)://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?", origin.lower()
    )
    port = match and match[3] and int(match[3])
    if not match or port is not None and not 0 < port < 65536:
        raise ValueError(
            f"each origin in {CORS_VARIABLE} must be one a browser sends, as "
            "https://example.org or http://localhost:3000: a port from 1 to 65535 "
            "if any, no path, no trailing slash, no *"
        )
    default = port in (None, {"http": 80, "https": 443}[match[1]])
    return f"{match[1]}://{match[2]}" + ("" if default else f":{port}")


def _origin(url):
    """A receiver in a log line or a metric, by its origin as a browser writes it;
    never a path or a query, which may hold a secret."""
    return browser_origin("://".join(urlsplit(url)[:2]))


# ---- Webhooks: each new plant, signed and retried, from threads of its own ----


class WebhookSender:
    """Delivers the sample's new-plant webhook to each receiver, signed as Standard
    Webhooks says.

    Every event waits in an outbox, the plant_events table, until its receiver answers
    2xx. With a SQL store that table is written in the plant's own transaction, so a 200
    means at least one delivery, across crashes and restarts; several workers may
    deliver one event, and receivers deduplicate by webhook-id. With the in-memory store
    the table is in an SQLite database in the memory of the process: best effort, lost
    with the process, and at most MAX_WAITING events and MAX_WAITING_BYTES of bodies;
    there, what waits is counted as events come and go (IN_MEMORY), so that no create
    waits on a count of them.

    It starts when it is made (see "Background work" above). Its thread claims due
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
    MAX_WAITING, MAX_WAITING_BYTES = 10000, 32 * 2**20  # the in-memory outbox's bounds
    # an event taken by a sender killed mid-attempt is free after it
    LEASE_SECONDS = TIMEOUT + 2
    # a fork's child sends this long after the fork, or at its first create: a child
    # that serves nothing and ends sooner has taken nothing
    CHILD_DELAY = 3
    CLOSE_SECONDS = 5  # the longest close() waits for the outbox in memory

    # An event is due from its making on: its next_at is its birth, not 0, so that the
    # claim's order below (next_at, then seq) is nearly an index's order on PostgreSQL
    # too (plant_events_due), where a backlog of ties at 0 would be sorted each claim.
    # (Another host's sender, its clock behind, takes it that much later.)
    EVENT = (
        "INSERT INTO plant_events (url, webhook_id, body, next_at, created)"
        " VALUES (:url, :webhook_id, :body, :created, :created)"
    )
    # A sender leases the events it takes, so that no other sender takes them meanwhile:
    # the URL's events due by :due, those due longest first (the oldest of those due
    # together), read in the order of an index (SQLiteStore.CLAIMS; on PostgreSQL,
    # plant_events_due), however many wait.
    CLAIM = (
        "UPDATE plant_events SET lease = :lease"
        " WHERE lease <= :now AND seq IN (SELECT seq"
        " FROM plant_events WHERE url = :url AND next_at <= :due AND lease <= :now"
        " ORDER BY next_at, seq LIMIT :free)"
        " RETURNING seq, url, webhook_id, body, attempts, next_at"
    )
    RETRY = (
        "UPDATE plant_events SET attempts = :attempts, next_at = :next_at, lease = 0"
        " WHERE seq = :seq"
    )
    RELEASE = "UPDATE plant_events SET lease = 0 WHERE seq = :seq"
    DUE_NOW = (
        "UPDATE plant_events SET next_at = :now WHERE url = :url AND next_at > :now"
    )
    DONE = "DELETE FROM plant_events WHERE seq = :seq"
    FORGET = "DELETE FROM plant_events WHERE url = :url"
    # The outbox in memory: SQLiteStore's table and indexes, and, per receiver, the
    # events waiting, those failing and their bytes, kept by triggers as events come and
    # go, so that neither a create nor /metrics counts them.
    IN_MEMORY = (
        SQLiteStore.OUTBOX,
        SQLiteStore.CLAIMS,
        "CREATE INDEX plant_events_age ON plant_events (url, created)",
        "CREATE TABLE receivers (url TEXT PRIMARY KEY, waiting INTEGER NOT NULL,"
        " failing INTEGER NOT NULL, bytes INTEGER NOT NULL)",
        "CREATE TRIGGER came AFTER INSERT ON plant_events BEGIN"
        " INSERT INTO receivers VALUES (NEW.url, 1, 0, length(NEW.body))"
        " ON CONFLICT (url) DO UPDATE SET waiting = waiting + 1,"
        " bytes = bytes + excluded.bytes; END",
        "CREATE TRIGGER went AFTER DELETE ON plant_events BEGIN"
        " UPDATE receivers SET waiting = waiting - 1,"
        " failing = failing - (OLD.attempts > 0), bytes = bytes - length(OLD.body)"
        " WHERE url = OLD.url; END",
        "CREATE TRIGGER failed AFTER UPDATE OF attempts ON plant_events BEGIN"
        " UPDATE receivers SET failing = failing + (NEW.attempts > 0)"
        " - (OLD.attempts > 0) WHERE url = NEW.url; END",
    )
    TOTAL = "SELECT total(waiting), total(bytes) FROM receivers"
    # by receiver: the events waiting, those whose last attempt failed, the oldest's
    # birth; from the outbox in memory, as its triggers count them
    RECEIVERS = (
        "SELECT url, count(*), count(*) FILTER (WHERE attempts > 0), min(created)"
        " FROM plant_events GROUP BY url"
    )
    RECEIVERS_IN_MEMORY = (
        "SELECT url, waiting, failing, (SELECT min(created) FROM plant_events"
        " WHERE url = receivers.url) FROM receivers WHERE waiting > 0"
    )

    def __init__(self, urls, secret, store):
        self._key = webhook_secret_key(secret)
        self.urls = [check_webhook_url(url) for url in urls]  # a 410 takes its URL out
        # None: the outbox in memory
        self._store = store if isinstance(store, SQLStore) else None
        if self._store:
            store.write_event = lambda run, *plant: self._write(run, event_json(*plant))
        self._closed = False
        self._background = Background(
            "plantstore-webhooks",
            self._loop,
            lambda: this_process(self, self._new_state),
            # SQLite's threads stop, and the outbox in memory is SQLite's too
            stops_for_fork=getattr(self._store, "STOPS_FOR_FORK", True),
            child_delay=self.CHILD_DELAY,
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
        if not self._store:  # used by the sender and by notify(), in turn
            state.memory = sqlite3.connect(
                ":memory:", isolation_level=None, check_same_thread=False
            )
            for statement in self.IN_MEMORY:
                state.memory.execute(statement)
            state.lock, state.dropping = threading.Lock(), False
        return state

    def _execute(self, sql, **parameters):
        """Run one statement on the outbox: this process's in memory, or the store's in
        a transaction of its own, so that a statement cut short leaves nothing done,
        within BACKGROUND_WAIT and outside the requests' breaker."""
        if self._store:
            return self._store.session(
                lambda run: run(sql, **parameters),
                write=True,  # its reads too, a few a process, wait their turn
                transaction=True,
                wait=BACKGROUND_WAIT,
                background=True,
            )
        state = this_process(self, self._new_state)
        with state.lock:
            return state.memory.execute(sql, parameters).fetchall()

    def receivers(self):
        """For each URL with events waiting: how many, how many of them failed their
        last attempt, and when the oldest one's plant was made, within the bound of a
        health check."""
        if self._store:
            return self._store.session(
                lambda run: run(self.RECEIVERS), wait=HEALTH_WAIT_SECONDS
            )
        return self._execute(self.RECEIVERS_IN_MEMORY)

    def notify(self, plant_id, name, tag):
        """After a create: write its events in memory, or wake for those SQL wrote."""
        if not (self._store or self._closed):  # closed: its memory is gone
            self._keep(event_json(plant_id, name, tag))
        self._background.wake()

    def _keep(self, body):
        """Write an event for each URL in memory, within the bounds; the first refused
        since the outbox last had room is said once."""
        state = this_process(self, self._new_state)
        with state.lock:
            waiting, size = state.memory.execute(self.TOTAL).fetchone()
            full = (
                waiting + len(self.urls) > self.MAX_WAITING
                or size + len(body) * len(self.urls) > self.MAX_WAITING_BYTES
            )
            if not full:
                self._write(lambda sql, **row: state.memory.execute(sql, row), body)
            said, state.dropping = state.dropping, full
        if full and not said:
            _log(
                "webhook events are dropped: the outbox in memory holds the most it "
                f"keeps ({self.MAX_WAITING} events, {self.MAX_WAITING_BYTES} bytes)",
                "warning",
            )

    def close(self):
        """Stop sending, in this process, and free the events of the attempts under
        way: a SQL outbox keeps them, and a sender takes them at once. The outbox in
        memory, lost with the process, has CLOSE_SECONDS at most first to deliver what
        waits for a receiver that is not failing."""
        state = this_process(self, self._new_state)
        until = time.monotonic() + self.CLOSE_SECONDS
        while not self._store and time.monotonic() < until:
            if all(url in state.failing for url, *_ in self.receivers()):
                break
            time.sleep(0.05)
        self._closed = True
        self._background.stop()

    def _write(self, run, body):
        for url in self.urls:
            run(
                self.EVENT,
                url=url,
                webhook_id=f"msg_{secrets.token_urlsafe(18)}",
                body=body,
                created=time.time(),
            )

    def _loop(self):
        state, wait = this_process(self, self._new_state), 0  # the first round at once
        while self._background.go_on_after(wait):
            wait = RETRY_AFTER  # unless the round goes well
            try:
                if state.first_round:
                    self._drop_unconfigured()
                    state.first_round = False
                self._settle_ended(state)
                self._claim(state)
                self._cut_late_attempts(state)
            except HTTPError as error:  # the database is away, or busy elsewhere
                if not state.stalled:  # said once, until it answers again
                    state.stalled = True
                    _log(
                        f"webhook delivery waits for the {self._store.name}: "
                        f"{self._store.describe(error.__cause__)}",
                        "warning",
                    )
            except Exception:
                _log(
                    f"webhook delivery failed, and goes on in {RETRY_AFTER} s:\n"
                    f"{traceback.format_exc()}",
                    "error",
                )
            else:
                wait = self.POLL_SECONDS
                if state.stalled:
                    state.stalled = False
                    _log("webhook delivery goes on")
        if self._closed or not self._background.stopping:  # not a fork's pause: the end
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
        for url, count, *_ in self._execute(self.RECEIVERS):
            if url not in self.urls:
                self._execute(self.FORGET, url=url)
                _log(
                    f"{count} waiting webhook events are dropped: their receiver "
                    f"{_origin(url)} is no longer in {WEBHOOK_URL_VARIABLE}",
                    "warning",
                )

    def _claim(self, state):
        """Start an attempt for each URL's due events, up to PER_URL in flight each; on
        probation, one for the URL's first event in CLAIM's order, due or not, every
        PROBE_SECONDS."""
        now = time.time()
        for url in self.urls:
            busy = sum(event[1] == url for event, _ in state.in_flight.values())
            probe = state.probation.get(url)  # when it was last tried; None: not on it
            if probe and (busy or now - probe < self.PROBE_SECONDS):
                continue
            events = self._execute(
                self.CLAIM,
                lease=now + self.LEASE_SECONDS,
                now=now,
                url=url,
                due=math.inf if probe else now,
                free=1 if probe else self.PER_URL - busy,
            )
            if probe:  # tried now; with no event, there is none to probe
                state.probation[url] = now
                if not events:
                    del state.probation[url]
            for event in events:
                state.in_flight[event[0]] = event, probe
                threading.Thread(
                    target=self._attempt,
                    args=(state, event),
                    daemon=True,  # a stop waits for no receiver
                ).start()

    def _attempt(self, state, event):
        state.done.append((event[0], self._post(state, *event[1:4])))
        self._background.wake()

    def _cut_late_attempts(self, state):
        """Close the connection of each attempt past its TIMEOUT: http.client's timeouts
        bound each read, which a receiver that trickles bytes would never reach."""
        for connection, deadline in list(state.connections.items()):
            if time.monotonic() > deadline:
                with contextlib.suppress(AttributeError, OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)

    def _post(self, state, url, webhook_id, body):
        """One attempt: the receiver's status, or None when no answer came."""
        timestamp = str(int(time.time()))
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
        seq, url, webhook_id, _, attempts, due = event
        now = time.time()
        if status == 410 and url in self.urls:  # gone: this process sends it no more
            # a new list, not this one changed: a request may be iterating it
            self.urls = [other for other in self.urls if other != url]
            self._execute(self.FORGET, url=url)
            _log(
                f"the webhook receiver {_origin(url)} answered 410 Gone: "
                "it gets no more events",
                "warning",
            )
            return
        if url not in self.urls or (status and 200 <= status < 300):  # or its URL went
            self._execute(self.DONE, seq=seq)
            state.probation.pop(url, None)
            if probe:  # through after a silence: the others follow now
                self._execute(self.DUE_NOW, now=now, url=url)
            return self._say_failing(state, url, None)
        # no answer from the receiver itself: it is probed until one gets through
        if status in (None, 502, 503, 504):
            state.probation.setdefault(url, now)
        else:  # its answer, if no 2xx: it is back, its events go as usual
            state.probation.pop(url, None)
        if probe and due > now:  # a probe ahead of the event's schedule
            self._execute(self.RELEASE, seq=seq)
        elif attempts < len(self.SCHEDULE):
            delay = self.SCHEDULE[attempts] * random.uniform(1, 1.2)
            self._execute(
                self.RETRY, attempts=attempts + 1, next_at=now + delay, seq=seq
            )
        else:
            self._execute(self.DONE, seq=seq)
            _log(
                f"webhook {webhook_id} to {_origin(url)} is given up "
                f"after {attempts + 1} attempts",
                "warning",
            )
        self._say_failing(state, url, status or "no answer")

    def _say_failing(self, state, url, failure):
        """Say once when a receiver starts failing (`failure`: its status, or "no
        answer"), and once when it takes events again (None), with how many wait."""
        if url in self.urls and (failure is None) == (url in state.failing):
            state.failing ^= {url}
            rows = self._execute(
                self.RECEIVERS if self._store else self.RECEIVERS_IN_MEMORY
            )
            waiting = sum(row[1] for row in rows if row[0] == url)
            said = f"fails ({failure})" if failure else "takes events again"
            _log(
                f"the webhook receiver {_origin(url)} {said}; {waiting} events wait",
                "warning" if failure else "info",
            )


def check_webhook_url(url):
    """Return url as it is sent, its path and query in ASCII (/r%C3%A9ception), if it
    can be delivered to: http(s), a host in ASCII, a port that parses, no user-info."""
    try:
        _origin(url)  # scheme, host and port as a browser's origin: no user-info
        good = not re.search(r"[\x00-\x20\x7f]", url)
    except ValueError:
        good = False
    if not good:  # the URL is not repeated: its query may hold a secret
        raise ValueError(
            f"each URL in {WEBHOOK_URL_VARIABLE} must be http:// or https://, with a "
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
            f"{WEBHOOK_SECRET_VARIABLE} is required when {WEBHOOK_URL_VARIABLE} is "
            "set: receivers check every webhook's signature"
        )
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        key = b""
    if not secret.startswith("whsec_") or len(key) < 24:
        raise ValueError(
            f"{WEBHOOK_SECRET_VARIABLE} must be whsec_ followed by base64 of at "
            "least 24 random bytes: make one with "
            'python -c "import base64, secrets; '
            "print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\""
        )
    return key


# ---- Metrics: what an operator watches, for Prometheus ----

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text format
METRICS = """\
# HELP plantstore_info The version of plantstore that answered this scrape.
# TYPE plantstore_info gauge
plantstore_info{{version="{version}"}} 1
# HELP plantstore_database_up Whether the store answered this scrape's question in time.
# TYPE plantstore_database_up gauge
plantstore_database_up {up}
"""
RECEIVER_METRICS = {  # a series a receiver, from a figure of WebhookSender.receivers()
    "plantstore_webhook_events_waiting": "Webhook events not yet delivered.",
    "plantstore_webhook_events_failing": "Waiting events whose last attempt failed.",
    "plantstore_webhook_oldest_event_age_seconds": "Since the oldest waiting event's "
    "plant was created.",
}


def add_metrics(application, sender):
    """Serve GET /metrics, with a token: figures of the whole service, not of the
    process that answers, which a load balancer picks. The store is asked as /health
    asks it, and the sender for its receivers, from the outbox every process shares
    (the SQL store's, else its own in memory). A receiver is named by its origin alone
    (its path or query may hold a secret); one configured shows 0 when none of its
    events wait. Counts and times of requests come from the server in front."""
    configured = [_origin(url) for url in sender.urls] if sender else []

    @operation("GET", "/metrics")
    def getMetrics(environ, _):
        up, now = 1, time.time()
        try:
            application.checkHealth(environ, None)
            rows = sender.receivers() if sender else []
        except HTTPError:  # the database is away, or did not answer in time
            rows, up = [], 0
        # with no answer, no figures: a receiver's 0 would say that none of its wait
        receivers = {origin: [0, 0, 0.0] for origin in configured if up}
        for url, waiting, failing, created in rows:
            figures = receivers.setdefault(_origin(url), [0, 0, 0.0])
            figures[0] += waiting
            figures[1] += failing
            # the oldest event's age; created is None for an event written by 1.3.0
            figures[2] = max(figures[2], now - (created or now))
        text = METRICS.format(version=__version__, up=up)
        for at, (name, meaning) in enumerate(RECEIVER_METRICS.items()):
            text += f"# HELP {name} {meaning}\n# TYPE {name} gauge\n"
            for origin, figures in receivers.items():
                figure = round(figures[at], 3)
                text += f"{name}{{receiver={_json_string(origin)}}} {figure}\n"
        return 200, text.encode(), [("Content-Type", METRICS_TYPE)]

    application.declare(getMetrics)


def add_liveness(application):
    """Serve GET /livez, to anyone: 200 while the process answers, asking no database.
    It is an orchestrator's liveness probe, and /health, which asks the store, its
    readiness probe: a database away must not have every process restarted."""

    @operation("GET", "/livez", token=False)
    def checkLiveness(_environ, _):
        return 200, b'{"status": "ok"}', JSON_HEADERS

    application.declare(checkLiveness)


# ---- CORS: browser pages of other origins, as a wrapper the core never sees ----


def with_cors(application, origins):
    """The application, answering browser pages of the listed origins (as a browser
    sends Origin).

    Every answer varies with Origin. An answer to a listed origin may be read by its
    page; to its preflight (OPTIONS with Access-Control-Request-Method) the core's Allow
    is what it may send.
    """

    def cors(environ, start_response):
        origin = environ.get("HTTP_ORIGIN")

        def start(status, headers, exc_info=None):
            headers.append(("Vary", "Origin"))
            if origin in origins:
                headers += [
                    ("Access-Control-Allow-Origin", origin),
                    (
                        "Access-Control-Expose-Headers",
                        "Link, Retry-After, WWW-Authenticate, X-Request-ID",
                    ),
                ]
                if (
                    environ["REQUEST_METHOD"] == "OPTIONS"
                    and status.startswith("204")
                    and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in environ
                ):
                    headers += [
                        ("Access-Control-Allow-Methods", dict(headers)["Allow"]),
                        (
                            "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, X-Request-ID",
                        ),
                        ("Access-Control-Max-Age", "600"),
                    ]
            return start_response(status, headers, exc_info)

        return application(environ, start)

    return cors


# ---- The OpenAPI document the service serves at /openapi.json ----

# The document as it is served, but for `servers`, which says where the application is
# mounted. Each operation is its handler's, by its operationId, the handler's name: a
# test holds the two to each other, both ways, and `security: []` to token=False.
# HEAD and OPTIONS are not operations in it, though every route answers them
# (docs/http.md): a client has nothing to call there; nor, for that reason, is 405.
OPENAPI = json.loads(
    """{
  "openapi": "3.1.0",
  "info": {
    "title": "Plant Store",
    "version": "1.0.0",
    "license": {"name": "MIT", "identifier": "MIT"},
    "description": "Add, list and delete plants with a token; new plants go to webhooks"
  },
  "tags": [
    {"name": "plants", "description": "The plants in the store"},
    {"name": "service", "description": "About the service itself"}
  ],
  "security": [{"bearerAuth": []}],
  "paths": {
    "/plants": {
      "get": {
        "operationId": "listPlants",
        "tags": ["plants"],
        "summary": "List plants, oldest first",
        "description": "Every plant, streamed; with `limit`, a page and a next `Link`",
        "parameters": [
          {
            "name": "limit",
            "in": "query",
            "description": "How many plants at most (a page holds {PAGE_MAX} at most)",
            "schema": {"type": "integer", "format": "int32", "minimum": 0}
          },
          {
            "name": "after",
            "in": "query",
            "description": "The cursor of a next link, where the page starts",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{11}$"}
          }
        ],
        "responses": {
          "200": {
            "description": "The plants, oldest first",
            "content": {
              "application/json": {
                "schema": {
                  "type": "array",
                  "items": {"$ref": "#/components/schemas/Plant"}
                }
              }
            },
            "headers": {
              "Link": {
                "description": "The next page (RFC 8288), when more may follow",
                "schema": {"type": "string"}
              }
            }
          },
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      },
      "post": {
        "operationId": "addPlant",
        "tags": ["plants"],
        "summary": "Add a plant",
        "description": "Creates a new plant in the store",
        "requestBody": {
          "description": "Plant to add to the store",
          "required": true,
          "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/NewPlant"}}
          }
        },
        "responses": {
          "200": {
            "description": "plant response",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/Plant"}}
            }
          },
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "408": {"$ref": "#/components/responses/Error408"},
          "409": {"$ref": "#/components/responses/Error409"},
          "411": {"$ref": "#/components/responses/Error411"},
          "413": {"$ref": "#/components/responses/Error413"},
          "415": {"$ref": "#/components/responses/Error415"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/plants/{id}": {
      "parameters": [
        {
          "name": "id",
          "in": "path",
          "required": true,
          "description": "The plant's id",
          "schema": {"type": "integer", "format": "int64"}
        }
      ],
      "delete": {
        "operationId": "deletePlant",
        "tags": ["plants"],
        "summary": "Delete a plant",
        "description": "Its id can be used again",
        "responses": {
          "204": {"description": "The plant is deleted"},
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "404": {"$ref": "#/components/responses/Error404"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/openapi.json": {
      "get": {
        "operationId": "getOpenApiDocument",
        "security": [],
        "tags": ["service"],
        "summary": "Read this document",
        "description": "Needs no token",
        "responses": {
          "200": {
            "description": "The OpenAPI document",
            "content": {"application/json": {"schema": {"type": "object"}}}
          }
        }
      }
    },
    "/health": {
      "get": {
        "operationId": "checkHealth",
        "security": [],
        "tags": ["service"],
        "summary": "Check that the service can reach its store",
        "description": "For load balancers and orchestrators; no token needed",
        "responses": {
          "200": {"$ref": "#/components/responses/Ok"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/livez": {
      "get": {
        "operationId": "checkLiveness",
        "security": [],
        "tags": ["service"],
        "summary": "Check that the process answers",
        "description": "For an orchestrator's liveness probe: it asks no database",
        "responses": {"200": {"$ref": "#/components/responses/Ok"}}
      }
    },
    "/metrics": {
      "get": {
        "operationId": "getMetrics",
        "tags": ["service"],
        "summary": "Read the service's figures, for Prometheus",
        "description": "The same from every process: read from the store they share",
        "responses": {
          "200": {
            "description": "Prometheus's text format 0.0.4",
            "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}
          },
          "401": {"$ref": "#/components/responses/Error401"}
        }
      }
    }
  },
  "webhooks": {
    "/plant/webhook": {
      "post": {
        "operationId": "newPlant",
        "tags": ["plants"],
        "summary": "A new plant, sent to each webhook URL",
        "description": "A new plant, signed as Standard Webhooks says (HMAC-SHA256)",
        "security": [],
        "parameters": [
          {
            "name": "webhook-id",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          },
          {
            "name": "webhook-timestamp",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          },
          {
            "name": "webhook-signature",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          }
        ],
        "requestBody": {
          "description": "Information about a new plant in the system",
          "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/NewPlant"}}
          }
        },
        "responses": {
          "200": {
            "description":
              "Return a 200 status to indicate that the data was received successfully"
          }
        }
      }
    }
  },
  "components": {
    "schemas": {
      "Plant": {
        "type": "object",
        "required": ["name"],
        "properties": {
          "name": {"description": "The name of the plant", "type": "string"},
          "tag": {"description": "Tag to specify the type", "type": "string"}
        }
      },
      "NewPlant": {
        "allOf": [
          {"$ref": "#/components/schemas/Plant"},
          {
            "type": "object",
            "required": ["id"],
            "properties": {
              "id": {
                "description": "Identification number of the plant",
                "type": "integer",
                "format": "int64"
              }
            }
          }
        ]
      },
      "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
          "error": {"type": "integer", "format": "int32"},
          "message": {"type": "string"}
        }
      }
    },
    "responses": {
      "Ok": {
        "description": "It answers",
        "content": {
          "application/json": {
            "schema": {
              "type": "object",
              "required": ["status"],
              "properties": {"status": {"const": "ok"}}
            }
          }
        }
      },
      "Error400": {
        "description": "The request is not valid; the message names the field and rule",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error401": {
        "description": "The bearer token is missing or not accepted",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}
      },
      "Error404": {
        "description": "No plant has this id",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error408": {
        "description": "The request body did not arrive in time",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error409": {
        "description": "A plant with this id already exists; it is left unchanged",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error411": {
        "description": "A chunked body this server cannot read: send a Content-Length",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error413": {
        "description": "The request body is larger than the limit",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error415": {
        "description": "The body is not application/json",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"Accept": {"schema": {"type": "string"}}}
      },
      "Error500": {
        "description": "The server failed",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error503": {
        "description": "The database is away; try again after Retry-After seconds",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"Retry-After": {"schema": {"type": "string"}}}
      }
    },
    "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}
  }
}""".replace("{PAGE_MAX}", str(PAGE_MAX))
)


def add_document(application):
    """Serve OPENAPI at GET /openapi.json, to anyone: tools read it before they have a
    token. `servers` says where the application is mounted."""
    document = json.dumps({"servers": [{"url": "MOUNTED"}], **OPENAPI}, indent=2)

    @operation("GET", "/openapi.json", token=False)
    def getOpenApiDocument(environ, _):
        mounted = _json_string(quote(environ.get("SCRIPT_NAME", "")) or "/")
        return 200, document.replace('"MOUNTED"', mounted, 1).encode(), JSON_HEADERS

    application.declare(getOpenApiDocument)


# ---- The embedded server: wsgiref, threaded, with timeouts ----

CLIENT_TIMEOUT = 10  # seconds the embedded server waits on a silent client


class _ServerHandler(ServerHandler):
    # wsgiref starts each request's environ as a copy of the process's environment,
    # secrets and all: a request gets only what PEP 3333 and CGI define
    os_environ = {}

    def finish_content(self):
        # wsgiref gives every answer without a body "Content-Length: 0": RFC 9110
        # forbids it on a 204 (8.6), and on HEAD it would contradict a GET that streams
        # a body of no set length.
        if not self.headers_sent and (
            self.status.startswith("204") or self.environ["REQUEST_METHOD"] == "HEAD"
        ):
            self.send_headers()
        super().finish_content()


class _RequestHandler(WSGIRequestHandler):
    """wsgiref's request handler, with a socket timeout and a log without secrets."""

    # http.server's own answers to broken HTTP (400, 414, 431) as Error JSON: `explain`
    # is its fixed text for the status (send_error below keeps it so).
    error_content_type = JSON_TYPE
    error_message_format = '{"error": %(code)d, "message": "%(explain)s"}'

    def setup(self):
        # a silent client cannot hold its thread
        self.timeout = self.server.client_timeout
        super().setup()

    def parse_request(self):
        if not super().parse_request():
            return False
        if self.path.startswith(("http://", "https://")):  # RFC 9112, 3.2.2
            # the absolute form: its path and query alone
            self.path = urlsplit(self.path)._replace(scheme="", netloc="").geturl()
        return True

    def handle(self):
        """wsgiref's, with _ServerHandler: read one request and run the app on it."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
        elif self.parse_request():
            handler = _ServerHandler(
                self.rfile,
                self.wfile,
                self.get_stderr(),
                self.get_environ(),
                multithread=True,
            )
            handler.request_handler = self  # for its log line
            handler.run(self.server.get_app())

    def log_request(self, code="-", size="-"):
        # Method and path only: the query string is where careless clients put secrets.
        path = getattr(self, "path", "").partition("?")[0]  # none: a garbled request
        self.log_message('"%s %s" %s %s', self.command or "-", path, code, size)

    def log_error(self, format, *args):
        pass  # http.server would quote the raw request line, secrets and all

    def send_error(self, code, *_message_and_explain, **_):
        # http.server's message quotes the request line (in the status line, since
        # 3.13.15 and 3.14.7): the status's own phrase and text instead; and a status
        # line even to a line that looked like HTTP/0.9, as 3.13 and later send
        self.request_version = ""
        super().send_error(code)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server: a thread per connection, a backlog for bursts, a clean stop."""

    # at exit, no thread is waited for: finish() has waited for the requests
    daemon_threads = True
    # listen backlog: a burst of connects waits here, not refused
    request_queue_size = 1024
    linger_seconds = 2

    def process_request(self, request, client_address):
        with self.request_ended:
            self.in_flight += 1
        super().process_request(request, client_address)

    def stop(self, signum, _frame):
        """End serve_forever() between two accepts: an exception raised by a signal
        handler could cut one under way. From another thread, since shutdown() waits
        for serve_forever(), which runs in the thread that takes the signal. A second
        Ctrl-C, a second or more after the first, ends the process at once, with the
        requests under way cut (130: ended by SIGINT, as a shell says it)."""
        if self.stopping is None:
            self.stopping = time.monotonic()
            threading.Thread(target=self.shutdown).start()
        elif signum == signal.SIGINT and time.monotonic() - self.stopping >= 1:
            os._exit(130)

    def finish(self):
        """Stop accepting, and wait up to client_timeout for the requests in flight."""
        self.server_close()  # closed before it is said: no connection comes after
        _log(
            "stopping: accepting no new requests, and answering those under way "
            f"({self.in_flight}) for {self.client_timeout} s at most"
        )
        with self.request_ended:
            self.request_ended.wait_for(lambda: not self.in_flight, self.client_timeout)

    def handle_error(self, request, client_address):
        # a client timed out or hung up: quiet
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def shutdown_request(self, request):
        # Send our FIN, then drain what the client still sends (an unread body, say):
        # closing with unread bytes resets the connection, and the client would lose the
        # answer it was sent.
        try:
            request.shutdown(socket.SHUT_WR)
            request.settimeout(self.linger_seconds)
            deadline = time.monotonic() + self.linger_seconds
            while request.recv(65536) and time.monotonic() < deadline:
                pass
        except OSError:
            pass
        self.close_request(request)
        with self.request_ended:
            self.in_flight -= 1
            self.request_ended.notify_all()


def make_server(host, port, application, *, client_timeout=CLIENT_TIMEOUT):
    """The embedded server for application on (host, port); port 0 picks a free one."""
    server = _Server((host, port), _RequestHandler)
    server.client_timeout = client_timeout
    server.in_flight, server.request_ended = 0, threading.Condition()
    server.stopping = None  # when the first signal to stop came
    server.set_app(application)
    return server


# ---- The assembly: settings from the environment, make_app, `app`, the command line


def make_app(
    tokens,
    store=None,
    max_body_bytes=MAX_BODY_BYTES,
    *,
    webhook_urls=(),
    webhook_secret=None,
    cors_origins=(),
):
    """Return the WSGI application (PEP 3333) that accepts the given bearer tokens.

    It is the core's Application, with PlantStore unless given a store, the usual
    body's fast read, GET /metrics, GET /livez and the OpenAPI document. With
    webhook_urls, each new plant is also POSTed to every one of them, signed with
    webhook_secret (see WebhookSender). With a store given or webhooks, it is that
    Application wrapped by naming_requests, and with cors_origins, the origins whose
    browser pages may call it (https://example.org), wrapped by with_cors too: then a
    function. Either way, its `store` attribute is the store, and `webhook_sender` the
    sender or None.
    """
    application = Application(
        tokens, PlantStore() if store is None else store, max_body_bytes
    )
    application.read_new_plant = read_usual_new_plant
    sender = None
    if isinstance(webhook_urls, str):  # one URL
        webhook_urls = [webhook_urls]
    if webhook_urls:  # it starts sending now (see "Background work")
        sender = WebhookSender(webhook_urls, webhook_secret, application.store)
        application.on_create = sender.notify
    add_metrics(application, sender)
    add_liveness(application)
    add_document(application)
    served = application
    if sender or store is not None:  # they may write a line that a request causes
        served = naming_requests(application)
    if isinstance(cors_origins, str):  # one origin
        cors_origins = [cors_origins]
    origins = {browser_origin(origin) for origin in cors_origins}
    served = with_cors(served, origins) if origins else served
    served.webhook_sender, served.store = sender, application.store
    return served


def setting(environ, name):
    """A setting's value from its variable, or from the file that NAME_FILE names
    (systemd's LoadCredential=, a mounted secret), without one line end; or None."""
    path = environ.get(f"{name}_FILE")
    if path is None:
        return environ.get(name)
    if name in environ:
        raise ValueError(f"{name} and {name}_FILE ({path}) are both set: set one")
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
            if not select.select([fd], [], [], max(0, deadline - time.monotonic()))[0]:
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
    value = setting(environ, TOKENS_VARIABLE)
    if value is None:
        return None
    tokens = [token.strip() for token in re.split("[,\n]", value) if token.strip()]
    if not tokens:
        raise ValueError(
            f"{TOKENS_VARIABLE} is set but holds no token: set it to the bearer "
            f"tokens to accept, comma-separated (make one with {MAKE_A_TOKEN}), "
            "or unset it"
        )
    return tokens


def store_from_environ(environ=os.environ):
    """The store PLANTSTORE_DB names, told apart by its form, never by a guess: a
    PostgreSQL URL, a libpq string, an SQLite file's path; or None (in memory). The
    value is never quoted."""
    value = (setting(environ, DB_VARIABLE) or "").strip()
    problem = db_mistake(value)
    if problem:
        raise ValueError(f"{DB_VARIABLE} {problem}; it takes {DB_FORMS}")
    if re.match("(?i)postgres(ql)?://", value) or re.match(r"\w+\s*=", value):
        try:  # the module beside this file, with psycopg: the postgres extra
            from plantstore_postgres import PostgresStore
        except ImportError as error:  # one of the two is missing, or psycopg's libpq
            raise ValueError(
                f"{DB_VARIABLE} names a PostgreSQL database, which needs "
                f"{error.name or 'psycopg'}: pip install '.[postgres]' in plantstore's "
                "folder installs plantstore_postgres.py and psycopg"
            ) from None
        return PostgresStore(value)
    # SQLAlchemy's sqlite:///relative/path, but not :memory: nor ?mode=
    if path := re.fullmatch("(?i)sqlite:///([^:?][^?]*)", value):
        value = path[1]
    elif re.match(r"[A-Za-z][\w+.-]*:|:", value):  # mysql://, file:, :memory:: no
        raise ValueError(
            f"{DB_VARIABLE} takes {DB_FORMS}; unset it to keep the plants in memory"
        )
    return SQLiteStore(value) if value else None


def db_mistake(value):
    """What makes PLANTSTORE_DB none of its forms, or None; it is never quoted."""
    if value.startswith("\ufeff"):
        return "starts with a byte-order mark: save the file that sets it without one"
    if value.startswith(("'", '"')):  # docker --env-file and systemd keep them
        return "starts with a quote: remove the quotes around it"
    if re.search(r"[\x00-\x1f\x7f]", value):
        return "holds a control character"
    if re.match(r"[A-Za-z][\w+.-]*//", value):
        return "looks like a URL without the ':' after its scheme"
    return None


def unknown_setting(environ=os.environ):
    """A refusal of the first PLANTSTORE_* variable plantstore does not read, with the
    setting it may mean: a typo's, or one whose name says its form (DB_URL,
    DATABASE_URL: DB); or None. The value is never quoted."""
    known = [TOKENS_VARIABLE, WEBHOOK_URL_VARIABLE, CORS_VARIABLE, *FILE_SETTINGS]
    known += [f"{name}_FILE" for name in FILE_SETTINGS]
    short = {name.removeprefix("PLANTSTORE_"): name for name in known}
    for name in sorted(set(environ) - set(known)):
        if name.upper().startswith("PLANTSTORE_"):
            asked = name.upper().removeprefix("PLANTSTORE_").replace("DATABASE", "DB")
            asked = re.sub(r"_(URL|URI|DSN|PATH)(?=_FILE$|$)", "", asked)
            close = difflib.get_close_matches(asked, short, 1, 0.5)
            return f"{name} is not a plantstore setting" + "".join(
                f": did you mean {short[match]}?" for match in close
            )
    return None


@contextlib.contextmanager
def refusals_of(environ, name):
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


def app_from_environ(environ=os.environ, tokens=None):
    """make_app with what the environment says, every setting checked before the store
    opens a file or a connection; then the start line."""
    if problem := unknown_setting(environ):
        raise ValueError(problem)
    tokens = tokens or tokens_from_environ(environ)
    if tokens is None:
        raise ValueError(
            f"neither {TOKENS_VARIABLE} nor {TOKENS_VARIABLE}_FILE is set: set one to "
            "the bearer tokens to accept, comma-separated or one a line; plantstore "
            "never runs without them"
        )
    with refusals_of(environ, TOKENS_VARIABLE):
        tokens = checked_tokens(tokens)

    def listed(name, check):  # each comma-separated item, checked
        items = environ.get(name, "").split(",")
        return [check(item.strip()) for item in items if item.strip()]

    urls = listed(WEBHOOK_URL_VARIABLE, check_webhook_url)
    secret = setting(environ, WEBHOOK_SECRET_VARIABLE)
    if urls:
        with refusals_of(environ, WEBHOOK_SECRET_VARIABLE):
            webhook_secret_key(secret)
    origins = listed(CORS_VARIABLE, browser_origin)
    with refusals_of(environ, DB_VARIABLE):  # last: a refused setting makes no file
        store = store_from_environ(environ)
    application = make_app(
        tokens, store, webhook_urls=urls, webhook_secret=secret, cors_origins=origins
    )
    where = store.name if store else "memory, in this process alone"
    _log(f"version {__version__}, plants in {where}")
    return application


def __getattr__(name):
    """Build `app` from the environment on first use (PEP 562), as a server imports it
    (`gunicorn plantstore:app`). A setting it cannot serve is said in one line, and
    the process ends with status 4: a server that forks workers takes that status for
    an application that cannot load, and stops rather than start them again."""
    global app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        app = app_from_environ()
    except ValueError as problem:
        _log(str(problem), "error")
        raise SystemExit(4) from None
    return app


ENVIRONMENT_HELP = f"""environment:
  {TOKENS_VARIABLE}          bearer tokens, comma-separated, each {MIN_TOKEN_LENGTH}+
                             (unset: one is made up for this run)
  {DB_VARIABLE}              a postgresql:// URL, a libpq string or an SQLite file
                             (unset: plants are kept in memory)
  {WEBHOOK_URL_VARIABLE}     URLs, comma-separated, each new plant is POSTed to
  {WEBHOOK_SECRET_VARIABLE}  the Standard Webhooks secret that signs them (whsec_...)
  {CORS_VARIABLE}    origins, comma-separated, whose browser pages may call it
  {TOKENS_VARIABLE}_FILE
  {WEBHOOK_SECRET_VARIABLE}_FILE
  {DB_VARIABLE}_FILE         a file that holds the setting named without _FILE,
                             read instead of it: a secret kept out of the
                             environment (a last line end is ignored; tokens may
                             be one a line)

more: README.md, or python -m pydoc plantstore"""


def main(argv=None):
    """Run the embedded server: python plantstore.py [--host H] [--port P]; --help
    lists the settings too."""
    parser = argparse.ArgumentParser(
        prog="plantstore",
        description="Serve the Plant Store API.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (%(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port, 0 for any (%(default)s)"
    )
    parser.add_argument(
        "--version", action="version", version=f"plantstore {__version__}"
    )
    args = parser.parse_args(argv)
    try:  # the port first: a start refused for it makes no file
        server = make_server(args.host, args.port, None)
    except (OSError, OverflowError) as error:
        _log(f"cannot listen on {args.host}:{args.port}: {error}", "error")
        return 2
    with server:
        try:
            tokens = tokens_from_environ()
            if tokens is None:  # said to the one at the terminal, and in no log
                tokens = [secrets.token_urlsafe(32)]
                print(
                    f"plantstore: {TOKENS_VARIABLE} is not set, so this run accepts one"
                    f" new token: {tokens[0]}",
                    file=sys.stderr,
                )
            server.set_app(app_from_environ(tokens=tokens))
        except ValueError as error:  # a bad setting: one line, and no server starts
            _log(str(error), "error")
            return 2
        for stop in signal.SIGINT, signal.SIGTERM:  # Ctrl-C, and how systemd stops it
            signal.signal(stop, server.stop)  # SIGINT too: background jobs ignore it
        host, port = server.server_address[:2]
        _log(f"listening on http://{host}:{port}/plants (Ctrl-C to stop)")
        server.serve_forever()
        server.finish()
    for part in server.application.webhook_sender, server.application.store:
        getattr(part, "close", lambda: None)()  # nothing left open at a clean stop
    return 0


if __name__ == "__main__":
    # one copy of this module: plantstore_postgres's `import plantstore` finds this one,
    # so its errors are this module's HTTPError, and its store this module's SQLStore
    sys.modules.setdefault("plantstore", sys.modules[__name__])
    sys.exit(main())
