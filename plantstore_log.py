"""An operator's lines: the logger "plantstore".

A line for the operator (a start, an outage and its end, a receiver that fails) goes
through logging, to the logger "plantstore", once for each change of state, never for
each attempt. A host's own configuration (gunicorn's --log-config, an embedding
program's dictConfig) routes and formats them; with none, they go to stderr as
"plantstore: ...", each in one write, so that the lines of several processes never mix;
a write that fails loses its line alone, as with logging's own handlers (handleError).
A line that a request causes names its request id.
"""

import logging
import sys
import threading

from plantstore import make_request_id

log = logging.getLogger("plantstore")
if log.level == logging.NOTSET:  # the start line is INFO; a host may say otherwise
    log.setLevel(logging.INFO)
current_request = threading.local()  # the request each thread answers: its request_id


class _Stderr(logging.Handler):
    """Write plantstore's lines to stderr while no other handler takes them."""

    def emit(self, record):
        # the handlers the record meets: this one, and the root's if it goes there
        if log.handlers == [self] and not (log.propagate and logging.root.handlers):
            try:
                sys.stderr.write(f"plantstore: {self.format(record)}\n")
                sys.stderr.flush()
            except Exception:  # a closed pipe, a full disk: the line alone is lost
                self.handleError(record)


log.addHandler(_Stderr())


def log_line(message, level="info"):
    """An operator's line, at the level named ("warning", "error")."""
    request_id = getattr(current_request, "request_id", None)
    getattr(log, level)(f"{message} (request {request_id})" if request_id else message)


def naming_requests(application):
    """The application, with each line a request causes naming the request's id: the
    client's X-Request-ID if the core keeps it, else one made here and given to the
    core in its place, as nginx makes $request_id. make_app wraps the application so
    when its store or its webhook sender may write such a line."""

    def named(environ, start_response):
        request_id = environ["HTTP_X_REQUEST_ID"] = make_request_id(environ)
        current_request.request_id = request_id
        try:
            return application(environ, start_response)
        finally:
            current_request.request_id = None

    return named
