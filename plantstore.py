"""The Plant Store API in one file, on the Python standard library alone: a WSGI
application (PEP 3333) that keeps plants for the clients that hold a bearer token, in a
dict under a lock, and answers every error in JSON.

    python plantstore.py [--host H] [--port P]   # wsgiref's server, threaded, to try it
    gunicorn --threads 8 plantstore:app          # a production server (one process!)
    Application(tokens)                          # inside another WSGI stack

`app` and `python plantstore.py` read one setting, PLANTSTORE_TOKENS: the bearer tokens
to accept, comma-separated (unset, `python plantstore.py` makes one up and prints it).
Importing the module reads, prints and starts nothing.

The one thing people get wrong: the plants live in the memory of one process. Several
server processes would each hold plants of their own, so run one, with threads.

The full service (SQLite, PostgreSQL, webhooks, metrics, CORS, the OpenAPI document, a
hardened server) is in the modules beside this file, or all in plantstore.pyz."""

# The file, top to bottom; each section uses those above it alone, and in each the
# entry point comes first, the helpers it calls after it.
#
#   Errors             HTTPError, raised anywhere, answered by Application
#   Reading a request  the token, the body, strict JSON, a NewPlant, a page's query
#   The store          Store, the interface; MemoryStore, a dict under a lock
#   Writing an answer  the Plant and Error shapes, a listing streamed page by page
#   The application    operation() declares a route; Application, its handlers
#   Running it         `app`, `python plantstore.py`; full_service(), the one place
#                      that names the modules beside this file

import argparse
import difflib
import itertools
import json
import logging
import os
import random
import re
import secrets
import socketserver
import sys
import threading
import traceback
import wsgiref.simple_server
from decimal import Decimal
from hmac import compare_digest
from http import HTTPStatus
from urllib.parse import parse_qs, quote

if sys.version_info < (3, 11):  # one line, not a traceback from code that needs 3.11
    raise SystemExit("plantstore needs Python 3.11 or newer")

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
# Each final status's line, "200 OK", made once: HTTPStatus(status) for each answer
# cost 5-10% of creates/s. Any other status (1xx, 499, 600) is answered as a 500.
_STATUS_LINES = {code: f"{code} {code.phrase}" for code in HTTPStatus if code >= 200}


# ---- Errors: raised anywhere, answered by Application.error_answer ----


class HTTPError(Exception):
    """An error answer: a status, a message for the Error body, extra headers."""

    def __init__(self, status, message, *, headers=()):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


# ---- Reading a request, in the order the checks run ----


def check_bearer(environ, tokens):
    """Raise 401 unless Authorization is "Bearer <token>" with a known token."""
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    token, challenge = token.strip(), 'Bearer realm="plantstore"'
    if not token or scheme.lower() != "bearer":
        required = "a bearer token is required: send 'Authorization: Bearer <token>'"
        raise HTTPError(401, required, headers=[("WWW-Authenticate", challenge)])
    matched = False
    if token.isascii():  # compare_digest takes ASCII only; no other token could match
        for good in tokens:  # each one, in constant time: the time taken tells nothing
            matched |= compare_digest(token, good)
    if not matched:
        invalid = [("WWW-Authenticate", f'{challenge}, error="invalid_token"')]
        raise HTTPError(401, "the bearer token is not valid", headers=invalid)


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
        length = int(digits[:19])  # past any limit, an int64: no int() of thousands
        if length > limit:  # decided before a byte of the body is read
            raise HTTPError(413, f"request body is larger than {limit} bytes")
    # No length: a body only if the server marks its end (PEP 3333's extension
    # wsgi.input_terminated: a chunked body it decoded), read to it; else none.
    elif not environ.get("wsgi.input_terminated"):
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
    if len(body) > limit:  # with no length
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


def as_integer(value, name, low=INT64_MIN, high=INT64_MAX):
    """Return value as an int from low to high, as JSON Schema has it: 7.0, not true."""
    decimal = type(value) is Decimal and value == value.to_integral_value()
    if type(value) is not int and not decimal:
        raise HTTPError(400, f"'{name}' must be an integer")
    if not low <= value <= high:  # compared as it is: 1e400 never becomes a huge int
        raise HTTPError(400, f"'{name}' must be an integer from {low} to {high}")
    return int(value)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def url_integer(text, name, *limits):
    """Read an integer in the path or query as a JSON number, as in a body: 7 or 7.0."""
    if _JSON_NUMBER.fullmatch(text):
        try:
            return as_integer(Decimal(text), name, *limits)
        except ArithmeticError:  # an exponent beyond even Decimal's range
            pass
    raise HTTPError(400, f"'{name}' must be an integer")


def read_page_query(environ):
    """Return `limit` (None, or 0 to INT32_MAX) and `after` (None, or a plant's seq)."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    for name in "limit", "after":
        if len(query.get(name, [])) > 1:
            raise HTTPError(400, f"'{name}' may be given once")
    limit, after = query.get("limit"), query.get("after")
    if limit is not None:
        limit = url_integer(limit[0], "limit", 0, INT32_MAX)
    if after is not None:  # the cursor of a next link: the seq of its last plant
        after = url_integer(after[0], "after")
    return limit, after


# ---- The store: its interface, and the core's, a dict under a lock ----


class Store:
    """What the application asks of a store: subclass it, or give any object add, page
    and delete (`tag` is None for no tag), and maybe ping(), the health check's cheap
    question. One whose database is away raises HTTPError(503, ...)."""

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


class MemoryStore(Store):
    """The core's store: the plants in a dict, in the order they came, under a lock. A
    page walks past the plants before it: under a millisecond at 10,000 plants, tens of
    milliseconds at a million; past that, a store whose pages cost what they hold."""

    def __init__(self):
        self._plants = {}  # id: (seq, name, tag), oldest first
        self._seqs = itertools.count()  # 0, 1, 2, ...
        self._lock = threading.Lock()

    def add(self, plant_id, name, tag):
        with self._lock:
            if plant_id in self._plants:
                return False
            self._plants[plant_id] = next(self._seqs), name, tag
            return True

    def page(self, after, limit):
        after = -1 if after is None else after  # seqs start at 0
        with self._lock:
            newer = (plant for plant in self._plants.values() if plant[0] > after)
            return list(itertools.islice(newer, limit))

    def delete(self, plant_id):
        with self._lock:
            return self._plants.pop(plant_id, None) is not None


# ---- Writing an answer ----

# json's C routine, ASCII-escaped (a lone surrogate is safe): far faster than dumps()
json_string = json.encoder.encode_basestring_ascii


def plant_json(name, tag):
    """The Plant shape: name, and tag if it has one; never the id, which Plant lacks."""
    if tag is None:
        return f'{{"name": {json_string(name)}}}'.encode()
    return f'{{"name": {json_string(name)}, "tag": {json_string(tag)}}}'.encode()


def error_json(status, message):
    """The Error shape, with `error` the HTTP status."""
    return f'{{"error": {status}, "message": {json_string(message)}}}'.encode()


def stream_plants(next_page, plants):
    """Yield one JSON array of `plants`, a first page, and every plant after them: each
    next page is read only once the one before is sent, so a store that fails after the
    200 makes the server cut the answer short: no client takes it for a whole list."""
    yield b"["
    comma = b""
    while plants:
        yield comma + b", ".join([plant_json(name, tag) for _, name, tag in plants])
        comma = b", "
        plants = next_page(plants[-1][0], PAGE_MAX) if len(plants) == PAGE_MAX else None
    yield b"]"


# ---- The application: routes declared on their handlers, and the handlers ----


def make_request_id(environ):
    """The client's X-Request-ID if it is safe to echo and to log, else a new one."""
    given = environ.get("HTTP_X_REQUEST_ID")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    # random re-seeds in a fork's child: no two workers make the same ids
    return random.getrandbits(64).to_bytes(8).hex()


def operation(method, path, *, token=True):
    """Declare a handler's route. Its name is its operationId in the OpenAPI document,
    and `token` says whether it needs the bearer token."""

    def mark(handler):
        handler.route = method, path, token
        return handler

    return mark


def checked_tokens(tokens):
    """The tokens as a list, once each is one a client can send and no one can guess."""
    if isinstance(tokens, str) or not (tokens := list(tokens)):  # "abc": a, b, c
        raise ValueError("tokens must be a list of one or more strings")
    if not all(  # printable ASCII, no space: ! to ~
        isinstance(token, str)
        and re.fullmatch("[!-~]+", token)
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
        for method in "add", "page", "delete":
            if not callable(getattr(store, method, None)):
                raise TypeError(f"the store has no {method}() method: see Store")
        self.store, self.max_body_bytes, self.on_create = store, max_body_bytes, None
        self.plant_reader = read_new_plant  # or one as exact, and faster

        self.routes = {}  # path: {method: (handler, whether it needs the token)}
        # those of fixed paths; of those that end in a parameter, by the path above it
        self.paths, self.templates = {}, {}
        for name in dir(self):  # in the order of their names
            if hasattr(member := getattr(self, name), "route"):
                self.declare(member)

    def declare(self, handler):
        """Route to a handler declared with operation(); a HEAD runs a GET's handler."""
        method, path, token = handler.route
        methods = self.routes.setdefault(path, {})
        methods[method] = handler, token
        if method == "GET":
            methods["HEAD"] = handler, token
        if path.endswith("}"):
            self.templates[path.rpartition("/")[0]] = methods
        else:
            self.paths[path] = methods

    def __call__(self, environ, start_response):
        """Answer a request; only a stream's exception escapes, once its 200 is sent."""
        request_id = make_request_id(environ)
        try:
            status, body, headers = self.respond(environ)
            status_line = _STATUS_LINES[status]  # a KeyError for a status it lacks
        except Exception as error:
            status, body, headers = self.error_answer(environ, error, request_id)
            status_line = _STATUS_LINES[status]
        headers = [*headers, ("X-Request-ID", request_id)]
        if status == 204:  # No Content: no body, nor its length
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
        """An HTTPError's answer; any other error, or a status with no line, is a 500,
        logged to wsgi.errors: the request id, the traceback."""
        if isinstance(error, HTTPError) and error.status in _STATUS_LINES:
            headers = [*JSON_HEADERS, *error.headers]
            return error.status, error_json(error.status, error.message), headers
        failed = f"plantstore: request {request_id} failed:\n{traceback.format_exc()}"
        environ["wsgi.errors"].write(failed)
        return 500, error_json(500, "internal server error"), JSON_HEADERS

    def respond(self, environ):
        """Route, authenticate and run one request; return (status, body, headers)."""
        path, id_text = environ.get("PATH_INFO", ""), None
        methods = self.paths.get(path)
        if methods is None:  # /plants/7, or /plants/{id} as sent: its id "7", "{id}"
            parent, _, id_text = path.rpartition("/")
            methods = self.templates.get(parent) if id_text else None
        if methods is None:
            mounted = environ.get("SCRIPT_NAME", "")
            routes = ", ".join(mounted + route for route in self.routes)
            raise HTTPError(404, f"not found: the routes are {routes}")
        method = environ["REQUEST_METHOD"]
        found = methods.get(method)
        if found is None:
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
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
        body = read_body(environ, self.max_body_bytes)
        plant_id, name, tag = self.plant_reader(body)
        if not self.store.add(plant_id, name, tag):
            raise HTTPError(409, "a plant with this 'id' already exists")
        if self.on_create:
            self.on_create(plant_id, name, tag)
        return 200, plant_json(name, tag), JSON_HEADERS

    @operation("GET", "/plants")
    def listPlants(self, environ, _id_text):
        limit, after = read_page_query(environ)
        next_page, headers = self.store.page, JSON_HEADERS
        if limit is None:  # all, a page at a time: memory does not grow with the store
            return 200, stream_plants(next_page, next_page(after, PAGE_MAX)), headers
        size = min(limit, PAGE_MAX)
        plants = next_page(after, size + 1)  # one extra: is there more?
        if len(plants) > size:
            del plants[size:]
            if plants:  # a page of none would link to itself
                link = f"{quote(environ.get('SCRIPT_NAME', ''))}/plants?limit={limit}"
                link += f"&after={plants[-1][0]}"  # the last plant's seq, its cursor
                headers = [*headers, ("Link", f'<{link}>; rel="next"')]
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
        # the store's own cheap question, if it has one
        getattr(self.store, "ping", lambda: self.store.page(None, 1))()
        return 200, b'{"status": "ok"}', JSON_HEADERS


# ---- Running it: the settings, `app` for a WSGI server, `python plantstore.py` ----

# The settings, from the environment. This file serves PLANTSTORE_TOKENS; the full
# service (the modules beside it, or plantstore.pyz) serves them all, and reads a
# setting that has a NAME_FILE form from the file it names.
SETTINGS = (
    "PLANTSTORE_TOKENS",
    "PLANTSTORE_DB",
    "PLANTSTORE_WEBHOOK_URL",
    "PLANTSTORE_WEBHOOK_SECRET",
    "PLANTSTORE_CORS_ORIGINS",
    "PLANTSTORE_TOKENS_FILE",
    "PLANTSTORE_DB_FILE",
    "PLANTSTORE_WEBHOOK_SECRET_FILE",
)
# What Kubernetes sets in every pod for a Service named plantstore or plantstore-...:
# PLANTSTORE_SERVICE_HOST, PLANTSTORE_PORT, PLANTSTORE_DB_PORT_5432_TCP_ADDR, ...
SERVICE_LINK = re.compile(r"PLANTSTORE\w*_(SERVICE_\w+|PORT(_\d+_[A-Z]+\w*)?)")


def unknown_setting(environ):
    """The refusal of a PLANTSTORE_* variable that is no setting nor a service link,
    with the setting it may mean (DB_URL, DATABASE_URL: DB), never its value; or
    None."""
    short = {name.removeprefix("PLANTSTORE_"): name for name in SETTINGS}
    for name in sorted(set(environ) - set(SETTINGS)):
        if name.upper().startswith("PLANTSTORE_") and not SERVICE_LINK.fullmatch(name):
            asked = name.upper().removeprefix("PLANTSTORE_").replace("DATABASE", "DB")
            asked = re.sub(r"_(URL|URI|DSN|PATH)(?=_FILE$|$)", "", asked)
            close = difflib.get_close_matches(asked, short, 1, 0.5)
            return f"{name} is not a plantstore setting" + "".join(
                f": did you mean {short[match]}?" for match in close
            )


def core_app(environ):
    """Application for the tokens of PLANTSTORE_TOKENS. Any other setting is refused:
    this file never keeps plants in memory when a database was asked for."""
    if problem := unknown_setting(environ):
        raise ValueError(problem)
    if others := sorted(set(SETTINGS) & set(environ) - {"PLANTSTORE_TOKENS"}):
        raise ValueError(
            f"{others[0]} needs the full service: plantstore_app.py and the modules "
            "beside plantstore.py, or plantstore.pyz; this file keeps plants in memory"
        )
    tokens = re.findall(r"[^,\s]+", environ.get("PLANTSTORE_TOKENS", ""))  # a, b, ...
    if not tokens:
        raise ValueError("PLANTSTORE_TOKENS must hold the tokens to accept, a,b,...")
    return Application(tokens)


def full_service():
    """plantstore_app, the full service, where Python finds it (beside this file, in
    plantstore.pyz, installed); else None."""
    try:
        import plantstore_app
    except ModuleNotFoundError as missing:
        if missing.name != "plantstore_app":
            raise
        return None
    return plantstore_app


log = logging.getLogger("plantstore")  # an operator's lines: a start, a refusal


def __getattr__(name):
    """`app`, built from the environment on first use (PEP 562), and the full service's
    names (make_app, ...). A refused setting ends the process with status 4, which a
    server that forks takes for an app that cannot load."""
    global app
    # its own names alone: not __path__ and the like, which tools ask of any module
    service = not name.startswith("__") and full_service()
    if service and name in [*service.__all__, "app"]:
        return getattr(service, name)
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        app = core_app(os.environ)
    except ValueError as problem:
        log.error(f"plantstore: {problem}")
        raise SystemExit(4) from None
    return app


class ServerHandler(wsgiref.simple_server.ServerHandler):
    """wsgiref's, without two faults: it copies the process's environment, secrets and
    all, into each environ, and sends Content-Length: 0 with a 204 (RFC 9110, 8.6
    forbids it) and with a HEAD, where it contradicts the GET's."""

    os_environ = {}  # a request's environ holds what PEP 3333 and CGI define, alone

    def finish_content(self):
        if self.status.startswith("204") or self.environ["REQUEST_METHOD"] == "HEAD":
            self.headers_sent or self.send_headers()
        super().finish_content()


class RequestHandler(wsgiref.simple_server.WSGIRequestHandler):
    """wsgiref's reading of a request, handed to ServerHandler."""

    def handle(self):
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:  # http.server's bound: a 414
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
        elif self.parse_request():
            handler = ServerHandler(
                self.rfile, self.wfile, self.get_stderr(), self.get_environ()
            )
            handler.request_handler = self  # for its log line
            handler.run(self.server.get_app())


class Server(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    """wsgiref's server, with a thread for each connection."""

    daemon_threads = True  # a stop waits for no client


def main(argv=None):
    """python plantstore.py [--host H] [--port P]: the core on wsgiref's server; the
    full service's main() when it is here."""
    if service := full_service():
        return service.main(argv)
    parser = argparse.ArgumentParser(prog="plantstore")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    logging.basicConfig(format="plantstore: %(message)s", level=logging.INFO)
    environ = dict(os.environ)
    if "PLANTSTORE_TOKENS" not in environ:  # to the one at the terminal, in no log
        environ["PLANTSTORE_TOKENS"] = token = secrets.token_urlsafe(32)
        print(f"plantstore: this run accepts one new token: {token}", file=sys.stderr)
    try:
        application = core_app(environ)
    except ValueError as problem:
        log.error(problem)
        return 2
    with Server((args.host, args.port), RequestHandler) as server:
        server.set_app(application)
        log.info(f"listening on http://{args.host}:{server.server_port}/plants")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    # one copy of this module: the full service's `import plantstore` finds this one
    sys.modules.setdefault("plantstore", sys.modules[__name__])
    sys.exit(main())
