"""Webhook notifications: the spec's ``webhooks`` URLs each receive one JSON object (an HTTP POST)
when a run succeeds (``on_success``), fails (``on_failure``) or retries a step or its driver
(``on_retry``). A webhook that fails (refused, an HTTP error, slower than its timeout) is logged and
recorded; it never changes the run's outcome. Secret values never leave in a payload or a log line.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

from ..version import __version__
from .records import Recorder, now_iso

log = logging.getLogger("tensorflow_ooc.workflow")

WEBHOOK_EVENTS = ("on_success", "on_failure", "on_retry")
WEBHOOK_TIMEOUT = 10.0  # seconds a webhook may take (``$TFOOC_WEBHOOK_TIMEOUT_S``)
MAX_NOTIFICATIONS = 100  # outcomes kept in a record (a step retried often keeps the latest)


def payload(rec: Recorder, event: str, **extra: Any) -> dict[str, Any]:
    """The JSON object a webhook receives: what happened, the run and its steps' states.

    Parameters
    ----------
    rec : Recorder
        The run's recorder (its record as it is now).
    event : str
        ``on_success``, ``on_failure`` or ``on_retry``.
    **extra
        Fields of the event (the step and error of a retry, ...).
    """
    r = rec.record
    body = {
        "event": event,
        "time": now_iso(),
        "run_id": r.run_id,
        "workflow": r.workflow,
        "state": r.state,
        "exit_code": r.exit_code,
        "error": r.error,
        "run_date": r.run_date,
        "storage": r.storage,
        "spec": r.spec_path,
        "mode": r.mode,
        "host": r.host,
        "attempt": len(r.attempts) or None,
        "created_at": r.created_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "steps": {name: st.state for name, st in r.steps.items()},
        "tfooc": __version__,
        **extra,
    }
    return rec.mask.apply(body)


def post_json(url: str, body: dict[str, Any], timeout: float) -> int:
    """POST ``body`` as JSON to ``url``; the HTTP status (an error status raises)."""
    data = json.dumps(body, default=str).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"tfooc/{__version__}"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the spec's http(s) URL
        return int(response.status)


def notify(webhooks: Any, rec: Recorder, event: str, **extra: Any) -> None:
    """Tell each URL of ``webhooks`` (the spec's :class:`~.step_models.Webhooks`, or None) for
    ``event``; each outcome goes into the record (``notifications``) and a ``webhook`` event."""
    if webhooks is None:
        return
    urls = webhooks.urls(event)
    if not urls:
        return
    body = payload(rec, event, **extra)
    timeout = float(os.environ.get("TFOOC_WEBHOOK_TIMEOUT_S", WEBHOOK_TIMEOUT))
    for url in urls:
        shown = rec.mask.text(url)
        t0 = time.time()
        outcome: dict[str, Any] = {"event": event, "url": shown, "time": now_iso()}
        try:
            outcome["status"] = post_json(url, body, timeout)
        except urllib.error.HTTPError as exc:
            outcome["error"] = f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            outcome["error"] = f"{type(exc).__name__}: {reason}"
        outcome["seconds"] = round(time.time() - t0, 3)
        failed = "error" in outcome
        outcome = rec.mask.apply(outcome)
        try:
            notes = (rec.record.notifications + [outcome])[-MAX_NOTIFICATIONS:]
            rec.update(notifications=notes)
            rec.event(
                "webhook",
                f"webhook {event} {shown}: "
                + (f"failed ({outcome['error']}); the run's outcome stands" if failed else f"HTTP {outcome['status']}"),
                level="warning" if failed else "info",
                **{("hook" if k == "event" else k): v for k, v in outcome.items() if k != "time"},
            )
        except Exception as exc:  # the record cannot be written: the outcome is still logged
            log.warning("webhook %s %s: %s (could not record it: %s)", event, shown, outcome.get("error", "done"), exc)


__all__ = ["WEBHOOK_EVENTS", "notify", "payload", "post_json"]
