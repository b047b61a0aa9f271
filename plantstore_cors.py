"""CORS, as a WSGI wrapper the core never sees: browser pages of the listed origins may
call the service. Also an origin as a browser writes it, which webhooks and metrics use
to name a receiver without its path or query.
"""

import re
from urllib.parse import urlsplit


def browser_origin(origin):
    """The origin as a browser sends it: lower-case, no default port; or ValueError."""
    match = re.fullmatch(
        r"(https?)://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?", origin.lower()
    )
    if not match or match[3] and not 0 < int(match[3]) < 65536:
        raise ValueError(
            "each origin in PLANTSTORE_CORS_ORIGINS must be one a browser sends, as "
            "https://example.org or http://localhost:3000: a port from 1 to 65535 "
            "if any, no path, no trailing slash, no *"
        )
    scheme, host, port = match.groups()
    origin = f"{scheme}://{host}"
    if port and int(port) != {"http": 80, "https": 443}[scheme]:  # not the default
        origin += f":{int(port)}"
    return origin


def receiver_origin(url):
    """A receiver in a log line or a metric, by its origin as a browser writes it;
    never a path or a query, which may hold a secret."""
    return browser_origin("://".join(urlsplit(url)[:2]))


def with_cors(application, origins):
    """The application, answering browser pages of the listed origins (as a browser
    sends Origin).

    Every answer varies with Origin. An answer to a listed origin may be read by its
    page; to its preflight (OPTIONS with Access-Control-Request-Method) the core's Allow
    is what it may send.
    """

    def cors(environ, start_response):
        origin = environ.get("HTTP_ORIGIN")

        def start(status, headers, exc_info=None):
            headers.append(("Vary", "Origin"))
            if origin in origins:
                headers += [
                    ("Access-Control-Allow-Origin", origin),
                    (
                        "Access-Control-Expose-Headers",
                        "Link, Retry-After, WWW-Authenticate, X-Request-ID",
                    ),
                ]
                if (
                    environ["REQUEST_METHOD"] == "OPTIONS"
                    and status.startswith("204")
                    and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in environ
                ):
                    headers += [
                        ("Access-Control-Allow-Methods", dict(headers)["Allow"]),
                        (
                            "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, X-Request-ID",
                        ),
                        ("Access-Control-Max-Age", "600"),
                    ]
            return start_response(status, headers, exc_info)

        return application(environ, start)

    return cors
