"""Tests of plantstore.py under the servers that run it: its embedded server ("The
embedded server: wsgiref, threaded, with timeouts") over real sockets; gunicorn, the
production server, and granian, the other one, each with its shipped recipe (deploy/);
nginx in front of either, with deploy/nginx.conf; and any status a store raises, a final
answer under gunicorn and granian. The other WSGI servers a user may pick (uWSGI,
waitress, cheroot, werkzeug) run the webhooks' tests, in test_plantstore_webhooks.py."""

import contextlib
import http.client
import http.server
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import plantstore
from plantstore import MAX_BODY_BYTES
from plantstore_app import make_app
from plantstore_server import make_server
from plantstore_sqlite import SQLiteStore
from testbed import (
    AUTH,
    HERE,
    SERVICE_LINKS,
    Lines,
    SECRET,
    STATUSES_RAISED,
    TOKEN,
    WAIT,
    body_of_size,
    environ_without_tokens,
    exchange,
    fill,
    first_retry_after,
    free_port,
    granian_command,
    granian_recipe,
    over_http,
    post_over_http,
    raw_request,
    read_database,
    read_raw,
    read_status,
    start_granian,
    start_gunicorn,
    start_nginx,
    stored,
    stored_plants,
    tmpfs,
    wait_listening,
    wait_until,
)


# ---- Promises at the edges (issue 29): what a store raises, under a real server


RAISING_APP = """
import os

import plantstore

STATUSES = {STATUSES}  # by plant id: the status the store raises


class RaisingStore:
    def add(self, plant_id, name, tag):
        status = STATUSES[plant_id]
        raise plantstore.HTTPError(status, f"the store raised {{status!r}}")

    def page(self, after, limit):
        return []

    def delete(self, plant_id):
        return False


tokens = os.environ["PLANTSTORE_TOKENS"].split(",")
app = plantstore.make_app(tokens, store=RaisingStore())
"""


@pytest.mark.parametrize("server", ["gunicorn", "granian"])
def test_edges_any_status_a_store_raises_is_a_final_answer_under_a_real_server(
    server, spawn, tmp_path
):
    statuses = {n: raised for n, (raised, _) in enumerate(STATUSES_RAISED, 1)}
    (tmp_path / "raising_app.py").write_text(RAISING_APP.format(STATUSES=statuses))
    # plantstore: this folder's
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PYTHONPATH=str(tmp_path))
    if server == "gunicorn":
        process = spawn(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-w",
                "1",
                "--threads",
                "8",
                "-b",
                "127.0.0.1:0",
                "raising_app:app",
            ],
            env,
        )
        log = Lines(process.stderr)
        port = int(log.until(r"Listening at: http://[\d.]+:(\d+)")[1])
    else:
        command = granian_command("memory")
        command[-1] = "raising_app:app"
        process = spawn(command, env)
        port = int(command[command.index("--port") + 1])
    wait_listening(process, port)
    for plant_id, (raised, answered) in enumerate(STATUSES_RAISED, 1):
        status, headers, body = exchange(
            "127.0.0.1", port, "POST", "/plants", {"id": plant_id, "name": "Fern"}
        )
        # final, with a client's timeout
        assert (status, body["error"]) == (answered, answered), raised
        assert {name.lower(): value for name, value in headers.items()}[
            "content-type"
        ] == "application/json"
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(WAIT)
    logged = (
        log.rest() if server == "gunicorn" else process.stderr.read()
    ) + process.stdout.read()
    for raised, answered in STATUSES_RAISED:
        assert logged.count(f"plantstore.HTTPError: the store raised {raised!r}") == (
            answered == 500
        ), raised


# ---- The embedded server, over real sockets ----


@pytest.fixture
def served(store):
    """Start the embedded server on a free loopback port; yield it; always stop it."""
    servers = []

    def start(*, accepting=True, **kwargs):
        server = make_server("127.0.0.1", 0, make_app([TOKEN], store=store), **kwargs)
        server.thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        servers.append(server)
        if accepting:
            server.thread.start()
        return server

    yield start
    for server in servers:
        if server.thread.is_alive():
            server.shutdown()
            server.thread.join(WAIT)
        server.server_close()


def http_post(server, document, headers=None, path="/plants"):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=WAIT)
    try:
        body = json.dumps(document).encode()
        connection.request(
            "POST",
            path,
            body,
            {"Content-Type": "application/json", **AUTH, **(headers or {})},
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def test_embedded_server_creates_a_plant(served, store):
    server = served()
    status, headers, body = http_post(
        server, {"id": 1, "name": "Fern", "tag": "indoor"}
    )
    assert (status, body) == (200, {"name": "Fern", "tag": "indoor"})
    assert headers["Content-Type"] == "application/json"
    assert "Connection" not in headers or headers["Connection"].lower() == "close"
    assert stored(store).get(1) == ("Fern", "indoor")


def test_a_stalled_client_does_not_delay_another(served, store):
    server = served(client_timeout=WAIT * 2)
    with socket.create_connection(server.server_address, timeout=WAIT) as stalled:
        # Promise 100 bytes of body and send 10: the server waits on this one...
        stalled.sendall(raw_request(b'{"id": 1, ', content_length=100))
        # ...while another client is answered in full (its own timeout is well below the
        # server's).
        assert http_post(server, {"id": 2, "name": "Quick"})[0] == 200
    assert stored(store).get(2) == ("Quick", None) and stored(store).get(1) is None


def test_a_stalled_client_is_answered_408_after_the_timeout(served, store):
    server = served(client_timeout=0.3)
    with socket.create_connection(server.server_address, timeout=WAIT) as stalled:
        stalled.sendall(raw_request(b'{"id": 1, ', content_length=100))
        status, body = read_status(stalled)
    assert status == 408 and body["error"] == 408
    assert len(stored(store)) == 0


def test_a_silent_connection_is_closed_after_the_timeout(served):
    server = served(client_timeout=0.3)
    with socket.create_connection(server.server_address, timeout=WAIT) as silent:
        assert silent.recv(100) == b""  # closed by the server, not by our timeout


def test_200_simultaneous_connections_are_all_answered(served, store):
    # Connect all 200 before the server accepts any: they must all fit in the listen
    # backlog (with wsgiref's default of 5, the sixth connect would wait for a SYN retry
    # and time out).
    server = served(accepting=False)
    sockets = []
    try:
        for n in range(200):
            sockets.append(socket.create_connection(server.server_address, timeout=5))
            sockets[-1].sendall(raw_request({"id": n, "name": f"p{n}"}))
        server.thread.start()
        for sock in sockets:
            sock.settimeout(WAIT)
        statuses = [read_status(sock)[0] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert statuses == [200] * 200
    assert len(stored(store)) == 200


def exchange_raw(server, request):
    """Send raw bytes to the embedded server; return the whole answer (it closes the
    connection)."""
    with socket.create_connection(server.server_address[:2], timeout=WAIT) as sock:
        sock.sendall(request)
        return read_raw(sock)


def test_the_embedded_server_sends_no_content_length_on_a_204(served, store):
    store.add(1, "Fern", None)
    answer = exchange_raw(
        served(),
        f"DELETE /plants/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
        f"\r\n\r\n".encode(),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 204") and body == b""
    assert b"content-length" not in head.lower() and b"content-type" not in head.lower()


def test_the_embedded_server_sends_no_body_on_head(served):
    for target, token in [
        ("/plants", TOKEN),
        ("/plants", "wrong-token-of-16ch"),
        ("/nowhere", TOKEN),
    ]:
        answer = exchange_raw(
            served(),
            f"HEAD {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
            f"\r\n\r\n".encode(),
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split()[1] in (b"200", b"401", b"404") and body == b""


def test_head_on_the_embedded_server_has_the_headers_get_has_and_no_content_length_0(
    served, store
):
    store.add(1, "Fern", None)
    server = served()
    answers = [
        exchange_raw(
            server,
            f"{method} /plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{TOKEN}\r\n\r\n".encode(),
        )
        for method in ("GET", "HEAD")
    ]
    (get_head, _, get_body), (head_head, _, head_body) = (
        a.partition(b"\r\n\r\n") for a in answers
    )
    assert json.loads(get_body) == [{"name": "Fern"}] and head_body == b""
    headers = [
        {line.split(b":")[0].lower() for line in h.split(b"\r\n")[1:]} - {b"date"}
        for h in (get_head, head_head)
    ]
    # GET streams: no length
    assert headers[0] == headers[1] and b"content-length" not in headers[1]


def test_the_embedded_server_takes_an_absolute_form_target(served, store):
    body = b'{"id": 1, "name": "Fern"}'
    answer = exchange_raw(
        served(),
        b"POST http://plants.example:8000/plants HTTP/1.1\r\nHost: plants.example\r\n"
        b"Authorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
    )
    assert answer.startswith(b"HTTP/1.0 200") and stored(store) == {1: ("Fern", None)}


def test_the_embedded_server_answers_a_chunked_body_411_not_empty(served, store):
    answer = exchange_raw(
        served(),
        b"POST /plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'19\r\n{"id": 1, "name": "Fern"}\r\n0\r\n\r\n',
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert (
        head.startswith(b"HTTP/1.0 411")
        and json.loads(body)["error"] == 411
        and stored(store) == {}
    )


def test_an_oversized_body_gets_its_413_not_a_reset(served):
    server = served()
    body = body_of_size(4 * MAX_BODY_BYTES)
    with socket.create_connection(server.server_address, timeout=WAIT) as sock:
        sock.sendall(raw_request(body))
        status, answer = read_status(sock)
    assert status == 413 and answer["error"] == 413


def test_broken_http_gets_an_error_json_body_from_the_server(served):
    server = served()
    with socket.create_connection(server.server_address, timeout=WAIT) as sock:
        sock.sendall(b"POST /plants HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        head, _, body = read_raw(sock).partition(b"\r\n\r\n")
    assert (
        head.startswith(b"HTTP/1.0 431") and b"Content-Type: application/json" in head
    )
    assert json.loads(body)["error"] == 431


@pytest.mark.parametrize(
    "request_line, status",
    [
        (b"\x16\x03\x01SECRET\r\n", 400),
        (b"GET /SECRET HTTP/1.1 SECRET\r\n", 400),
        (b"GET /SECRET SECRET/1.1\r\n", 400),
        (b"GET /SECRET HTTP/1.SECRET\r\n", 400),
        (b"SECRET /plants\r\n", 400),
        (b"GET /SECRET HTTP/2.0\r\n", 505),
        (b"GET /SECRET" + b"a" * 70_000 + b" HTTP/1.1\r\n", 414),
    ],
    ids=[
        "one-word",
        "four-words",
        "not-a-version",
        "bad-version-number",
        "http-0.9-not-get",
        "http-2",
        "long-request-line",
    ],
)
def test_the_embedded_server_never_quotes_a_broken_request_line(
    served, request_line, status
):
    """http.server quotes the request line in its error's reason phrase (since 3.13.15
    and 3.14.7 in the status line too): the status's own phrase instead, and Error
    JSON, whatever Python it runs on."""
    answer = exchange_raw(served(), request_line + b"Host: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    phrase = http.HTTPStatus(status).phrase.encode()
    assert head.split(b"\r\n")[0] == b"HTTP/1.0 %d %s" % (status, phrase)
    assert b"Content-Type: application/json" in head
    assert json.loads(body)["error"] == status and b"SECRET" not in answer


def test_log_lines_carry_no_query_string_and_no_token(served, capsys):
    server = served()
    http_post(
        server, {"id": 1, "name": "Fern"}, path="/plants?access_token=SECRET-IN-QUERY"
    )
    http_post(
        server,
        {"id": 2, "name": "Fern"},
        headers={"Authorization": "Bearer WRONG-SECRET"},
    )
    for garbage in (
        b"GARBAGE /SECRET-IN-BAD-LINE?x HTTP/9\r\n\r\n",
        b"\x16\x03\x01SECRET-IN-BAD-LINE\r\n\r\n",
    ):
        # the whole answer: http.server may send the status line and the body apart
        answer = exchange_raw(server, garbage)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0] == b"HTTP/1.0 400 Bad Request"
        assert json.loads(body)["error"] == 400 and b"SECRET" not in answer
    server.shutdown()
    logged = capsys.readouterr().err
    assert '"POST /plants" 200' in logged and '"POST /plants" 401' in logged
    assert "Traceback" not in logged
    for secret in ("SECRET-IN-QUERY", "WRONG-SECRET", "SECRET-IN-BAD-LINE", TOKEN):
        assert secret not in logged


# ---- gunicorn, the production server (a test dependency too) ----


def gunicorn(spawn, env):
    return spawn(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            "1",
            "--threads",
            "8",
            "-b",
            "127.0.0.1:0",
            "plantstore:app",
        ],
        env,
    )


def test_gunicorn_serves_with_plantstore_tokens(spawn):
    process = gunicorn(spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN))
    err = Lines(process.stderr)
    host, port = err.until(r"Listening at: http://([\d.]+):(\d+)").groups()
    err.until(r"Booting worker")
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"}) == (
        200,
        {"name": "Fern"},
    )
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Again"})[0] == 409
    process.send_signal(signal.SIGTERM)
    assert process.wait(WAIT) == 0
    assert TOKEN not in err.rest()


def test_gunicorn_refuses_to_boot_without_tokens(spawn):
    process = gunicorn(spawn, environ_without_tokens())
    assert process.wait(WAIT) != 0
    err = process.stderr.read()
    assert (
        "plantstore: neither PLANTSTORE_TOKENS nor PLANTSTORE_TOKENS_FILE is set" in err
    )
    assert "Traceback" not in err


# ---- nginx in front of gunicorn, with the shipped deploy/nginx.conf ----


@pytest.fixture
def nginx_in_front(spawn, tmp_path):
    """gunicorn -w 1 --threads 8, and nginx before it with deploy/nginx.conf, its ports
    and paths substituted."""
    _, _, gunicorn_port, _ = start_gunicorn(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN)
    )
    port = start_nginx(spawn, tmp_path, [f"127.0.0.1:{gunicorn_port}"])
    return SimpleNamespace(port=port, folder=tmp_path, gunicorn_port=gunicorn_port)


def from_address(source, port):
    """A connection to loopback from another loopback address: nginx counts it as
    another client."""
    sock = socket.create_connection(
        ("127.0.0.1", port), timeout=WAIT, source_address=(source, 0)
    )
    return sock


def still_open(sock):
    """True while the peer has not closed the connection (nothing to read, no end of
    stream)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_nginx_keeps_serving_a_client_while_slow_ones_hold_500_connections(
    nginx_in_front,
):
    port, slow, stop = nginx_in_front.port, [], threading.Event()
    request = raw_request({"id": 0, "name": "never"})
    try:
        # 8 that send one byte and go silent, 500 that trickle their headers
        for _ in range(508):
            slow.append(from_address("127.0.0.2", port))
            slow[-1].sendall(request[:1])

        def trickle():
            for offset in itertools.count(1):
                for sock in slow[8:]:
                    with contextlib.suppress(OSError):
                        sock.sendall(request[offset : offset + 1])
                # bounded: 8 s at most, below nginx's header timeout
                if stop.wait(0.2) or offset > 40:
                    return

        trickler = threading.Thread(target=trickle)
        trickler.start()
        statuses = [
            post_over_http("127.0.0.1", port, TOKEN, {"id": n, "name": f"p{n}"})[0]
            for n in range(1, 21)
        ]
        held = sum(map(still_open, slow))
    finally:
        stop.set()
        for sock in slow:
            sock.close()
    trickler.join(WAIT)
    assert statuses == [200] * 20
    # every create was answered while all the slow connections were still held
    assert held == 508
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": f"p{n}"} for n in range(1, 21)],
    )


def test_nginx_closes_a_stalled_body_without_troubling_gunicorn(spawn, tmp_path):
    """nginx reads the body before gunicorn sees it; a body that stalls never takes a
    gunicorn thread: a create is answered while more stalled bodies wait than gunicorn
    has threads, and each is closed at client_body_timeout.

    nginx never sends the 408 its log records: it closes the connection
    (nginx/nginx#489).

    The test is of the mechanism, not of the shipped 10 s: deploy/nginx.conf's line is
    replaced by one of 3 s, so that the stalled bodies are closed sooner.
    """
    _, _, gunicorn_port, _ = start_gunicorn(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN)
    )
    port = start_nginx(
        spawn,
        tmp_path,
        [f"127.0.0.1:{gunicorn_port}"],
        changed=[("client_body_timeout 10s;", "client_body_timeout 3s;")],
    )
    stalled = []
    try:
        for _ in range(10):  # more than gunicorn's 8 threads
            stalled.append(from_address("127.0.0.2", port))
            stalled[-1].sendall(raw_request(b'{"id": 1, ', content_length=100))
        assert (
            post_over_http("127.0.0.1", port, TOKEN, {"id": 2, "name": "served"})[0]
            == 200
        )
        # answered while every stalled body was held, not once they were closed
        assert sum(map(still_open, stalled)) == 10
        for sock in stalled:  # after client_body_timeout: closed, with no answer
            assert read_raw(sock) == b""
    finally:
        for sock in stalled:
            sock.close()
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": "served"}],
    )
    assert '"POST /plants" 408' in (tmp_path / "access.log").read_text()


def test_nginx_refuses_an_oversized_body_with_its_own_413_in_json(nginx_in_front):
    status, headers, body = exchange(
        "127.0.0.1",
        nginx_in_front.port,
        "POST",
        "/plants",
        {"id": 1, "name": "x" * MAX_BODY_BYTES},
    )
    assert status == 413 and headers["Content-Type"] == "application/json"
    # nginx's
    assert body == {
        "error": 413,
        "message": "request body is larger than 65536 bytes (the proxy)",
    }
    at_the_limit = body_of_size(MAX_BODY_BYTES).decode()
    status, _, body = exchange(
        "127.0.0.1", nginx_in_front.port, "POST", "/plants", json.loads(at_the_limit)
    )
    # the limits agree: what plantstore accepts, nginx lets through
    assert status == 200


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (
            b"GET /plants HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
            431,
        ),
    ],
    ids=["not-http", "long-request-line", "large-header"],
)
def test_nginx_answers_broken_http_in_json(nginx_in_front, request_bytes, status):
    with socket.create_connection(
        ("127.0.0.1", nginx_in_front.port), timeout=WAIT
    ) as sock:
        sock.sendall(request_bytes)
        head, _, body = read_raw(sock).partition(b"\r\n\r\n")
    assert int(head.split()[1]) == status and b"Content-Type: application/json" in head
    assert json.loads(body)["error"] == status


def test_nginx_answers_502_in_json_when_gunicorn_is_gone(nginx_in_front, spawn):
    os.killpg(
        next(p for p in spawn.processes if "gunicorn" in p.args).pid, signal.SIGKILL
    )
    status, headers, body = exchange("127.0.0.1", nginx_in_front.port, "GET", "/plants")
    assert (status, body["error"], headers["Content-Type"]) == (
        502,
        502,
        "application/json",
    )


def test_nginx_keeps_query_strings_out_of_its_access_log(nginx_in_front):
    port = nginx_in_front.port
    assert (
        exchange(
            "127.0.0.1", port, "GET", "/plants?limit=1&access_token=SECRET-IN-QUERY"
        )[0]
        == 200
    )
    # in a malformed request line too
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(
            b"GET /plants?access_token=SECRET-IN-BAD-LINE HTTP/1.1 extra\r\n\r\n"
        )
        read_raw(sock)
    access_log = nginx_in_front.folder / "access.log"
    # nginx writes a request's line once it has sent the answer, not before: a client
    # that reads the file at once may find it without them
    wait_until(
        lambda: access_log.read_text().count("\n") == 2,
        lambda: f"nginx logged {access_log.read_text()!r}, not one line per request",
    )
    logged = access_log.read_text()
    assert '"GET /plants" 200' in logged and " 400 " in logged
    assert "SECRET" not in logged and TOKEN not in logged


def test_nginx_passes_the_client_s_request_id_or_its_own_and_logs_the_one_answered(
    nginx_in_front,
):
    """deploy/nginx.conf's map: the client's X-Request-ID when plantstore would keep it,
    else nginx's $request_id (32 hex digits), sent to gunicorn, answered by plantstore
    and written last in nginx's access log line, an error's (401) too."""
    sent = {  # the id sent (None: none), the token, the status
        "client-chose.this_1": (TOKEN, 200),
        None: (TOKEN, 200),
        "not kept: spaces": (TOKEN, 200),
        "B" * 65: (TOKEN, 200),
        "on.a.401": ("not-the-token-not-the-token", 401),
    }
    answered = []
    for request_id, (token, status) in sent.items():
        got, headers, _ = exchange(
            "127.0.0.1",
            nginx_in_front.port,
            "GET",
            "/plants",
            token=token,
            headers=request_id and {"X-Request-ID": request_id},
        )
        assert got == status
        answered.append(headers["X-Request-ID"])
    assert answered[0] == "client-chose.this_1" and answered[4] == "on.a.401"
    assert all(re.fullmatch("[0-9a-f]{32}", made) for made in answered[1:4]), answered
    assert len(set(answered)) == len(answered)
    access_log = nginx_in_front.folder / "access.log"
    wait_until(
        lambda: access_log.read_text().count("\n") == len(sent),
        lambda: f"nginx logged {access_log.read_text()!r}, not one line per request",
    )
    # each worker of nginx writes its lines once it has answered: in any order
    text = access_log.read_text()
    logged = {line.split()[-1]: line.split()[-4] for line in text.splitlines()}
    assert logged == dict(zip(answered, ["200"] * 4 + ["401"], strict=True))  # $status
    assert "not kept" not in text and "B" * 65 not in text


def test_nginx_logs_its_own_answers_with_the_client_s_method_and_path(
    nginx_in_front, spawn
):
    """An answer of nginx's own, a 413 for a body over the limit and a 502 with
    gunicorn gone, is logged with the method and path of the client's request line and
    the status the client got, not as the error page that made it
    (GET /.plantstore-errors/413); and never with its query string."""
    port, access_log = nginx_in_front.port, nginx_in_front.folder / "access.log"
    too_large = {"id": 1, "name": "x" * MAX_BODY_BYTES}
    sent = [
        ("POST", "/plants?access_token=SECRET-413", too_large, 413),
        ("GET", "/plants?limit=1&access_token=SECRET-502", None, 502),
        ("POST", "/plants?access_token=SECRET-POST-502", {"id": 2, "name": "y"}, 502),
    ]
    for number, (method, path, document, status) in enumerate(sent):
        if number == 1:  # gunicorn gone
            os.killpg(
                next(p for p in spawn.processes if "gunicorn" in p.args).pid,
                signal.SIGKILL,
            )
        assert exchange("127.0.0.1", port, method, path, document)[0] == status
    wait_until(
        lambda: access_log.read_text().count("\n") == len(sent),
        lambda: f"nginx logged {access_log.read_text()!r}, not one line per request",
    )
    text = access_log.read_text()
    # each worker of nginx writes its lines once it has answered: in any order
    logged = sorted(re.findall(r'"([^"]*)" (\d{3}) ', text))
    assert logged == sorted(
        (f"{method} {path.partition('?')[0]}", str(status))
        for method, path, _, status in sent
    ), text
    assert "SECRET" not in text and ".plantstore-errors" not in text, text


# ---- granian, the other production server, with deploy/plantstore-granian.service ----


@pytest.fixture
def granian(spawn):
    """start(store="memory", **settings): granian serving plantstore with the recipe for
    that store."""

    def start(store="memory", **settings):
        return start_granian(
            spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, **settings), store
        )

    return start


def granian_exchange(port, request):
    """Send raw bytes, asking the server to close after its answer; return (status,
    head, body bytes)."""
    head, _, rest = request.partition(b"\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(head + b"\r\nConnection: close\r\n" + rest)
        head, _, body = read_raw(sock).partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode("latin-1").lower(), body


CHUNKED_HEAD = (
    b"POST /plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + TOKEN.encode()
    + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunks(body, pieces):
    """body in Transfer-Encoding: chunked framing, as `pieces` chunks and the last,
    empty one."""
    size = -(-len(body) // pieces)
    return [
        b"%x\r\n%s\r\n" % (len(body[n : n + size]), body[n : n + size])
        for n in range(0, len(body), size)
    ] + [b"0\r\n\r\n"]


def chunked_request(body, pieces=3):
    return CHUNKED_HEAD + b"".join(chunks(body, pieces))


def test_granian_answers_head_without_a_body_and_204_without_a_length(granian):
    port = granian().port
    assert post_over_http("127.0.0.1", port, TOKEN, {"id": 1, "name": "Fern"}) == (
        200,
        {"name": "Fern"},
    )
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for target, status in [
        (b"/plants", 200),
        (b"/plants?limit=1", 200),
        (b"/openapi.json", 200),
        (b"/nowhere", 404),
    ]:
        answer = granian_exchange(
            port, b"HEAD " + target + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
        )
        assert (
            answer[0] == status
            and "content-type: application/json" in answer[1]
            and answer[2] == b""
        )
    status, head, body = granian_exchange(
        port, b"DELETE /plants/1 HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    )
    assert (
        (status, body) == (204, b"")
        and "content-length" not in head
        and "content-type" not in head
    )
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (200, [])


def test_granian_reads_a_chunked_body(granian):
    port = granian().port
    status, _, body = granian_exchange(
        port, chunked_request(b'{"id": 1, "name": "Fern", "tag": "indoor"}')
    )
    assert (status, json.loads(body)) == (200, {"name": "Fern", "tag": "indoor"})
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": "Fern", "tag": "indoor"}],
    )


def test_granian_streams_the_whole_listing(granian, tmp_path):
    count = 2 * plantstore.PAGE_MAX + 500  # three pages
    store = SQLiteStore(tmp_path / "plants.sqlite3")
    for plant_id in range(count):
        store.add(plant_id, f"p{plant_id}", None)
    port = granian(PLANTSTORE_DB=str(tmp_path / "plants.sqlite3")).port
    status, head, body = granian_exchange(
        port,
        f"GET /plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
        f"\r\n\r\n".encode(),
    )
    assert (
        status == 200
        and "transfer-encoding: chunked" in head
        and "content-length" not in head
    )
    body, pieces = dechunk(body)
    assert json.loads(body) == [{"name": f"p{plant_id}"} for plant_id in range(count)]
    assert pieces > 1  # sent as it was made, not gathered first


def dechunk(data):
    """Undo chunked framing; return (the body, how many chunks it came in)."""
    body, chunks = b"", 0
    while True:
        size, _, data = data.partition(b"\r\n")
        size = int(size, 16)
        if not size:
            return body, chunks
        body, data, chunks = body + data[:size], data[size + 2 :], chunks + 1


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_granian_answers_an_oversized_body_413(granian, framing):
    port = granian().port
    body = body_of_size(MAX_BODY_BYTES + 1)
    status, _, answer = granian_exchange(
        port,
        raw_request(body) if framing == "content-length" else chunked_request(body),
    )
    assert (status, json.loads(answer)) == (
        413,
        {
            "error": 413,
            "message": f"request body is larger than {MAX_BODY_BYTES} bytes",
        },
    )
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (200, [])


def test_granian_needs_no_write_callable_nor_a_read_without_size(granian):
    """granian's start_response returns no write(), and its input wants read(size):
    plantstore uses neither.

    Every answer is the iterable the application returns; every body is read with a
    size. So a body of exactly the limit, and a chunked body arriving a chunk at a time,
    are each read whole.
    """
    port = granian().port
    document = json.dumps({"id": 1, "name": "x" * 60_000}).encode()
    at_the_limit = document + b" " * (MAX_BODY_BYTES - len(document))
    status, _, answer = granian_exchange(port, raw_request(at_the_limit))
    assert (status, json.loads(answer)) == (200, {"name": "x" * 60_000})
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(
            CHUNKED_HEAD.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
        )
        for chunk in chunks(
            json.dumps({"id": 2, "name": "n" * 5000, "tag": "slow"}).encode(), 20
        ):
            # the application is reading meanwhile: each read waits for what is still to
            # come
            time.sleep(0.02)
            sock.sendall(chunk)
        assert read_status(sock) == (200, {"name": "n" * 5000, "tag": "slow"})
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": "x" * 60_000}, {"name": "n" * 5000, "tag": "slow"}],
    )


def test_granian_on_sigterm_answers_the_request_in_flight_then_exits_0(granian):
    server = granian()
    with socket.create_connection(
        ("127.0.0.1", server.port), timeout=WAIT
    ) as in_flight:
        in_flight.sendall(
            CHUNKED_HEAD.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
        )
        first, *rest = chunks(b'{"id": 1, "name": "Fern"}', 2)
        # the application is reading the body: the rest comes after the signal
        in_flight.sendall(first)
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        server.log.until("Shutting down granian")
        time.sleep(0.3)
        with pytest.raises(OSError):  # no new connection is accepted meanwhile
            socket.create_connection(("127.0.0.1", server.port), timeout=WAIT).close()
        in_flight.sendall(b"".join(rest))
        assert read_status(in_flight) == (200, {"name": "Fern"})
    assert server.process.wait(WAIT) == 0
    assert "Traceback" not in server.process.stderr.read()


def test_granian_without_tokens_says_so_in_one_line(spawn):
    process = spawn(granian_command("memory"), environ_without_tokens())
    assert process.wait(WAIT) != 0
    err = process.stderr.read()
    said = [line for line in err.splitlines() if "PLANTSTORE_TOKENS" in line]
    assert (
        len(said) == 1
        and "neither PLANTSTORE_TOKENS nor PLANTSTORE_TOKENS_FILE is set" in said[0]
    ), err
    assert "Traceback" not in err, err


def worker_holding(server, sock):
    """The process id of the granian worker that holds the other end of this client's
    connection."""
    # local, remote: as the server sees it
    wanted = f"0100007F:{server.port:04X} 0100007F:{sock.getsockname()[1]:04X}"
    deadline = time.monotonic() + WAIT
    while True:  # a connection still waiting to be accepted has no process, and inode 0
        inode = next(
            line.split()[9]
            for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
            if " ".join(line.split()[1:3]) == wanted
        )
        for pid in server.pids:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(fd) == f"socket:[{inode}]":
                        return pid
        assert time.monotonic() < deadline, "no worker accepted the connection"
        time.sleep(0.01)


def freeze(pid):
    """SIGSTOP the process at a moment it holds no write lock (SQLite's, or plantstore's
    writers' lock file), so that the processes still running are never left waiting for
    one it would hold while stopped."""
    for _ in range(1000):
        os.kill(pid, signal.SIGSTOP)
        held = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
        if not any(fields[3:5] == ["WRITE", str(pid)] for fields in held):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"process {pid} held a write lock each time it was stopped")


def test_granian_runs_the_webhook_sender_in_each_worker(granian, receiver, tmp_path):
    """Two workers on SQLite: with either one frozen, the other's own sender delivers
    what it created."""
    hook = receiver()
    server = granian(
        "sqlite",
        PLANTSTORE_DB=str(tmp_path / "plants.sqlite3"),
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    assert len(server.pids) == 2
    connections, opened = {}, []
    try:
        while len(connections) < 2:  # a kept-alive connection to each worker
            assert len(opened) < 200, "every connection went to one worker"
            opened.append(
                http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
            )
            opened[-1].connect()
            connections.setdefault(worker_holding(server, opened[-1].sock), opened[-1])
        plant_id = 0
        for frozen, serving in [server.pids, server.pids[::-1]]:
            freeze(frozen)
            try:
                for _ in range(5):
                    plant_id += 1
                    connections[serving].request(
                        "POST",
                        "/plants",
                        json.dumps({"id": plant_id, "name": "p"}),
                        {"Content-Type": "application/json", **AUTH},
                    )
                    response = connections[serving].getresponse()
                    assert (response.status, response.read()) == (200, b'{"name": "p"}')
                # delivered while the other worker can do nothing
                deadline = time.monotonic() + WAIT
                while {plant["id"] for plant in hook.delivered()} != set(
                    range(1, plant_id + 1)
                ):
                    assert time.monotonic() < deadline, (
                        f"{hook.delivered()} of {plant_id} came"
                    )
                    time.sleep(0.05)
            finally:
                os.kill(frozen, signal.SIGCONT)
    finally:
        for connection in opened:
            connection.close()
    assert sorted({plant["id"] for plant in hook.delivered()}) == list(range(1, 11))


@pytest.fixture
def many_files():
    """Room for a thousand sockets or more, here and in the servers started meanwhile
    (they inherit it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    assert wanted >= 1100, (
        f"the hard limit on open files ({hard}) leaves no room for "
        f"this test's connections"
    )
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("many_files")
def test_granian_keeps_serving_a_client_while_slow_ones_hold_508_connections(granian):
    """8 connections that sent one byte and went silent, 500 that trickle their headers
    a byte a second: a normal client's creates are each answered within 1 s (the issue's
    bar) meanwhile."""
    port, slow, stop = granian().port, [], threading.Event()
    request = raw_request({"id": 0, "name": "never"})
    try:
        for _ in range(508):
            slow.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT))
            slow[-1].sendall(request[:1])

        def trickle():
            # bounded: a byte a second, 8 s at most, below any header timeout
            for offset in range(1, 9):
                if stop.wait(1):
                    return
                for sock in slow[8:]:
                    with contextlib.suppress(OSError):
                        sock.sendall(request[offset : offset + 1])

        trickler = threading.Thread(target=trickle)
        trickler.start()
        answers = []
        for plant_id in range(1, 21):
            begin = time.monotonic()
            status, body = post_over_http(
                "127.0.0.1", port, TOKEN, {"id": plant_id, "name": f"p{plant_id}"}
            )
            answers.append((status, body, time.monotonic() - begin < 1))
            time.sleep(0.1)  # spread over the trickle's first seconds
        held = sum(map(still_open, slow))
    finally:
        stop.set()
        for sock in slow:
            sock.close()
    trickler.join(WAIT)
    assert answers == [(200, {"name": f"p{n}"}, True) for n in range(1, 21)]
    # every create was answered while all the slow connections were still held
    assert held == 508
    assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants") == (
        200,
        [{"name": f"p{n}"} for n in range(1, 21)],
    )


@pytest.fixture
def nginx_before_granian(spawn, tmp_path):
    """granian with its in-memory recipe, and nginx before it with the shipped
    deploy/nginx.conf."""
    granian_port = start_granian(
        spawn, environ_without_tokens(PLANTSTORE_TOKENS=TOKEN)
    ).port
    return SimpleNamespace(
        port=start_nginx(spawn, tmp_path, [f"127.0.0.1:{granian_port}"])
    )


def test_granian_behind_nginx_is_not_held_up_by_stalled_bodies(nginx_before_granian):
    """Alone, granian gives a request to a Python thread once its headers are in, and
    the thread waits for the body, with no timeout: as many stalled bodies as the
    recipe's blocking threads stop every create. nginx reads each body whole first, so
    through it, more stalled bodies than threads hold up no one."""
    threads = int(
        granian_recipe("memory")[
            granian_recipe("memory").index("--blocking-threads") + 1
        ]
    )
    stalled = []
    try:
        for _ in range(threads + 2):
            stalled.append(
                socket.create_connection(
                    ("127.0.0.1", nginx_before_granian.port), timeout=WAIT
                )
            )
            stalled[-1].sendall(raw_request(b'{"id": 1, ', content_length=100))
        time.sleep(0.5)  # every stalled request is in, as far as it will go
        for plant_id in range(2, 7):
            assert (
                post_over_http(
                    "127.0.0.1",
                    nginx_before_granian.port,
                    TOKEN,
                    {"id": plant_id, "name": "served"},
                )[0]
                == 200
            )
        # answered while every stalled body was held
        assert sum(map(still_open, stalled)) == threads + 2
    finally:
        for sock in stalled:
            sock.close()
    assert over_http(
        "127.0.0.1", nginx_before_granian.port, TOKEN, "GET", "/plants"
    ) == (200, [{"name": "served"}] * 5)


# ---- One file to deploy: dist/plantstore.pyz, and plantstore.py copied alone ----

WHICH_PLANTSTORE = """
import sys
def post_worker_init(worker):
    import plantstore
    print("plantstore from", plantstore.__file__, file=sys.stderr, flush=True)
"""


@pytest.fixture
def pyz_alone(tmp_path):
    """deploy/build_pyz.py's dist/plantstore.pyz, copied into a folder of its own, which
    has no plantstore.py: a path relative to it, and the folder."""
    built = subprocess.run(
        [sys.executable, "deploy/build_pyz.py", str(tmp_path / "dist/plantstore.pyz")],
        cwd=HERE,
        capture_output=True,
        text=True,
        check=True,
    )
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    shutil.copy(built.stdout.strip(), folder)
    return "plantstore.pyz", folder


def test_pyz_alone_serves_the_whole_service_with_python(pyz_alone, spawn, receiver):
    """`python plantstore.pyz`, with no site-packages (-S): an SQLite file, a webhook,
    CORS and the document, all from the .pyz; PostgreSQL names psycopg, not in it."""
    pyz, folder = pyz_alone
    hook = receiver()
    settings = {
        "PLANTSTORE_TOKENS": TOKEN,
        "PLANTSTORE_DB": "plants.sqlite3",
        "PLANTSTORE_WEBHOOK_URL": hook.url,
        "PLANTSTORE_WEBHOOK_SECRET": SECRET,
        "PLANTSTORE_CORS_ORIGINS": "https://example.org",
    }
    which = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path[:0] = ['{pyz}']; "
            "import plantstore, plantstore_app; print(plantstore.__file__, "
            "plantstore_app.__file__)",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    assert which.stdout.split() == [f"{pyz}/plantstore.py", f"{pyz}/plantstore_app.py"]
    process = spawn(
        [sys.executable, "-S", pyz, "--port", "0"],
        environ_without_tokens(**settings),
        cwd=folder,
    )
    host, port = (
        Lines(process.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    )
    origin = {"Origin": "https://example.org"}
    status, headers, body = exchange(
        host, port, "POST", "/plants", {"id": 1, "name": "Fern"}, headers=origin
    )
    assert (status, body) == (200, {"name": "Fern"})
    assert headers["Access-Control-Allow-Origin"] == "https://example.org"
    assert exchange(host, port, "GET", "/openapi.json")[0] == 200
    assert hook.wait_for(1) == [{"id": 1, "name": "Fern"}]
    assert stored_plants(str(folder / "plants.sqlite3")) == {1: "Fern"}
    refused = subprocess.run(
        [sys.executable, "-S", pyz, "--port", "0"],
        cwd=folder,
        env=environ_without_tokens(
            **{**settings, "PLANTSTORE_DB": "postgresql://u:hunter2@127.0.0.1/d"}
        ),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert (refused.returncode, refused.stderr) == (
        2,
        "plantstore: PLANTSTORE_DB names a PostgreSQL database, which needs psycopg: "
        "pip install 'psycopg[binary]' (or '.[postgres]' in plantstore's folder)\n",
    )


def test_pyz_alone_serves_under_gunicorn(pyz_alone, spawn, receiver):
    """gunicorn --pythonpath plantstore.pyz plantstore:app: the workers import
    plantstore from the .pyz, and serve an SQLite file and a webhook."""
    pyz, folder = pyz_alone
    (folder / "which.py").write_text(WHICH_PLANTSTORE)
    hook = receiver()
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB="plants.sqlite3",
        PLANTSTORE_WEBHOOK_URL=hook.url,
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    process = spawn(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "which.py",
            "--pythonpath",
            pyz,
            "-w",
            "2",
            "--threads",
            "4",
            "-b",
            "127.0.0.1:0",
            "plantstore:app",
        ],
        env,
        cwd=folder,
    )
    err = Lines(process.stderr)
    host, port = err.until(r"Listening at: http://([\d.]+):(\d+)").groups()
    assert err.until(r"plantstore from (\S+)")[1] == f"{folder}/{pyz}/plantstore.py"
    for plant_id in range(1, 5):
        assert (
            post_over_http(host, port, TOKEN, {"id": plant_id, "name": "Fern"})[0]
            == 200
        )
    assert sorted(plant["id"] for plant in hook.wait_for(4)) == [1, 2, 3, 4]
    assert stored_plants(str(folder / "plants.sqlite3")) == dict.fromkeys(
        range(1, 5), "Fern"
    )


def test_plantstore_py_copied_alone_serves_the_core_under_gunicorn(tmp_path, spawn):
    """gunicorn plantstore:app in a folder that holds plantstore.py alone: the core,
    from PLANTSTORE_TOKENS; a setting it cannot serve stops gunicorn (status 4, which
    it takes for an app that cannot load), Kubernetes' service links do not."""
    shutil.copy(HERE / "plantstore.py", tmp_path)
    # gunicorn from site-packages, but not plantstore, installed there too: its .pth
    # files are left unread (-S)
    site = sysconfig.get_path("purelib")
    command = [
        sys.executable,
        "-S",
        "-c",
        f"import sys; sys.path.append({site!r}); sys.argv[0] = 'gunicorn'; "
        "from gunicorn.app.wsgiapp import run; run()",
        *("--threads", "4", "-b", "127.0.0.1:0"),
    ]
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, **SERVICE_LINKS)
    process = spawn([*command, "plantstore:app"], env, cwd=tmp_path)
    host, port = (
        Lines(process.stderr).until(r"Listening at: http://([\d.]+):(\d+)").groups()
    )
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"}) == (
        200,
        {"name": "Fern"},
    )
    refused = subprocess.run(
        [*command, "plantstore:app"],
        cwd=tmp_path,
        env={**env, "PLANTSTORE_DB": "plants.sqlite3"},
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert refused.returncode != 0 and (
        "plantstore: PLANTSTORE_DB needs the full service: plantstore_app.py"
        in refused.stderr
    )
    assert "plants.sqlite3" not in os.listdir(tmp_path)


# ---- Issue 57: a log stream that breaks, under each server ----


def serving_on(kind, port):
    """The command that serves plantstore under `kind` on this loopback port, as
    start_a_server starts it (SQLite's recipe for granian)."""
    if kind == "granian":
        return granian_command("sqlite", port)
    if kind == "gunicorn":
        gunicorn = [sys.executable, "-m", "gunicorn", "-w", "2", "--threads", "4"]
        return [*gunicorn, "-b", f"127.0.0.1:{port}", "plantstore:app"]
    return [sys.executable, "plantstore.py", "--port", str(port)]


@contextlib.contextmanager
def broken_stream(stream, folder):
    """A descriptor to give a server for its stderr: a pipe whose reader has gone, or a
    file on a full disk (a tmpfs of its own at folder). The test's copy is closed
    when the block ends."""
    with tmpfs(folder, 1):
        if stream == "closed-pipe":
            reader, broken = os.pipe()
            os.close(reader)
        else:
            fill(folder)
            broken = os.open(folder / "stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            yield broken
        finally:
            os.close(broken)


@pytest.mark.parametrize("stream", ["closed-pipe", "full-disk"])
@pytest.mark.parametrize("kind", ["python-plantstore-py", "gunicorn", "granian"])
def test_a_broken_log_stream_stops_no_start_no_sender_and_changes_no_answer(
    kind, stream, spawn, receiver, tmp_path
):
    """Issue 57's item 5: stderr, where plantstore's lines go, is a pipe whose reader
    has gone or a file on a full disk, from the start. Each line is lost, and nothing
    else: the server starts, creates answer 200, the receiver whose first attempt
    failed (a line) gets every event, and a create while the SQLite file's disk is
    full answers 503 (an outage's line, in the request). In 1.5.0 the start line
    raised, and no server started; once started, the first line raised in the
    sender's thread, which died, or in the request, a 500."""
    hook = receiver()
    hook.statuses = [500]  # a line: the receiver fails, and again when it takes events
    with tmpfs(tmp_path / "db") as db, broken_stream(stream, tmp_path / "log") as err:
        port = free_port()
        retried = first_retry_after(tmp_path / "site", 0.5)  # not 5 s later
        env = environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_DB=str(db / "plants.sqlite3"),
            PLANTSTORE_WEBHOOK_URL=hook.url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            PYTHONPATH=os.pathsep.join([str(retried), str(HERE)]),
        )
        process = spawn(serving_on(kind, port), env, stderr=err)
        wait_listening(process, port)
        for plant_id in range(6):
            plant = {"id": plant_id, "name": f"p{plant_id}"}
            assert post_over_http("127.0.0.1", port, TOKEN, plant)[0] == 200
        # each event delivered and settled: no write of the sender's can fail first
        # and, closing the last connection, free the WAL's room
        outbox = "SELECT count(*) FROM plant_events"
        wait_until(
            lambda: read_database(str(db / "plants.sqlite3"), outbox) == [(0,)],
            lambda: f"delivered: {hook.delivered()}",
        )
        assert {plant["id"] for plant in hook.delivered()} == set(range(6))
        fill(db)
        plant = {"id": 6, "name": "p6"}
        assert post_over_http("127.0.0.1", port, TOKEN, plant)[0] == 503
        assert process.poll() is None


@pytest.mark.parametrize("stream", ["closed-pipe", "full-disk"])
def test_a_made_up_token_that_cannot_be_said_stops_no_start(stream, spawn, tmp_path):
    """Issue 57's item 5, its last edge: with no PLANTSTORE_TOKENS, `python
    plantstore.py` says on stderr the token it made up for the run. With stderr a pipe
    whose reader has gone or a file on a full disk, that line is lost, and the server
    starts all the same, with that token alone: a request without it gets a 401. In
    1.5.0 the start stopped there (and at its first log line too)."""
    with broken_stream(stream, tmp_path / "log") as err:
        port = free_port()
        command = [sys.executable, "plantstore.py", "--port", str(port)]
        process = spawn(command, environ_without_tokens(), stderr=err)
        wait_listening(process, port)
        assert over_http("127.0.0.1", port, TOKEN, "GET", "/plants")[0] == 401
        assert over_http("127.0.0.1", port, None, "GET", "/livez")[0] == 200
        assert process.poll() is None
