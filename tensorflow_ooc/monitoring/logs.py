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

- :class:`JsonLinesStream`: in JSON mode the CLI's stderr, so that every line on it is one JSON
  object whoever writes it: the error line, argparse's usage errors, Python warnings and third
  party log lines that do not go through :class:`JsonFormatter` are each wrapped in one.
- :func:`progress_wanted`: progress bars only for people: on a terminal, in text mode.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
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


def _now_iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _now_iso(record.created),
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


def progress_wanted(quiet: bool, log_format: str, stream: TextIO | None = None) -> bool:
    """Whether a command draws progress bars: only for a person watching a terminal.

    A bar is redrawn with carriage returns many times a second; in a file, a pipe or a log
    collector those redraws are fragments that break every line they touch (a JSON reader then
    parses none), so bars are off in JSON mode, when ``stream`` (default ``sys.stderr``) is not
    a terminal, and with ``--quiet``. The log lines stay (``--quiet`` is what drops them).
    """
    stream = sys.stderr if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    return not quiet and log_format == "text" and tty


class JsonLinesStream:
    """A text stream that passes JSON lines through and wraps anything else in one JSON object.

    The CLI puts it in place of ``sys.stderr`` in JSON mode. Log records arrive as JSON already
    (:class:`JsonFormatter`); what does not (the ``tfooc: error: ...`` line, argparse's usage
    errors, Python warnings, a library's own log handler) becomes
    ``{"time", "level", "logger": "stderr", "message"}`` with level ``ERROR`` for ``tfooc:``
    lines, else ``WARNING``. Text is collected per thread up to the end of a ``write`` that ends
    a line, so a message printed in one call stays one object even when it spans lines (a
    failed run's error and its hint) and two threads' lines never mix.
    """

    ERROR_PREFIX = "tfooc: error: "

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        key = threading.get_ident()
        with self._lock:
            buf = self._pending.pop(key, "") + text
            if not buf.endswith("\n"):
                self._pending[key] = buf
                return len(text)
            self.stream.write(self._as_json_lines(buf[:-1]))
        return len(text)

    def _as_json_lines(self, block: str) -> str:
        lines = [s for s in block.split("\n") if s.strip()]
        if not lines:
            return ""
        if all(self._is_json_object(s) for s in lines):
            return "\n".join(lines) + "\n"
        text = "\n".join(s.rstrip("\r") for s in block.strip("\n").split("\n"))
        level = "ERROR" if text.startswith("tfooc: ") else "WARNING"
        logger = "tensorflow_ooc.cli" if text.startswith("tfooc: ") else "stderr"
        message = text.removeprefix(self.ERROR_PREFIX)
        record = {"time": _now_iso(datetime.now(UTC).timestamp()), "level": level, "logger": logger, "message": message}
        return json.dumps(record) + "\n"

    @staticmethod
    def _is_json_object(line: str) -> bool:
        if not line.startswith("{"):
            return False
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False

    def flush(self) -> None:
        # a partial line of this thread stays pending (its newline follows); another thread's too
        if not getattr(self.stream, "closed", False):
            self.stream.flush()

    def finish(self) -> None:
        """Write what is pending, whole (a last line without its newline: a write cut short)."""
        with self._lock:
            for key in list(self._pending):
                rest = self._pending.pop(key)
                if rest.strip():
                    self.stream.write(self._as_json_lines(rest))
        self.flush()

    def isatty(self) -> bool:
        return False  # nothing drawn for a terminal goes to a JSON stream

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")

    @property
    def closed(self) -> bool:
        return bool(getattr(self.stream, "closed", False))

    def __getattr__(self, name: str) -> Any:
        # the rest of a text stream's interface (name, errors, writable, ...) is the wrapped one's
        if name == "stream":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)
