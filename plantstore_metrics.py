"""What an operator and an orchestrator ask: GET /metrics, for Prometheus, and GET
/livez, the liveness probe.
"""

import contextlib

from plantstore import JSON_HEADERS, HTTPError, __version__, json_string, operation
from plantstore_cors import receiver_origin

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text format
METRICS = """\
# HELP plantstore_info The version of plantstore that answered this scrape.
# TYPE plantstore_info gauge
plantstore_info{{version="{version}"}} 1
# HELP plantstore_database_up Whether the store answered this scrape's question in time.
# TYPE plantstore_database_up gauge
plantstore_database_up {up}
"""
RECEIVER_METRICS = {  # a series a receiver, from a figure of WebhookSender.backlog()
    "plantstore_webhook_events_waiting": "Webhook events not yet delivered.",
    "plantstore_webhook_events_failing": "Waiting events whose last attempt failed.",
    "plantstore_webhook_oldest_event_age_seconds": "Since the oldest waiting event's "
    "plant was created.",
}


def add_metrics(application, sender):
    """Serve GET /metrics, with a token: figures of the whole service, not of the
    process that answers, which a load balancer picks. The store is asked as /health
    asks it, and the sender for its receivers, from the outbox every process shares
    (the SQL store's, else its own in memory). A receiver is named by its origin alone
    (its path or query may hold a secret); one configured shows 0 when none of its
    events wait. Counts and times of requests come from the server in front."""
    configured = [receiver_origin(url) for url in sender.urls] if sender else []

    @operation("GET", "/metrics")
    def getMetrics(environ, _):
        up, rows = 0, None
        # the database is away, or did not answer in time; or the count did not come
        with contextlib.suppress(HTTPError):
            application.checkHealth(environ, None)
            up = 1
            rows = sender.backlog() if sender else []
        # with no count, no figures: a receiver's 0 would say that none of its wait
        receivers = {origin: [0, 0, 0.0] for origin in configured if rows is not None}
        for url, waiting, failing, age in rows or ():
            figures = receivers.setdefault(receiver_origin(url), [0, 0, 0.0])
            figures[0] += waiting
            figures[1] += failing
            # the oldest event's age; None for events of 1.3.0 alone
            figures[2] = max(figures[2], age or 0)
        text = METRICS.format(version=__version__, up=up)
        for at, (name, meaning) in enumerate(RECEIVER_METRICS.items()):
            text += f"# HELP {name} {meaning}\n# TYPE {name} gauge\n"
            for origin, figures in receivers.items():
                figure = round(figures[at], 3)
                text += f"{name}{{receiver={json_string(origin)}}} {figure}\n"
        return 200, text.encode(), [("Content-Type", METRICS_TYPE)]

    application.declare(getMetrics)


def add_liveness(application):
    """Serve GET /livez, to anyone: 200 while the process answers, asking no database.
    It is an orchestrator's liveness probe, and /health, which asks the store, its
    readiness probe: a database away must not have every process restarted."""

    @operation("GET", "/livez", token=False)
    def checkLiveness(_environ, _):
        return 200, b'{"status": "ok"}', JSON_HEADERS

    application.declare(checkLiveness)
