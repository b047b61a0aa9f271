"""The OpenAPI document the service serves at GET /openapi.json, each operation by its
handler's operationId.
"""

import json
from urllib.parse import quote

from plantstore import JSON_HEADERS, PAGE_MAX, json_string, operation

# The document as it is served, but for `servers`, which says where the application is
# mounted. Each operation is its handler's, by its operationId, the handler's name: a
# test holds the two to each other, both ways, and `security: []` to token=False.
# HEAD and OPTIONS are not operations in it, though every route answers them
# (docs/http.md): a client has nothing to call there; nor, for that reason, is 405.
OPENAPI = json.loads(
    """{
  "openapi": "3.1.0",
  "info": {
    "title": "Plant Store",
    "version": "1.0.0",
    "license": {"name": "MIT", "identifier": "MIT"},
    "description": "Plants kept for the holders of a token; new ones go to webhooks"
  },
  "tags": [
    {"name": "plants", "description": "The plants in the store"},
    {"name": "service", "description": "About the service itself"}
  ],
  "security": [{"bearerAuth": []}],
  "paths": {
    "/plants": {
      "get": {
        "operationId": "listPlants",
        "tags": ["plants"],
        "summary": "List plants, oldest first",
        "description": "Every plant, streamed; with `limit`, a page and a next `Link`",
        "parameters": [
          {
            "name": "limit",
            "in": "query",
            "description": "How many plants at most (a page holds {PAGE_MAX} at most)",
            "schema": {"type": "integer", "format": "int32", "minimum": 0}
          },
          {
            "name": "after",
            "in": "query",
            "description": "The cursor of a next link, where the page starts",
            "schema": {"type": "integer", "format": "int64"}
          }
        ],
        "responses": {
          "200": {
            "description": "The plants, oldest first",
            "content": {
              "application/json": {
                "schema": {
                  "type": "array",
                  "items": {"$ref": "#/components/schemas/Plant"}
                }
              }
            },
            "headers": {
              "Link": {
                "description": "The next page (RFC 8288), when more may follow",
                "schema": {"type": "string"}
              }
            }
          },
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      },
      "post": {
        "operationId": "addPlant",
        "tags": ["plants"],
        "summary": "Add a plant",
        "description": "Creates a new plant in the store",
        "requestBody": {
          "description": "Plant to add to the store",
          "required": true,
          "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/NewPlant"}}
          }
        },
        "responses": {
          "200": {
            "description": "plant response",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/Plant"}}
            }
          },
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "408": {"$ref": "#/components/responses/Error408"},
          "409": {"$ref": "#/components/responses/Error409"},
          "411": {"$ref": "#/components/responses/Error411"},
          "413": {"$ref": "#/components/responses/Error413"},
          "415": {"$ref": "#/components/responses/Error415"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/plants/{id}": {
      "parameters": [
        {
          "name": "id",
          "in": "path",
          "required": true,
          "description": "The plant's id",
          "schema": {"type": "integer", "format": "int64"}
        }
      ],
      "delete": {
        "operationId": "deletePlant",
        "tags": ["plants"],
        "summary": "Delete a plant",
        "description": "Its id can be used again",
        "responses": {
          "204": {"description": "The plant is deleted"},
          "400": {"$ref": "#/components/responses/Error400"},
          "401": {"$ref": "#/components/responses/Error401"},
          "404": {"$ref": "#/components/responses/Error404"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/openapi.json": {
      "get": {
        "operationId": "getOpenApiDocument",
        "security": [],
        "tags": ["service"],
        "summary": "Read this document",
        "description": "Needs no token",
        "responses": {
          "200": {
            "description": "The OpenAPI document",
            "content": {"application/json": {"schema": {"type": "object"}}}
          }
        }
      }
    },
    "/health": {
      "get": {
        "operationId": "checkHealth",
        "security": [],
        "tags": ["service"],
        "summary": "Check that the service can reach its store",
        "description": "For load balancers and orchestrators; no token needed",
        "responses": {
          "200": {"$ref": "#/components/responses/Ok"},
          "500": {"$ref": "#/components/responses/Error500"},
          "503": {"$ref": "#/components/responses/Error503"}
        }
      }
    },
    "/livez": {
      "get": {
        "operationId": "checkLiveness",
        "security": [],
        "tags": ["service"],
        "summary": "Check that the process answers",
        "description": "For an orchestrator's liveness probe: it asks no database",
        "responses": {"200": {"$ref": "#/components/responses/Ok"}}
      }
    },
    "/metrics": {
      "get": {
        "operationId": "getMetrics",
        "tags": ["service"],
        "summary": "Read the service's figures, for Prometheus",
        "description": "The same from every process: read from the store they share",
        "responses": {
          "200": {
            "description": "Prometheus's text format 0.0.4",
            "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}
          },
          "401": {"$ref": "#/components/responses/Error401"}
        }
      }
    }
  },
  "webhooks": {
    "/plant/webhook": {
      "post": {
        "operationId": "newPlant",
        "tags": ["plants"],
        "summary": "A new plant, sent to each webhook URL",
        "description": "A new plant, signed as Standard Webhooks says (HMAC-SHA256)",
        "security": [],
        "parameters": [
          {
            "name": "webhook-id",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          },
          {
            "name": "webhook-timestamp",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          },
          {
            "name": "webhook-signature",
            "in": "header",
            "required": true,
            "schema": {"type": "string"}
          }
        ],
        "requestBody": {
          "description": "Information about a new plant in the system",
          "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/NewPlant"}}
          }
        },
        "responses": {
          "200": {
            "description":
              "Return a 200 status to indicate that the data was received successfully"
          }
        }
      }
    }
  },
  "components": {
    "schemas": {
      "Plant": {
        "type": "object",
        "required": ["name"],
        "properties": {
          "name": {"description": "The name of the plant", "type": "string"},
          "tag": {"description": "Tag to specify the type", "type": "string"}
        }
      },
      "NewPlant": {
        "allOf": [
          {"$ref": "#/components/schemas/Plant"},
          {
            "type": "object",
            "required": ["id"],
            "properties": {
              "id": {
                "description": "Identification number of the plant",
                "type": "integer",
                "format": "int64"
              }
            }
          }
        ]
      },
      "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
          "error": {"type": "integer", "format": "int32"},
          "message": {"type": "string"}
        }
      }
    },
    "responses": {
      "Ok": {
        "description": "It answers",
        "content": {
          "application/json": {
            "schema": {
              "type": "object",
              "required": ["status"],
              "properties": {"status": {"const": "ok"}}
            }
          }
        }
      },
      "Error400": {
        "description": "The request is not valid; the message names the field and rule",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error401": {
        "description": "The bearer token is missing or not accepted",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}
      },
      "Error404": {
        "description": "No plant has this id",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error408": {
        "description": "The request body did not arrive in time",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error409": {
        "description": "A plant with this id already exists; it is left unchanged",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error411": {
        "description": "A chunked body this server cannot read: send a Content-Length",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error413": {
        "description": "The request body is larger than the limit",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error415": {
        "description": "The body is not application/json",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"Accept": {"schema": {"type": "string"}}}
      },
      "Error500": {
        "description": "The server failed",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        }
      },
      "Error503": {
        "description": "The database is away; try again after Retry-After seconds",
        "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
        },
        "headers": {"Retry-After": {"schema": {"type": "string"}}}
      }
    },
    "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}
  }
}""".replace("{PAGE_MAX}", str(PAGE_MAX))
)


def add_document(application):
    """Serve OPENAPI at GET /openapi.json, to anyone: tools read it before they have a
    token. `servers` says where the application is mounted."""
    document = json.dumps({"servers": [{"url": "MOUNTED"}], **OPENAPI}, indent=2)

    @operation("GET", "/openapi.json", token=False)
    def getOpenApiDocument(environ, _):
        mounted = json_string(quote(environ.get("SCRIPT_NAME", "")) or "/")
        return 200, document.replace('"MOUNTED"', mounted, 1).encode(), JSON_HEADERS

    application.declare(getOpenApiDocument)
