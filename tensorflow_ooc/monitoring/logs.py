"""Log lines for people and for machines, and log lines that do not break progress bars.

- :class:`JsonFormatter`: one JSON object per log record (``tfooc --log-format json``), with
  ``time`` (UTC ISO 8601, milliseconds), ``level``, ``logger``, ``message`` and, where the record
  has them, ``run_id``, ``step``, ``iteration``, ``event`` and ``exception``.
- :class:`TqdmHandler`: writes each line with ``tqdm.write``, which clears the progress bars on
  the stream, prints the line and redraws the bars below it, so a line never lands on a
  half-drawn bar.

``run_id`` and ``step`` come from the record (``extra={"run_id": ...}``) or, for lines logged by
the thread that drives a workflow run, from that run's event capture (the
``EventLogHandler`` the runner installs on the ``tensorflow_ooc`` logger while the run goes):
CP-ALS and the converter then need not know which run they serve.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
CONTEXT_FIELDS = ("run_id", "step", "iteration", "event")


def _run_context(record: logging.LogRecord) -> dict[str, Any]:
    """``run_id`` and ``step`` of the workflow run driven by the thread that logged ``record``."""
    for h in logging.getLogger("tensorflow_ooc").handlers:
        recorder = getattr(h, "recorder", None)
        if recorder is not None and getattr(h, "thread_id", None) == record.thread:
            return {"run_id": recorder.record.run_id, "step": getattr(h, "step", None)}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in _run_context(record).items():
            if v is not None:
                out[k] = v
        for k in CONTEXT_FIELDS:
            v = getattr(record, k, None)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TqdmHandler(logging.StreamHandler):
    """A stream handler that prints through ``tqdm.write`` (progress bars cleared, then redrawn).

    Without a stream it writes to ``sys.stderr`` as it is at each line, as tqdm's bars do: a
    stream captured when the handler was made may be closed by then (a test's capture, a
    redirected stderr)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._follow_stderr = stream is None

    def _target(self) -> TextIO:
        return sys.stderr if self._follow_stderr else self.stream

    def flush(self) -> None:
        with self.lock:
            target = self._target()
            if target is not None and hasattr(target, "flush") and not getattr(target, "closed", False):
                target.flush()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            msg = self.format(record)
            tqdm.write(msg, file=self._target())
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def make_handler(log_format: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """The CLI's handler: ``text`` (``HH:MM:SS LEVEL message``) or ``json``, through tqdm."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    h = TqdmHandler(stream)
    h.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT, "%H:%M:%S"))
    h._tfooc_cli = True  # type: ignore[attr-defined]   # replaced, not stacked, when set up again
    return h


def setup_logging(level: int, log_format: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Route the ``tensorflow_ooc`` loggers to stderr (or ``stream``) in ``log_format``.

    Called once per CLI command; a handler from an earlier call in the same process (tests call
    ``main`` many times) is replaced, so each line is printed once, in the latest format, to the
    latest stream.
    """
    root = logging.getLogger("tensorflow_ooc")
    for old in [h for h in root.handlers if getattr(h, "_tfooc_cli", False)]:
        root.removeHandler(old)
    h = make_handler(log_format, stream)
    root.addHandler(h)
    root.setLevel(level)
    return h
