from plantstore import JSON_TYPE, PAGE_MAX  # to try this draft alone; not pasted

# ---- The OpenAPI document the service serves at /openapi.json ----

def _json_content(schema):
    return {JSON_TYPE: {"schema": schema}}


def _operation(operation_id, tag, summary, description, success, *errors, **more):
    """One operation: the name clients give it, its tag and line, its answers, errors last.

    HEAD and OPTIONS are no operations here, though every route answers them: a client has
    nothing to call there, and docs/http.md describes them.
    """
    refs = {str(status): {"$ref": f"#/components/responses/Error{status}"} for status in errors}
    return {"operationId": operation_id, "tags": [tag], "summary": summary,
            "description": description, **more, "responses": {**success, **refs}}


_PLANT = {"$ref": "#/components/schemas/Plant"}
_NEW_PLANT = _json_content({"$ref": "#/components/schemas/NewPlant"})

_ERRORS = {
    400: "The request is not valid; the message names the field and the rule",
    401: "The bearer token is missing or not accepted",
    404: "No plant has this id",
    408: "The request body did not arrive in time",
    409: "A plant with this id already exists; it is left unchanged",
    411: "A chunked body that this server cannot read: send a Content-Length",
    413: "The request body is larger than the limit",
    415: "The body is not application/json",
    500: "The server failed",
    503: "The database is unavailable for a moment; try again after Retry-After seconds",
}
_ERROR_HEADERS = {401: "WWW-Authenticate", 415: "Accept", 503: "Retry-After"}  # sent with those

OPENAPI = {
    "openapi": "3.1.0",
    "info": {"title": "Plant Store", "version": "1.0.0",
             "license": {"name": "MIT", "identifier": "MIT"},
             "description": "A store of plants: add, list and delete them, with a bearer token. "
                            "New plants can also be sent to a webhook."},
    "tags": [{"name": "plants", "description": "The plants in the store"},
             {"name": "service", "description": "About the service itself; no token needed"}],
    "security": [{"bearerAuth": []}],
    "paths": {
        "/plants": {
            "get": _operation(
                "listPlants", "plants", "List plants, oldest first",
                "Without `limit`, every plant (streamed, with no Content-Length); with it, one "
                "page, and a `Link` to the next when more follow",
                {"200": {"description": "The plants, oldest first", "content": _json_content(
                    {"type": "array", "items": _PLANT}), "headers": {"Link": {
                        "description": 'The next page, as <...>; rel="next" (RFC 8288), when more '
                                       "plants may follow", "schema": {"type": "string"}}}}},
                400, 401, 500, 503,
                parameters=[
                    {"name": "limit", "in": "query",
                     "description": f"How many plants at most (a page holds {PAGE_MAX} at most)",
                     "schema": {"type": "integer", "format": "int32", "minimum": 0}},
                    {"name": "after", "in": "query",
                     "description": "Where a page starts: the cursor of a next link, "
                                    "opaque to clients",
                     "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{11}$"}}]),
            "post": _operation(
                "addPlant", "plants", "Add a plant", "Creates a new plant in the store",
                {"200": {"description": "plant response", "content": _json_content(_PLANT)}},
                400, 401, 408, 409, 411, 413, 415, 500, 503,
                requestBody={"description": "Plant to add to the store", "required": True,
                             "content": _NEW_PLANT}),
        },
        "/plants/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "description": "The plant's id",
                            "schema": {"type": "integer", "format": "int64"}}],
            "delete": _operation(
                "deletePlant", "plants", "Delete a plant", "Its id can be used again",
                {"204": {"description": "The plant is deleted"}}, 400, 401, 404, 500, 503),
        },
        "/openapi.json": {"get": _operation(
            "getOpenApiDocument", "service", "Read this document",
            "The one request that needs no token",
            {"200": {"description": "The OpenAPI document",
                     "content": _json_content({"type": "object"})}},
            security=[])},
        "/health": {"get": _operation(
            "checkHealth", "service", "Check that the service can reach its store",
            "For load balancers and orchestrators; no token needed",
            {"200": {"description": "The store answers", "content": _json_content({
                "type": "object", "required": ["status"],
                "properties": {"status": {"const": "ok"}}})}},
            500, 503, security=[])},
    },
    "webhooks": {"/plant/webhook": {"post": _operation(  # the sample's, when a webhook URL is set
        "newPlant", "plants", "A new plant, sent to each webhook URL",
        "Information about a new plant added to the store, signed as Standard Webhooks says: "
        "webhook-signature is v1, and the base64 HMAC-SHA256 of webhook-id.webhook-timestamp.body",
        {"200": {"description":
                 "Return a 200 status to indicate that the data was received successfully"}},
        security=[],
        parameters=[{"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
                    for name in ("webhook-id", "webhook-timestamp", "webhook-signature")],
        requestBody={"description": "Information about a new plant in the system",
                     "content": _NEW_PLANT})}},
    "components": {
        "schemas": {  # the specification's own, unchanged
            "Plant": {"type": "object", "required": ["name"], "properties": {
                "name": {"description": "The name of the plant", "type": "string"},
                "tag": {"description": "Tag to specify the type", "type": "string"}}},
            "NewPlant": {"allOf": [_PLANT, {"type": "object", "required": ["id"], "properties": {
                "id": {"description": "Identification number of the plant", "type": "integer",
                       "format": "int64"}}}]},
            "Error": {"type": "object", "required": ["error", "message"], "properties": {
                "error": {"type": "integer", "format": "int32"}, "message": {"type": "string"}}},
        },
        "responses": {
            f"Error{status}": {
                "description": text,
                "content": _json_content({"$ref": "#/components/schemas/Error"}),
                **({"headers": {_ERROR_HEADERS[status]: {"schema": {"type": "string"}}}}
                   if status in _ERROR_HEADERS else {})}
            for status, text in _ERRORS.items()
        },
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
    },
}
