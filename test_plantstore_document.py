"""Tests for the OpenAPI document plantstore.py serves at /openapi.json ("The OpenAPI
document the service serves"): valid OpenAPI 3.1 that keeps the specification's schemas,
its servers entry where the app is mounted, the webhook it lists; every status each
operation sends listed, and none it never sends (STATUS_CASES); the routes served and
the document's agreeing; HEAD, OPTIONS and 405 on its own route as on the core's; and
schemathesis, in process, finding no failure against it, at the root and mounted at
/api."""

import json
import re

import hypothesis
import openapi_spec_validator
import pytest
import schemathesis
import webtest

import plantstore_openapi
from plantstore import MAX_BODY_BYTES
from plantstore_app import make_app
from testbed import (
    AUTH,
    FailingInput,
    TOKEN,
    assert_405_with_the_allow_of_options_before_auth,
    assert_head_as_get,
    assert_options_204_with_allow,
    call_case,
    mounted_at_api,
    operations_of,
)


# ---- The OpenAPI document, and schemathesis against it ----


def test_openapi_document_is_served_without_a_token_and_is_valid(app):
    response = app.get("/openapi.json", status=200)
    assert response.content_type == "application/json"
    # OPENAPI as written, and where the application is mounted
    served = json.loads(response.text)
    assert served == {"servers": [{"url": "/"}], **plantstore_openapi.OPENAPI}
    # raises unless it is valid OpenAPI 3.1
    openapi_spec_validator.validate(response.json)
    assert response.json["openapi"] == "3.1.0"
    info = response.json["info"]
    assert {key: info[key] for key in ("title", "version", "license")} == {
        "title": "Plant Store",
        "version": "1.0.0",
        "license": {"name": "MIT", "identifier": "MIT"},
    }
    assert info["description"].strip()
    assert response.json["security"] == [{"bearerAuth": []}]
    assert response.json["components"]["securitySchemes"] == {
        "bearerAuth": {"type": "http", "scheme": "bearer"}
    }


def test_openapi_document_keeps_the_specification_schemas():
    schemas = plantstore_openapi.OPENAPI["components"]["schemas"]
    assert schemas["Plant"]["required"] == ["name"]
    assert {k: v["type"] for k, v in schemas["Plant"]["properties"].items()} == {
        "name": "string",
        "tag": "string",
    }
    assert schemas["NewPlant"]["allOf"][0] == {"$ref": "#/components/schemas/Plant"}
    assert schemas["NewPlant"]["allOf"][1]["required"] == ["id"]
    assert schemas["NewPlant"]["allOf"][1]["properties"]["id"] == {
        "description": "Identification number of the plant",
        "type": "integer",
        "format": "int64",
    }
    assert schemas["Error"] == {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "integer", "format": "int32"},
            "message": {"type": "string"},
        },
    }


@pytest.mark.parametrize(
    "script_name, url",
    [("", "/"), ("/api", "/api"), ("/plant store", "/plant%20store")],
)
def test_the_documents_servers_say_where_the_app_is_mounted(store, script_name, url):
    document = (
        webtest.TestApp(make_app([TOKEN], store=store))
        .get("/openapi.json", extra_environ={"SCRIPT_NAME": script_name}, status=200)
        .json
    )
    assert document["servers"] == [{"url": url}]


def test_the_document_has_the_samples_webhook(app):
    webhook = app.get("/openapi.json", status=200).json["webhooks"]["/plant/webhook"][
        "post"
    ]
    assert webhook["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NewPlant"
    }
    assert webhook["responses"]["200"]["description"].startswith("Return a 200 status")


def documented(method, path, status):
    """The document's answer for that status of that operation, with a component
    reference followed."""
    answer = plantstore_openapi.OPENAPI["paths"][path][method.lower()]["responses"].get(
        str(status)
    )
    if answer and "$ref" in answer:
        answer = plantstore_openapi.OPENAPI["components"]["responses"][
            answer["$ref"].rsplit("/", 1)[1]
        ]
    return answer


# Every status each operation can send, each brought about once: (operation, call()
# arguments, status, header).
PLANT = json.dumps({"id": 1, "name": "Fern"}).encode()
STATUS_CASES_OF_GET = [
    (("GET", "/plants"), dict(method="GET", path="/plants"), 200, None),
    (
        ("GET", "/plants"),
        dict(method="GET", path="/plants", environ={"QUERY_STRING": "limit=-1"}),
        400,
        None,
    ),
    (
        ("GET", "/plants"),
        dict(method="GET", path="/plants", environ={"HTTP_AUTHORIZATION": ""}),
        401,
        "WWW-Authenticate",
    ),
    (("GET", "/plants"), dict(method="GET", path="/plants", store="broken"), 500, None),
    (
        ("GET", "/plants"),
        dict(method="GET", path="/plants", store="away"),
        503,
        "Retry-After",
    ),
    (
        ("GET", "/openapi.json"),
        dict(method="GET", path="/openapi.json", environ={"HTTP_AUTHORIZATION": ""}),
        200,
        None,
    ),
    (
        ("GET", "/health"),
        dict(method="GET", path="/health", environ={"HTTP_AUTHORIZATION": ""}),
        200,
        None,
    ),
    (
        ("GET", "/livez"),
        dict(
            method="GET",
            path="/livez",
            store="away",
            environ={"HTTP_AUTHORIZATION": ""},
        ),
        200,
        None,
    ),
    (("GET", "/metrics"), dict(method="GET", path="/metrics"), 200, None),
    (
        ("GET", "/metrics"),
        dict(method="GET", path="/metrics", environ={"HTTP_AUTHORIZATION": ""}),
        401,
        "WWW-Authenticate",
    ),
    (("GET", "/health"), dict(method="GET", path="/health", store="broken"), 500, None),
    (
        ("GET", "/health"),
        dict(
            method="GET",
            path="/health",
            store="away",
            environ={"HTTP_AUTHORIZATION": ""},
        ),
        503,
        "Retry-After",
    ),
]
STATUS_CASES = [
    (("POST", "/plants"), dict(body=PLANT), 200, None),
    (("POST", "/plants"), dict(body=b"[]"), 400, None),
    (
        ("POST", "/plants"),
        dict(body=PLANT, environ={"HTTP_AUTHORIZATION": ""}),
        401,
        "WWW-Authenticate",
    ),
    (
        ("POST", "/plants"),
        dict(
            environ={"wsgi.input": FailingInput(TimeoutError()), "CONTENT_LENGTH": "9"}
        ),
        408,
        None,
    ),
    (("POST", "/plants"), dict(body=PLANT, store="taken"), 409, None),
    (("POST", "/plants"), dict(body=b" " * (MAX_BODY_BYTES + 1)), 413, None),
    (
        ("POST", "/plants"),
        dict(body=PLANT, environ={"CONTENT_TYPE": "text/plain"}),
        415,
        "Accept",
    ),
    (("POST", "/plants"), dict(body=PLANT, store="broken"), 500, None),
    (("POST", "/plants"), dict(body=PLANT, store="away"), 503, "Retry-After"),
    *STATUS_CASES_OF_GET,
    (
        ("DELETE", "/plants/{id}"),
        dict(method="DELETE", path="/plants/1", store="taken"),
        204,
        None,
    ),
    (("DELETE", "/plants/{id}"), dict(method="DELETE", path="/plants/x"), 400, None),
    (
        ("DELETE", "/plants/{id}"),
        dict(method="DELETE", path="/plants/1", environ={"HTTP_AUTHORIZATION": ""}),
        401,
        "WWW-Authenticate",
    ),
    (("DELETE", "/plants/{id}"), dict(method="DELETE", path="/plants/1"), 404, None),
    (
        ("DELETE", "/plants/{id}"),
        dict(method="DELETE", path="/plants/1", store="broken"),
        500,
        None,
    ),
    (
        ("DELETE", "/plants/{id}"),
        dict(method="DELETE", path="/plants/1", store="away"),
        503,
        "Retry-After",
    ),
    (
        ("POST", "/plants"),
        dict(
            body=PLANT,
            environ={"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked"},
        ),
        411,
        None,
    ),
]


@pytest.mark.parametrize(
    "operation, arguments, status, header",
    STATUS_CASES,
    ids=[f"{op[0]} {op[1]} {status}" for op, _, status, _ in STATUS_CASES],
)
def test_every_status_an_operation_sends_is_in_the_document(
    operation, arguments, status, header, tmp_path
):
    got, headers, _ = call_case(arguments, tmp_path)
    assert got == status
    answer = documented(*operation, status)
    assert answer is not None, (
        f"{operation} sends {status}, which the document does not list for it"
    )
    if header:
        assert header in headers and header in answer["headers"]


def test_the_document_lists_no_status_an_operation_never_sends():
    for path, operations in plantstore_openapi.OPENAPI["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":  # the path's own, not an operation
                continue
            sent = {
                status
                for op, _, status, _ in STATUS_CASES
                if op == (method.upper(), path)
            }
            assert {int(status) for status in operation["responses"]} == sent, (
                method,
                path,
            )


# HEAD and OPTIONS are answered on every route, and are no operations of the document: a
# client has nothing to call there (docs/http.md describes them). The tests below hold
# the document to that, tie it to the routes the app serves, and keep what its HEAD and
# OPTIONS used to cover.


def test_every_operation_has_a_stable_operation_id_a_summary_and_a_tag(app):
    document = app.get("/openapi.json", status=200).json
    tags = {tag["name"] for tag in document["tags"]}
    for method, path, operation in operations_of(document):
        assert method not in ("HEAD", "OPTIONS"), f"{method} {path} is no operation"
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z]*)*", operation["operationId"]), (
            method,
            path,
        )
        assert operation["summary"].strip() and "\n" not in operation["summary"], (
            method,
            path,
        )
        assert operation["tags"] and set(operation["tags"]) <= tags, (method, path)
    ids = [operation["operationId"] for _, _, operation in operations_of(document)]
    assert len(ids) == len(set(ids))  # each one pinned by docs/http.md's table


def test_each_route_is_a_document_entry_and_each_entry_a_route_by_operation_id():
    """Both ways, as make_app serves them: each route's handler is named by the
    operationId of the document's entry at its path and method, which says `security:
    []` where the route needs no token; and each entry of the document is such a
    route. So an operation's route, handler and entry are found from one another."""
    application = make_app([TOKEN])
    routes = {
        (method, path, handler.__name__, token)
        for path, methods in application.routes.items()
        for method, (handler, token) in methods.items()
        if method != "HEAD"  # a GET's handler: no operation of its own
    }
    entries = {
        (
            method.upper(),
            path,
            operation["operationId"],
            operation.get("security") != [],
        )
        for path, methods in plantstore_openapi.OPENAPI["paths"].items()
        for method, operation in methods.items()
        if method != "parameters"  # the path's own, not an operation
    }
    assert routes == entries
    assert len({name for _, _, name, _ in routes}) == len(routes)  # each one its own


def test_the_routes_served_and_the_document_agree(app, store):
    """Read from the app, not a list: its 404 names the routes, OPTIONS and 405 the
    methods."""
    document = app.get("/openapi.json", status=200).json
    named = app.get(
        "/no/such/route", headers=AUTH, status=404, expect_errors=True
    ).json["message"]
    assert set(re.findall(r"/[^\s,]*", named)) == set(document["paths"]), named
    store.add(1, "Fern", None)
    for path in document["paths"]:
        url = path.replace("{id}", "1")
        allow = app.options(url, status=204).headers["Allow"].split(", ")
        listed = {method for method, at, _ in operations_of(document) if at == path}
        assert set(allow) - {"HEAD", "OPTIONS"} == listed, path
        for method in (
            "GET",
            "HEAD",
            "POST",
            "PUT",
            "PATCH",
            "DELETE",
            "OPTIONS",
            "TRACE",
        ):
            response = app.request(url, method=method, headers=AUTH, expect_errors=True)
            assert (response.status_int == 405) == (method not in allow), (method, url)


@pytest.mark.parametrize(
    "arguments, status, header",
    [case[1:] for case in STATUS_CASES_OF_GET],
    ids=[f"HEAD {op[1]} {code}" for op, _, code, _ in STATUS_CASES_OF_GET],
)
def test_head_sends_every_status_get_does_with_its_header_and_no_body(
    arguments, status, header, tmp_path
):
    got, headers, body = call_case(dict(arguments, method="HEAD"), tmp_path)
    assert got == status and body is None
    assert header is None or header in headers


SCHEMA = schemathesis.openapi.from_wsgi("/openapi.json", make_app([TOKEN]))
# as `st run -H`: schemathesis knows the token and still tries without it
SCHEMA.config.update(headers=AUTH)


@SCHEMA.parametrize()
@hypothesis.settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_schemathesis_finds_no_failure(case):
    """Every check, positive and negative data, a fixed seed, in process against the
    served document."""
    case.call_and_validate()


MOUNTED_SCHEMA = schemathesis.openapi.from_wsgi(
    "/api/openapi.json", mounted_at_api(make_app([TOKEN]))
)
MOUNTED_SCHEMA.config.update(headers=AUTH)


@MOUNTED_SCHEMA.parametrize()
@hypothesis.settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_schemathesis_from_the_document_of_an_app_mounted_at_api_finds_no_failure(case):
    """Started from /api/openapi.json alone: its servers entry sends every call to
    /api."""
    assert case.path.startswith("/") and case.operation.base_url.endswith("/api")
    case.call_and_validate()


# ---- The routes make_app adds: HEAD, OPTIONS and 405, as on the core's routes ----


@pytest.mark.parametrize("path", ["/openapi.json", "/metrics", "/livez"])
def test_the_routes_make_app_adds_answer_head_options_and_405_as_the_core_s(
    app, store, path
):
    """The rules test_plantstore.py holds the core's routes to, on these."""
    assert_405_with_the_allow_of_options_before_auth(app, path)
    assert_options_204_with_allow(app, path)
    assert_head_as_get(make_app([TOKEN], store=store), path, AUTH, 200)
