"""The Plant Store API in one file, on the Python standard library alone.

``POST /plants`` takes a NewPlant JSON object (``id``, ``name``, optional
``tag``) and answers the stored Plant (``name``, ``tag``; no ``id``);
``GET /plants?limit=N`` answers a page of plants, oldest first, with a ``Link``
to the next (without ``limit``, every plant, streamed); ``DELETE /plants/{id}``
removes one. Errors are ``{"error": <status>, "message": ...}``. Every request
needs ``Authorization: Bearer <token>`` except ``GET /openapi.json``, which
answers the OpenAPI 3.1 document of the service as it is, every status included.

Three ways to run it:

    python plantstore.py [--host H] [--port P]    # the embedded server below
    gunicorn -w 1 --threads 8 plantstore:app       # production, behind nginx (deploy/)
    make_app(tokens, store=..., max_body_bytes=...)  # inside another WSGI stack

Settings come from the environment (``python plantstore.py --help`` lists them):
``PLANTSTORE_TOKENS`` holds the accepted bearer tokens, comma-separated. Left
unset, ``python plantstore.py`` makes up one token and prints it once;
``gunicorn plantstore:app`` refuses to boot. ``PLANTSTORE_DB`` keeps the plants
in an SQLite file, or in PostgreSQL for a ``postgresql://`` URL (with psycopg,
the one optional dependency). ``PLANTSTORE_WEBHOOK_URL`` and ``_SECRET`` send
each new plant to receivers; ``PLANTSTORE_CORS_ORIGINS`` lets browser pages of
those origins call it. Importing this module reads, prints and generates nothing.

A store is any object with these methods (``tag`` is None when there is none):
``add(plant_id, name, tag) -> bool`` inserts atomically and returns False,
changing nothing, when the id is taken; ``page(after, limit) -> list`` returns
up to ``limit`` ``(key, name, tag)`` of the plants created after the one whose
key is ``after`` (None: from the oldest), the key an int64 that grows with
creation order; ``delete(plant_id) -> bool`` removes the plant and returns False
when there was none. A store of the first interface, with ``list(limit)`` (up to
``limit``, None: all, ``(name, tag)`` pairs, oldest first) instead of ``page``,
still works, and pages the slow way. A store whose database is away raises
``HTTPError(503, ...)``.

The one thing people get wrong: the default ``PlantStore`` lives in the memory
of one process. Several gunicorn workers would each hold a separate store, so
run one worker with threads, or set ``PLANTSTORE_DB`` and run several.

The embedded server is wsgiref made threaded: a reference server, fine on a
laptop or behind nginx; gunicorn behind nginx is the one for real traffic.
"""

import argparse
import base64
import collections
import concurrent.futures
import contextlib
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import secrets
import signal
import socket
import socketserver
import sqlite3
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from decimal import Decimal
from hmac import compare_digest
from http import HTTPStatus
from urllib.parse import parse_qs, quote, unquote, urlsplit
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

if sys.version_info < (3, 11):  # one line, before anything that needs 3.11 fails with a traceback
    raise getattr(sys.modules.get("gunicorn.errors"), "AppImportError", SystemExit)(
        f"plantstore needs Python 3.11 or newer; this is Python {sys.version.split()[0]}")

__version__ = "1.1.0"
# `app` is left out on purpose: it is built from the environment on first use.
__all__ = ["HTTPError", "OPENAPI", "PlantStore", "PostgresStore", "SQLStore", "SQLiteStore", "make_app", "make_server", "main"]

TOKENS_VARIABLE, DB_VARIABLE = "PLANTSTORE_TOKENS", "PLANTSTORE_DB"
WEBHOOK_URL_VARIABLE, WEBHOOK_SECRET_VARIABLE = "PLANTSTORE_WEBHOOK_URL", "PLANTSTORE_WEBHOOK_SECRET"
CORS_VARIABLE = "PLANTSTORE_CORS_ORIGINS"
MIN_TOKEN_LENGTH = 16  # characters; a shorter token can be guessed
MAKE_A_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
MAX_BODY_BYTES = 65536  # default request body limit; larger bodies get 413
CLIENT_TIMEOUT = 10  # seconds the embedded server waits on a silent client
CONNECT_TIMEOUT = 3  # seconds a SQL store waits to connect before the request answers 503
RETRY_AFTER = 2  # seconds a 503 asks the client to wait before trying again
JSON_TYPE = "application/json"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
PAGE_MAX = 1000  # plants in one page; a listing without `limit` streams pages of this size
CHUNK = 1024  # plants in one chunk of the in-memory store

_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


# ---- Errors: raised anywhere, rendered in one place (the application) ----

class HTTPError(Exception):
    """An error answer: a status, a message for the Error body, extra headers."""

    def __init__(self, status, message, *, headers=()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


# ---- Reading a request, in the order the checks run ----

def check_bearer(environ, credentials):
    """Raise 401 unless Authorization is one of the credentials, each "Bearer <token>" in ASCII."""
    header = environ.get("HTTP_AUTHORIZATION", "")
    matched = False
    if header.isascii():  # compare_digest takes ASCII strings only; no other one could match
        for good in credentials:  # each one, in constant time: how long it takes tells nothing
            matched |= compare_digest(header, good)
    if matched:
        return
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if not token or scheme.lower() != "bearer":
        raise HTTPError(401, "a bearer token is required: send 'Authorization: Bearer <token>'",
                        headers=[("WWW-Authenticate", 'Bearer realm="plantstore"')])
    usual = f"Bearer {token}"
    if usual == header:  # compared above already: the token is not one of them
        raise HTTPError(401, "the bearer token is not valid",
                        headers=[("WWW-Authenticate", 'Bearer realm="plantstore", error="invalid_token"')])
    check_bearer({"HTTP_AUTHORIZATION": usual}, credentials)  # sent as "bearer  <token>": check it as usual


def read_body(environ, limit):
    """Return the request body, refusing a wrong media type or an oversized body before reading it."""
    media_type = environ.get("CONTENT_TYPE", "")
    if media_type != JSON_TYPE and media_type.partition(";")[0].strip().lower() != JSON_TYPE:
        raise HTTPError(415, "Content-Type must be application/json", headers=[("Accept", JSON_TYPE)])
    length = environ.get("CONTENT_LENGTH") or None
    if length is not None:
        if not (length.isdigit() and length.isascii()):  # int() would also take " 7", "+7", "7_0"
            raise HTTPError(400, "Content-Length must be a non-negative integer")
        if len(length) > 18:  # never build a huge int: 19 digits, zeros aside, are over any limit
            length = length.lstrip("0")[:19] or "0"
        length = int(length)
        if length > limit:  # decided before a byte of the body is read
            raise HTTPError(413, f"request body is larger than {limit} bytes")
    elif not environ.get("wsgi.input_terminated"):  # no length and no end-of-body marker: PEP 3333 says read nothing
        if environ.get("HTTP_TRANSFER_ENCODING"):  # a chunked body this server does not frame for us
            raise HTTPError(411, "send the body with a Content-Length: this server cannot read a chunked body")
        return b""
    try:  # a chunked body is read to one byte past the limit, which tells one that is over it
        body = environ["wsgi.input"].read(limit + 1 if length is None else length)
    except TimeoutError:  # the client stalled past the server's timeout
        raise HTTPError(408, "the request body did not arrive in time") from None
    except Exception:  # the server's stream failed on the client's bytes: a bad chunk, a hang-up
        raise HTTPError(400, "the request body could not be read") from None
    if length is None:
        if len(body) > limit:  # the 413 above judged a declared length; this one, what a chunked body brought
            raise HTTPError(413, f"request body is larger than {limit} bytes")
    elif len(body) < length:
        raise HTTPError(400, "request body is shorter than its Content-Length")
    return body


def read_new_plant(body):
    """Return (id, name, tag) from the body: UTF-8, then strict JSON, then the NewPlant shape."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, "request body is not valid UTF-8") from None
    usual = _USUAL_NEWPLANT.fullmatch(text)
    if usual:  # the fast path: the same answer as below, several times faster
        plant_id, name, tag = usual.groups()
        return int(plant_id), name, tag  # 18 digits at most: always an int64
    return parse_new_plant(decode_json(text))


# The usual body, as JSON libraries write it ({"id": 7, "name": "Fern", "tag": "indoor"}, or the same
# without spaces), with no escapes and an id of up to 18 digits, has one meaning, which a regular
# expression reads; any other body goes to the JSON decoder. Every quantifier is possessive (?+ *+,
# Python 3.11): nothing here needs to backtrack, and not keeping the way back is faster.
_USUAL_NEWPLANT = re.compile(r'\{"id": ?+(-?+(?:0|[1-9][0-9]{0,17}+)), ?+'   # id: always an int64
                             r'"name": ?+"([^"\\\x00-\x1f]*+)"'                # name: no escapes
                             r'(?:\}|, ?+"tag": ?+"([^"\\\x00-\x1f]*+)"\})')   # the end, or tag and the end


def decode_json(text):
    """Parse text as strict RFC 8259 JSON; any failure is a 400."""
    if not text:
        raise HTTPError(400, "request body is empty: send a NewPlant JSON object")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as error:
        raise HTTPError(400, f"request body is not valid JSON: {error.msg} "
                             f"(line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise HTTPError(400, "request body is nested too deeply") from None
    except ValueError:  # int() refuses literals longer than sys.get_int_max_str_digits()
        raise HTTPError(400, "request body has an integer too long to read") from None


def _json_object(pairs):
    """Build a JSON object, refusing duplicate keys (RFC 8259 leaves their meaning open)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise HTTPError(400, "request body has a duplicate key in an object")
    return obj


def _json_number(text):
    """Keep a number with a fraction or exponent exact, so that 9223372036854775807.0 stays an integer."""
    try:
        return Decimal(text)
    except ArithmeticError:  # an exponent beyond even Decimal's range
        raise HTTPError(400, "request body has a number too large to read") from None


def _json_constant(name):
    """Refuse NaN, Infinity and -Infinity, which Python's json accepts and RFC 8259 does not."""
    raise HTTPError(400, "request body is not valid JSON: NaN and Infinity are not numbers in JSON")


# Built once: json.loads() would build a new decoder on every call that passes hooks.
_DECODER = json.JSONDecoder(object_pairs_hook=_json_object, parse_float=_json_number,
                            parse_constant=_json_constant)


def parse_new_plant(document):
    """Return (id, name, tag) from a NewPlant document, or raise a 400 naming the field and the rule."""
    if type(document) is not dict:
        raise HTTPError(400, "request body must be a JSON object (a NewPlant)")
    if "id" not in document:
        raise HTTPError(400, "'id' is required")
    plant_id = as_integer(document["id"], "id")
    if "name" not in document:
        raise HTTPError(400, "'name' is required")
    name, tag = document["name"], document.get("tag")
    if type(name) is not str:
        raise HTTPError(400, "'name' must be a string")
    if "tag" in document and type(tag) is not str:
        raise HTTPError(400, "'tag' must be a string")
    return plant_id, name, tag  # other fields are ignored, and not stored


def as_integer(value, name, low=INT64_MIN, high=INT64_MAX, kind="int64"):
    """Return value as an int from low to high, JSON Schema's way: 7.0 is the integer 7, true is not one."""
    if type(value) is not int:
        if not (type(value) is Decimal and value == value.to_integral_value()):
            raise HTTPError(400, f"'{name}' must be an integer")
        if low <= value <= high:  # compared first: 1e400 never becomes a huge int
            value = int(value)
    if not low <= value <= high:
        raise HTTPError(400, f"'{name}' must be an integer from {low} to {high} ({kind})")
    return value


def url_integer(text, name, *limits):
    """Read an integer in the path or the query as a JSON number, as in a body: 7 and 7.0 alike."""
    try:
        value = Decimal(text) if _JSON_NUMBER.fullmatch(text) else None
    except ArithmeticError:  # an exponent beyond even Decimal's range
        value = None
    return as_integer(value, name, *limits)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def query_page(environ):
    """Return `limit` (None, or one integer from 0 to INT32_MAX) and `after` (None, or a cursor's key)."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    limit, after = query.get("limit"), query.get("after")
    for name, values in ("limit", limit), ("after", after):
        if values is not None and len(values) > 1:
            raise HTTPError(400, f"'{name}' may be given once")
    if limit is not None:
        limit = url_integer(limit[0], "limit", 0, INT32_MAX, "int32")
    if after is not None:
        if not _CURSOR.fullmatch(after[0]):
            raise HTTPError(400, "'after' must be a cursor from a Link header of this service")
        after = int.from_bytes(base64.urlsafe_b64decode(after[0] + "="), "big", signed=True)  # an int64
    return limit, after


def cursor(key):
    """The opaque `after` of a next link: the store's key of the last plant on the page, as base64url."""
    return base64.urlsafe_b64encode(key.to_bytes(8, "big", signed=True)).rstrip(b"=").decode("ascii")


_CURSOR = re.compile(r"[A-Za-z0-9_-]{11}")

# ---- The in-memory store ----

class PlantStore:
    """The default store: plants in memory, in creation order, guarded by a lock.

    Each plant gets a slot, numbered in creation order: its seq. Names and tags sit in chunks of
    CHUNK slots, and a dict maps each id to its seq. A page starts at the chunk and index its seq
    gives, so it costs what it holds however large the store is; it skips deleted plants, and a
    chunk with no plant left is dropped whole. Nothing is a new object per plant for the garbage
    collector to track: the dict holds ints, and a full chunk becomes a tuple of strings and None,
    which the collector stops tracking after it first meets it, so no collection walks the store.
    """

    def __init__(self):
        self._seq = {}  # id: seq, for the plants that exist
        self._open_names, self._open_tags = [], []  # the last chunk, still a list
        self._names, self._tags = [self._open_names], [self._open_tags]  # chunks: tuples once full, None once empty
        self._first = self._next = 0  # no plant has a seq below _first; the next plant gets _next
        self._lock = threading.Lock()

    def add(self, plant_id, name, tag):
        """Store the plant and return True, or return False if the id is taken; never overwrite."""
        self._lock.acquire()  # not `with`, which here costs as much again as the lock itself
        try:
            seq = self._next
            if self._seq.setdefault(plant_id, seq) is not seq:  # looked up and stored at once
                return False
            self._next = seq + 1
            self._open_names.append(name)
            self._open_tags.append(tag)
            if seq % CHUNK == CHUNK - 1:  # the open chunk is full
                self._seal()
            return True
        finally:
            self._lock.release()

    def _seal(self):
        """Make the full open chunk a tuple, and open a new one."""
        self._names[-1], self._tags[-1] = tuple(self._open_names), tuple(self._open_tags)
        self._open_names, self._open_tags = [], []
        self._names.append(self._open_names)
        self._tags.append(self._open_tags)

    def page(self, after, limit):
        """Return up to `limit` (seq, name, tag) of the plants created after the one with seq `after`."""
        with self._lock:
            page = []
            number, index = divmod(self._first if after is None else max(after + 1, self._first), CHUNK)
            while len(page) < limit and number < len(self._names):
                names, tags = self._names[number], self._tags[number]
                for index in range(index, 0 if names is None else len(names)):
                    if names[index] is not None:
                        page.append((number * CHUNK + index, names[index], tags[index]))
                        if len(page) == limit:
                            break
                number, index = number + 1, 0
            return page

    def list(self, limit=None):
        """Return up to `limit` (None: all) (name, tag) pairs, oldest first (the first store interface)."""
        return [(name, tag) for _, name, tag in self.page(None, INT64_MAX if limit is None else limit)]

    def delete(self, plant_id):
        """Remove the plant and return True, or return False if there was none."""
        with self._lock:
            seq = self._seq.pop(plant_id, None)
            if seq is None:
                return False
            number, index = divmod(seq, CHUNK)
            if number == len(self._names) - 1:  # the open chunk, a list: changed in place
                self._open_names[index] = self._open_tags[index] = None
            else:  # a full chunk, a tuple: made anew, or dropped when no plant is left in it
                names, tags = list(self._names[number]), list(self._tags[number])
                names[index] = tags[index] = None
                empty = names.count(None) == CHUNK
                self._names[number], self._tags[number] = (None, None) if empty else (tuple(names), tuple(tags))
            first = self._first
            while first < self._next:  # deleting the oldest leaves pages nothing to walk over
                names = self._names[first // CHUNK]
                if names is not None and names[first % CHUNK] is not None:
                    break
                first = first + 1 if names is not None else (first // CHUNK + 1) * CHUNK
            self._first = first
            return True


# ---- Writing an answer ----

# json's own C routine for one string literal, ASCII-escaped, so that a lone surrogate cannot break
# the encoding; writing the two shapes around it is 8x faster than json.dumps() of a dict.
_quote = json.encoder.encode_basestring_ascii


def plant_json(name, tag):
    """The Plant shape: name, and tag only when the plant has one; never the id (spec rule 2)."""
    if tag is None:
        return f'{{"name": {_quote(name)}}}'.encode()  # ASCII, so UTF-8 gives the same bytes, by the fast codec
    return f'{{"name": {_quote(name)}, "tag": {_quote(tag)}}}'.encode()


def error_json(status, message):
    """The Error shape, with `error` the HTTP status."""
    return f'{{"error": {status}, "message": {_quote(message)}}}'.encode("ascii")

# ---- The WSGI application ----

def make_app(tokens, store=None, max_body_bytes=MAX_BODY_BYTES, *, webhook_urls=(), webhook_secret=None,
             cors_origins=()):
    """Return the WSGI application (PEP 3333) that accepts the given bearer tokens.

    With webhook_urls, each new plant is also POSTed to every one of them, signed with
    webhook_secret (see WebhookSender); the application's `webhook_sender` attribute is the sender.
    cors_origins lists the exact origins (https://example.org) whose browser pages may call it.
    """
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings, not one string")
    tokens = list(tokens)
    if not tokens:
        raise ValueError("tokens must not be empty: plantstore never runs without authentication")
    if not all(isinstance(t, str) and t and t.isascii() and t.isprintable() and " " not in t
               for t in tokens):
        raise ValueError(f"each token (as in {TOKENS_VARIABLE}) must be printable ASCII without spaces")
    if any(len(token) < MIN_TOKEN_LENGTH for token in tokens):
        raise ValueError(f"each token (as in {TOKENS_VARIABLE}) must be at least {MIN_TOKEN_LENGTH} characters, "
                         f"or it can be guessed; make one with {MAKE_A_TOKEN}")
    if type(max_body_bytes) is not int or max_body_bytes < 0:
        raise ValueError("max_body_bytes must be a non-negative integer")
    credentials = [f"Bearer {token}" for token in tokens]
    store = PlantStore() if store is None else store
    for method in "add", "delete", "page" if hasattr(store, "page") else "list":  # or the first interface's list
        if not callable(getattr(store, method, None)):
            raise TypeError(f"the store has no {method}() method: see the store interface in help(plantstore)")
    page = getattr(store, "page", None) or _pages_from_list(store)
    cors_origins = frozenset([cors_origins] if isinstance(cors_origins, str) else cors_origins)
    for origin in cors_origins:  # as a browser sends Origin: a scheme, a host, maybe a port; nothing after
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname or origin != f"{parts.scheme}://{parts.netloc}":
            raise ValueError(f"each origin (as in {CORS_VARIABLE}) must be exact, as https://example.org or "
                             "http://localhost:3000: no path, no trailing slash, no *")
    document = json.dumps({"servers": [{"url": "SCRIPT_NAME"}], **OPENAPI}, indent=2).encode("ascii")
    webhook_urls = [webhook_urls] if isinstance(webhook_urls, str) else list(webhook_urls)
    sender = WebhookSender(webhook_urls, webhook_secret, store) if webhook_urls else None  # started by a request
    notify = sender and sender.notify  # after each create: a SQL store wrote the event, the memory one queues it

    # Each handler takes the environ and the {id} of the path (None on other routes), and returns
    # its status and body; anything else is an HTTPError.
    def create_plant(environ, _):
        plant_id, name, tag = read_new_plant(read_body(environ, max_body_bytes))
        if not store.add(plant_id, name, tag):
            raise HTTPError(409, "a plant with this 'id' already exists")
        if notify:
            notify(plant_id, name, tag)
        return 200, plant_json(name, tag), ()

    def list_plants(environ, _):
        limit, after = query_page(environ)
        if limit is None:  # every plant, a page at a time: memory does not grow with the store
            return 200, stream_plants(page, after, page(after, PAGE_MAX)), ()
        size = min(limit, PAGE_MAX)
        plants, headers = page(after, size + 1), ()  # one more than is answered tells whether more follow
        if len(plants) > size:
            del plants[size:]
            if plants:  # a page of none would link to itself
                link = f"{quote(environ.get('SCRIPT_NAME', ''))}/plants?limit={limit}&after={cursor(plants[-1][0])}"
                headers = [("Link", f'<{link}>; rel="next"')]
        return 200, b"[" + b", ".join([plant_json(name, tag) for _, name, tag in plants]) + b"]", headers

    def delete_plant(environ, plant_id):
        if not store.delete(url_integer(plant_id, "id")):
            raise HTTPError(404, "no plant has this 'id'")
        return 204, b"", ()

    def read_document(environ, _):  # the one handler anyone may call: tools read it before they have a token
        mounted = _quote(quote(environ.get("SCRIPT_NAME", "")) or "/").encode()
        return 200, document.replace(b'"SCRIPT_NAME"', mounted, 1), ()  # where the app is mounted, as `servers`

    routes = {"/plants": {"GET": list_plants, "POST": create_plant}, "/openapi.json": {"GET": read_document}}
    plant_route = {"DELETE": delete_plant}  # /plants/{id}

    def allowed(methods):
        return ", ".join(sorted([*methods, *(["HEAD"] if "GET" in methods else []), "OPTIONS"]))

    def options_headers(environ, methods):
        """OPTIONS: the route's methods, and to the preflight of a listed origin, what CORS asks."""
        headers = [("Allow", allowed(methods))]
        if environ.get("HTTP_ORIGIN") in cors_origins and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in environ:
            headers += [("Access-Control-Allow-Methods", allowed(methods)), ("Access-Control-Max-Age", "600"),
                        ("Access-Control-Allow-Headers", "Authorization, Content-Type")]
        return headers

    def cors_headers(origin):
        """Every answer varies with Origin; one to a listed origin may be read by that origin's page."""
        if origin not in cors_origins:
            return [("Vary", "Origin")]
        return [("Vary", "Origin"), ("Access-Control-Allow-Origin", origin),
                ("Access-Control-Expose-Headers", "Link, Retry-After, WWW-Authenticate")]

    def application(environ, start_response):
        """Route, authenticate and run one request, and answer it: JSON (204: no body), never an exception."""
        headers, head = (), False
        if sender:
            sender.start_here()
        try:
            path, plant_id = environ.get("PATH_INFO", ""), None
            methods = routes.get(path)
            if methods is None:
                plant_id = path[8:] if path.startswith("/plants/") else ""
                if not plant_id or "/" in plant_id:
                    raise HTTPError(404, "not found: the routes are /plants, /plants/{id} and /openapi.json")
                methods = plant_route
            method = environ["REQUEST_METHOD"]
            handler = methods.get(method)
            if handler is None and method == "HEAD" and "GET" in methods:
                handler, head = methods["GET"], True  # GET's answer, without its body
            if handler is not None:
                if handler is not read_document:
                    check_bearer(environ, credentials)
                status, body, headers = handler(environ, plant_id)
            elif method == "OPTIONS":  # no token: a browser's preflight never carries one
                if plant_id is not None:
                    url_integer(plant_id, "id")  # /plants/abc has no methods: it is no plant's path
                status, body, headers = 204, b"", options_headers(environ, methods)
            else:
                allow = allowed(methods)
                raise HTTPError(405, f"method not allowed here; allowed: {allow}", headers=[("Allow", allow)])
        except HTTPError as error:
            status, headers, body = error.status, error.headers, error_json(error.status, error.message)
            head = environ.get("REQUEST_METHOD") == "HEAD"
        except Exception:
            traceback.print_exc(file=environ.get("wsgi.errors", sys.stderr))
            status, body = 500, error_json(500, "internal server error")
            head = environ.get("REQUEST_METHOD") == "HEAD"
        if cors_origins:
            headers = [*headers, *cors_headers(environ.get("HTTP_ORIGIN"))]
        # The Content-Type pair is written out: a literal is one constant, not a tuple built per answer.
        if type(body) is not bytes:  # a streamed listing: its length is not known before its end
            start_response(_STATUS_LINES[status], [("Content-Type", "application/json"), *headers])
            if head:
                body.close()  # its first page was read, to answer a failure with its status; no more is
            return [] if head else body
        start_response(_STATUS_LINES[status], list(headers) if status == 204 else [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers])
        return [] if head or status == 204 else [body]  # HEAD: the headers GET would have, and no body

    application.webhook_sender = sender
    return application


def stream_plants(page, after, plants):
    """Yield one JSON array of every plant after `after`, a page at a time, from the first page on."""
    yield b"["
    comma = b""
    while plants:
        yield comma + b", ".join([plant_json(name, tag) for _, name, tag in plants])
        comma = b", "
        plants = page(plants[-1][0], PAGE_MAX) if len(plants) == PAGE_MAX else None
    yield b"]"


def _pages_from_list(store):
    """Pages of a store written to the first interface (add, list, delete): each one reads the whole list."""
    def page(after, limit):
        start = max(after or 0, 0)  # the key is the position in the list (any cursor may come: never below 0)
        return [(start + n, name, tag) for n, (name, tag) in enumerate(store.list(None)[start:start + limit], 1)]
    return page


def tokens_from_environ(environ=os.environ):
    """Return the tokens listed in PLANTSTORE_TOKENS, or None when it is unset; set, it must hold one."""
    if TOKENS_VARIABLE not in environ:
        return None
    tokens = [token.strip() for token in environ[TOKENS_VARIABLE].split(",") if token.strip()]
    if not tokens:
        raise ValueError(f"{TOKENS_VARIABLE} is set but holds no token: set it to the bearer tokens to accept, "
                         f"comma-separated (make one with {MAKE_A_TOKEN}), or unset it")
    return tokens


def options_from_environ(environ=os.environ):
    """Return make_app's other settings: the webhook's URLs and secret, and the CORS origins."""
    def listed(name):
        return [item.strip() for item in environ.get(name, "").split(",") if item.strip()]
    return {"webhook_urls": listed(WEBHOOK_URL_VARIABLE), "webhook_secret": environ.get(WEBHOOK_SECRET_VARIABLE),
            "cors_origins": listed(CORS_VARIABLE)}


def store_from_environ(environ=os.environ):
    """Return the store PLANTSTORE_DB names: a postgresql:// URL, an SQLite file, or None (in memory)."""
    target = environ.get(DB_VARIABLE, "").strip()
    if target.startswith(("postgresql://", "postgres://")):
        return PostgresStore(target)
    return SQLiteStore(target) if target else None


def __getattr__(name):
    """Build `app` for `gunicorn plantstore:app` on first use (PEP 562), not at import."""
    global app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        tokens = tokens_from_environ()
        if tokens is None:
            raise ValueError(f"{TOKENS_VARIABLE} is not set: set it to the bearer tokens to accept, "
                             "comma-separated; plantstore never runs without authentication")
        app = make_app(tokens, store=store_from_environ(), **options_from_environ())
    except ValueError as problem:
        # gunicorn prints its own AppImportError as one line and stops instead of booting.
        error = getattr(sys.modules.get("gunicorn.errors"), "AppImportError", AttributeError)
        raise error(str(problem)) from None
    return app

# ---- The SQL stores: SQLite and PostgreSQL, one class ----

class SQLStore:
    """Plants in a SQL database that every worker shares: a 200 means committed.

    One class over two DB-API drivers, as peewee does it: the SQL is written once, and each engine's
    differences (connecting, its DDL, its placeholder, the errors that mean "the database is away")
    are the few lines of its subclass. Every thread has a connection of its own, opened on first use
    and dropped on the first error, so the next request opens a new one: while the database cannot
    be reached, requests answer 503 with Retry-After, and once it is back they succeed again.
    """

    sql = {
        "insert": "INSERT INTO plants (id, name, tag) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING seq",
        "page": "SELECT seq, name, tag FROM plants WHERE seq > ? ORDER BY seq LIMIT ?",
        "delete": "DELETE FROM plants WHERE id = ? RETURNING seq",
        "columns": "SELECT * FROM plants LIMIT 0",
        "begin": "BEGIN", "commit": "COMMIT", "rollback": "ROLLBACK",
        # The outbox of webhook events (see WebhookSender): written with the plant, in one transaction.
        "event": "INSERT INTO plant_events (url, webhook_id, body, next_at) VALUES (?, ?, ?, ?)",
        # A sender takes events for a while (lease), so that no other sender takes them meanwhile.
        "claim": "UPDATE plant_events SET lease = ? WHERE lease <= ? AND seq IN (SELECT seq FROM plant_events"
                 " WHERE next_at <= ? AND lease <= ? ORDER BY seq LIMIT ?) RETURNING seq, url, webhook_id, body, attempts",
        "probe": "UPDATE plant_events SET lease = ? WHERE lease <= ? AND seq = (SELECT seq FROM plant_events"
                 " WHERE url = ? AND lease <= ? ORDER BY seq LIMIT 1) RETURNING seq, url, webhook_id, body, attempts",
        "release": "UPDATE plant_events SET lease = 0 WHERE seq = ?",
        "retry": "UPDATE plant_events SET attempts = ?, next_at = ?, lease = 0 WHERE seq = ?",
        "hurry": "UPDATE plant_events SET next_at = ? WHERE url = ? AND next_at > ?",
        "done": "DELETE FROM plant_events WHERE seq = ?",
        "forget": "DELETE FROM plant_events WHERE url = ?",
        "count": "SELECT count(*) FROM plant_events",
    }
    schema = ()  # the statements that make the tables, in the engine's own DDL
    unavailable = ()  # the driver's exceptions that mean "the database is away", dropping the connection
    event_urls = ()  # where each new plant's webhook goes: make_app sets it when there are receivers

    def __init__(self, shown):
        self.shown = shown  # how messages name the database: never with its password
        self._local = threading.local()
        self._write_lock = contextlib.nullcontext()  # an engine that queues writers sets a lock
        self._away = False

    def add(self, plant_id, name, tag):
        """Store the plant and return True, or return False if the id is taken; never overwrite."""
        def insert(execute):
            created = bool(execute("insert", (plant_id, _utf8(name), None if tag is None else _utf8(tag))))
            for url in self.event_urls if created else ():
                execute("event", (url, f"msg_{secrets.token_urlsafe(18)}", event_json(plant_id, name, tag), 0))
            return created
        return self._run(insert, write=True, transaction=bool(self.event_urls))

    def page(self, after, limit):
        """Return up to `limit` (seq, name, tag) of the plants created after the one with seq `after`."""
        rows = self.run("page", after or 0, limit)
        return [(seq, _text(name), None if tag is None else _text(tag)) for seq, name, tag in rows]

    def list(self, limit=None):
        """Return up to `limit` (None: all) (name, tag) pairs, oldest first (the first store interface)."""
        return [(name, tag) for _, name, tag in self.page(0, INT64_MAX if limit is None else limit)]

    def delete(self, plant_id):
        """Remove the plant and return True, or return False if there was none."""
        return bool(self.run("delete", plant_id))

    def run(self, statement, *parameters):
        """Run one of the statements above and return its rows (a write unless it is a SELECT)."""
        return self._run(lambda execute: execute(statement, parameters), write=statement != "page")

    def _run(self, work, *, write=False, transaction=False):
        """Return work(execute) run on this thread's connection, in one transaction if asked; a database
        away is a 503. `execute(statement, parameters)` runs one statement and returns its rows."""
        def execute(statement, parameters):
            cursor = db.execute(self.sql[statement], parameters)
            return cursor.fetchall() if cursor.description else []  # all: the statement is done

        try:
            with self._write_lock if write else contextlib.nullcontext():
                db = self._connection()
                if not transaction:
                    result = work(execute)
                else:
                    execute("begin", ())
                    try:
                        result = work(execute)
                        execute("commit", ())
                    except BaseException:
                        with contextlib.suppress(Exception):
                            execute("rollback", ())
                        raise
                self._check(db)
        except self.unavailable as error:
            self._drop(error)
            raise HTTPError(503, "the database is unavailable; try again shortly",
                            headers=[("Retry-After", str(RETRY_AFTER))]) from None
        if self._away:
            self._away = False
            _log(f"the database {self.shown} is reachable again")
        return result

    def _connection(self):
        """This thread's connection, made in this process (a forked worker never uses its parent's)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.db, local.pid = None, os.getpid()
        if local.db is None:
            db = self.connect()
            try:
                self.setup(db)
            except BaseException:
                db.close()
                raise
            local.db = db
        return local.db

    def setup(self, db):
        """Make the tables unless they exist, and refuse a 'plants' table that plantstore did not make."""
        for statement in self.schema:
            db.execute(statement)
        columns = [column[0] for column in db.execute(self.sql["columns"]).description]
        if columns != ["seq", "id", "name", "tag"]:
            raise ValueError(f"{self.shown} has a 'plants' table that plantstore did not make")

    def _check(self, db):
        """Raise one of self.unavailable if what was just done cannot be trusted (SQLite: the file is gone)."""

    def _drop(self, error):
        """Close this thread's connection after an error; say so once per outage, password masked."""
        db, self._local.db = getattr(self._local, "db", None), None
        with contextlib.suppress(Exception):
            db.close()
        if not self._away:
            self._away = True
            _log(f"the database {self.shown} is unavailable: {self._mask(str(error).splitlines()[0])}")

    def _mask(self, text):
        return text


class SQLiteStore(SQLStore):
    """Plants in an SQLite file on this machine, shared by the worker processes that open it."""

    schema = ("CREATE TABLE IF NOT EXISTS plants (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
              " id INTEGER NOT NULL UNIQUE, name BLOB NOT NULL, tag BLOB)",
              "CREATE TABLE IF NOT EXISTS plant_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, url TEXT NOT NULL,"
              " webhook_id TEXT NOT NULL, body BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,"
              " lease REAL NOT NULL DEFAULT 0)",
              "CREATE INDEX IF NOT EXISTS plant_events_due ON plant_events (next_at)")
    sql = {**SQLStore.sql, "begin": "BEGIN IMMEDIATE"}  # the write lock at once: no deadlock upgrading a read
    unavailable = (sqlite3.DatabaseError, OSError)  # read-only, disk I/O, busy too long, the file gone
    busy_seconds = 10  # how long a connection waits for another process to let go of the file

    def __init__(self, path):
        self.path = os.fspath(path)
        super().__init__(self.path)
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise ValueError(f"{folder}: no such directory, so {self.path} cannot be created")
        if not os.access(folder, os.W_OK | os.X_OK):  # SQLite writes its journal beside the file
            raise ValueError(f"{folder}: this user cannot write in this directory, which {self.path} needs")
        self._write_lock = _WriteQueue(self.path + "-writers")
        self._mode = "rwc"  # the first connection may create the file; later ones must find it
        try:  # a file that is not a plantstore database fails here, at start-up, not per request
            self._connection()
        except sqlite3.Error as error:
            raise ValueError(f"{self.path} cannot be opened as a plantstore database: {error}") from None
        self._mode = "rw"

    def connect(self):
        uri = f"file:{quote(os.path.abspath(self.path))}?mode={self._mode}"
        db = sqlite3.connect(uri, uri=True, timeout=self.busy_seconds, isolation_level=None)  # autocommit
        deadline = time.monotonic() + 60
        while True:  # WAL: readers and a writer at once
            try:
                db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as error:
                # Turning a new file to WAL does not wait out the busy timeout: while another worker
                # that boots at the same moment does it, this one is told SQLITE_BUSY at once.
                if error.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() > deadline:
                    db.close()
                    raise
                time.sleep(0.01)
        db.execute("PRAGMA synchronous=FULL")  # each commit reaches the disk before the 200
        self._local.file = self._identity()
        return db

    def _identity(self):
        with contextlib.suppress(OSError):
            found = os.stat(self.path)
            return found.st_dev, found.st_ino
        return None

    def _check(self, db):
        # A file deleted or replaced under a running service: what this connection wrote, no one will read.
        if self._identity() != self._local.file:
            raise sqlite3.OperationalError(f"{self.path} was deleted or replaced while in use")


class _WriteQueue:
    """Writers of every process take turns here, woken as soon as the one before them is done.

    SQLite's own busy handler sleeps and polls (up to 100 ms a nap), so under load a writer could
    wait far longer than the others. A lock per process, then an flock(2) on a file beside the
    database, queue them instead.
    """

    def __init__(self, path):
        self.path, self._thread_lock, self._fd, self._pid = path, threading.Lock(), None, None

    def __enter__(self):
        self._thread_lock.acquire()
        try:
            if self._pid != os.getpid():  # opened in each process: a forked worker has its own
                self._fd, self._pid = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc_info):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()


class PostgresStore(SQLStore):
    """Plants in PostgreSQL, through psycopg 3: every instance on every machine shares them."""

    sql = {name: text.replace("?", "%s") for name, text in SQLStore.sql.items()}
    schema = ("BEGIN",
              # Workers on several machines start together: CREATE TABLE IF NOT EXISTS alone races in
              # PostgreSQL, so one at a time makes the tables, under a lock that the transaction holds.
              "SELECT pg_advisory_xact_lock(7274)",
              "CREATE TABLE IF NOT EXISTS plants (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
              " id BIGINT NOT NULL UNIQUE, name BYTEA NOT NULL, tag BYTEA)",
              "CREATE TABLE IF NOT EXISTS plant_events (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
              " url TEXT NOT NULL, webhook_id TEXT NOT NULL, body BYTEA NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
              " next_at DOUBLE PRECISION NOT NULL, lease DOUBLE PRECISION NOT NULL DEFAULT 0)",
              "CREATE INDEX IF NOT EXISTS plant_events_due ON plant_events (next_at)",
              "COMMIT")

    def __init__(self, url):
        try:
            import psycopg  # the one dependency outside the standard library, for this store alone
        except ImportError:
            raise ValueError(f"{DB_VARIABLE} names a PostgreSQL database, which needs psycopg: "
                             "pip install 'plantstore[postgres]'") from None
        self.url, self._psycopg = url, psycopg
        self._password = unquote(urlsplit(url).password or "")
        super().__init__(self._mask(url))
        self.unavailable = (psycopg.OperationalError, psycopg.InterfaceError)
        with contextlib.suppress(HTTPError):  # a database away at start-up is said once, then waited for
            self.run("page", 0, 0)

    def connect(self):
        return self._psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)

    def _mask(self, text):
        for secret in {self._password, quote(self._password, safe="")} - {""}:  # as written, and as meant
            text = text.replace(secret, "***")
        return text


def _utf8(text):
    return text.encode("utf-8", "surrogatepass")  # any JSON string, a lone surrogate too


def _text(data):
    return data.decode("utf-8", "surrogatepass")


def _log(message):
    """One line for the operator, on stderr (gunicorn's error log)."""
    print(f"plantstore: {message}", file=sys.stderr, flush=True)

# ---- Webhooks: each new plant, signed and retried, from a thread of its own ----

class WebhookSender:
    """Delivers the sample's new-plant webhook to each receiver URL, signed as Standard Webhooks says.

    Every event waits in an outbox until a receiver answers 2xx. With a SQL store the outbox is a
    table written in the plant's own transaction, so a 200 means at least one delivery, across
    crashes and restarts; several workers may deliver one event, and receivers deduplicate by
    webhook-id. With the in-memory store it is the same table in an SQLite database in this
    process's memory: best effort, lost with the process, and at most MAX_WAITING events.
    A thread of its own claims due events and hands them to a small pool that POSTs them, so a
    create never waits for a receiver. A failed attempt is retried on SCHEDULE, with jitter. While
    a receiver gives no answer at all (or its gateway answers 502-504), its oldest event is tried
    every PROBE_SECONDS, and once one gets through, the URL's other events follow at once; a new
    sender, after a restart, tries every waiting event once. A 410 means the URL gets nothing more.
    """

    SCHEDULE = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)  # seconds before each retry
    PROBE_SECONDS, POLL_SECONDS, TIMEOUT, PARALLEL, MAX_WAITING = 5, 1, 15, 8, 10_000
    LEASE_SECONDS = TIMEOUT + 2  # an event taken by a sender killed mid-attempt is free again after this

    def __init__(self, urls, secret, store):
        for parts in map(urlsplit, urls):
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"each webhook URL (as in {WEBHOOK_URL_VARIABLE}) must be an http:// or https:// URL")
        if not secret:
            raise ValueError(f"{WEBHOOK_SECRET_VARIABLE} is required when {WEBHOOK_URL_VARIABLE} is set: "
                             "receivers check every webhook's signature")
        self._key = webhook_secret_key(secret)
        self.urls = list(urls)  # a 410 takes its URL out, here and in the SQL store that writes events
        if isinstance(store, SQLStore):
            self.outbox, self._incoming = store, None
            store.event_urls = self.urls
        else:
            self.outbox, self._incoming = _EventsInMemory(), collections.deque()
        self._wake, self._stop, self._waiting, self._dropping = threading.Event(), threading.Event(), 0, False
        self._pid, self._start_lock = None, threading.Lock()  # started by the first request served

    def start_here(self):
        """Start sending in this process unless it does already: called before each request, since
        a server may fork after building the app (gunicorn --preload), and threads do not follow."""
        if self._pid != os.getpid():
            with self._start_lock:
                if self._pid != os.getpid():
                    self._start()

    def _start(self):
        """Start the sending thread and its pool, in this process."""
        self._failing = {}  # URL that gave no answer: when it was last tried
        self._pool = concurrent.futures.ThreadPoolExecutor(self.PARALLEL, thread_name_prefix="plantstore-webhook")
        self._thread = threading.Thread(target=self._loop, name="plantstore-webhooks", daemon=True)
        self._thread.start()
        self._pid = os.getpid()

    def notify(self, plant_id, name, tag):
        """After a create: queue the in-memory store's event, or wake up for the one a SQL store wrote."""
        if self._incoming is not None:
            self._put(plant_id, name, tag)
        self._wake.set()

    def close(self):
        """Stop sending (what is in the outbox stays there) and wait for attempts under way."""
        self._stop.set()
        self._wake.set()
        if self._pid == os.getpid():
            self._thread.join()
            self._pool.shutdown()

    def _put(self, plant_id, name, tag):
        """Queue the in-memory store's event; over MAX_WAITING, it is dropped, and that is said once."""
        if self._waiting + len(self._incoming) < self.MAX_WAITING:
            self._dropping = False
            self._incoming.append(event_json(plant_id, name, tag))
        elif not self._dropping:
            self._dropping = True
            _log(f"{self.MAX_WAITING} webhook events are waiting: events of new plants are dropped until they drain")

    def _loop(self):
        with contextlib.suppress(HTTPError):  # a new sender tries each waiting event once: receivers may be back
            now = time.time()
            for url in self.urls:
                self.outbox.run("hurry", now, url, now)
        flying = {}  # future: (event, whether it is a probe)
        while not self._stop.is_set():
            try:
                self._take_incoming()
                now = time.time()
                for url, tried in list(self._failing.items()):
                    if now - tried < self.PROBE_SECONDS or len(flying) >= self.PARALLEL:
                        continue
                    self._failing[url] = now
                    for event in self.outbox.run("probe", now + self.LEASE_SECONDS, now, url, now):
                        flying[self._pool.submit(self._post, *event[1:4])] = event, True
                free = self.PARALLEL - len(flying)
                for event in self.outbox.run("claim", now + self.LEASE_SECONDS, now, now, now, free) if free else ():
                    flying[self._pool.submit(self._post, *event[1:4])] = event, False
                if flying:
                    done, _ = concurrent.futures.wait(flying, self.POLL_SECONDS, concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        self._settle(*flying.pop(future), future.result())
                else:  # until a create here wakes it, or events of other workers may be due
                    self._wake.wait(self.POLL_SECONDS)
                    self._wake.clear()
            except HTTPError:  # the database is away, and said so: try again in a moment
                self._stop.wait(RETRY_AFTER)
            except Exception:
                _log(f"webhook delivery failed, and goes on in {RETRY_AFTER} s:\n{traceback.format_exc()}")
                self._stop.wait(RETRY_AFTER)

    def _take_incoming(self):
        """Move the in-memory store's new events into its outbox: one per URL, each with its webhook-id."""
        while self._incoming:
            body = self._incoming.popleft()
            for url in self.urls:
                self.outbox.run("event", url, f"msg_{secrets.token_urlsafe(18)}", body, 0)
        if self._incoming is not None:
            self._waiting = self.outbox.run("count")[0][0]

    def _post(self, url, webhook_id, body):
        """One attempt: the receiver's status, or None when no answer came (refused, timed out, cut)."""
        timestamp = str(int(time.time()))
        signature = hmac.new(self._key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": JSON_TYPE, "webhook-id": webhook_id, "webhook-timestamp": timestamp,
            "webhook-signature": "v1," + base64.b64encode(signature).decode()})
        try:
            with _NO_REDIRECTS.open(request, timeout=self.TIMEOUT) as answer:
                answer.read(1024)  # a little of the answer, never all of it
                return answer.status
        except urllib.error.HTTPError as error:  # 3xx (no redirect is followed), 4xx and 5xx
            error.close()
            return error.code
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def _settle(self, event, probe, status):
        seq, url, webhook_id, _, attempts = event
        now = time.time()
        if url not in self.urls:  # its receiver answered 410 meanwhile
            self.outbox.run("done", seq)
        elif status is not None and 200 <= status < 300:
            self.outbox.run("done", seq)
            if self._failing.pop(url, None) is not None:  # through again: its other events follow at once
                self.outbox.run("hurry", now, url, now)
        elif status == 410:  # a new list, not one changed under the requests that iterate it
            self.urls = [other for other in self.urls if other != url]
            if self._incoming is None:  # a SQL store, which writes the events itself
                self.outbox.event_urls = self.urls
            self._failing.pop(url, None)
            self.outbox.run("forget", url)
            _log(f"the webhook receiver {_origin(url)} answered 410 Gone: it gets no more events")
        elif probe:  # a probe that failed leaves its event's schedule as it was
            self.outbox.run("release", seq)
        else:
            if status in (None, 502, 503, 504):  # no answer from the receiver itself: probe it until it is back
                self._failing.setdefault(url, now)
            if attempts < len(self.SCHEDULE):
                self.outbox.run("retry", attempts + 1, now + self.SCHEDULE[attempts] * random.uniform(1, 1.2), seq)
            else:
                self.outbox.run("done", seq)
                _log(f"webhook {webhook_id} to {_origin(url)} is given up after {attempts + 1} attempts")


class _EventsInMemory(SQLStore):
    """The in-memory store's outbox: the same table in an SQLite database of this process, for one thread."""

    unavailable = (sqlite3.DatabaseError,)

    def __init__(self):
        super().__init__("the webhook events in memory")

    def connect(self):
        return sqlite3.connect(":memory:", isolation_level=None)

    def setup(self, db):
        db.execute(SQLiteStore.schema[1])  # the events table alone: the plants are elsewhere


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None  # a 3xx is an answer like any other: not a delivery


_NO_REDIRECTS = urllib.request.build_opener(_NoRedirects)


def event_json(plant_id, name, tag):
    """The webhook's body: the NewPlant as created, id first."""
    return b'{"id": %d, ' % plant_id + plant_json(name, tag)[1:]


def _origin(url):
    """A receiver, named in a log line: scheme, host and port, never a path or query that may hold a secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def webhook_secret_key(secret):
    """Check a Standard Webhooks secret, whsec_ and base64 of at least 24 bytes, without ever quoting it."""
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True) if secret.startswith("whsec_") else b""
    except ValueError:
        key = b""
    if len(key) < 24:
        raise ValueError(f"{WEBHOOK_SECRET_VARIABLE} must be whsec_ followed by base64 of at least 24 random bytes: "
                         "make one with python -c \"import base64, secrets; "
                         "print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\"")
    return key


# ---- The OpenAPI document the service serves at /openapi.json ----

def _json_content(schema):
    return {JSON_TYPE: {"schema": schema}}


def _responses(success, *errors):
    """One operation's answers: its success, then its errors, each one of the component responses below."""
    return {**success, **{str(status): {"$ref": f"#/components/responses/Error{status}"} for status in errors}}


_PLANT = {"$ref": "#/components/schemas/Plant"}


_ERRORS = {  # status: (description, the header that comes with it)
    400: ("The request is not valid; the message names the field and the rule", None),
    401: ("The bearer token is missing or not accepted", "WWW-Authenticate"),
    404: ("No plant has this id", None),
    405: ("The path does not have this method", "Allow"),
    408: ("The request body did not arrive in time", None),
    409: ("A plant with this id already exists; it is left unchanged", None),
    411: ("A chunked body that this server cannot read: send a Content-Length", None),
    413: ("The request body is larger than the limit", None),
    415: ("The body is not application/json", "Accept"),
    500: ("The server failed", None),
    503: ("The database is unavailable for a moment; try again after Retry-After seconds", "Retry-After"),
}


def _head(get):
    """HEAD, which every GET route has: GET's answers, headers and all, without their bodies (RFC 9110)."""
    return {**get, "description": "As GET, without the body"}


_OPTIONS = {"description": "The methods this path has; to a listed origin's CORS preflight, what CORS asks. "
                           "No token is needed", "security": [], "responses": {"204": {
                "description": "The methods, in Allow", "headers": {"Allow": {"schema": {"type": "string"}}}}}}
_OPTIONS_OF_A_PLANT = {**_OPTIONS, "responses": {**_OPTIONS["responses"], **_responses({}, 400)}}  # 400: not an id

_LIST_PLANTS = {
    "description": "Lists plants, oldest first: without `limit`, every plant (streamed, with no "
                   "Content-Length); with it, one page, and a `Link` to the next when more follow",
    "parameters": [
        {"name": "limit", "in": "query", "description": f"How many plants at most (a page holds "
         f"{PAGE_MAX} at most)", "schema": {"type": "integer", "format": "int32", "minimum": 0}},
        {"name": "after", "in": "query", "description": "Where a page starts: the cursor of a next "
         "link, opaque to clients", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{11}$"}}],
    "responses": _responses({"200": {
        "description": "The plants, oldest first",
        "headers": {"Link": {"description": 'The next page, as <...>; rel="next" (RFC 8288), when '
                                            "more plants may follow", "schema": {"type": "string"}}},
        "content": _json_content({"type": "array", "items": _PLANT})}}, 400, 401, 500, 503),
}
_READ_DOCUMENT = {
    "description": "This document: the one request that needs no token", "security": [],
    "responses": {"200": {"description": "The OpenAPI document", "content": _json_content({"type": "object"})}},
}

OPENAPI = {
    "openapi": "3.1.0",
    "info": {"title": "Plant Store", "version": "1.0.0", "license": {"name": "MIT", "identifier": "MIT"}},
    "security": [{"bearerAuth": []}],
    "paths": {
        "/plants": {
            "get": _LIST_PLANTS,
            "head": _head(_LIST_PLANTS),
            "post": {
                "description": "Creates a new plant in the store",
                "requestBody": {"description": "Plant to add to the store", "required": True,
                                "content": _json_content({"$ref": "#/components/schemas/NewPlant"})},
                "responses": _responses({"200": {"description": "plant response", "content": _json_content(_PLANT)}},
                                        400, 401, 408, 409, 411, 413, 415, 500, 503),
            },
            "options": _OPTIONS,
        },
        "/plants/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True, "description": "The plant's id",
                            "schema": {"type": "integer", "format": "int64"}}],
            "delete": {
                "description": "Deletes a plant; its id can be used again",
                "responses": _responses({"204": {"description": "The plant is deleted"}}, 400, 401, 404, 500, 503),
            },
            "options": _OPTIONS_OF_A_PLANT,
        },
        "/openapi.json": {"get": _READ_DOCUMENT, "head": _head(_READ_DOCUMENT), "options": _OPTIONS},
    },
    "webhooks": {"/plant/webhook": {"post": {  # the full sample's, sent when PLANTSTORE_WEBHOOK_URL is set
        "description": "Information about a new plant added to the store, signed as Standard Webhooks says: "
                       "webhook-signature is v1, and the base64 HMAC-SHA256 of webhook-id.webhook-timestamp.body",
        "security": [],
        "parameters": [{"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
                       for name in ("webhook-id", "webhook-timestamp", "webhook-signature")],
        "requestBody": {"description": "Information about a new plant in the system",
                        "content": _json_content({"$ref": "#/components/schemas/NewPlant"})},
        "responses": {"200": {"description": "Return a 200 status to indicate that the data was received successfully"}},
    }}},
    "components": {
        "schemas": {  # the specification's own, unchanged
            "Plant": {"type": "object", "required": ["name"], "properties": {
                "name": {"description": "The name of the plant", "type": "string"},
                "tag": {"description": "Tag to specify the type", "type": "string"}}},
            "NewPlant": {"allOf": [_PLANT, {
                "type": "object", "required": ["id"], "properties": {"id": {
                    "description": "Identification number of the plant", "type": "integer", "format": "int64"}}}]},
            "Error": {"type": "object", "required": ["error", "message"], "properties": {
                "error": {"type": "integer", "format": "int32"}, "message": {"type": "string"}}},
        },
        "responses": {  # Error405 is what any path answers to a method it does not list
            f"Error{status}": {"description": text,
                               "content": _json_content({"$ref": "#/components/schemas/Error"}),
                               **({"headers": {header: {"schema": {"type": "string"}}}} if header else {})}
            for status, (text, header) in _ERRORS.items()
        },
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
    },
}

# ---- The embedded server: wsgiref, threaded, with timeouts ----

class _ServerHandler(ServerHandler):
    def finish_content(self):
        # wsgiref gives every answer without a body "Content-Length: 0"; RFC 9110 (8.6) forbids it on a 204.
        if not self.headers_sent and self.status.startswith("204"):
            self.send_headers()
        super().finish_content()


class _RequestHandler(WSGIRequestHandler):
    """wsgiref's request handler, with a socket timeout and a log that keeps secrets out."""

    # http.server's own answers to broken HTTP (400, 414, 431) as Error JSON; `explain` is its
    # fixed text for the status, where `message` would quote the client's request line.
    error_content_type = JSON_TYPE
    error_message_format = '{"error": %(code)d, "message": "%(explain)s"}'

    def setup(self):
        self.timeout = self.server.client_timeout  # a silent client cannot hold its thread
        super().setup()

    def parse_request(self):
        if not super().parse_request():
            return False
        if self.path.startswith(("http://", "https://")):  # absolute form (RFC 9112, 3.2.2): its path and query
            target = urlsplit(self.path)
            self.path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        return True

    def handle(self):
        """wsgiref's, with _ServerHandler: read one request and run the application on it."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
        elif self.parse_request():
            handler = _ServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=False)
            handler.request_handler = self  # for its log line
            handler.run(self.server.get_app())

    def log_request(self, code="-", size="-"):
        # Method and path only: the query string is where careless clients put secrets.
        path = getattr(self, "path", "").partition("?")[0]  # no path when the request line was garbage
        self.log_message('"%s %s" %s %s', self.command or "-", path, code, size)

    def log_error(self, format, *args):
        pass  # http.server would quote the raw request line, secrets and all; log_request has the status


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per connection, a listen backlog for bursts, and a clean stop."""

    daemon_threads = True  # at exit, no thread is waited for: finish() has waited for the requests
    request_queue_size = 1024  # listen backlog: 200 simultaneous connects are queued, not refused
    linger_seconds = 2

    def process_request(self, request, client_address):
        with self.idle:
            self.in_flight += 1
        super().process_request(request, client_address)

    def finish(self, seconds):
        """Stop accepting, and wait up to `seconds` for the requests in flight to be answered."""
        self.server_close()
        with self.idle:
            self.idle.wait_for(lambda: not self.in_flight, timeout=seconds)

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # a client that timed out or hung up is quiet
            super().handle_error(request, client_address)

    def shutdown_request(self, request):
        # Send our FIN, then drain what the client still sends (an unread body, say): closing with
        # unread bytes resets the connection, and the client would lose the answer it was sent.
        try:
            request.shutdown(socket.SHUT_WR)
            request.settimeout(self.linger_seconds)
            deadline = time.monotonic() + self.linger_seconds
            while request.recv(65536) and time.monotonic() < deadline:
                pass
        except OSError:
            pass
        self.close_request(request)
        with self.idle:
            self.in_flight -= 1
            self.idle.notify_all()


def make_server(host, port, application, *, client_timeout=CLIENT_TIMEOUT):
    """Return the embedded server for application, bound to (host, port); port 0 picks a free one."""
    server = _Server((host, port), _RequestHandler)
    server.client_timeout = client_timeout
    server.in_flight, server.idle = 0, threading.Condition()
    server.set_app(application)
    return server

# ---- The command line ----

ENVIRONMENT_HELP = f"""environment:
  {TOKENS_VARIABLE}          bearer tokens, comma-separated, {MIN_TOKEN_LENGTH}+ characters (unset: one is made up)
  {DB_VARIABLE}              an SQLite file or a postgresql:// URL (unset: plants are kept in memory)
  {WEBHOOK_URL_VARIABLE}     URLs, comma-separated, that each new plant is POSTed to (unset: none)
  {WEBHOOK_SECRET_VARIABLE}  the Standard Webhooks secret that signs them: whsec_ and base64
  {CORS_VARIABLE}    exact origins, comma-separated, whose browser pages may call it

more: README.md, or python -m pydoc plantstore"""


def main(argv=None):
    """Run the embedded server: python plantstore.py [--host H] [--port P]."""
    parser = argparse.ArgumentParser(prog="plantstore", description="Serve the Plant Store API.",
                                     epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on, 0 for any (default: %(default)s)")
    parser.add_argument("--version", action="version", version=f"plantstore {__version__}")
    args = parser.parse_args(argv)
    try:
        tokens = tokens_from_environ()
        if tokens is None:
            tokens = [secrets.token_urlsafe(32)]
            print(f"plantstore: {TOKENS_VARIABLE} is not set, so this run accepts one new token: {tokens[0]}",
                  file=sys.stderr)
        application = make_app(tokens, store=store_from_environ(), **options_from_environ())
        server = make_server(args.host, args.port, application)
    except ValueError as error:  # a bad setting: said in one line, and the server does not start
        print(f"plantstore: {error}", file=sys.stderr)
        return 2
    except (OSError, OverflowError) as error:
        print(f"plantstore: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    with server:
        host, port = server.server_address[:2]
        print(f"plantstore {__version__} listening on http://{host}:{port}/plants (Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, _interrupt)  # how systemd and containers stop a service
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
            print("plantstore: stopping: answering the requests under way, accepting no new ones",
                  file=sys.stderr, flush=True)
            server.finish(server.client_timeout)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
