"""The docs say what the code does: each test reads a table or a sentence of README.md
or docs/ (what every route answers, the settings, signatures and their defaults, the
README's store example run as pasted, numbers tied to a constant, the retry schedule,
the limits, Retry-After, the CORS headers, the tour's quotes and names of plantstore.py)
and asks plantstore.py, the app, a signature or --help the same thing, so that a stale
line fails, named by file:line. And the benchmarks still run (smoke runs)."""

import ast
import functools
import importlib.util
import inspect
import re
import subprocess
import sys

import pytest
import webtest
import yaml

import plantstore
import plantstore_webhooks
from plantstore_app import make_app
from plantstore_server import make_server
from testbed import (
    AUTH,
    HERE,
    OUTAGE_CREATE_BOUND,
    TOKEN,
    WAIT,
    call_case,
    doc_table,
    doc_text,
    operations_of,
    post,
)


# ---- The docs say what the code does: a fact written in both is checked here ----
#
# Each test reads a table or a sentence of README.md or docs/ and asks the app (or its
# signature, or --help) the same thing, so that a stale line fails, named by file:line.
# doc_text and doc_table are testbed.py's: test_plantstore_metrics.py reads a table too.


def every_doc():
    """README.md and each file of docs/, by their names in the repository."""
    docs = sorted(f"docs/{path.name}" for path in (HERE / "docs").glob("*.md"))
    return ["README.md", *docs]


def doc_matches(name, pattern):
    """Each (name:line, match) of pattern in the file; a space in it matches any
    whitespace, a line break included."""
    text = doc_text(name)
    return [
        (f"{name}:{text.count(chr(10), 0, found.start()) + 1}", found)
        for found in re.finditer(pattern.replace(" ", r"\s+"), text)
    ]


def doc_find(name, pattern):
    """The first of doc_matches: a sentence the test reads is still there."""
    found = doc_matches(name, pattern)
    assert found, f"{name} no longer says anything like {pattern!r}: update this test"
    return found[0]


def served_document():
    return webtest.TestApp(make_app([TOKEN])).get("/openapi.json", status=200).json


def test_http_md_s_rules_hold_for_every_route():
    """docs/http.md lists no route: it says what holds for every one, and this holds
    each route to it, read from the app and the document it serves, not from a list.
    Allow is the route's methods (the document's, and the app's), OPTIONS, and HEAD
    where GET; an operation needs the token unless the document says `security: []`;
    and the webhook the document lists beside the routes is the one http.md names."""
    application, document = make_app([TOKEN]), served_document()
    asked = webtest.TestApp(application)
    where, _ = doc_find(
        "docs/http.md",
        r"\*\*Allow\*\*, on `OPTIONS` and on a 405: the route's methods, `OPTIONS`, "
        r"and `HEAD` where it has `GET`",
    )
    operations = {(m, path): op for m, path, op in operations_of(document)}
    paths = set(application.routes) | set(document["paths"])
    for path in sorted(paths):
        methods = {m for m, at in operations if at == path}
        routed = set(application.routes.get(path, ())) - {"HEAD"}  # a GET's, too
        assert methods == routed, (
            f"{path}: the document has {sorted(methods)}, the app {sorted(routed)}"
        )
        rule = {*methods, "OPTIONS", *(["HEAD"] if "GET" in methods else [])}
        sent = asked.options(path.replace("{id}", "1"), status=204).headers["Allow"]
        assert sent == ", ".join(sorted(rule)), f"{where}: {path}'s Allow is {sent}"
    where, _ = doc_find(
        "docs/http.md",
        r"needs the bearer token unless its entry in the document says "
        r"`\"security\": \[\]`",
    )
    for (method, path), operation in operations.items():
        if path not in document["paths"]:  # the webhook, which the service sends
            continue
        needs = operation.get("security", document["security"]) != []
        for asked_with in [method, *(["HEAD"] if method == "GET" else [])]:
            got = asked.request(
                path.replace("{id}", "1"), method=asked_with, expect_errors=True
            )
            assert (got.status_int == 401) == needs, (
                f"{where}: {asked_with} {path} without a token is {got.status}"
            )
    where, said = doc_find("docs/http.md", r"the service sends, `POST ([^`]+)` \((\w+)")
    sent = document["webhooks"][said[1]]["post"]["operationId"]
    assert sent == said[2], f"{where}: the webhook's operationId is {sent}"


def test_readme_settings_table_lists_what_help_lists():
    shown = subprocess.run(
        [sys.executable, str(HERE / "plantstore.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    ).stdout
    variables = set(re.findall(r"^  (PLANTSTORE_\w+)", shown, re.M))
    options = dict(re.findall(r"^  (--[\w-]+) [A-Z]+ +(.*)", shown, re.M))  # --port P
    rows = doc_table("README.md", "| where | name | meaning | default |")
    listed = set()
    for where, (kind, name, _, default, *_) in rows:
        name = name.strip("`")
        listed.add(name)
        if kind == "command line":
            assert name in options, f"{where}: --help lists no option {name}"
            said = f"({default.strip('`')})"
            assert said in options[name], f"{where}: --help says {options[name]}"
        else:
            assert name in variables, f"{where}: --help lists no variable {name}"
    every = variables | set(options)
    assert listed == every, f"README.md's settings table: --help lists {sorted(every)}"


def python_function(operation):
    """The module openapi-python-client makes of an operation: api.<tag>.<snake_id>."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", operation["operationId"]).lower()
    return f"api.{operation['tags'][0]}.{snake}"


def test_generated_clients_md_names_functions_as_the_generator_does():
    functions = {
        operation["operationId"]: python_function(operation)
        for _, _, operation in operations_of(served_document())
    }
    examples = doc_matches("docs/generated-clients.md", r"`(\w+)` is `(api\.[\w.]+)`")
    assert examples, "docs/generated-clients.md no longer says how functions are named"
    for where, said in examples:
        function = functions.get(said[1])
        assert said[2] == function, f"{where}: {said[1]}'s function is {function}"


def test_readme_and_the_example_name_functions_a_generated_client_has():
    document = served_document()
    functions = {
        python_function(operation)
        for _, path, operation in operations_of(document)
        if path in document["paths"]
    }  # no webhook
    where, said = doc_find("README.md", r"named after the operationIds \(([^)]*)\)")
    for name in re.findall(r"`(\w+)`", said[1]):
        assert any(f.endswith(f".{name}") for f in functions), f"{where}: no {name}()"
    imports = r"from plant_store_client\.api\.(\w+) import (.+)"
    for where, said in doc_matches("docs/generated-clients.md", imports):
        for name in said[2].split(", "):
            assert f"api.{said[1]}.{name}" in functions, f"{where}: {functions}"


def test_readme_signatures_and_their_defaults_are_the_code_s():
    for function in make_app, make_server, plantstore.Application:
        shown = f"{function.__name__}{inspect.signature(function)}"
        name = function.__name__  # a line of a code block, or `Application(...)`
        where, said = doc_find("README.md", rf"`{name}\([^`]*\)`|\n{name}\([^\n#]*\)")
        written = " ".join(said[0].strip("\n`").split())
        assert written == shown, f"{where}: it is {shown}"
    for where, (names, _, default) in doc_table("README.md", "| argument | meaning |"):
        function = make_server if "make_server" in names else make_app
        for name in re.findall(r"`(\w+)`", names.partition(" (")[0]):
            value = inspect.signature(function).parameters[name].default
            if default == "required" or re.fullmatch(r"`-?\d+`", default):
                empty = value is inspect.Parameter.empty
                expected = "required" if empty else f"`{value}`"
                assert default == expected, f"{where}: {name}'s default is {expected}"


def test_the_readme_store_example_works_as_pasted():
    readme = (HERE / "README.md").read_text()
    example = re.search(
        r"```python\n(import threading\n.*?class DictStore.*?)```", readme, re.S
    )[1]
    namespace = {}
    exec(example, namespace)  # as pasted into a file of one's own
    application = webtest.TestApp(namespace["application"])
    headers = {"Authorization": "Bearer a-long-random-token-of-yours"}
    post(application, {"id": 1, "name": "Fern", "tag": "indoor"}, 200, headers=headers)
    post(application, {"id": 1, "name": "Again"}, 409, headers=headers)
    post(application, {"id": 2, "name": "Ivy"}, 200, headers=headers)
    assert application.get("/plants", headers=headers, status=200).json == [
        {"name": "Fern", "tag": "indoor"},
        {"name": "Ivy"},
    ]
    assert application.get("/plants?limit=1", headers=headers, status=200).headers[
        "Link"
    ]
    application.delete("/plants/1", headers=headers, status=204)


# plantstore.py and the modules beside it, where a name the docs give is looked up
SERVICE_MODULES = [
    importlib.import_module(path.stem) for path in sorted(HERE.glob("plantstore*.py"))
]


def test_numbers_the_docs_tie_to_a_constant_are_its_value():
    """`DB_WAIT_SECONDS` (5 s), 1,000 plants (`PAGE_MAX`), 4 attempts to one URL
    (`WebhookSender.PER_URL`): the docs name the constant, and this reads it."""
    constant = r"((?:\w+\.)?[A-Z][A-Z0-9_]+)"  # PAGE_MAX, or WebhookSender.PER_URL
    for name in every_doc():
        tied = [
            (where, said[1], said[2])
            for where, said in doc_matches(name, rf"`{constant}` \((\d[\d,]*) s\)")
        ]
        tied += [
            (where, said[2], said[1])
            for where, said in doc_matches(
                name, rf"(\d[\d,]*)[^\d`(]{{0,40}}\(`{constant}`\)"
            )
        ]
        for where, named, number in tied:
            first = named.split(".")[0]  # the module that defines it
            module = next(m for m in SERVICE_MODULES if first in vars(m))
            value = functools.reduce(getattr, named.split("."), module)
            said = int(number.replace(",", ""))
            assert value == said, f"{where}: {named} is {value}"


def test_readme_names_the_python_versions_setup_cfg_classifies():
    """The versions the suite is run on, in README.md and in setup.cfg's classifiers."""
    classified = re.findall(
        r"Programming Language :: Python :: (3\.\d+)$",
        (HERE / "setup.cfg").read_text(),
        re.M,
    )
    version = r"\b3\.\d+(?![.\d])"  # 3.14, not 3.14.10
    for pattern in (
        r"The suite passes, unchanged, on ([^;]*);",  # the section
        r"tested on\]\S* ([^)]*)",  # Two commands
    ):
        where, said = doc_find("README.md", pattern)
        assert re.findall(version, said[1]) == classified, where


def test_webhooks_md_retry_schedule_is_the_sender_s():
    where, said = doc_find("docs/webhooks.md", r"with up to \d+% jitter: ([^;]+);")
    seconds = {"s": 1, "min": 60, "h": 3600}
    schedule = tuple(
        int(number) * seconds[unit]
        for number, unit in re.findall(r"(\d+) (s|min|h)\b", said[1])
    )
    sent = plantstore_webhooks.WebhookSender.SCHEDULE
    assert schedule == sent, f"{where}: the sender waits {sent} seconds"


def test_decisions_md_limits_are_the_served_ones():
    limits = {
        cells[0]: (where, cells[1])
        for where, cells in doc_table("docs/decisions.md", "| limit | value |")
    }
    body = inspect.signature(make_app).parameters["max_body_bytes"].default
    where, said = limits["request body"]
    assert f"{body:,} bytes by default" in said, f"{where}: the default is {body:,}"
    where, said = limits["`limit` of `GET /plants`"]
    largest = int(re.search(r"0 to ([\d,]+)", said)[1].replace(",", ""))
    asked = webtest.TestApp(make_app([TOKEN]))
    for limit, status in (largest, 200), (largest + 1, 400):
        got = asked.get(f"/plants?limit={limit}", headers=AUTH, expect_errors=True)
        assert got.status_int == status, f"{where}: limit={limit} is {got.status}"
    page = plantstore.PAGE_MAX
    assert f"streamed {page:,} at a time" in said, f"{where}: a page is {page:,}"
    where, said = limits["embedded server"]
    with make_server("127.0.0.1", 0, asked.app) as server:
        backlog, silent = server.request_queue_size, server.client_timeout
    assert f"listen backlog {backlog:,}" in said, f"{where}: it is {backlog:,}"
    assert f"silent for {silent} s" in said, f"{where}: it is {silent} s"


def test_retry_after_in_the_docs_is_what_a_503_sends(tmp_path):
    away = dict(method="GET", path="/plants", store="away")
    _, headers, _ = call_case(away, tmp_path)
    sent = headers["Retry-After"]
    for name in every_doc():  # `Retry-After: 2`, or ("Retry-After", "2") in an example
        for where, said in doc_matches(name, r'Retry-After(?:: |", ")(\d+)'):
            assert said[1] == sent, f"{where}: a 503 sends Retry-After: {sent}"


def test_the_proxy_read_timeout_the_readme_quotes_is_the_shipped_one_above_the_bound():
    where, said = doc_find("README.md", r"`proxy_read_timeout (\d+)s`")
    conf = (HERE / "deploy" / "nginx.conf").read_text()
    shipped = int(re.search(r"\n\s*proxy_read_timeout (\d+)s;", conf)[1])
    assert int(said[1]) == shipped, f"{where}: deploy/nginx.conf has {shipped}s"
    # nginx waits longer than a client's bound: plantstore's 503 arrives, not a 504
    assert shipped > OUTAGE_CREATE_BOUND


def test_the_cors_headers_the_docs_quote_are_the_ones_sent():
    origin = "https://playground.example"
    asked = webtest.TestApp(make_app([TOKEN], cors_origins=[origin]))
    preflight = asked.options(
        "/plants",
        status=204,
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    answer = asked.get("/plants", headers={**AUTH, "Origin": origin}, status=200)
    sent = {**answer.headers, **preflight.headers}
    for name in every_doc():
        for where, said in doc_matches(name, r"`(Access-Control-[\w-]+): ([^`]+)`"):
            header, value = said[1], " ".join(said[2].split())
            got = sent.get(header)
            assert got == value, f"{where}: {header} is {got}"


def tour_blocks():
    """The ```python blocks of docs/tour.md: for each, whether a heading came between
    it and the block before, and its pieces (cut at its lines that are `...`), each as
    (its first line's number in the tour, its lines)."""
    blocks, python, fence, heading = [], False, False, False
    for number, line in enumerate(doc_text("docs/tour.md").splitlines(), 1):
        if python and line == "```":
            python = False
        elif python and line.strip() == "...":
            blocks[-1][1].append((number + 1, []))
        elif python:
            blocks[-1][1][-1][1].append(line)
        elif line.startswith("```"):
            python = line == "```python"
            fence = not fence and not python  # another block: no heading inside
            if python:
                blocks.append((heading, [(number + 1, [])]))
                heading = False
        elif not fence and line.startswith("#"):
            heading = True
    return [(heading, [p for p in pieces if p[1]]) for heading, pieces in blocks]


def plantstore_places(text):
    """Each place of plantstore.py a block of the tour may quote, as its (first, last)
    line: a def or a class, at any depth, or a statement of the module's own, each with
    its decorators and the comment lines right above it."""
    lines, tree = text.splitlines(), ast.parse(text)
    top = {id(node) for node in tree.body}
    places = []
    for node in ast.walk(tree):
        if id(node) in top or isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            decorators = getattr(node, "decorator_list", [])
            first = min([node.lineno, *(above.lineno for above in decorators)])
            while first > 1 and lines[first - 2].lstrip().startswith("#"):
                first -= 1
            places.append((first, node.end_lineno))
    return places


def test_the_tour_quotes_plantstore_as_it_stands():
    """Each ```python block of docs/tour.md quotes one place of plantstore.py as it
    stands. Cut at its lines that are `...`, every piece is found in the file, whole
    lines alike, each below the one before; and all of them lie in the innermost def,
    class or module statement that holds the block's first line, so that no block
    joins two functions into what reads as one. The blocks of one section of the tour
    (from a heading to the next) are in the file's order, each below the one before.
    The order starts afresh at a heading, and only there: the tour follows a request,
    which steps back up the file to the helpers it calls (step 3, the bearer check, is
    above step 2, routing), while within a step it reads downwards, as the file does."""
    text = (HERE / "plantstore.py").read_text(encoding="utf-8")
    source, places = "\n" + text, plantstore_places(text)

    def line_at(offset):  # the line of plantstore.py that starts after source[offset]
        return source.count("\n", 0, offset + 1)

    def one_place(wanted, start, within=True):
        """The offset after the block's last piece, if its pieces are found in order
        from start, and (within) all in the place that holds the first; else None.
        Each place the first piece is found in is tried."""
        found = source.find(wanted[0], start)
        while found >= 0:
            first = line_at(found)
            holding = [(b - a, b) for a, b in places if a <= first <= b] or [(0, 0)]
            last = min(holding)[1] if within else len(source)  # 0: held by none
            at = found
            for piece in wanted:
                at = source.find(piece, at)
                if at < 0 or line_at(at) + piece.count("\n") - 2 > last:  # its end
                    break
                at += len(piece) - 1  # its last line break starts the next piece
            else:
                return at
            found = source.find(wanted[0], found + 1)
        return None

    blocks, at = tour_blocks(), 0
    assert blocks, "docs/tour.md quotes no ```python block: the test reads nothing"
    for heading, pieces in blocks:
        wanted = ["\n" + "\n".join(lines) + "\n" for _, lines in pieces]  # whole lines
        start = 0 if heading else at
        at = one_place(wanted, start)
        if at is None:
            for (number, _), piece in zip(pieces, wanted, strict=True):
                said = f"docs/tour.md:{number}: this excerpt is no longer in the file"
                assert piece in source, f"{said}:{piece.rstrip()}"
            said = f"docs/tour.md:{pieces[0][0]}: this block"
            assert one_place(wanted, start, within=False), (
                f"{said} is above the one before, or its pieces out of the file's order"
            )
            pytest.fail(
                f"{said} joins places of plantstore.py into what reads as one: "
                "quote each in a block of its own, introduced by where it is"
            )


TOUR_EXAMPLE_NAMES = {"getPlant"}  # the operation "Adding a route" adds, in a copy


def test_the_tour_names_what_plantstore_has():
    """The names the tour's sentences give in backquotes, between its quotes, are still
    the code's: `Class.method` where Class is plantstore's resolves, and a name written
    as code names are (snake_case, CamelCase, CONSTANT) is plantstore's, or found in
    plantstore.py, plantstore_postgres.py or a test file; so that a renamed function
    fails here, named by line, as a changed line fails the test above."""
    code = "\n".join(
        path.read_text(encoding="utf-8") for path in HERE.glob("*plantstore*.py")
    )
    code_like = re.compile(r"_?[a-z]+_\w+|_?[A-Za-z][a-z0-9]+[A-Z]\w*|[A-Z][A-Z0-9_]+")
    for where, said in doc_matches("docs/tour.md", r"`([A-Za-z_][\w.]*)(?:\(\))?`"):
        name = said[1]
        first, *rest = name.split(".")
        if rest and hasattr(plantstore, first):
            found = functools.reduce(
                lambda at, part: getattr(at, part, None),
                rest,
                getattr(plantstore, first),
            )
            assert found is not None, f"{where}: plantstore has no {name}"
        elif not rest and code_like.fullmatch(name) and name not in TOUR_EXAMPLE_NAMES:
            assert hasattr(plantstore, name) or re.search(
                rf"(?<!\w){re.escape(name)}(?!\w)", code
            ), f"{where}: plantstore.py has no {name}"


# ---- The benchmark still runs (a smoke run, tiny counts; speed is not asserted) ----


def test_benchmark_smoke_run(capsys):
    spec = importlib.util.spec_from_file_location(
        "bench_plantstore", HERE / "benchmarks" / "bench_plantstore.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"plantstore\s+[\d.]+\s+[\d.]+x", table) and re.search(
        r"ceiling\s+[\d.]+\s+1\.00x", table
    )
    assert re.search(r"Memory: \d+ bytes per stored plant at 2,000 plants", table)


def test_gc_index_benchmark_smoke_run(capsys):
    spec = importlib.util.spec_from_file_location(
        "gc_index", HERE / "benchmarks" / "gc_index.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["layouts", "--plants", "3000", "--rounds", "1", "--per-round", "200"])
    bench.main(["collect", "3000"])
    printed = capsys.readouterr().out
    assert re.search(r"through the app: dict [\d.]+ us, array [\d.]+ us", printed)
    assert re.search(r"3,000 plants: +[\d.]+ ms \(no store: [\d.]+ ms\)", printed)


# ---- The operator's docs, run as written (issue 53) ----
#
# Each test runs what README.md, docs/deploy.md or docs/operations.md tells an operator
# to do, with real components, or holds two files that must say the same to each other.
# Imported here, with the section that uses them, so that it merges apart from the
# file's head.

import contextlib  # noqa: E402 (this section's, above)
import fnmatch  # noqa: E402 (this section's, above)
import glob  # noqa: E402 (this section's, above)
import os  # noqa: E402 (this section's, above)
import secrets  # noqa: E402 (this section's, above)
import shlex  # noqa: E402 (this section's, above)
import shutil  # noqa: E402 (this section's, above)
import signal  # noqa: E402 (this section's, above)
import tempfile  # noqa: E402 (this section's, above)
from pathlib import Path  # noqa: E402 (this section's, above)

from plantstore import SQLiteStore  # noqa: E402 (this section's, above)
from plantstore_sql import HEALTH_WAIT_SECONDS  # noqa: E402 (this section's, above)
from testbed import (  # noqa: E402 (this section's, above)
    Lines,
    Runbook,
    environ_without_tokens,
    free_port,
    post_over_http,
    prometheus_binary,
    start_gunicorn,
    stored_plants,
    wait_listening,
    wait_until,
)


def sh_block_below(name, heading):
    """The first ```sh block of the file below the line `heading`."""
    text = doc_text(name)
    assert heading in text, f"{name} has no {heading!r} any more: update this test"
    block = re.search(r"```sh\n(.*?)```\n", text[text.index(heading) :], re.S)
    assert block, f"{name} has no ```sh block below {heading!r}"
    return block[1]


def in_a_mount_namespace(script, folder, env, mounts):
    """Run the bash script in folder, in a mount namespace of its own (util-linux's
    unshare, as root), where each (path, "ro" or "rw") of mounts is bound over itself
    read-only or writable, in order: a path read-only there cannot be written even by
    root, and nothing changes for any other process. Return (exit status, output)."""
    unshare = shutil.which("unshare")
    assert unshare, "unshare is missing: apt-get install util-linux"
    binds = "".join(
        f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(path))} && "
        f"mount -o remount,bind,{mode} {shlex.quote(str(path))} && "
        for path, mode in mounts
    )
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "bash", "-c"]
        + [f"{binds}exec bash -c {shlex.quote(script)}"],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
    )
    return done.returncode, done.stdout + done.stderr


def runbook_on(postgres, runbook, tmp_path):
    """docs/operations.md's settings on the suite's PostgreSQL, emptied, its password in
    the libpq file the settings name, never in $PG."""
    postgres.reset()
    password_file = Path(runbook.settings["PGPASSFILE"])
    password_file.write_text(
        f"127.0.0.1:{postgres.port}:plantstore:plantstore:{postgres.password}\n"
    )
    password_file.chmod(0o600)
    url = f"postgresql://plantstore@127.0.0.1:{postgres.port}/plantstore"
    return Runbook(tmp_path, **{**runbook.settings, "PG": url})


def test_operations_pgloader_step_needs_no_tmp_pgloader_and_a_fatal_is_mended(
    postgres, runbook, tmp_path
):
    """The move's copy, run where /tmp/pgloader cannot be written (another user's, in
    the issue; read-only here, even for root): pgloader writes in the folder the doc's
    --root-dir names. And after a FATAL (that folder read-only this time), the doc's
    way out: empty the tables, copy again, and no duplicate key is refused."""
    book = runbook_on(postgres, runbook, tmp_path)
    from plantstore_postgres import PostgresStore  # psycopg: its tests' import

    store = SQLiteStore(book.settings["SQLITE"])
    for plant_id in range(300):
        assert store.add(plant_id, f"plant {plant_id}", None)
    store.close()
    PostgresStore(postgres.url).close()  # plantstore's tables, as the doc makes them
    book.run("pgloader-file")
    folder = tmp_path / "pgloader"
    folder.mkdir()  # where the doc's --root-dir puts it, unwritable for this run
    status, said = in_a_mount_namespace(
        book.script("pgloader"),
        tmp_path,
        book.env,
        [("/tmp", "ro"), (tmp_path, "rw"), (folder, "ro")],
    )
    assert status != 0 and "FATAL" in said, said
    book.run("empty-tables")  # as the doc says after a FATAL
    status, said = in_a_mount_namespace(
        book.script("pgloader"), tmp_path, book.env, [("/tmp", "ro"), (tmp_path, "rw")]
    )
    assert status == 0 and "FATAL" not in said, said
    assert "duplicate key" not in said and " ERROR " not in said, said
    assert (folder / "pgloader.log").stat().st_size > 0  # its log, where the doc says
    assert book.run("check-move") == "the same rows\n"
    assert len(stored_plants(postgres.url)) == 300


def test_operations_md_upgrade_from_1_3_0_is_what_a_granted_role_s_refusal_asks(
    postgres, runbook, tmp_path
):
    """1.3.0's plant_events (no column `created`), an event waiting in it, and a role
    the owner granted the tables (docs/deploy.md's second setup): its start is refused
    in one line naming what the owner runs; docs/operations.md's block, run as the
    owner, is that; then the granted role starts and serves."""
    import psycopg  # its tests' import

    from plantstore_postgres import PostgresStore

    book = runbook_on(postgres, runbook, tmp_path)
    PostgresStore(postgres.url).close()
    password = secrets.token_urlsafe(18)
    with psycopg.connect(postgres.url, autocommit=True) as db:
        db.execute("ALTER TABLE plant_events DROP COLUMN created")  # as 1.3.0 made it
        db.execute(
            "INSERT INTO plant_events (url, webhook_id, body, next_at)"
            " VALUES ('http://127.0.0.1:1/hook', 'msg_1', '\\x7b7d', 0)"
        )
        db.execute(f"CREATE ROLE granted LOGIN PASSWORD '{password}'")
        db.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON plants, plant_events TO granted"
        )
    granted = f"postgresql://granted:{password}@127.0.0.1:{postgres.port}/plantstore"
    try:
        with pytest.raises(ValueError) as refused:
            PostgresStore(granted)
        said = str(refused.value)
        assert password not in said
        block = book.blocks["upgrade-from-1-3-0"]
        for statement in re.findall(r'-c "([^"]+)"', block):
            assert statement in said, f"the refusal asks: {said}"
        assert book.run("upgrade-from-1-3-0") == "ALTER TABLE\nUPDATE 1\n"
        served = PostgresStore(granted)
        try:
            assert served.add(1, "Fern", None) and served.page(None, 10)[0][1:] == (
                "Fern",
                None,
            )
        finally:
            served.close()
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as db:
            db.execute("DROP OWNED BY granted")
            db.execute("DROP ROLE granted")


def test_readme_apt_get_line_installs_what_ci_installs():
    where, said = doc_find("README.md", r"`sudo apt-get install ([a-z0-9 .+-]+)`")
    listed = set(said[1].split())
    run = (HERE / ".ci" / "run").read_text()
    installed = {
        package
        for group in re.findall(r"need\+=\(([^)]*)\)", run)
        for package in group.split()
    }
    assert installed, ".ci/run installs nothing any more: update this test"
    assert listed == installed, f"{where}: .ci/run installs {sorted(installed)}"


def test_the_core_s_tests_run_with_pytest_and_webtest_alone(tmp_path):
    """Audit item 12: the README's learner's command, `python -m pytest
    test_plantstore.py`, in a fresh venv with the card's packages alone (1.5.0's
    setup.cfg asked every run for pytest-xdist's -n 2)."""
    where, said = doc_find("README.md", r"a venv of `pip install ([\w ]+)`, `([^`]+)`")
    venv = tmp_path / "learner"
    # no pip of its own (ensurepip is slow): this one's installs into it
    made = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(made, check=True, timeout=WAIT)
    python = ["--python", str(venv / "bin" / "python")]
    subprocess.run(
        [sys.executable, "-m", "pip", *python, "install", "-q", *said[1].split()],
        check=True,
        timeout=300,
    )
    command = said[2].split()
    # in the checkout, and beside plantstore.py alone, with the tests' helpers
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in "plantstore.py", "test_plantstore.py", "testbed.py", "conftest.py":
        shutil.copy(HERE / name, alone)
    for folder in HERE, alone:
        ran = subprocess.run(
            [venv / "bin" / command[0], *command[1:], "-q", "-p", "no:cacheprovider"],
            cwd=folder,
            env=environ_without_tokens(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        said = f"{where}, in {folder}: {ran.stdout[-2000:]}{ran.stderr[-2000:]}"
        assert ran.returncode == 0, said
        assert re.search(r"\d+ passed", ran.stdout) and "xdist" not in ran.stdout


def ignored_by_git(name):
    """Whether .gitignore's patterns match the file `name` of the project's folder (no
    git needed: the suite also runs from `git archive`'s tree)."""
    patterns = [
        line.strip()
        for line in (HERE / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatchcase(name, p.strip("/")) for p in patterns)


def test_gitignore_keeps_out_what_the_readme_s_first_run_makes_in_the_folder(
    tmp_path,
):
    """The README's tokens file, made by its commands, and its PLANTSTORE_DB, an SQLite
    file with each file beside it that a create makes, all in the project's folder."""
    block = re.search(
        r"```sh\n(install -m 600 /dev/null tokens.*?)```", doc_text("README.md"), re.S
    )[1]
    making = block.split("\nPLANTSTORE_TOKENS_FILE=")[0]  # the lines before the run
    subprocess.run(
        ["bash", "-c", making], cwd=tmp_path, check=True, timeout=WAIT, env=os.environ
    )
    where, said = doc_find("README.md", r"`PLANTSTORE_DB=([\w.]+)`")
    store = SQLiteStore(tmp_path / said[1])
    try:
        assert store.add(1, "Fern", None)
        made = sorted(path.name for path in tmp_path.iterdir())
    finally:
        store.close()
    assert "tokens" in made and said[1] in made, made
    kept = [name for name in made if not ignored_by_git(name)]
    assert not kept, f".gitignore misses what the README's first run makes: {kept}"


def test_deploy_md_sqlite_by_hand_runs_as_written_in_the_folder_of_the_readme_s_tokens(
    spawn, tmp_path
):
    """docs/deploy.md's gunicorn by hand, from the virtualenv the recipe made, in the
    project's folder where the README's commands made `tokens`, with a home of its own
    that holds no tokens: it serves the token of that file."""
    project, home, state = tmp_path / "project", tmp_path / "home", tmp_path / "state"
    for folder in project, home, state:
        folder.mkdir()
    readme = re.search(
        r"```sh\n(install -m 600 /dev/null tokens.*?)```", doc_text("README.md"), re.S
    )[1]
    making = readme.split("\nPLANTSTORE_TOKENS_FILE=")[0]
    subprocess.run(
        ["bash", "-c", making], cwd=project, check=True, timeout=WAIT, env=os.environ
    )
    token = (project / "tokens").read_text().strip()
    block = sh_block_below(
        "docs/deploy.md", "## One machine, several processes: SQLite"
    )
    assert "/opt/plantstore/bin/gunicorn " in block, block  # the recipe's virtualenv
    port = free_port()
    script = "\n".join(
        line
        for line in block.replace("/var/lib/plantstore", str(state))
        .replace("/opt/plantstore/bin/", f"{Path(sys.executable).parent}/")
        .replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        .splitlines()
        if not line.startswith("sudo ")  # the folder, made above, is this user's
    )
    env = environ_without_tokens(HOME=str(home), PYTHONPATH=str(HERE))
    process = spawn(["bash", "-c", f"cd {shlex.quote(str(project))}\n{script}"], env)
    err = Lines(process.stderr)
    for _ in range(2):  # each worker, so that each takes the SIGTERM below
        err.until(r"plantstore: version")  # else: what it said instead
    wait_listening(process, port)
    created = post_over_http("127.0.0.1", port, token, {"id": 1, "name": "Fern"})
    assert created == (200, {"name": "Fern"})
    assert stored_plants(str(state / "plants.sqlite3")) == {1: "Fern"}
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(WAIT) == 0
    # gunicorn 27's control socket, $HOME/.gunicorn, would be every instance's
    assert not list(home.iterdir()), list(home.iterdir())


def test_the_recipes_make_their_virtualenv_with_the_system_python():
    """A python3 of one's own (pyenv, a build under a home) would leave /opt/plantstore
    a link into a home the service's user cannot enter."""
    files = [
        *every_doc(),
        *(
            f"deploy/{path.name}"
            for path in sorted((HERE / "deploy").glob("*.service"))
        ),
    ]
    made = 0
    for name in files:
        for where, said in doc_matches(name, r"(\S*python3?) -m venv /opt/plantstore"):
            assert said[1] == "/usr/bin/python3", f"{where}: {said[0]}"
            made += 1
    assert made >= 3, "the recipes no longer make /opt/plantstore: update this test"


# promtool's test of the backlog alert while the database is down: the oldest event's
# age over 30 minutes until minute 20, then no age shown from minute 21 (the database
# down: the backlog is not read), while plantstore_database_up is 0 from minute 21
BACKLOG_WHILE_DOWN_TEST = """\
rule_files: [plantstore.rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'plantstore_webhook_oldest_event_age_seconds{job="plantstore",
          instance="app1:8000", receiver="https://hooks.example"}'
        values: '1800+60x20 stale'
      - series: 'plantstore_database_up{job="plantstore", instance="app1:8000"}'
        values: '1x20 0x20'
    alert_rule_test:
      - eval_time: 10m
        alertname: PlantstoreWebhookEventsWaiting
        exp_alerts:
          - exp_labels: {severity: warning, job: plantstore,
              receiver: "https://hooks.example"}
            exp_annotations: {summary: "Webhook events for https://hooks.example have
              waited more than 30 minutes"}
      - {eval_time: 22m, alertname: PlantstoreWebhookEventsWaiting, exp_alerts: []}
      - {eval_time: 25m, alertname: PlantstoreDatabaseDown, exp_alerts: []}
      - eval_time: 26m
        alertname: PlantstoreDatabaseDown
        exp_alerts:
          - exp_labels: {severity: critical, job: plantstore, instance: "app1:8000"}
            exp_annotations: {summary: "app1:8000 has not reached its database for 5
              minutes"}
"""


def test_operations_md_backlog_alert_resolves_while_no_age_is_shown(tmp_path):
    where, _ = doc_find(
        "docs/operations.md", r"the backlog cannot be read and no age is shown"
    )
    rules = re.search(
        r"<!-- alert rules -->\n```yaml\n(.*?)```\n",
        doc_text("docs/operations.md"),
        re.S,
    )[1]
    (tmp_path / "plantstore.rules.yml").write_text(rules)
    (tmp_path / "test.yml").write_text(BACKLOG_WHILE_DOWN_TEST)
    done = subprocess.run(
        [prometheus_binary("promtool"), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, f"{where}: {done.stdout}{done.stderr}"


def test_operations_md_scrapes_each_app_host_where_nginx_reaches_it():
    """One way to reach several app hosts: the scrape's targets are the servers of
    failover.md's nginx upstream, and deploy.md binds gunicorn to such an address."""
    where, said = doc_find(
        "docs/operations.md", r"targets: \[([^\]]*)\] +# each app host's gunicorn"
    )
    targets = re.findall(r'"([^"]+)"', said[1])
    upstream = re.search(
        r"```nginx\nupstream plantstore \{\n(.*?)\}", doc_text("docs/failover.md"), re.S
    )
    assert upstream, "docs/failover.md has no upstream block: update this test"
    servers = re.findall(r"server (\S+) ", upstream[1])
    assert targets == servers, f"{where}: docs/failover.md's upstream has {servers}"
    bound, said = doc_find(
        "docs/deploy.md",
        r"several app hosts, the host's private "
        r"address \(`ListenStream=([\d.:]+)`\)",
    )
    assert said[1] in servers, f"{bound}: the upstream has {servers}"


def test_gunicorn_logging_conf_gives_plantstore_s_lines_gunicorn_s_time_level_and_pid(
    spawn,
):
    """deploy/gunicorn-logging.conf as shipped: the start line (INFO) of each worker,
    then a bad setting's line (ERROR), with the time, level and process id gunicorn's
    own lines have, `plantstore:` before the message, each once."""
    conf = str(HERE / "deploy" / "gunicorn-logging.conf")
    stamped = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[(\d+)\] \[([A-Z]+)\] "
    env = environ_without_tokens(PLANTSTORE_TOKENS=TOKEN)
    process, host, port, err = start_gunicorn(spawn, env, 1, 8, "--log-config", conf)
    started = err.until(rf"^{stamped}plantstore: version \S+, plants in memory")
    worker = re.search(r"Booting worker with pid: (\d+)", "".join(err.seen))[1]
    assert started.groups() == (worker, "INFO"), "".join(err.seen)
    assert re.match(stamped + "Starting gunicorn", err.seen[0])  # gunicorn's own
    assert post_over_http(host, port, TOKEN, {"id": 1, "name": "Fern"})[0] == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(WAIT) == 0
    logged = err.rest()
    assert logged.count("plantstore: version") == 1, logged  # no line twice
    assert not re.search(r"^plantstore:", logged, re.M), logged  # none unstamped
    assert TOKEN not in logged
    refused = spawn(
        [sys.executable, "-m", "gunicorn", "-w", "1", "--log-config", conf]
        + ["-b", "127.0.0.1:0", "plantstore:app"],
        environ_without_tokens(PLANTSTORE_TOKENS=TOKEN, PLANTSTORE_DB_URL="x.db"),
    )
    assert refused.wait(WAIT) == 4
    said = refused.stderr.read()
    line = rf"^{stamped}plantstore: PLANTSTORE_DB_URL is not a plantstore setting: "
    assert len(re.findall(line + "did you mean PLANTSTORE_DB\\?$", said, re.M)) == 1
    assert re.search(line, said, re.M)[2] == "ERROR", said


def test_deploy_md_embedding_logging_example_routes_and_silences_plantstore(tmp_path):
    """The dictConfig of docs/deploy.md, in a program that imported plantstore first:
    the start line comes out in the program's format, once; then the level set on the
    logger, as the doc says, keeps it out."""
    example = re.search(
        r"```python\n(import logging\.config\n.*?dictConfig.*?)```",
        doc_text("docs/deploy.md"),
        re.S,
    )
    assert example, "docs/deploy.md has no dictConfig example: update this test"
    where, said = doc_find(
        "docs/deploy.md",
        r'`(logging\.getLogger\("plantstore"\)'
        r"\.setLevel\(logging\.ERROR\))`",
    )
    program = tmp_path / "host.py"
    program.write_text(
        "import plantstore\n"  # the logger exists before the configuration
        + example[1]
        + f"plantstore.app_from_environ({{'PLANTSTORE_TOKENS': {TOKEN!r}}})\n"
        + f"{said[1]}\n"
        + f"plantstore.app_from_environ({{'PLANTSTORE_TOKENS': {TOKEN!r}}})\n"
    )
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=environ_without_tokens(PYTHONPATH=str(HERE)),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"{where}: {done.stderr}"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO plantstore: version \S+, plants "
        r"in memory, in this process alone",
        lines[0],
    ), lines


def test_deploy_md_probes_ask_the_database_for_readiness_alone(tmp_path):
    """The Kubernetes probes of docs/deploy.md, the manifests' (deploy/kubernetes/):
    with the database away, the liveness probe's path still answers 200 (no pod
    restarted) and the readiness probe's 503; neither needs a token; the readiness
    timeout is above /health's bound."""
    probes = re.search(
        r"<!-- probes -->\n```yaml\n(.*?)```", doc_text("docs/deploy.md"), re.S
    )
    assert probes, "docs/deploy.md has no probes (<!-- probes -->): update this test"
    (shown,) = yaml.safe_load(probes[1])["containers"]
    for manifest in "sqlite.yaml", "postgres.yaml":
        documents = yaml.safe_load_all(doc_text(f"deploy/kubernetes/{manifest}"))
        (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for probe in "livenessProbe", "readinessProbe":
            assert shown[probe] == container[probe], f"{manifest}'s {probe}"
    path = dict(re.findall(r"(\w+)Probe:.*?path: (/\w+)", probes[1], re.S))
    timeout = re.search(r"readinessProbe:.*?timeoutSeconds: (\d+)", probes[1], re.S)
    assert int(timeout[1]) > HEALTH_WAIT_SECONDS
    store = SQLiteStore(tmp_path / "plants.sqlite3")
    asked = webtest.TestApp(make_app([TOKEN], store=store))
    for probe in "liveness", "readiness":
        assert asked.get(path[probe], status=200).json == {"status": "ok"}
    os.remove(tmp_path / "plants.sqlite3")  # the database away
    assert asked.get(path["liveness"], status=200).json == {"status": "ok"}
    away = asked.get(path["readiness"], status=503)
    assert away.headers["Retry-After"] and away.json["error"] == 503
    store.close()


def test_docs_run_the_virtualenv_s_pytest():
    """A bare `pytest` is the one first on PATH, perhaps of another Python, without the
    test extra: the docs run the README's, `.venv/bin/python -m pytest`."""
    found = 0
    for name in every_doc()[1:]:  # docs/
        for where, said in doc_matches(name, r"`([^`]*\bpytest\b[^`]*)`"):
            command = re.sub(r"\s+", " ", said[1])
            if re.match(r"(\S+/)?(python3? -m )?pytest ", command):
                assert command.startswith(".venv/bin/python -m pytest "), where
                found += 1
    assert found >= 2, "the docs no longer run pytest: update this test"


def test_every_gunicorn_command_shipped_or_documented_makes_no_control_socket():
    """gunicorn 27 makes a control socket in $HOME/.gunicorn, one path for every
    instance of a user, and says [ERROR] at each start where HOME cannot be written:
    each command turns it off (the units' is run by test_plantstore_settings.py)."""
    shipped = (HERE / "deploy").rglob("*")
    files = [*every_doc(), *(str(p.relative_to(HERE)) for p in shipped if p.is_file())]
    commands = [
        (f"{name}:{text.count(chr(10), 0, found.start()) + 1}", found[0])
        for name in files
        for text in [doc_text(name)]
        for found in re.finditer(r"gunicorn (-[^`|\n]*?)?plantstore:app", text)
        if found[1]  # a command, with its flags; not the app's name in a sentence
    ]
    assert len(commands) >= 5, f"fewer gunicorn commands: update this test {commands}"
    for where, command in commands:
        assert "--no-control-socket" in command.split(), f"{where}: {command}"


def test_operations_md_installs_psycopg_before_plantstore_makes_the_tables():
    """The move's first start on PostgreSQL needs psycopg: the doc installs it before
    that block, not in the downtime after it."""
    text = doc_text("docs/operations.md")
    install = "pip install '.[server,postgres]'"
    tables = text.index("<!-- run: make-tables -->")
    before, downtime = (
        text.index("### Before the downtime"),
        text.index("### The downtime"),
    )
    assert before < text.find(install) < tables, "psycopg installed after make-tables"
    assert install not in text[downtime:], "psycopg installed in the downtime"


def test_failover_md_standby_block_runs_as_written():
    """docs/failover.md's standby, its commands run in order on this machine as on two
    hosts: a primary as Debian makes it (its superuser postgres, peer on its socket, a
    plantstore role as deploy.md's, no REPLICATION), the standby's folder where the
    doc clones it, each password typed at its prompt. `sudo -u postgres` is runuser,
    `systemctl` the standby's pg_ctl; db1.internal and 10.0.0.0/24 are loopback's. The
    last command says the standby is synchronous."""
    block = re.search(
        r"<!-- standby -->\n```sh\n(.*?)```\n", doc_text("docs/failover.md"), re.S
    )
    assert block, "docs/failover.md has no standby block: update this test"
    binaries = max(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4])
    )
    folder = Path(tempfile.mkdtemp(prefix="plantstore-standby-"))  # postgres enters it
    folder.chmod(0o755)
    primary, standby = folder / "primary", folder / "15-main"
    env = environ_without_tokens(
        PATH=f"{binaries}:{os.environ['PATH']}",
        PGHOST=str(folder),
        PGPORT=str(free_port()),
    )

    def run(line, typed=""):
        """Run a line of bash as root, as a session of its own (no terminal: a prompt
        reads stdin); return what it printed. It must exit 0."""
        done = subprocess.run(
            ["bash", "-c", line],
            env=env,
            input=typed,
            capture_output=True,
            text=True,
            timeout=WAIT * 2,
            start_new_session=True,
            cwd=folder,
        )
        assert done.returncode == 0, f"docs/failover.md: {line}\n{done.stderr}"
        return done.stdout

    def pg_ctl(data, action, port=env["PGPORT"]):
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        return (
            f"runuser -u postgres -- pg_ctl -D {data} -l {data}.log -w -m immediate"
            f" -o '{options}' {action}"
        )

    password = secrets.token_urlsafe(12)
    try:
        shutil.chown(folder, "postgres")
        run(
            f"runuser -u postgres -- initdb -D {primary} --no-sync -E UTF8"
            " --auth-local=peer --auth-host=scram-sha-256 >/dev/null"
        )
        run(pg_ctl(primary, "start"))
        # the app's role, by the password typed at each prompt (on stdin, not a line)
        run(
            "runuser -u postgres -- psql",
            f"CREATE ROLE plantstore LOGIN PASSWORD '{password}'",
        )
        standby.mkdir()  # the standby host's own cluster, which the doc removes
        shutil.chown(standby, "postgres")
        for line in block[1].splitlines():
            if hba := re.fullmatch(r"#\s+(host replication .*)", line):
                with (primary / "pg_hba.conf").open("a") as conf:
                    conf.write(hba[1].replace("10.0.0.0/24", "127.0.0.1/32") + "\n")
            if not line.strip() or line.startswith("#"):
                continue
            line = (
                line.replace("/var/lib/postgresql/15/main", str(standby))
                .replace("db1.internal", "127.0.0.1")
                .replace("sudo -u postgres ", "runuser -u postgres -- ")
                .replace("sudo systemctl stop postgresql", "true")  # it is not running
                .replace(
                    "sudo systemctl start postgresql",
                    pg_ctl(standby, "start", free_port()),
                )
            )
            assert "sudo" not in line, line
            run(line, f"{password}\n" * (2 if "--pwprompt" in line else 1))
        # the last line again, until the standby streams, as the doc says
        synchronous = re.compile(r"^ \S+ +\| sync$", re.M)
        wait_until(lambda: synchronous.search(run(line)), "no synchronous standby")
    finally:
        for data in standby, primary:
            with contextlib.suppress(AssertionError):
                run(pg_ctl(data, "stop"))
        shutil.rmtree(folder, ignore_errors=True)
