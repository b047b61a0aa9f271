"""The embedded server of `python plantstore.py`: the core's, on wsgiref, with timeouts,
a log without secrets, JSON for broken HTTP, and a clean stop.
"""

import os
import re
import signal
import socket
import socketserver
import sys
import threading
import time

from plantstore import JSON_TYPE, RequestHandler, Server
from plantstore_log import log_line

CLIENT_TIMEOUT = 10  # seconds the embedded server waits on a silent client


class _RequestHandler(RequestHandler):
    """The core's request handler, with a log without secrets, JSON for broken HTTP."""

    # http.server's own answers to broken HTTP (400, 414, 431) as Error JSON: `explain`
    # is its fixed text for the status (send_error below keeps it so).
    error_content_type = JSON_TYPE
    error_message_format = '{"error": %(code)d, "message": "%(explain)s"}'

    def parse_request(self):
        if not super().parse_request():
            return False
        # the absolute form (RFC 9112, 3.2.2): its path and query alone
        self.path = re.sub("^https?://[^/?#]*", "", self.path)
        return True

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


class _Server(Server):
    """The core's server, a thread per connection, with a timeout on each, a backlog for
    bursts and a clean stop; finish() waits for the requests under way."""

    # listen backlog: a burst of connects waits here, not refused
    request_queue_size = 1024
    linger_seconds = 2

    def __init__(self, address, client_timeout):
        super().__init__(address, _RequestHandler)
        self.client_timeout = client_timeout
        self.in_flight, self.in_flight_changed = 0, threading.Condition()
        self.stopping = None  # when the first signal to stop came

    def server_bind(self):
        """wsgiref's, but for the host's name, which it asks DNS for (getfqdn): a
        resolver that never answers held the start up. SERVER_NAME is the address."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()

    def process_request(self, request, client_address):
        request.settimeout(self.client_timeout)  # a silent client holds no thread long
        with self.in_flight_changed:
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
        log_line(
            "stopping: accepting no new requests, and answering those under way "
            f"({self.in_flight}) for {self.client_timeout} s at most"
        )
        with self.in_flight_changed:
            self.in_flight_changed.wait_for(
                lambda: not self.in_flight, self.client_timeout
            )

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
        with self.in_flight_changed:
            self.in_flight -= 1
            self.in_flight_changed.notify_all()


def make_server(host, port, application, *, client_timeout=CLIENT_TIMEOUT):
    """The embedded server for application on (host, port); port 0 picks a free one."""
    server = _Server((host, port), client_timeout)
    server.set_app(application)
    return server
