"""The full service, assembled: make_app(), the settings read into it, `app` for WSGI
servers and main() for `python plantstore.py`. plantstore.py hands its `app`, main() and
the names below over to this module when it is beside it.
"""

import argparse
import os
import secrets
import signal
import sys

from plantstore import (
    MAX_BODY_BYTES,
    MIN_TOKEN_LENGTH,
    Application,
    Store,
    __version__,
    checked_tokens,
    unknown_setting,
)
from plantstore_accelerators import ChunkedStore, read_usual_new_plant
from plantstore_cors import browser_origin, with_cors
from plantstore_log import log_line, naming_requests
from plantstore_metrics import add_liveness, add_metrics
from plantstore_openapi import OPENAPI, add_document
from plantstore_server import make_server
from plantstore_settings import (
    naming_setting,
    setting,
    store_from_environ,
    tokens_from_environ,
)
from plantstore_sql import SQLStore
from plantstore_sqlite import SQLiteStore
from plantstore_webhooks import WebhookSender, check_webhook_url, webhook_secret_key

# the full service's names, which `from plantstore import ...` finds here too
__all__ = [
    "ChunkedStore",
    "OPENAPI",
    "PagesFromList",
    "PlantStore",
    "SQLStore",
    "SQLiteStore",
    "app_from_environ",
    "main",
    "make_app",
    "make_server",
]
PlantStore = ChunkedStore  # its name until 1.5.0


class PagesFromList(Store):
    """A store of add, list(limit) and delete, with no page(): each page reads the whole
    list, and its seqs are positions, so a plant deleted between two pages shifts the
    next."""

    def __init__(self, store):
        self.store, self.add, self.delete = store, store.add, store.delete

    def page(self, after, limit):
        start = max(after or 0, 0)  # seqs are list positions; any cursor may come
        plants = self.store.list(None)[start : start + limit]
        return [(start + n, name, tag) for n, (name, tag) in enumerate(plants, 1)]


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

    It is the core's Application, with ChunkedStore unless given a store, the usual
    body's fast read, GET /metrics, GET /livez and the OpenAPI document. With
    webhook_urls, each new plant is also POSTed to every one of them, signed with
    webhook_secret (see WebhookSender). With a store given or webhooks, it is that
    Application wrapped by naming_requests, and with cors_origins, the origins whose
    browser pages may call it (https://example.org), wrapped by with_cors too: then a
    function. Either way, its `store` attribute is the store, and `webhook_sender` the
    sender or None.
    """
    if not hasattr(store, "page") and hasattr(store, "list"):
        store = PagesFromList(store)
    application = Application(
        tokens, ChunkedStore() if store is None else store, max_body_bytes
    )
    application.plant_reader = read_usual_new_plant
    sender = None
    if isinstance(webhook_urls, str):  # one URL
        webhook_urls = [webhook_urls]
    if webhook_urls:  # it starts sending now (plantstore_background.py)
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


def app_from_environ(environ=os.environ, tokens=None):
    """make_app with what the environment says, every setting checked before the store
    opens a file or a connection; then the start line."""
    if problem := unknown_setting(environ):
        raise ValueError(problem)
    tokens = tokens or tokens_from_environ(environ)
    if tokens is None:
        raise ValueError(
            "neither PLANTSTORE_TOKENS nor PLANTSTORE_TOKENS_FILE is set: set one to "
            "the bearer tokens to accept, comma-separated or one a line; plantstore "
            "never runs without them"
        )
    with naming_setting(environ, "PLANTSTORE_TOKENS"):
        tokens = checked_tokens(tokens)

    def listed(name, check):  # each comma-separated item, checked
        items = environ.get(name, "").split(",")
        return [check(item.strip()) for item in items if item.strip()]

    urls = listed("PLANTSTORE_WEBHOOK_URL", check_webhook_url)
    secret = setting(environ, "PLANTSTORE_WEBHOOK_SECRET")
    if urls:
        with naming_setting(environ, "PLANTSTORE_WEBHOOK_SECRET"):
            webhook_secret_key(secret)
    origins = listed("PLANTSTORE_CORS_ORIGINS", browser_origin)
    # last: a refused setting makes no file
    with naming_setting(environ, "PLANTSTORE_DB"):
        store = store_from_environ(environ)
    application = make_app(
        tokens, store, webhook_urls=urls, webhook_secret=secret, cors_origins=origins
    )
    where = store.name if store else "memory, in this process alone"
    log_line(f"version {__version__}, plants in {where}")
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
        log_line(str(problem), "error")
        raise SystemExit(4) from None
    return app


ENVIRONMENT_HELP = f"""environment:
  PLANTSTORE_TOKENS          bearer tokens, comma-separated, each {MIN_TOKEN_LENGTH}+
                             (unset: one is made up for this run)
  PLANTSTORE_DB              a postgresql:// URL, a libpq string or an SQLite file
                             (unset: plants are kept in memory)
  PLANTSTORE_WEBHOOK_URL     URLs, comma-separated, each new plant is POSTed to
  PLANTSTORE_WEBHOOK_SECRET  the Standard Webhooks secret that signs them (whsec_...)
  PLANTSTORE_CORS_ORIGINS    origins, comma-separated, whose browser pages may call it
  PLANTSTORE_TOKENS_FILE
  PLANTSTORE_WEBHOOK_SECRET_FILE
  PLANTSTORE_DB_FILE         a file that holds the setting named without _FILE,
                             read instead of it: a secret kept out of the
                             environment (a last line end is ignored; tokens may
                             be one a line)

more: README.md, or python -m pydoc plantstore"""


def main(argv=None):
    """Run the embedded server: python plantstore.py [--host H] [--port P]; --help
    lists the settings too."""
    args = command_line().parse_args(argv)
    try:  # the port first: a start refused for it makes no file
        server = make_server(args.host, args.port, None)
    except (OSError, OverflowError) as error:
        log_line(f"cannot listen on {args.host}:{args.port}: {error}", "error")
        return 2
    with server:
        try:
            tokens = tokens_from_environ()
            if tokens is None:  # said to the one at the terminal, and in no log
                tokens = [secrets.token_urlsafe(32)]
                try:
                    print(
                        "plantstore: PLANTSTORE_TOKENS is not set, so this run accepts"
                        f" one new token: {tokens[0]}",
                        file=sys.stderr,
                    )
                except OSError:  # a broken stderr: the run starts, its token unsaid
                    pass
            server.set_app(app_from_environ(tokens=tokens))
        except ValueError as error:  # a bad setting: one line, and no server starts
            log_line(str(error), "error")
            return 2
        for stop in signal.SIGINT, signal.SIGTERM:  # Ctrl-C, and how systemd stops it
            signal.signal(stop, server.stop)  # SIGINT too: background jobs ignore it
        host, port = server.server_address[:2]
        log_line(f"listening on http://{host}:{port}/plants (Ctrl-C to stop)")
        server.serve_forever()
        server.finish()
    for part in server.application.webhook_sender, server.application.store:
        getattr(part, "close", lambda: None)()  # nothing left open at a clean stop
    return 0


def command_line():
    """main()'s arguments, and its --help."""
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
    return parser
