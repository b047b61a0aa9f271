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

import plantstore
from plantstore import make_app, make_server
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
        assert methods == set(application.routes.get(path, ())), (
            f"{path}: the document has {sorted(methods)}, the app "
            f"{sorted(application.routes.get(path, ()))}"
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
            value = functools.reduce(getattr, named.split("."), plantstore)
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
    sent = plantstore.WebhookSender.SCHEDULE
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
