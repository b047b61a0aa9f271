"""Tests for /metrics, plantstore.py's "Metrics: what an operator watches, for
Prometheus" (issue 46): the token, Prometheus's text format as prometheus_client reads
it, each receiver's backlog by its origin, whether the database answers (within its
bound while another process holds the SQLite file), the same backlog from every worker,
a 1.3.0 SQLite file upgraded at start; Debian's prometheus scraping it, and promtool
running docs/operations.md's alert rules; the docs' table of the metrics; and the
request id the answer carries. PostgreSQL's cases are test_plantstore_postgres.py's."""

import contextlib
import io
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import webtest
from prometheus_client.parser import text_string_to_metric_families

import plantstore
import plantstore_sql
import plantstore_cors
from plantstore_accelerators import ChunkedStore
from plantstore_app import make_app
from plantstore_sqlite import SQLiteStore
from testbed import (
    AUTH,
    HERE,
    KEPT_IDS,
    OUTAGE_HEALTH_BOUND,
    REPLACED_IDS,
    SECRET,
    SQLITE_FILE_HOLDER,
    SQLITE_LOCKER,
    TOKEN,
    WAIT,
    answered_ids,
    assert_error,
    call,
    doc_table,
    environ_without_tokens,
    free_port,
    plantstore_1_3_0,
    post,
    post_over_http,
    prometheus_binary,
    prometheus_query,
    read_database,
    read_metrics,
    rolled_back_to_1_3_0_and_forward,
    same_backlog_from_every_worker,
    scrape,
    sqlite_held,
    start_gunicorn,
    start_prometheus,
    wait_apps_built,
    wait_until,
)


# ---- Metrics for Prometheus (issue 46) ----
#
# GET /metrics, with the token: what is true of the whole service, read from the store
# every worker shares, in Prometheus's text format 0.0.4, bounded like /health.

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FAMILIES = {  # each with its HELP and TYPE lines, and the label of its series
    "plantstore_info": "version",
    "plantstore_database_up": None,
    "plantstore_webhook_events_waiting": "receiver",
    "plantstore_webhook_events_failing": "receiver",
    "plantstore_webhook_oldest_event_age_seconds": "receiver",
}


def write_events(path, events):
    """Events straight into the outbox, as senders leave them: (url, attempts,
    created), created None as 1.3.0 writes it, each due in a year: no sender of the
    test's touches them."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executemany(
            "INSERT INTO plant_events (url, webhook_id, body, attempts, next_at,"
            f" created) VALUES (?, 'msg_x', x'7b7d', ?, {time.time() + 3e7}, ?)",
            events,
        )


def counted(path, urls):
    """make_app on the SQLite file, sending to the urls (figures are its sender's)."""
    return make_app(
        [TOKEN], store=SQLiteStore(path), webhook_urls=urls, webhook_secret=SECRET
    )


def test_metrics_need_the_token_and_answer_prometheus_s_text_format(app):
    for headers in {}, {"Authorization": f"Bearer {'not-the-token-' * 2}"}:
        refused = app.get("/metrics", headers=headers, status=401)
        assert_error(refused, 401)
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "plantstore_" not in refused.text
    answer = app.get("/metrics", headers=AUTH, status=200)
    assert answer.headers["Content-Type"] == METRICS_TYPE
    assert int(answer.headers["Content-Length"]) == len(answer.body)
    assert answer.text.endswith("\n")
    assert app.head("/metrics", headers=AUTH, status=200).body == b""
    read = {f.name: f for f in text_string_to_metric_families(answer.text)}
    assert FAMILIES.keys() <= read.keys()
    for name, family in read.items():
        assert family.type == "gauge" and family.documentation, name
        assert f"# HELP {name} {family.documentation}\n" in answer.text
        assert f"# TYPE {name} gauge\n" in answer.text
    assert [s.labels for s in read["plantstore_info"].samples] == [
        {"version": plantstore.__version__}
    ]
    values = read_metrics(answer.text)
    assert values["plantstore_info"] == {plantstore.__version__: 1}
    assert values["plantstore_database_up"] == 1
    assert "receiver=" not in answer.text  # no webhook: no receiver


def test_metrics_count_each_receiver_s_waiting_and_failing_events_and_the_oldest_s_age(
    tmp_path,
):
    path = tmp_path / "plants.sqlite3"
    urls = [
        "http://a.example:8080/hook",
        "http://a.example:8080/other?key=SECRET-IN-QUERY",
        "https://b.example/hook",
    ]
    served = counted(path, urls)
    application = webtest.TestApp(served)
    now = time.time()
    write_events(
        path,
        [
            ("http://a.example:8080/hook", 0, now - 3600),
            ("http://a.example:8080/hook", 2, now - 60),
            ("http://a.example:8080/other?key=SECRET-IN-QUERY", 1, now - 10),
            ("http://a.example:8080/hook", 0, None),  # 1.3.0's, after a rollback
            ("https://b.example/hook", 0, None),
            ("https://b.example/hook", 3, None),
        ],
    )
    text = application.get("/metrics", headers=AUTH, status=200).text
    read = read_metrics(text)
    asked = time.time()
    assert read["plantstore_database_up"] == 1
    assert read["plantstore_webhook_events_waiting"] == {
        "http://a.example:8080": 4,  # its two URLs add up, 1.3.0's event counted
        "https://b.example": 2,
    }
    assert read["plantstore_webhook_events_failing"] == {
        "http://a.example:8080": 2,
        "https://b.example": 1,
    }
    ages = read["plantstore_webhook_oldest_event_age_seconds"]
    assert 3600 - 0.001 <= ages["http://a.example:8080"] <= asked - now + 3600 + 0.001
    assert ages["https://b.example"] == 0  # none of its events has a creation time
    assert "SECRET" not in text and "/hook" not in text and "/other" not in text
    served.webhook_sender.close()


@pytest.mark.parametrize(
    "url, origin",
    [
        ("http://hooks.example/in?token=secret", "http://hooks.example"),
        ("http://hooks.example:80/in", "http://hooks.example"),
        ("https://hooks.example:443/in", "https://hooks.example"),
        ("https://hooks.example:8443/in", "https://hooks.example:8443"),
        ("http://[::1]:8080/in", "http://[::1]:8080"),
        ("http://[::1]/in", "http://[::1]"),
    ],
)
def test_a_receiver_is_named_by_its_origin_as_a_browser_would_write_it(url, origin):
    """One origin, one series: the scheme's own port is left out, an IPv6 host keeps
    its brackets, and no path or query shows (they may hold a secret)."""
    assert plantstore_cors.receiver_origin(url) == origin


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_metrics_name_a_receiver_by_its_origin_alone_and_add_up_the_urls_of_one(
    kind, tmp_path, receiver
):
    """Configured receivers show 0 before any event; two URLs of one origin, one with a
    secret in its query, are one series; a receiver that got its events shows 0."""
    down, live = free_port(), receiver()  # no one listens on `down`: its events wait
    urls = [
        f"http://127.0.0.1:{down}/plant/webhook?token=SECRET-IN-QUERY",
        f"http://127.0.0.1:{down}/other/path",
        live.url,
    ]
    store = ChunkedStore() if kind == "memory" else SQLiteStore(tmp_path / "p.sqlite3")
    served = make_app([TOKEN], store=store, webhook_urls=urls, webhook_secret=SECRET)
    application = webtest.TestApp(served)
    origins = f"http://127.0.0.1:{down}", live.url.removesuffix("/plant/webhook")

    def read():
        text = application.get("/metrics", headers=AUTH, status=200).text
        assert "SECRET" not in text and "token" not in text and "/plant" not in text
        assert "/other" not in text
        return read_metrics(text)

    try:
        assert read()["plantstore_webhook_events_waiting"] == dict.fromkeys(origins, 0)
        for plant_id in range(3):
            post(application, {"id": plant_id, "name": f"plant {plant_id}"}, 200)
        live.wait_for(3)
        expected = dict(zip(origins, (6, 0), strict=True))  # 2 URLs, 3 events each
        wait_until(
            lambda: read()["plantstore_webhook_events_waiting"] == expected,
            lambda: f"not {expected} waiting: {read()}",
        )
        ages = read()["plantstore_webhook_oldest_event_age_seconds"]
        assert ages[origins[0]] > 0 and ages[origins[1]] == 0
    finally:
        served.webhook_sender.close()


def test_metrics_cost_the_health_check_and_one_query_of_the_outbox_no_plant(tmp_path):
    path = tmp_path / "plants.sqlite3"
    urls = [f"http://{n}.example/hook" for n in range(5)]
    served = counted(path, urls)
    store, application = served.store, webtest.TestApp(served)
    write_events(path, [(url, n, time.time()) for n, url in enumerate(urls)])
    ran, execute = [], store.execute

    def recorded(db, sql, parameters, deadline):
        if threading.current_thread() is scraper:  # not the sender's own
            ran.append(sql)
        return execute(db, sql, parameters, deadline)

    store.execute, scraper = recorded, threading.current_thread()
    read = read_metrics(application.get("/metrics", headers=AUTH, status=200).text)
    served.webhook_sender.close()
    assert len(read["plantstore_webhook_events_waiting"]) == 5
    asked = [sql for sql in ran if "plant_events" in sql and "url" in sql]
    assert ran[0] == "SELECT 1" and "plants " not in " ".join(ran) + " ", ran
    assert asked[0].startswith("SELECT ") and "plant_event_counts" in asked[0], ran


@pytest.mark.parametrize("held", ["a-write-transaction", "the-file-from-readers-too"])
def test_metrics_sqlite_held_by_another_process_answer_200_within_2_5_s(
    held, spawn, tmp_path
):
    """Another process's exclusive transaction leaves WAL's readers be: the scrape
    counts; one that holds the file in exclusive locking mode stops reads too: the
    scrape says the database is down. Each answers 200 within 2.5 s."""
    holder, up = {  # SQLITE_LOCKER: testbed.py's, the outages'
        "a-write-transaction": (SQLITE_LOCKER, 1),
        "the-file-from-readers-too": (SQLITE_FILE_HOLDER, 0),
    }[held]
    path = tmp_path / "plants.sqlite3"
    SQLiteStore(path)  # the tables, then events waiting for a receiver
    write_events(path, [("http://hooks.example/a", 0, time.time())] * 3)
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(path))
    if up:  # a sender, to count them; none holds a connection that the holder waits on
        env |= {
            "PLANTSTORE_WEBHOOK_URL": "http://hooks.example/a",
            "PLANTSTORE_WEBHOOK_SECRET": SECRET,
        }
    _, host, port, err = start_gunicorn(spawn, env, 2, 4)  # no connection held yet
    wait_apps_built(err, 2)
    with sqlite_held(path, holder):
        scrapes = [scrape(host, port) for _ in range(4)]
    for seconds, status, headers, text in scrapes:
        assert status == 200 and headers["Content-Type"] == METRICS_TYPE, text
        assert seconds < OUTAGE_HEALTH_BOUND, f"answered after {seconds:.2f} s"
        read = read_metrics(text)
        assert read["plantstore_database_up"] == up
        waiting = {"http://hooks.example": 3} if up else {}
        assert read.get("plantstore_webhook_events_waiting", {}) == waiting


def test_metrics_every_worker_answers_the_same_backlog_on_sqlite(spawn, tmp_path):
    expected, backlogs, answered = same_backlog_from_every_worker(
        spawn, str(tmp_path / "plants.sqlite3")
    )
    assert backlogs == [expected] * len(backlogs), f"answered by {answered}"


def test_metrics_a_1_3_0_sqlite_file_is_upgraded_at_start_and_1_3_0_still_serves_it(
    spawn, tmp_path, receiver
):
    path = str(tmp_path / "plants.sqlite3")
    rolled_back_to_1_3_0_and_forward(spawn, tmp_path, path, receiver)
    indexes = read_database(path, "SELECT name FROM sqlite_master WHERE type='index'")
    assert ("plant_events_age",) in indexes


def test_metrics_a_1_3_0_sqlite_upgrade_that_outlasts_the_bound_starts_each_worker(
    spawn, tmp_path
):
    """Found by benchmarks/metrics.py: a 1.3.0 file holding 2,000,000 waiting events
    took 6.5 s to upgrade here, and gunicorn -w 2 on it stopped ("App failed to load"):
    the other worker's wait for the writers' turn at start gives up after
    DB_WAIT_SECONDS, which the upgrade outlasts. Here a trigger the test adds makes a
    small file's upgrade last 8 s at least on any machine: it sleeps 10 ms for each of
    800 events, in the workers, through a function their sitecustomize gives SQLite.
    (Calibrated by the trigger's CPU time, as it was, a machine at load 15 that then
    calmed down made it 3.9 s.)"""
    old = plantstore_1_3_0(tmp_path / "1.3.0")
    path = tmp_path / "plants.sqlite3"
    make = "import sys, plantstore; plantstore.SQLiteStore(sys.argv[1])"
    subprocess.run(  # 1.3.0's tables, made by 1.3.0
        [sys.executable, "-c", make, str(path)],
        cwd=old.parent,
        check=True,
        timeout=WAIT,
    )
    insert = (
        "INSERT INTO plant_events (url, webhook_id, body, next_at)"
        " VALUES ('http://hooks.example/a', 'msg_x', x'7b7d', 0)"
    )
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TRIGGER slow_upgrade AFTER UPDATE ON plant_events"
            " BEGIN SELECT pause(0.01); END"
        )
        db.executemany(insert, [()] * 800)
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sqlite3, time\n"
        "connect = sqlite3.connect\n"
        "def paused(*args, **kwargs):\n"
        "    db = connect(*args, **kwargs)\n"
        "    db.create_function('pause', 1, time.sleep)\n"
        "    return db\n"
        "sqlite3.connect = paused\n"
    )
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB=str(path))
    env["PYTHONPATH"] = f"{slow}{os.pathsep}{HERE}"
    started = time.monotonic()
    _, _, _, err = start_gunicorn(spawn, env, 2, 4)
    while sum(line.count(", plants in ") for line in err.seen) < 2:
        said = err.until(r", plants in |cannot be opened.*|Reason: .*")[0]
        assert said == ", plants in ", "".join(err.seen)
    assert (
        time.monotonic() - started > plantstore_sql.DB_WAIT_SECONDS
    )  # it outlasted it
    created = read_database(str(path), "SELECT DISTINCT created FROM plant_events")
    assert len(created) == 1 and created[0][0] is not None  # upgraded once


def test_metrics_scraped_by_prometheus_the_backlog_reads_back_through_its_api(
    spawn, tmp_path
):
    """Debian's prometheus scrapes gunicorn -w 2 on SQLite with the token, read from a
    file; its HTTP API then answers the backlog, under the receiver's origin."""
    down = free_port()  # no one listens: every event waits
    env = environ_without_tokens(
        PLANTSTORE_TOKENS=TOKEN,
        PLANTSTORE_DB=str(tmp_path / "plants.sqlite3"),
        PLANTSTORE_WEBHOOK_URL=f"http://127.0.0.1:{down}/hook?key=SECRET-IN-QUERY",
        PLANTSTORE_WEBHOOK_SECRET=SECRET,
    )
    _, host, port, _ = start_gunicorn(spawn, env, 2, 4)
    for plant_id in range(6):
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http(host, port, TOKEN, document)[0] == 200
    prometheus = start_prometheus(spawn, tmp_path, [f"{host}:{port}"])
    assert TOKEN not in (tmp_path / "prometheus.yml").read_text()
    target = {"instance": f"{host}:{port}", "job": "plantstore"}

    def series(query):
        return {
            tuple((k, v) for k, v in labels if k != "__name__"): value
            for labels, value in prometheus_query(prometheus, query).items()
        }

    wait_until(
        lambda: series("plantstore_webhook_events_waiting"),
        lambda: f"prometheus holds no backlog: {series('up')}",
    )
    receiver = {**target, "receiver": f"http://127.0.0.1:{down}"}
    assert series("plantstore_webhook_events_waiting") == {
        tuple(sorted(receiver.items())): 6
    }
    assert series("up") == {tuple(sorted(target.items())): 1}
    assert series("plantstore_database_up") == {tuple(sorted(target.items())): 1}
    ages = series("plantstore_webhook_oldest_event_age_seconds")
    assert list(ages) == [tuple(sorted(receiver.items()))] and min(ages.values()) > 0


def alert_rules():
    """docs/operations.md's alert rules, as written there."""
    found = re.search(
        r"<!-- alert rules -->\n```yaml\n(.*?)```\n",
        (HERE / "docs" / "operations.md").read_text(),
        re.S,
    )
    assert found, "docs/operations.md has no alert rules (<!-- alert rules -->)"
    return found[1]


# promtool's own test of the rules: an oldest event's age that grows a minute a minute
# (no alert at 30 minutes, one at 31), and a database down from minute 2 (no alert at 6
# minutes, one at 7, after 5 minutes down)
ALERT_RULES_TEST = """\
rule_files: [plantstore.rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'plantstore_webhook_oldest_event_age_seconds{job="plantstore",
          instance="app1:8000", receiver="https://hooks.example"}'
        values: '0+60x60'
      - series: 'plantstore_webhook_oldest_event_age_seconds{job="plantstore",
          instance="app1:8000", receiver="https://fine.example"}'
        values: '0x60'
      - series: 'plantstore_database_up{job="plantstore", instance="app1:8000"}'
        values: '1 1 0x20'
      - series: 'plantstore_database_up{job="plantstore", instance="app2:8000"}'
        values: '1x22'
    alert_rule_test:
      - {eval_time: 30m, alertname: PlantstoreWebhookEventsWaiting, exp_alerts: []}
      - eval_time: 31m
        alertname: PlantstoreWebhookEventsWaiting
        exp_alerts:
          - exp_labels: {severity: warning, job: plantstore,
              receiver: "https://hooks.example"}
            exp_annotations: {summary: "Webhook events for https://hooks.example have
              waited more than 30 minutes"}
      - {eval_time: 6m, alertname: PlantstoreDatabaseDown, exp_alerts: []}
      - eval_time: 7m
        alertname: PlantstoreDatabaseDown
        exp_alerts:
          - exp_labels: {severity: critical, job: plantstore, instance: "app1:8000"}
            exp_annotations: {summary: "app1:8000 has not reached its database for 5
              minutes"}
"""


def test_operations_md_alert_rules_pass_promtool_and_fire_when_the_doc_says(tmp_path):
    (tmp_path / "plantstore.rules.yml").write_text(alert_rules())
    (tmp_path / "test.yml").write_text(ALERT_RULES_TEST)
    said = {}
    for command in "check rules plantstore.rules.yml", "test rules test.yml":
        done = subprocess.run(
            [prometheus_binary("promtool"), *command.split()],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        said[command] = done.stdout + done.stderr
        assert done.returncode == 0, f"promtool {command}:\n{said[command]}"
    assert "SUCCESS: 2 rules found" in said["check rules plantstore.rules.yml"]


def test_operations_md_describes_each_metric_served_and_no_other():
    served = {
        family.name
        for family in text_string_to_metric_families(
            webtest.TestApp(make_app([TOKEN])).get("/metrics", headers=AUTH).text
        )
    }
    described = {
        cells[0].strip("`").partition("{")[0]
        for _, cells in doc_table("docs/operations.md", "| metric | meaning |")
    }
    assert described == served, f"docs/operations.md's table: /metrics serves {served}"
    rules = set(re.findall(r"plantstore_\w+", alert_rules()))
    assert rules <= served, f"the alert rules name {rules - served}"


# ---- Request ids (issue 46): /metrics answers text, and an X-Request-ID all the same


def answer_of(case, request_id):
    """One request of the case, GET /metrics, sending request_id (None: no header);
    return (status, the X-Request-ID headers answered, what went to wsgi.errors)."""
    errors, answered = io.StringIO(), []
    environ = {"wsgi.errors": errors, "HTTP_X_REQUEST_ID": request_id}
    status, _, _ = call(
        answered_ids(make_app([TOKEN], store=ChunkedStore()), answered),
        method="GET",
        path=f"/{case}",
        environ=environ,
    )
    assert status == 200, f"the case {case} answered {status}"
    return status, answered, errors.getvalue()


# the core's statuses are test_plantstore.py's cases of these two tests
@pytest.mark.parametrize("case", ["metrics"])
@pytest.mark.parametrize("request_id", KEPT_IDS.values(), ids=list(KEPT_IDS))
def test_request_id_a_client_s_own_is_answered_as_it_is_errors_too(case, request_id):
    _, answered, _ = answer_of(case, request_id)
    assert answered == [request_id]


@pytest.mark.parametrize("case", ["metrics"])
@pytest.mark.parametrize("request_id", REPLACED_IDS.values(), ids=list(REPLACED_IDS))
def test_request_id_any_other_is_replaced_by_16_hex_digits_errors_too(case, request_id):
    _, answered, _ = answer_of(case, request_id)
    assert len(answered) == 1 and re.fullmatch("[0-9a-f]{16}", answered[0])
