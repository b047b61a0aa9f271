"""Tests for the assembly of plantstore.py ("The assembly: settings from the
environment, make_app, `app`, the command line") as a user meets it: `python
plantstore.py` and its command line, the module's `app` built from the environment,
settings that mean what they say and refuse in one line what cannot be served, secrets
that never show, secrets read from files (issue 45) as systemd's units hand them over,
and the file run as a new user runs it, alone in a folder too."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import webtest

import plantstore
import plantstore_webhooks
import plantstore_sqlite
import plantstore_settings
import plantstore_app
from plantstore_sqlite import SQLiteStore
from testbed import (
    HERE,
    SERVICE_LINKS,
    Lines,
    OTHER_TOKEN,
    SECRET,
    SECRET_SPELLINGS,
    TOKEN,
    WAIT,
    assert_secret_kept,
    doc_text,
    environ_without_tokens,
    free_port,
    make_read_only,
    over_http,
    post,
    post_over_http,
    processes_in_group,
    raw_request,
    read_status,
    run_plantstore,
    start_nginx,
    stored_plants,
    wait_listening,
    wait_until,
)


# ---- The command line and the module's configuration ----


def test_python_plantstore_py_prints_a_token_that_works_and_stops_on_ctrl_c(spawn):
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"], environ_without_tokens()
    )
    err = Lines(process.stderr)
    token = err.until(r"accepts one new token: (\S+)")[1]
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    assert host == "127.0.0.1"
    assert post_over_http(
        host, port, token, {"id": 1, "name": "Fern", "tag": "indoor"}
    ) == (200, {"name": "Fern", "tag": "indoor"})
    assert post_over_http(host, port, "not-the-token", {"id": 2, "name": "x"})[0] == 401
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT) == 0
    rest = err.rest()
    assert "Traceback" not in rest
    assert rest.count(token) == 1  # printed once, never logged again


@pytest.mark.parametrize("database", ["memory", "sqlite", "postgres"])
def test_python_plantstore_py_stops_on_ctrl_c_leaving_nothing_open(
    spawn, receiver, tmp_path, request, database
):
    """python -X dev shows a ResourceWarning for a connection or a file left open
    (sqlite3 says so since 3.13): a clean stop leaves none, webhooks on, any store."""
    db = {"memory": None, "sqlite": str(tmp_path / "plants.sqlite3")}.get(database)
    hook = receiver()
    process = spawn(
        [sys.executable, "-X", "dev", "plantstore.py", "--port", "0"],
        environ_without_tokens(
            PLANTSTORE_TOKENS=TOKEN,
            PLANTSTORE_WEBHOOK_URL=hook.url,
            PLANTSTORE_WEBHOOK_SECRET=SECRET,
            **{"PLANTSTORE_DB": db or request.getfixturevalue("pg_url")}
            if database != "memory"
            else {},
        ),
    )
    err = Lines(process.stderr)
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    assert over_http(host, port, TOKEN, "GET", "/plants")[0] == 200
    assert hook.wait_for(1) == [{"id": 1, "name": "Fern"}]
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT) == 0
    rest = err.rest()
    assert "Warning" not in rest and "Traceback" not in rest, rest


STALLED_BODY = b'{"id": 1, "name": "Fern"}'


def a_request_under_way(spawn):
    """python plantstore.py, and a create sent to it but for its body's last 10 bytes:
    (process, its stderr Lines, host, port, the client's socket)."""
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"],
        environ_without_tokens(PLANTSTORE_TOKENS=TOKEN),
    )
    err = Lines(process.stderr)
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    client = socket.create_connection((host, int(port)), timeout=WAIT)
    client.sendall(raw_request(STALLED_BODY)[:-10])
    time.sleep(0.3)  # the request is under way: its last bytes come later
    return process, err, host, port, client


def test_python_plantstore_py_on_sigterm_answers_the_request_in_flight_then_exits_0(
    spawn,
):
    process, err, host, port, in_flight = a_request_under_way(spawn)
    with in_flight:
        process.send_signal(signal.SIGTERM)
        err.until(r"stopping: .* answering those under way \(1\) for 10 s at most")
        with pytest.raises(OSError):  # no new connection is accepted meanwhile
            socket.create_connection((host, int(port)), timeout=WAIT).close()
        in_flight.sendall(STALLED_BODY[-10:])
        assert read_status(in_flight) == (200, {"name": "Fern"})
    assert process.wait(WAIT) == 0 and "Traceback" not in err.rest()


def test_python_plantstore_py_uses_plantstore_tokens(spawn):
    process = spawn(
        [sys.executable, "plantstore.py", "--host", "127.0.0.1", "--port", "0"],
        environ_without_tokens(PLANTSTORE_TOKENS=f" {TOKEN} , {OTHER_TOKEN} "),
    )
    err = Lines(process.stderr)
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    assert post_over_http(host, port, OTHER_TOKEN, {"id": 1, "name": "Fern"}) == (
        200,
        {"name": "Fern"},
    )
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT) == 0
    rest = err.rest()
    assert "new token" not in rest and TOKEN not in rest and OTHER_TOKEN not in rest


def test_python_plantstore_py_reports_a_port_in_use_in_one_line_and_makes_no_file(
    spawn, tmp_path
):
    """The port is taken before the store opens: the SQLite file, its -writers and
    -writers-bell are not made for a start that cannot serve."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = spawn(
            [sys.executable, "plantstore.py", "--port", str(taken.getsockname()[1])],
            environ_without_tokens(
                PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(tmp_path / "p.sqlite3")
            ),
        )
        assert process.wait(WAIT) == 2
    err = process.stderr.read()
    assert err.count("\n") == 1 and "cannot listen on 127.0.0.1" in err, err
    assert list(tmp_path.iterdir()) == []


def test_python_plantstore_py_ends_at_a_second_ctrl_c_a_second_after_the_first(
    spawn,
):
    """The first Ctrl-C stops it gently: it waits for the request under way (a client
    stalls its body here). One that comes with it (a terminal's double press) changes
    nothing; one a second or more later ends the process at once, 130, the request
    cut."""
    process, err, _, _, stalled = a_request_under_way(spawn)
    with stalled:
        process.send_signal(signal.SIGINT)
        err.until(r"answering those under way \(1\)")
        process.send_signal(signal.SIGINT)  # with the first: nothing more
        time.sleep(1.2)
        assert process.poll() is None  # still waiting for the stalled request
        process.send_signal(signal.SIGINT)
        assert process.wait(WAIT) == 130
        try:  # cut, unanswered: closed, or reset if it had bytes unread
            assert stalled.recv(65536) == b""
        except ConnectionResetError:
            pass
    assert "Traceback" not in err.rest()


@pytest.mark.parametrize(
    "settings, said",
    [
        # the README's placeholder, pasted as is
        ({"PLANTSTORE_TOKENS": "..."}, "must be at least 16 characters"),
        ({"PLANTSTORE_TOKENS": "eleven-char"}, "must be at least 16 characters"),
        ({"PLANTSTORE_TOKENS": ",, ,"}, "PLANTSTORE_TOKENS is set but holds no token"),
        (
            {"PLANTSTORE_DB": "{tmp}/missing/plants.sqlite3"},
            "{tmp}/missing: no such directory",
        ),
        (
            {"PLANTSTORE_DB": "{tmp}/locked/plants.sqlite3"},
            "{tmp}/locked: this user cannot write in this directory",
        ),
    ],
    ids=[
        "placeholder-token",
        "short-token",
        "no-token",
        "missing-directory",
        "unwritable-directory",
    ],
)
def test_python_plantstore_py_refuses_a_bad_setting_in_one_line(
    spawn, tmp_path, settings, said
):
    (tmp_path / "locked").mkdir()
    make_read_only(tmp_path / "locked", True)
    try:
        settings = {
            name: value.format(tmp=tmp_path)
            for name, value in {"PLANTSTORE_TOKENS": TOKEN, **settings}.items()
        }
        process = spawn(
            [sys.executable, "plantstore.py", "--port", "0"],
            environ_without_tokens(**settings),
        )
        assert process.wait(WAIT) == 2
    finally:
        make_read_only(tmp_path / "locked", False)
    err = process.stderr.read()
    # one line, saying why
    assert err.splitlines() == [err.strip()] and said.format(tmp=tmp_path) in err
    assert "listening" not in err and "Traceback" not in err and "not set" not in err


def test_version_and_help_name_the_settings(spawn):
    version = spawn(
        [sys.executable, "plantstore.py", "--version"], environ_without_tokens()
    )
    assert (
        version.wait(WAIT) == 0
        and version.stdout.read() == f"plantstore {plantstore.__version__}\n"
    )
    shown = spawn([sys.executable, "plantstore.py", "--help"], environ_without_tokens())
    assert shown.wait(WAIT) == 0
    text = shown.stdout.read()
    assert (
        "PLANTSTORE_TOKENS" in text and "PLANTSTORE_DB" in text and "README.md" in text
    )


def test_import_has_no_side_effects(spawn):
    code = "import plantstore; print('app' in vars(plantstore))"
    process = spawn([sys.executable, "-c", code], environ_without_tokens())
    assert process.wait(WAIT) == 0
    assert process.stdout.read() == "False\n" and process.stderr.read() == ""


def test_app_is_built_from_the_environment(monkeypatch):
    monkeypatch.delitem(vars(plantstore_app), "app", raising=False)
    monkeypatch.setenv("PLANTSTORE_TOKENS", f"{TOKEN},{OTHER_TOKEN}")
    application = plantstore.app
    # built once, then a plain attribute of the full service's
    assert vars(plantstore_app)["app"] is application is plantstore.app
    post(
        webtest.TestApp(application),
        {"id": 1, "name": "Fern"},
        200,
        headers={"Authorization": f"Bearer {OTHER_TOKEN}"},
    )


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "neither PLANTSTORE_TOKENS nor PLANTSTORE_TOKENS_FILE is set"),
        ("", "PLANTSTORE_TOKENS is set but holds no token"),
        (" , ,", "PLANTSTORE_TOKENS is set but holds no token"),
        ("...", "PLANTSTORE_TOKENS: each token must be at least 16 characters"),
    ],
    ids=["unset", "empty", "only-commas", "placeholder"],
)
def test_app_without_tokens_refuses_naming_the_variable(
    monkeypatch, caplog, value, message
):
    """A server that reads `app` gets its line through the logger plantstore, then
    the process's end with status 4, which gunicorn takes for an app that cannot
    load: whatever the server, the same."""
    monkeypatch.delitem(vars(plantstore_app), "app", raising=False)
    monkeypatch.delenv("PLANTSTORE_TOKENS_FILE", raising=False)
    if value is None:
        monkeypatch.delenv("PLANTSTORE_TOKENS", raising=False)
    else:
        monkeypatch.setenv("PLANTSTORE_TOKENS", value)
    with pytest.raises(SystemExit) as ended:
        # the attribute is built when first read: reading it is the test
        _ = plantstore.app
    assert ended.value.code == 4
    [record] = caplog.records
    assert record.name == "plantstore" and record.levelname == "ERROR"
    assert record.getMessage().startswith(message)
    assert "app" not in vars(plantstore_app)  # hasattr() would build it again


def test_unknown_module_attributes_still_raise_attribute_error():
    with pytest.raises(AttributeError):
        _ = plantstore.no_such_thing


# ---- Settings that mean what they say, and secrets that never show ----


@pytest.mark.parametrize(
    "value, path",
    [
        ("plants.db", "plants.db"),
        ("sqlite:///plants.db", "plants.db"),
        ("SQLITE:///plants.db", "plants.db"),
        ("sqlite:///sub/plants.db", "sub/plants.db"),
    ],
)
def test_settings_an_sqlite_file_is_served_where_it_says(
    value, path, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    store = plantstore_settings.store_from_environ({"PLANTSTORE_DB": value})
    assert isinstance(store, plantstore_sqlite.SQLiteStore)
    assert store.name == f"SQLite file {tmp_path / path}"
    assert (tmp_path / path).stat().st_mode & 0o777 == 0o600


REFUSED = [  # PLANTSTORE_DB, words of the one line
    ("mysql://plant:s3cr3t-pw@db.example/plants", "PLANTSTORE_DB takes"),
    ("postgresql+psycopg://plant:s3cr3t-pw@db.example/plants", "PLANTSTORE_DB takes"),
    ("http://plant:s3cr3t-pw@db.example/plants", "PLANTSTORE_DB takes"),
    ("postgresql://plant:s3cr3t-pw%zz@db.example/plants", "%-escape"),
    (
        "postgresql://plant:s3cr3t-pw@db.example/plants?bogus=1",
        "an option libpq does not know",
    ),
    ("host=db.example bogus=1 password=s3cr3t-pw", "an option libpq does not know"),
    ("host=db.example password", "a word without =value"),
    (
        "postgresql://plant:s3cr3t-pw@db.example:notaport/plants",
        "a number from 1 to 65535",
    ),
    (
        "postgresql://plant:s3cr3t-pw@db.example:99999/plants",
        "a number from 1 to 65535",
    ),
    ("postgresql://plant:s3cr3t-pw@db.example:0/plants", "a number from 1 to 65535"),
    ("host=db.example port=s3cr3t-pw", "a number from 1 to 65535"),
    # the host forgotten
    ("postgresql://plant:s3cr3t-pw/plants", "a number from 1 to 65535"),
    ("host=h1,h2,h3 port=5432,5433", "one for every host or one for all"),
    ("file:plants.db?mode=rwc", "unset it to keep the plants in memory"),
    ("FILE:plants.db", "unset it to keep the plants in memory"),
    (":memory:", "unset it to keep the plants in memory"),
    ("sqlite://", "unset it to keep the plants in memory"),
    ("sqlite:///:memory:", "unset it to keep the plants in memory"),
    ("sqlite:///", "unset it to keep the plants in memory"),
    ("sqlite:///plants.db?mode=ro", "PLANTSTORE_DB"),
]


@pytest.mark.parametrize("value, words", REFUSED, ids=[row[0] for row in REFUSED])
def test_settings_a_database_that_cannot_be_served_is_refused_in_one_line(
    value, words, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as refusal:
        plantstore_settings.store_from_environ({"PLANTSTORE_DB": value})
    line = str(refusal.value)
    assert line.startswith("PLANTSTORE_DB") and words in line and "\n" not in line
    assert "plant:" not in line  # no user-info either
    assert_secret_kept(line)
    # nothing chained: libpq's message quotes the value
    assert refusal.value.__cause__ is None
    assert refusal.value.__context__ is None or refusal.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []  # no file named after the setting


WEBHOOKS_REFUSED = [  # user-info, a bad port, a bad host, another scheme, a space
    "https://plant:s3cr3t-pw@example.org/hook",
    "https://@example.org/hook?k=s3cr3t-pw",
    "https://example.org:abc/hook?key=s3cr3t-pw",
    "https://example.org:99999/hook?key=s3cr3t-pw",
    "https://example.org:0/hook?key=s3cr3t-pw",
    "https://[::1/hook?key=s3cr3t-pw",
    "https://exa mple.org/hook?key=s3cr3t-pw",
    "https:///hook?key=s3cr3t-pw",
    "ftp://example.org/hook?key=s3cr3t-pw",
    "example.org/hook?key=s3cr3t-pw",
    "https://example.org/hook?key=s3cr3t pw",
]


@pytest.mark.parametrize("url", WEBHOOKS_REFUSED)
def test_settings_a_webhook_url_never_delivered_is_refused_without_its_secret(url):
    with pytest.raises(ValueError) as refusal:
        plantstore_webhooks.check_webhook_url(url)
    line = str(refusal.value)
    assert "PLANTSTORE_WEBHOOK_URL" in line and "\n" not in line
    assert "example.org" not in line and "s3cr3t" not in line


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/hook?key=s3cr3t-pw",
        "http://127.0.0.1:8080/h",
        "http://[::1]:9000/h",
        "HTTPS://Example.org/Hook",
    ],
)
def test_settings_a_webhook_url_that_can_be_delivered_is_kept_as_written(url):
    assert plantstore_webhooks.check_webhook_url(url) == url


ORIGINS = [  # as written, as a browser sends it
    ("https://Example.ORG", "https://example.org"),
    ("HTTPS://EXAMPLE.ORG:443", "https://example.org"),
    ("http://localhost:80", "http://localhost"),
    ("http://localhost:443", "http://localhost:443"),
    ("https://example.org:80", "https://example.org:80"),
    ("http://localhost:3000", "http://localhost:3000"),
    ("http://[::1]:3000", "http://[::1]:3000"),
]


@pytest.mark.parametrize("written, sent", ORIGINS, ids=[row[0] for row in ORIGINS])
def test_settings_a_cors_origin_is_compared_as_a_browser_sends_it(written, sent):
    application = plantstore_app.make_app(
        [TOKEN], cors_origins=["https://a.example", written]
    )
    app = webtest.TestApp(application)
    answer = app.get(
        "/plants",
        headers={"Authorization": f"Bearer {TOKEN}", "Origin": sent},
        status=200,
    )
    assert answer.headers["Access-Control-Allow-Origin"] == sent


@pytest.mark.parametrize(
    "origin",
    [
        "https://example.org:99999",
        "https://example.org:0",
        "https://example.org:abc",
        "https://example.org/",
        "https://example.org/app",
        "https://example.org?",
        "*",
        "null",
        "example.org",
        "ftp://example.org",
        "https://bücher.example",
        "https://user:pw@example.org",
        "http://[::1",
        "https://exa mple.org",
    ],
)
def test_settings_a_cors_origin_no_browser_sends_is_refused(origin):
    with pytest.raises(
        ValueError,
        match=r"^each origin in PLANTSTORE_CORS_ORIGINS must be one a "
        r"browser sends",
    ):
        plantstore_app.make_app([TOKEN], cors_origins=["https://a.example", origin])


UNKNOWN = [  # variable, the close name suggested (None: none)
    ("PLANTSTORE_DATABASE", "PLANTSTORE_DB"),
    ("PLANTSTORE_DB_URL", "PLANTSTORE_DB"),
    ("PLANTSTORE_DATABASE_URL", "PLANTSTORE_DB"),
    ("PLANTSTORE_TOKEN", "PLANTSTORE_TOKENS"),
    ("PLANTSTORE_WEBHOOK_URLS", "PLANTSTORE_WEBHOOK_URL"),
    ("PLANTSTORE_CORS_ORIGIN", "PLANTSTORE_CORS_ORIGINS"),
    ("plantstore_db", "PLANTSTORE_DB"),
    ("PLANTSTORE_FOO", None),
    ("PLANTSTORE_LOG_LEVEL", None),
]


@pytest.mark.parametrize("name, close", UNKNOWN, ids=[row[0] for row in UNKNOWN])
def test_settings_an_unknown_plantstore_variable_is_named_never_its_secret(name, close):
    environ = {
        name: "s3cr3t-pw",
        "PLANTSTORE_DB": "",
        "HOME": "/root",
        "PLANTSTORE_TOKENS": TOKEN,
    }
    refusal = plantstore.unknown_setting(environ)
    assert refusal == f"{name} is not a plantstore setting" + (
        f": did you mean {close}?" if close else ""
    )
    assert_secret_kept(refusal)
    with pytest.raises(ValueError) as refused:
        plantstore_app.app_from_environ(environ)
    assert str(refused.value) == refusal


# ---- Secrets from files (issue 45) ----

# The settings that may be read from a file, NAME_FILE, and a secret of each that must
# never show: a token, a webhook secret, a database URL with a password.
FILE_SECRETS = {
    "PLANTSTORE_TOKENS": "file-token-9-Zq3Vx7Lm2Kp",
    "PLANTSTORE_WEBHOOK_SECRET": SECRET,
    "PLANTSTORE_DB": "postgresql://plant:s3cr3t-pw@127.0.0.1:1/plants",
}


def secret_file(path, content):
    """Write content (text, or bytes as they are) to path, its owner's alone."""
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(0o600)
    return path


def without_dac_override():
    """The command prefix under which root, too, is refused a file its mode refuses: no
    capability to override file permissions (util-linux's setpriv). None needed for
    other users."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv is missing: apt-get install util-linux"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def make_bad_file(kind, name, path, env):
    """Make path the bad file `kind` for the setting `name`, set {name}_FILE to it in
    env; return what the one line says of it."""
    env[f"{name}_FILE"] = str(path)
    secret = FILE_SECRETS[name]
    if kind == "both-ways":  # the file is fine, and the variable is set too
        secret_file(path, secret + "\n")
        env[name] = secret
        return "both"
    if kind == "missing":
        return "cannot be read: No such file or directory"
    if kind == "empty":
        secret_file(path, "")
        return "is empty"
    if kind == "unreadable":
        secret_file(path, secret + "\n").chmod(0)
        return "cannot be read: Permission denied"
    if kind == "folder":
        path.mkdir()
        return "cannot be read: Is a directory"
    if kind == "not-utf-8":
        secret_file(path, b"\xff\xfe" + secret.encode() + b"\n")
        return "is not UTF-8 text"
    if kind == "1-gib":  # sparse: no disk spent, and none of it may be read whole
        secret_file(path, secret + "\n")
        os.truncate(path, 2**30)
        return "is over 64 KiB, more than any setting"
    assert kind == "an-sqlite-database"
    with contextlib.closing(sqlite3.connect(path)) as database:
        database.execute("CREATE TABLE plants (id INTEGER PRIMARY KEY)")
        database.commit()
    return f"is an SQLite database: set {name} to its path instead"


FILE_REFUSALS = [
    (name, kind)
    for name in FILE_SECRETS
    for kind in [
        "both-ways",
        "missing",
        "empty",
        "unreadable",
        "folder",
        "not-utf-8",
        "1-gib",
    ]
] + [("PLANTSTORE_DB", "an-sqlite-database")]


def refused_settings(tmp_path, name, kind):
    """The environment of a start that the file of `name` stops, the other settings
    good; the command prefix it needs; what the line says; the path."""
    path = tmp_path / name.lower().removeprefix("plantstore_")
    env = environ_without_tokens()
    if name != "PLANTSTORE_TOKENS":
        env["PLANTSTORE_TOKENS"] = TOKEN
    said = make_bad_file(kind, name, path, env)
    prefix = without_dac_override() if kind == "unreadable" else []
    return env, prefix, said, path


def assert_refused_in_one_line(err, name, path, said):
    """Each line that names the setting is the same one line: the setting, the path and
    the reason, and no secret."""
    lines = {line for line in err.splitlines() if name in line or str(path) in line}
    assert len(lines) == 1, err
    [line] = lines
    assert f"{name}_FILE" in line and str(path) in line and said in line, err
    assert "Traceback" not in err, err
    for secret in FILE_SECRETS.values():
        assert secret not in err and secret.removeprefix("whsec_") not in err
    assert_secret_kept(err)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    "tokens, line_end",
    [(f"{TOKEN}\r\n{OTHER_TOKEN}\r\n", "\r\n"), (f"{TOKEN},{OTHER_TOKEN}\n", "\n")],
    ids=["one-a-line-crlf", "comma-separated"],
)
def test_secrets_python_plantstore_py_reads_each_setting_from_its_file(
    spawn, tmp_path, receiver, request, database, tokens, line_end
):
    """Tokens one a line or comma-separated, the webhook secret and the database's
    address, each from its file and its last line end dropped (a whsec_ secret with
    \\r\\n left on would not decode); none of them shown."""
    hook = receiver()
    if database == "postgres":
        db, password = (
            request.getfixturevalue("pg_url"),
            request.getfixturevalue("postgres").password,
        )
        shown = f"plants in PostgreSQL {db.replace(':' + password, '')}"
    else:
        db, password = str(tmp_path / "plants.sqlite3"), None
        shown = f"plants in SQLite file {db}"
    process = spawn(
        [sys.executable, "plantstore.py", "--port", "0"],
        environ_without_tokens(
            PLANTSTORE_TOKENS_FILE=str(secret_file(tmp_path / "tokens", tokens)),
            PLANTSTORE_WEBHOOK_SECRET_FILE=str(
                secret_file(tmp_path / "webhook-secret", SECRET + line_end)
            ),
            PLANTSTORE_DB_FILE=str(secret_file(tmp_path / "db", db + line_end)),
            PLANTSTORE_WEBHOOK_URL=hook.url,
        ),
    )
    err = Lines(process.stderr)
    host, port = err.until(r"listening on http://([\d.]+):(\d+)/plants").groups()
    for plant_id, token in [(1, TOKEN), (2, OTHER_TOKEN)]:
        assert post_over_http(host, port, token, {"id": plant_id, "name": "Fern"}) == (
            200,
            {"name": "Fern"},
        )
    assert post_over_http(host, port, FILE_SECRETS["PLANTSTORE_TOKENS"], {})[0] == 401
    # the receiver verifies each signature with SECRET
    assert sorted(hook.wait_for(2), key=lambda plant: plant["id"]) == [
        {"id": 1, "name": "Fern"},
        {"id": 2, "name": "Fern"},
    ]  # in any order: a sender has up to PER_URL attempts under way at once
    assert stored_plants(db) == {1: "Fern", 2: "Fern"}
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT) == 0
    said = err.rest() + process.stdout.read()
    assert shown in said and "new token" not in said and "Traceback" not in said
    for secret in TOKEN, OTHER_TOKEN, SECRET, SECRET.removeprefix("whsec_"), password:
        assert not secret or secret not in said


@pytest.mark.parametrize(
    "name, kind", FILE_REFUSALS, ids=[f"{n[11:]}-{k}" for n, k in FILE_REFUSALS]
)
def test_secrets_python_plantstore_py_refuses_a_bad_file_in_one_line(
    spawn, tmp_path, name, kind
):
    env, prefix, said, path = refused_settings(tmp_path, name, kind)
    process = spawn([*prefix, sys.executable, "plantstore.py", "--port", "0"], env)
    assert process.wait(WAIT) == 2
    err = process.stderr.read()
    assert err.count("\n") == 1 and process.stdout.read() == ""
    assert_refused_in_one_line(err, name, path, said)


@pytest.mark.parametrize(
    "name, kind", FILE_REFUSALS, ids=[f"{n[11:]}-{k}" for n, k in FILE_REFUSALS]
)
def test_secrets_gunicorn_prints_the_same_line_and_stops_booting_no_worker_again(
    spawn, tmp_path, name, kind
):
    """As deploy/plantstore.service runs it, -w 1: the master stops with 4, "App failed
    to load", which its RestartPreventExitStatus= lists."""
    env, prefix, said, path = refused_settings(tmp_path, name, kind)
    process = spawn(
        [*prefix, sys.executable, "-m", "gunicorn", "-w", "1", "--threads", "8"]
        + ["-b", "127.0.0.1:0", "plantstore:app"],
        env,
    )
    assert process.wait(WAIT) == 4
    err = process.stderr.read()
    assert err.count("Booting worker") == 1, err
    assert_refused_in_one_line(err, name, path, said)


# python plantstore.py, run so that the process says the most memory it ever held:
# VmHWM, its own peak, for ru_maxrss carries over the peak of pytest (its parent) that
# the exec replaced
PEAK_MEMORY = (
    "import runpy, sys\n"
    "sys.argv = ['plantstore.py', '--port', '0']\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "finally:\n"
    "    status = open('/proc/self/status').read()\n"
    "    print(status.split('VmHWM:')[1].split()[0], flush=True)\n"
)


@pytest.mark.parametrize(
    "name, header, said",
    [
        ("PLANTSTORE_DB", b"SQLite format 3\0", "is an SQLite database"),
        ("PLANTSTORE_TOKENS", b"", "is over 64 KiB"),
    ],
)
def test_secrets_a_file_of_a_gib_is_refused_having_read_64_kib(
    tmp_path, name, header, said
):
    """A setting's file is read 64 KiB at most: a 1 GiB one (a database named where
    its address should be, a log given by mistake) is refused at once, the process
    holding no more than Python's own and a little (read whole, it took 2 GiB)."""
    path = tmp_path / "big"
    path.write_bytes(header)
    os.truncate(path, 2**30)
    env = {**environ_without_tokens(), f"{name}_FILE": str(path)}
    if name != "PLANTSTORE_TOKENS":
        env["PLANTSTORE_TOKENS"] = TOKEN
    ran = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr == f"plantstore: {name}_FILE: {path} {said}" + (
        f": set {name} to its path instead\n" if header else ", more than any setting\n"
    )
    assert int(ran.stdout) < 200 * 1024, f"{ran.stdout} KiB at most"


def test_secrets_a_fifo_that_no_one_writes_is_refused_within_its_bound(
    tmp_path, monkeypatch
):
    """A FIFO named by mistake, that no one will write, holds the start up
    SETTING_FILE_SECONDS at most (5 s; shortened here), then is refused in a line."""
    monkeypatch.setattr(plantstore_settings, "SETTING_FILE_SECONDS", 0.3)
    fifo = tmp_path / "tokens"
    os.mkfifo(fifo)
    environ = {"PLANTSTORE_TOKENS_FILE": str(fifo)}
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        plantstore_settings.setting(environ, "PLANTSTORE_TOKENS")
    assert time.monotonic() - started < WAIT
    assert str(refused.value) == (
        f"PLANTSTORE_TOKENS_FILE: {fifo} gave nothing to read within 0.3 s"
    )


@pytest.mark.parametrize("given", ["bash-process-substitution", "kubernetes-secret"])
def test_secrets_a_pipe_and_a_mounted_secret_are_read(spawn, tmp_path, given):
    """bash's <(pass show ...) is a pipe, read as its writer writes it (a moment
    late here); Kubernetes mounts a secret as a symlink, through ..data, to a file."""
    env = environ_without_tokens(TEST_TOKEN=TOKEN)
    if given == "kubernetes-secret":
        (tmp_path / "..2026_11_27").mkdir()
        secret_file(tmp_path / "..2026_11_27" / "tokens", TOKEN + "\n")
        (tmp_path / "..data").symlink_to("..2026_11_27")
        (tmp_path / "tokens").symlink_to("..data/tokens")
        command = f"PLANTSTORE_TOKENS_FILE={tmp_path}/tokens"
    else:  # the token from the environment, never on a command line
        command = 'PLANTSTORE_TOKENS_FILE=<(sleep 0.5; printf "%s\\n" "$TEST_TOKEN")'
    process = spawn(
        ["bash", "-c", f"{command} exec {sys.executable} plantstore.py --port 0"], env
    )
    host, port = (
        Lines(process.stderr).until(r"listening on http://([\d.]+):(\d+)/").groups()
    )
    assert (
        over_http(host, port, TOKEN, "POST", "/plants", {"id": 1, "name": "F"})[0]
        == 200
    )


def test_secrets_a_tokens_file_with_a_byte_order_mark_is_read(tmp_path):
    """Notepad saves UTF-8 with a byte-order mark first: no part of the token."""
    path = secret_file(tmp_path / "tokens", "\ufeff" + TOKEN + "\r\n")
    assert plantstore_settings.tokens_from_environ(
        {"PLANTSTORE_TOKENS_FILE": str(path)}
    ) == [TOKEN]


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("PLANTSTORE_TOKENS", "short\n", ": each token must be at least 16 characters"),
        ("PLANTSTORE_DB", "postgresql://u:s3cr3t-pw@h:x/db", ": each port must be"),
        ("PLANTSTORE_WEBHOOK_SECRET", "whsec_short", " must be whsec_ followed by"),
    ],
)
def test_secrets_a_refused_value_read_from_a_file_names_the_file(
    tmp_path, name, content, said
):
    path = secret_file(tmp_path / "setting", content)
    env = {**environ_without_tokens(), f"{name}_FILE": str(path)}
    if name != "PLANTSTORE_TOKENS":
        env["PLANTSTORE_TOKENS"] = TOKEN
    if name == "PLANTSTORE_WEBHOOK_SECRET":
        env["PLANTSTORE_WEBHOOK_URL"] = "http://hooks.example/"
    ran = subprocess.run(
        [sys.executable, "plantstore.py", "--port", "0"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(f"plantstore: {name}_FILE ({path}){said}"), ran.stderr
    assert_secret_kept(ran.stderr)


@pytest.mark.parametrize(
    "name", ["PLANTSTORE_TOKENS", "PLANTSTORE_DB", "PLANTSTORE_WEBHOOK_SECRET"]
)
def test_secrets_a_setting_given_both_ways_is_refused_naming_each_way_once(
    tmp_path, name
):
    path = secret_file(tmp_path / "setting", "value\n")
    environ = {"PLANTSTORE_TOKENS": TOKEN, name: "value", f"{name}_FILE": str(path)}
    with pytest.raises(ValueError) as refusal:
        plantstore_app.app_from_environ(environ)
    said = str(refusal.value)
    assert "both set" in said and said.count(str(path)) == 1, said
    assert sorted(re.findall(rf"{name}\w*", said)) == [name, f"{name}_FILE"], said


def test_secrets_gunicorn_with_two_workers_stops_on_a_bad_file_booting_each_once(
    spawn, tmp_path
):
    """-w 2, as deploy/plantstore.service says for SQLite and PostgreSQL: both workers
    fail, and gunicorn's master stops with 4, or with 1 and a traceback of its own when
    the second failure comes while it is stopping (its HaltServer raised again in
    halt()). The unit's RestartPreventExitStatus= lists both."""
    env, prefix, said, path = refused_settings(tmp_path, "PLANTSTORE_DB", "folder")
    process = spawn(
        [sys.executable, "-m", "gunicorn", "-w", "2", "--threads", "4"]
        + ["-b", "127.0.0.1:0", "plantstore:app"],
        env,
    )
    status = process.wait(WAIT)
    err = process.stderr.read()
    assert status in {1, 4} and status in restart_prevented("plantstore.service"), err
    assert err.count("Booting worker") == 2, err
    assert "plantstore.py" not in err  # gunicorn's own traceback, if any: not ours
    lines = {line for line in err.splitlines() if "PLANTSTORE_DB" in line}
    assert lines == {f"plantstore: PLANTSTORE_DB_FILE: {path} {said}"}, err


@pytest.mark.parametrize("server", ["python plantstore.py", "gunicorn"])
@pytest.mark.parametrize("given", ["variable", "file"])
def test_secrets_a_refused_token_with_an_sqlite_path_leaves_no_file(
    spawn, tmp_path, server, given
):
    short = "eleven-char"
    tokens = (
        {"PLANTSTORE_TOKENS": short}
        if given == "variable"
        else {"PLANTSTORE_TOKENS_FILE": str(secret_file(tmp_path / "tokens", short))}
    )
    (tmp_path / "data").mkdir()
    env = environ_without_tokens(
        PLANTSTORE_DB=str(tmp_path / "data" / "p.sqlite3"), **tokens
    )
    command = {
        "python plantstore.py": [sys.executable, "plantstore.py", "--port", "0"],
        "gunicorn": [sys.executable, "-m", "gunicorn", "-b", "127.0.0.1:0"]
        + ["plantstore:app"],
    }[server]
    process = spawn(command, env)
    assert process.wait(WAIT) == (2 if server == "python plantstore.py" else 4)
    err = process.stderr.read()
    assert "at least 16 characters" in err and short not in err
    # neither p.sqlite3 nor p.sqlite3-writers
    assert list((tmp_path / "data").iterdir()) == []


@pytest.mark.parametrize("server", ["python plantstore.py", "gunicorn"])
def test_kubernetes_service_links_never_stop_a_start_and_a_typo_still_does(
    spawn, server
):
    """Audit item 1: a Service named plantstore (or plantstore-db) makes the kubelet set
    PLANTSTORE_PORT, PLANTSTORE_DB_SERVICE_HOST, ... in every pod of its namespace;
    1.5.0 refused them, and every pod crash-looped. They pass; PLANTSTORE_DB_URL, a
    typo of a setting, is refused as before, under either server."""
    command = {
        "python plantstore.py": [sys.executable, "plantstore.py", "--port", "0"],
        # one worker: with two, a refusal may stop gunicorn with 1 rather than 4
        "gunicorn": [sys.executable, "-m", "gunicorn", "-w", "1", "--threads", "4"]
        + ["--no-control-socket", "-b", "127.0.0.1:0", "plantstore:app"],
    }[server]
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, **SERVICE_LINKS)
    err = Lines(spawn(command, env).stderr)
    host, port = err.until(
        r"(?:listening on|Listening at:) http://([\d.]+):(\d+)"
    ).groups()
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    typo = spawn(command, {**env, "PLANTSTORE_DB_URL": "plants.sqlite3"})
    assert typo.wait(WAIT) == (2 if server == "python plantstore.py" else 4)
    assert (
        "plantstore: PLANTSTORE_DB_URL is not a plantstore setting: did you mean "
        "PLANTSTORE_DB?"
    ) in typo.stderr.read()


# The keys a request's environ may hold: CGI's meta-variables (RFC 3875, 4.1), the
# request's headers as HTTP_*, and PEP 3333's wsgi.* keys.
CGI_VARIABLES = {
    "AUTH_TYPE",
    "CONTENT_LENGTH",
    "CONTENT_TYPE",
    "GATEWAY_INTERFACE",
    "PATH_INFO",
    "PATH_TRANSLATED",
    "QUERY_STRING",
    "REMOTE_ADDR",
    "REMOTE_HOST",
    "REMOTE_IDENT",
    "REMOTE_USER",
    "REQUEST_METHOD",
    "SCRIPT_NAME",
    "SERVER_NAME",
    "SERVER_PORT",
    "SERVER_PROTOCOL",
    "SERVER_SOFTWARE",
}
PEP_3333_REQUIRED = {
    "REQUEST_METHOD",
    "SCRIPT_NAME",
    "PATH_INFO",
    "QUERY_STRING",
    "CONTENT_TYPE",
    "CONTENT_LENGTH",
    "SERVER_NAME",
    "SERVER_PORT",
    "SERVER_PROTOCOL",
    "HTTP_AUTHORIZATION",
    "wsgi.version",
    "wsgi.url_scheme",
    "wsgi.input",
    "wsgi.errors",
    "wsgi.multithread",
    "wsgi.multiprocess",
    "wsgi.run_once",
}
# Each prints the keys of every request's environ, one JSON line on stdout. An app of
# its own, served by make_server:
SPY_ON_MAKE_SERVER = """
import json, plantstore_server
def spy(environ, start_response):
    print(json.dumps(sorted(environ)), flush=True)
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b"{}"]
server = plantstore_server.make_server("127.0.0.1", 0, spy)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
# python plantstore.py itself, run as __main__, each request seen on its way to the app:
SPY_ON_PLANTSTORE_PY = """
import json, runpy, sys, wsgiref.handlers
run = wsgiref.handlers.BaseHandler.run
def spying(handler, application):
    def spy(environ, start_response):
        print(json.dumps(sorted(environ)), flush=True)
        return application(environ, start_response)
    return run(handler, spy)
wsgiref.handlers.BaseHandler.run = spying
sys.argv = ["plantstore.py", "--port", "0"]
runpy.run_path("plantstore.py", run_name="__main__")
"""


@pytest.mark.parametrize(
    "served", ["make_server", "python plantstore.py", "plantstore.py alone"]
)
def test_secrets_the_embedded_server_hands_a_request_none_of_the_process_environment(
    spawn, served, tmp_path
):
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN, SECRET_X="hush-s3cr3t-pw", SERVER_X="on"
    )
    if served == "make_server":
        process = spawn([sys.executable, "-c", SPY_ON_MAKE_SERVER], env)
        out = Lines(process.stdout)
        port = int(out.until(r"^(\d+)$")[1])
    else:  # alone: the core's own server, with no module beside it nor site-packages
        alone = served.endswith("alone") and shutil.copy(
            HERE / "plantstore.py", tmp_path
        )
        command = [
            sys.executable,
            *(["-S"] if alone else []),
            "-c",
            SPY_ON_PLANTSTORE_PY,
        ]
        process = spawn(command, env, cwd=tmp_path if alone else HERE)
        out, err = Lines(process.stdout), Lines(process.stderr)
        port = int(err.until(r"listening on http://[\d.]+:(\d+)")[1])
    assert post_over_http("127.0.0.1", port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    out.until(r"^\[")
    keys = set(json.loads(out.seen[-1]))
    assert not keys & set(env), sorted(keys & set(env))
    assert "SECRET_X" not in keys and "PLANTSTORE_TOKENS" not in keys
    assert all(
        key in CGI_VARIABLES or key.startswith(("HTTP_", "wsgi.")) for key in keys
    ), sorted(keys)
    assert PEP_3333_REQUIRED <= keys, sorted(PEP_3333_REQUIRED - keys)


def test_secrets_help_names_the_file_settings(spawn):
    shown = spawn([sys.executable, "plantstore.py", "--help"], environ_without_tokens())
    assert shown.wait(WAIT) == 0
    text = shown.stdout.read()
    for name in FILE_SECRETS:
        assert f"  {name}_FILE" in text, text


@pytest.mark.parametrize(
    "name, close",
    [
        ("PLANTSTORE_TOKEN_FILE", "PLANTSTORE_TOKENS_FILE"),
        ("PLANTSTORE_DATABASE_FILE", "PLANTSTORE_DB_FILE"),
        ("PLANTSTORE_WEBHOOK_SECRETS_FILE", "PLANTSTORE_WEBHOOK_SECRET_FILE"),
    ],
)
def test_secrets_a_misspelt_file_setting_is_named_with_the_one_it_may_mean(name, close):
    environ = {name: "/etc/plantstore/s3cr3t-pw", "PLANTSTORE_TOKENS": TOKEN}
    for known in FILE_SECRETS:
        environ[f"{known}_FILE"] = "/etc/plantstore/x"
    assert plantstore.unknown_setting(environ) == (
        f"{name} is not a plantstore setting: did you mean {close}?"
    )


def test_secrets_python_plantstore_py_refuses_plantstore_token_file(tmp_path):
    """A misspelt setting stops the start, though PLANTSTORE_TOKENS would serve: the
    operator meant the file, and a start on the variable would not be what they set."""
    path = secret_file(tmp_path / "tokens", TOKEN)
    code, lines = run_plantstore(tmp_path, PLANTSTORE_TOKEN_FILE=str(path))
    assert (code, lines) == (
        2,
        [
            "plantstore: PLANTSTORE_TOKEN_FILE is not a plantstore setting: "
            "did you mean PLANTSTORE_TOKENS_FILE?\n"
        ],
    )


# The systemd units, as systemd would start them (it is not running here: no PID 1 of
# its own), and as systemd-analyze verify reads them.

UNITS = ["plantstore.service", "plantstore-granian.service"]
# what an operator puts in /etc/plantstore/tokens; systemd copies it to %d/tokens
UNIT_TOKEN = "unit-token-4-Hs8Qw2Zx6Rt"


def unit_text(name, every_secret=False, two_workers=False):
    """The unit as shipped; every_secret: its CHANGE lines for the database's and the
    webhook's secrets uncommented; two_workers: with its ExecStart for SQLite."""
    text = (HERE / "deploy" / name).read_text()
    if every_secret:
        text, count = re.subn(
            r"^#((?:LoadCredential|Environment)=)", r"\1", text, flags=re.M
        )
        assert count == 4, f"deploy/{name}: its commented credentials changed"
    if two_workers:
        if name == "plantstore.service":  # as its CHANGE comment says
            changed = text.replace("-w 1 --threads 8 ", "-w 2 --threads 4 ")
        else:
            sqlite = re.search(r"^# SQLite: (ExecStart=.*)$", text, re.M)[1]
            changed = re.sub(r"^ExecStart=.*$", sqlite, text, count=1, flags=re.M)
        assert changed != text, f"deploy/{name}: its ExecStart changed"
        text = changed
    return text


def unit_settings(text, section="[Service]"):
    """A section of a unit: {setting: [each value, in order]}."""
    settings, current = {}, None
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line
        elif line and line[0] not in "#;" and current == section:
            name, _, value = line.partition("=")
            settings.setdefault(name.strip(), []).append(value.strip())
    return settings


def restart_prevented(name):
    """The exit statuses after which systemd does not restart the unit."""
    settings = unit_settings(unit_text(name))
    assert settings["Restart"] == ["on-failure"]  # any other status is restarted
    return {
        int(status)
        for line in settings.get("RestartPreventExitStatus", [])
        for status in line.split()
    }


def required_sockets(text):
    """The .socket units (of deploy/) the unit requires."""
    required = " ".join(unit_settings(text, "[Unit]").get("Requires", [])).split()
    return [name for name in required if name.endswith(".socket")]


def unit_socket(text):
    """The socket of a .socket unit the unit requires, listening as systemd holds it
    (its ListenStream=, on a free port); None for a unit that requires none."""
    names = required_sockets(text)
    if not names:
        return None
    [name] = names
    [address] = unit_settings((HERE / "deploy" / name).read_text(), "[Socket]")[
        "ListenStream"
    ]
    host, _, port = address.rpartition(":")
    assert port == "8000", address
    listening = socket.socket()
    listening.bind((host, 0))
    listening.listen(socket.SOMAXCONN)
    return listening


def start_unit(
    spawn,
    folder,
    text,
    credentials,
    environment_file="",
    *,
    held=None,
    home=None,
):
    """Run the unit's ExecStart as systemd would hand it its settings: a clean
    environment with its Environment= and EnvironmentFile=, the files of its
    LoadCredential= copied into a credentials directory (%d), its WorkingDirectory, and
    the socket of the .socket unit it requires as fd 3 (LISTEN_FDS): `held`, kept open
    across restarts as systemd keeps it, or a new one. The paths of the unit are under
    `folder`, as a root; /opt/plantstore/bin is this venv's, and the port a free one.
    credentials: {id: what the operator's file holds}. As root, its HOME the state
    directory, as the recipe's useradd makes it, or `home`.

    The answer has the process, its port, the credentials directory, the socket a
    Type=notify service tells it is ready on, and the socket it was handed."""
    import shlex  # here, not at the top: this section is one block

    def root(path):
        return folder / path.lstrip("/")

    settings = unit_settings(text)
    creds = folder / "run" / "credentials" / "unit"
    shutil.rmtree(creds, ignore_errors=True)  # made anew at each start
    creds.mkdir(parents=True)
    loaded = {}
    for line in settings.get("LoadCredential", []):
        credential, _, source = line.partition(":")
        # the operator's file, where the unit's comments say, root's alone
        assert source in text.split("[Unit]")[0], f"the unit's comments miss {source}"
        root(source).parent.mkdir(parents=True, exist_ok=True)
        secret_file(root(source), credentials[credential])
        shutil.copyfile(root(source), creds / credential)
        (creds / credential).chmod(0o400)  # systemd's: read-only, the service's alone
        loaded[credential] = root(source)
    assert set(loaded) == set(credentials), f"the unit loads {sorted(loaded)}"
    creds.chmod(0o500)
    state = root("/var/lib") / settings["StateDirectory"][0]
    state.mkdir(parents=True, exist_ok=True)
    assert settings["WorkingDirectory"] == [f"/var/lib/{state.name}"]
    env = {  # what systemd gives every service, and what its settings add
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
        "LANG": "C.UTF-8",
        "HOME": str(home or state),
        "CREDENTIALS_DIRECTORY": str(creds),
        "STATE_DIRECTORY": str(state),
    }
    for line in settings.get("Environment", []):
        for assignment in shlex.split(line):
            name, _, value = assignment.partition("=")
            assert not re.search(r"%[^d%]", value), f"a specifier to add: {value}"
            env[name] = re.sub(
                "%[d%]", lambda s: str(creds) if s[0] == "%d" else "%", value
            )
    for path in settings.get("EnvironmentFile", []):
        root(path.lstrip("-")).parent.mkdir(parents=True, exist_ok=True)
        secret_file(root(path.lstrip("-")), environment_file)
        for line in environment_file.splitlines():
            if line.strip() and not line.startswith(("#", ";")):
                name, _, value = line.partition("=")
                env[name.strip()] = value.strip()
    # /opt/plantstore has plantstore installed from this folder: this venv has it
    # installed too, perhaps from another checkout; this folder's comes first
    env["PYTHONPATH"] = str(HERE)
    notify = None
    if settings.get("Type") == ["notify"]:  # systemd waits for READY=1
        notify = notify_socket(folder)
        env["NOTIFY_SOCKET"] = notify.getsockname()
    [command] = settings["ExecStart"]
    argv = shlex.split(command)
    assert argv[0].startswith("/opt/plantstore/bin/"), argv[0]
    argv[0] = str(Path(sys.executable).parent / Path(argv[0]).name)
    argv = [shutil.which("env"), "-C", str(state), *argv]
    ports = [
        n for n, word in enumerate(argv) if re.fullmatch(r"(127.0.0.1:)?8000", word)
    ]
    held = held or unit_socket(text)
    if held:
        assert not ports, f"the unit binds a port of its own: {argv}"
        argv, port = handing(held, argv), held.getsockname()[1]
        env["LISTEN_FDS"] = "1"
    else:
        assert len(ports) == 1, argv
        port = free_port()
        argv[ports[0]] = argv[ports[0]].replace("8000", str(port))
    process = spawn(argv, env, pass_fds=(held.fileno(),) if held else ())
    return SimpleNamespace(
        process=process, port=port, creds=creds, notify=notify, held=held
    )


def notify_socket(folder):
    """systemd's NOTIFY_SOCKET, made anew at each start, on which a Type=notify service
    says READY=1."""
    (folder / "notify").unlink(missing_ok=True)  # the last start's
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(folder / "notify"))
    notify.settimeout(WAIT)
    return notify


def handing(held, argv):
    """The command argv, run so that it gets the socket `held` as systemd hands a
    socket to a service: as fd 3, with LISTEN_PID the process id it runs as."""
    fd = held.fileno()
    handed = f"exec 3<&{fd} {fd}<&-\n" if fd != 3 else ""
    return ["bash", "-c", handed + 'LISTEN_PID=$$ exec "$@"', "bash", *argv]


def ready(service):
    """Wait for the service to say it is ready, as systemctl start waits for READY=1
    of a Type=notify service; a Type=exec one, until it listens."""
    if service.notify:
        assert service.notify.recv(4096).startswith(b"READY=1")
        service.notify.close()
    wait_listening(service.process, service.port)


def stop_unit(service):
    """systemctl stop, as KillMode=mixed does it: SIGTERM to the main process, then,
    once it has exited, SIGKILL to every process left. Return its exit status."""
    service.process.send_signal(signal.SIGTERM)
    status = service.process.wait(WAIT)
    if processes_in_group(service.process.pid):
        os.killpg(service.process.pid, signal.SIGKILL)
    return status


@pytest.mark.parametrize(
    "every_secret", [False, True], ids=["as-shipped", "every-secret"]
)
@pytest.mark.parametrize("unit", UNITS)
def test_secrets_each_unit_serves_with_its_credentials_as_systemd_hands_them(
    spawn, tmp_path, request, receiver, unit, every_secret
):
    credentials, environment_file, password = {"tokens": UNIT_TOKEN + "\n"}, "", None
    if every_secret:
        hook, postgres = receiver(), request.getfixturevalue("postgres")
        pg_url, password = request.getfixturevalue("pg_url"), postgres.password
        credentials |= {"db": pg_url + "\n", "webhook-secret": SECRET + "\n"}
        environment_file = f"PLANTSTORE_WEBHOOK_URL={hook.url}\n"
    service = start_unit(
        spawn, tmp_path, unit_text(unit, every_secret), credentials, environment_file
    )
    ready(service)
    wait_listening(service.process, service.port)
    created = post_over_http(
        "127.0.0.1", service.port, UNIT_TOKEN, {"id": 1, "name": "Fern"}
    )
    assert created == (200, {"name": "Fern"})
    assert (
        post_over_http("127.0.0.1", service.port, TOKEN, {"id": 2, "name": "x"})[0]
        == 401
    )
    if every_secret:
        assert hook.wait_for(1) == [{"id": 1, "name": "Fern"}]
        assert stored_plants(pg_url) == {1: "Fern"}
    assert stop_unit(service) == 0
    said = service.process.stdout.read() + service.process.stderr.read()
    for secret in UNIT_TOKEN, SECRET, SECRET.removeprefix("whsec_"), password:
        assert not secret or secret not in said
    assert "Traceback" not in said


@pytest.mark.parametrize(
    "two_workers", [False, True], ids=["as-shipped", "two-workers"]
)
@pytest.mark.parametrize("unit", UNITS)
def test_secrets_each_unit_is_not_restarted_after_a_bad_credential(
    spawn, tmp_path, unit, two_workers
):
    """The tokens' file made (install -m 600 /dev/null) and never written: the start
    stops in one line, with a status the unit's RestartPreventExitStatus= lists."""
    text = unit_text(unit, two_workers=two_workers)
    service = start_unit(spawn, tmp_path, text, {"tokens": ""})
    status = service.process.wait(WAIT)
    if service.notify:
        service.notify.close()
    said = service.process.stdout.read() + service.process.stderr.read()
    assert status != 0 and status in restart_prevented(unit), (status, said)
    assert f"PLANTSTORE_TOKENS_FILE: {service.creds}/tokens is empty" in said, said
    # gunicorn -w 2 may add a traceback of its own (its HaltServer, above); never ours
    gunicorn_halted_twice = two_workers and unit == "plantstore.service"
    assert "plantstore.py" not in said
    assert "Traceback" not in said or gunicorn_halted_twice, said


@pytest.mark.parametrize(
    "every_secret", [False, True], ids=["as-shipped", "every-secret"]
)
@pytest.mark.parametrize("unit", UNITS)
def test_secrets_systemd_analyze_verifies_each_unit(tmp_path, unit, every_secret):
    analyze = shutil.which("systemd-analyze")
    assert analyze, (
        "systemd-analyze is missing: apt-get install systemd (.ci/run does it)"
    )
    # its command must exist: this venv's, for /opt/plantstore's
    text = unit_text(unit, every_secret).replace(
        "/opt/plantstore/bin/", f"{Path(sys.executable).parent}/"
    )
    (tmp_path / unit).write_text(text)
    sockets = required_sockets(text)
    for name in sockets:  # beside it, as it requires them, and verified with it
        shutil.copy(HERE / "deploy" / name, tmp_path)
    done = subprocess.run(
        [
            analyze,
            "verify",
            str(tmp_path / unit),
            *(str(tmp_path / s) for s in sockets),
        ],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_keeps_the_in_memory_plants_at_a_reload(spawn, tmp_path, unit):
    """systemctl reload of each unit as shipped, the in-memory store: systemd runs its
    ExecReload= with $MAINPID (a unit without one refuses the reload, and nothing runs),
    and the workers it replaces are waited out. Every plant is still listed (gunicorn's
    HUP made a new worker, and an empty store: issue 57)."""
    import shlex  # this section's

    text = unit_text(unit)
    service = start_unit(spawn, tmp_path, text, {"tokens": UNIT_TOKEN + "\n"})
    ready(service)
    address = "127.0.0.1", service.port
    for plant_id in range(10):
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http(*address, UNIT_TOKEN, document)[0] == 200
    main = service.process.pid
    workers = set(processes_in_group(main)) - {main}
    for command in unit_settings(text).get("ExecReload", []):
        subprocess.run(
            shlex.split(command.replace("$MAINPID", str(main))),
            check=True,
            timeout=WAIT,
        )
        wait_until(
            lambda: not workers & set(processes_in_group(main)),
            "the reload's old workers are still there",
        )
    status, plants = over_http(*address, UNIT_TOKEN, "GET", "/plants")
    assert (status, len(plants)) == (200, 10), plants
    assert stop_unit(service) == 0


def test_the_gunicorn_unit_makes_no_control_socket_in_its_home(spawn, tmp_path):
    """deploy/plantstore.service twice, with one HOME (one user's two instances), and
    once with a HOME that cannot be written: gunicorn 27 makes its control socket in
    $HOME/.gunicorn, one path for both, and says [ERROR] at each start where it cannot.
    Each serves; none makes anything in HOME, or says an error."""
    home = tmp_path / "home"
    home.mkdir()
    text = unit_text("plantstore.service")
    services = [
        start_unit(spawn, tmp_path / name, text, {"tokens": UNIT_TOKEN + "\n"}, home=at)
        for name, at in [("one", home), ("two", home), ("three", Path("/dev/null"))]
    ]
    for service in services:
        ready(service)
        document = {"id": 1, "name": "Fern"}
        assert post_over_http("127.0.0.1", service.port, UNIT_TOKEN, document)[0] == 200
    for service in services:  # gunicorn stops its control socket first, if it has one
        assert stop_unit(service) == 0
        said = service.process.stdout.read() + service.process.stderr.read()
        assert "[ERROR]" not in said and "control socket" not in said.lower(), said
    assert not list(home.iterdir()), list(home.iterdir())


def test_gunicorn_logging_conf_where_it_says_is_read_by_the_unit_s_user(
    spawn, tmp_path
):
    """deploy/gunicorn-logging.conf installed where its first line says, with
    /etc/plantstore root's alone as the recipe makes it: an unprivileged user, as User=
    runs the unit, reads it (1.5.0's first line named a path in /etc/plantstore, and
    gunicorn exited 1); the unit's ExecStart given --log-config as its comment says
    serves, its start line stamped. The unit's comment and docs/deploy.md name the
    same path."""
    conf = (HERE / "deploy" / "gunicorn-logging.conf").read_text()
    path = re.search(r"--log-config (/\S+)", conf.splitlines()[0])[1]
    named = [
        found[1].rstrip(",")
        for text in [unit_text("plantstore.service"), doc_text("docs/deploy.md")]
        for found in re.finditer(r"(?:--log-config|gunicorn-logging.conf) (/\S+)", text)
    ]
    root = Path(tempfile.mkdtemp(prefix="plantstore-unit-"))  # nobody enters it
    try:
        root.chmod(0o755)
        (root / "etc" / "plantstore").mkdir(parents=True, mode=0o700)
        installed = root / path.lstrip("/")
        shutil.copyfile(HERE / "deploy" / "gunicorn-logging.conf", installed)
        installed.chmod(0o644)  # as the recipe's install -m 644
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        read = subprocess.run(
            [*nobody, "cat", installed], capture_output=True, text=True, timeout=WAIT
        )
        assert read.stdout == conf, read.stderr
        text = re.sub(
            r"^(ExecStart=.*) plantstore:app$",
            rf"\1 --log-config {installed} plantstore:app",
            unit_text("plantstore.service"),
            flags=re.M,
        )
        service = start_unit(spawn, tmp_path, text, {"tokens": UNIT_TOKEN + "\n"})
        stamped = r"^\[\d{4}-\d\d-\d\d [\d:]+ [+-]\d{4}\] \[\d+\] \[INFO\] plantstore: "
        Lines(service.process.stderr).until(stamped + "version")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    document = {"id": 1, "name": "Fern"}
    assert post_over_http("127.0.0.1", service.port, UNIT_TOKEN, document)[0] == 200
    assert stop_unit(service) == 0
    assert set(named) == {path}, named


NEW_TOKEN = "unit-token-5-Vb3Nm7Kq1Ws"  # the token a rotation brings in


def rotation_steps():
    """docs/deploy.md's token rotation, checked to be the steps the test takes in turn:
    the tokens' file edited (the new token added), a restart, clients moved, the file
    edited (the old one removed), a restart. Return the block."""
    block = re.search(
        r"<!-- token rotation -->\n```sh\n(.*?)```\n",
        (HERE / "docs" / "deploy.md").read_text(),
        re.S,
    )
    assert block, "docs/deploy.md has no token rotation: update this test"
    steps = [
        re.sub(r"\s+#\s*", " # ", line).split(" # ")[0] + (" add" * ("add" in line))
        for line in block[1].splitlines()
        if not line.startswith("#")
    ]
    edit, restart = (
        "sudoedit /etc/plantstore/tokens",
        "sudo systemctl restart plantstore",
    )
    assert steps == [f"{edit} add", restart, edit, restart], steps
    return block[1]


def test_tokens_rotate_as_deploy_md_says_with_no_401_and_no_502(spawn, tmp_path):
    """docs/deploy.md's rotation under deploy/plantstore.service (gunicorn -w 2,
    SQLite) behind nginx, while clients send GETs and creates with each token: no
    answer but 200 and 401, none a 502; the new token gets no 401 once the restart that
    brings it in returns, the old one none before the restart that takes it out, and
    only 401s once that returns. systemd held the socket across each restart, so that
    requests sent while no gunicorn ran waited and were answered; every create
    answered 200 is in the file."""
    rotation_steps()
    text = unit_text("plantstore.service", two_workers=True)
    database = tmp_path / "var" / "lib" / "plantstore" / "plants.sqlite3"
    settings = f"PLANTSTORE_DB={database}\n"

    def start(*tokens, held=None):
        tokens = {"tokens": "".join(f"{token}\n" for token in tokens)}
        service = start_unit(spawn, tmp_path, text, tokens, settings, held=held)
        ready(service)  # systemctl returns
        returned, err = time.monotonic(), Lines(service.process.stderr)
        # each of the 2 workers built its app, so has its signal handlers: gunicorn
        # loses a SIGTERM that comes between a worker's fork and them, and that worker
        # serves on until the graceful timeout (30 s) kills it
        for _ in range(2):
            err.until(r"plantstore: version")
        return service, returned

    service, _ = start(UNIT_TOKEN)
    (tmp_path / "nginx").mkdir()
    port = start_nginx(spawn, tmp_path / "nginx", [f"127.0.0.1:{service.port}"])
    answers, stop = [], threading.Event()  # each: token, sent, answered, status, id
    tokens = {UNIT_TOKEN: "old", NEW_TOKEN: "new"}

    def client(token, plant_id):
        while not stop.is_set():
            sent, plant_id = time.monotonic(), plant_id + 1
            try:
                if plant_id % 2:
                    listing = "GET", "/plants?limit=1"
                    status = over_http("127.0.0.1", port, token, *listing)[0]
                else:
                    document = {"id": plant_id, "name": "Fern"}
                    status = post_over_http("127.0.0.1", port, token, document)[0]
            except OSError as error:
                status = repr(error)
            answers.append((tokens[token], sent, time.monotonic(), status, plant_id))

    def answered(token, after):
        return sum(a[0] == token and a[1] > after for a in answers)

    clients = [
        threading.Thread(target=client, args=(token, n * 10**6))
        for n, token in enumerate([*tokens] * 2)
    ]
    for thread in clients:
        thread.start()
    try:
        began = time.monotonic()
        wait_until(lambda: answered("new", began) >= 10, "no answers")
        restarts = []
        for kept in (UNIT_TOKEN, NEW_TOKEN), (NEW_TOKEN,):  # each edit, then restart
            stopping = time.monotonic()
            assert stop_unit(service) == 0
            stopped = time.monotonic()
            service, returned = start(*kept, held=service.held)
            restarts.append((stopping, stopped, returned))
            wait_until(lambda at=returned: answered("old", at) >= 10, "no answers")
    finally:
        stop.set()
        for thread in clients:
            thread.join(WAIT)
    assert stop_unit(service) == 0
    (_, _, brought_in), (taking_out, _, taken_out) = restarts

    def wrong(token, sent, done, status, _):
        return (
            status not in (200, 401)
            or (token == "new" and sent > brought_in and status != 200)
            or (token == "old" and done < taking_out and status != 200)
            or (token == "old" and sent > taken_out and status != 401)
        )

    # what went wrong, and when, in seconds from the start, as the restarts
    timeline = [[round(at - began, 3) for at in restart] for restart in restarts]
    said = [
        (token, round(sent - began, 3), round(done - began, 3), status)
        for token, sent, done, status, _ in answers
        if wrong(token, sent, done, status, _)
    ]
    assert not said, f"{said} (restarts: {timeline})"
    # a request under way while no gunicorn answered, which waited for the next one
    assert any(
        sent < returned and done > stopped
        for _, sent, done, _, _ in answers
        for _, stopped, returned in restarts
    ), timeline
    created = {a[4] for a in answers if a[3] == 200 and a[4] % 2 == 0}
    assert created and created <= set(stored_plants(str(database))), "creates lost"


# ---- python plantstore.py, as a new user runs it ----


MORE_REFUSED = {
    "mysql": "mysql://plant:s3cr3t-pw@h/plants",
    "notaport": "POSTGRESQL://plant:s3cr3t-pw@127.0.0.1:notaport/plants",
    "option": "postgresql://plant:s3cr3t-pw@h/plants?bogus=1",
    "sqlite-memory": "sqlite:///:memory:",
    "file": "file:plants.db?mode=rwc",
}


@pytest.mark.parametrize(
    "value",
    [*SECRET_SPELLINGS.values(), *MORE_REFUSED.values()],
    ids=[*SECRET_SPELLINGS, *MORE_REFUSED],
)
def test_settings_python_plantstore_py_never_shows_the_password(tmp_path, value):
    # served: no DNS look-up of db.example, a refused loopback port
    if "db.example" in value:
        value = value.replace("db.example", "127.0.0.1").replace("5432", "1")
    code, lines = run_plantstore(tmp_path, PLANTSTORE_DB=value)
    said = "".join(lines)
    assert_secret_kept(said)
    assert "Traceback" not in said
    # no file named after the setting
    assert [path.name for path in tmp_path.iterdir()] == []
    if code is not None:
        assert code == 2 and len(lines) <= 2 and "PLANTSTORE_DB" in said
    else:
        assert "plants in PostgreSQL postgresql://plant@127.0.0.1:1/plants" in said


def test_settings_python_plantstore_py_names_its_sqlite_file(tmp_path):
    code, lines = run_plantstore(tmp_path, PLANTSTORE_DB="sqlite:///plants.db")
    said = "".join(lines)
    assert code is None and f"plants in SQLite file {tmp_path}/plants.db" in said
    assert (tmp_path / "plants.db").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "name", ["PLANTSTORE_DATABASE", "PLANTSTORE_DB_URL", "PLANTSTORE_DATABASE_URL"]
)
def test_settings_a_misspelt_db_stops_the_start_before_any_file(tmp_path, name):
    """PLANTSTORE_DATABASE=plants.sqlite3 served from memory in 1.4.0, every plant
    gone at the next restart: now the start stops, exit 2, with the name it meant,
    and makes no file; the value, which may hold a password, is never said."""
    code, lines = run_plantstore(tmp_path, **{name: "postgresql://u:s3cr3t-pw@h/db"})
    meant = "PLANTSTORE_DB"
    assert (code, lines) == (
        2,
        [f"plantstore: {name} is not a plantstore setting: did you mean {meant}?\n"],
    )
    assert list(tmp_path.iterdir()) == []


def test_settings_sqlite_files_are_readable_by_their_owner_alone_whatever_the_umask(
    tmp_path,
):
    previous = os.umask(0o022)
    try:
        store = SQLiteStore(tmp_path / "plants.sqlite3")
        assert store.add(1, "Fern", None)  # a write: the -wal and -shm files exist now
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()}
    assert {"plants.sqlite3", "plants.sqlite3-wal", "plants.sqlite3-shm"} <= set(modes)
    assert set(modes.values()) == {0o600}
