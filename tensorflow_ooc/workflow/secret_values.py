"""Secret variables of a spec: which ``${NAME}`` references are secret (named in the spec's
``secrets`` or matching an operator's pattern), and the :class:`Mask` that keeps their values out of
run records, events, log lines and notifications."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

#: variable names whose values are secret unless the operator says otherwise (case-insensitive)
DEFAULT_SECRET_PATTERNS = (
    "*TOKEN*",
    "*PASSWORD*",
    "*PASSWD*",
    "*SECRET*",
    "*CREDENTIAL*",
    "*API_KEY*",
    "*APIKEY*",
    "*ACCESS_KEY*",
    "*PRIVATE_KEY*",
)

#: more patterns from the operator's environment (comma-separated), added to the defaults
SECRET_PATTERNS_ENV = "TFOOC_SECRET_PATTERNS"

#: what a secret value is replaced by wherever the run writes or says something
MASKED = "***"


def split_patterns(given: Iterable[str] | None) -> list[str]:
    """Patterns from ``--secret-pattern`` values, each possibly comma-separated (``*TOKEN*,*PW*``)."""
    return [p.strip() for g in (given or ()) for p in str(g).split(",") if p.strip()]


def secret_patterns(given: Sequence[str] | None = None, *, environment: bool = True) -> tuple[str, ...]:
    """The name patterns of secret variables: :data:`DEFAULT_SECRET_PATTERNS`, then those of
    ``$TFOOC_SECRET_PATTERNS`` (with ``environment``), then ``given`` (``--secret-pattern``); an
    operator adds patterns, never removes one."""
    extra = split_patterns([os.environ.get(SECRET_PATTERNS_ENV, "")] if environment else []) + split_patterns(given)
    return tuple(dict.fromkeys((*DEFAULT_SECRET_PATTERNS, *extra)))


def is_secret(name: str, patterns: Sequence[str], marked: Iterable[str] = ()) -> bool:
    """Whether variable ``name`` is secret: named in ``marked`` or matching one of ``patterns``
    (shell-style, case-insensitive).

    Examples
    --------
    >>> is_secret("SLACK_TOKEN", DEFAULT_SECRET_PATTERNS), is_secret("RANK", DEFAULT_SECRET_PATTERNS)
    (True, False)
    """
    upper = name.upper()
    return name in set(marked) or any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)


class Mask:
    """Replaces the values of a run's secret variables by :data:`MASKED` in text and in JSON-like
    objects (the strings inside dicts and lists; keys are the program's own and left alone).

    Parameters
    ----------
    values : iterable of str
        The secret values; empty ones are ignored. Longer values are replaced first, so a value
        that contains another is masked whole.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = tuple(sorted({v for v in values if v}, key=len, reverse=True))

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self, text: str) -> str:
        """``text`` with every secret value replaced."""
        for v in self.values:
            if v in text:
                text = text.replace(v, MASKED)
        return text

    def apply(self, obj: Any) -> Any:
        """A copy of ``obj`` (str, dict, list, tuple or a scalar) with its strings masked."""
        if not self.values:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.apply(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.apply(v) for v in obj]
        return obj


class MaskingFilter(logging.Filter):
    """A log handler's filter that masks secret values in each record's message (args merged in)
    and exception text, so a log line never carries one."""

    def __init__(self, mask: Mask) -> None:
        super().__init__("")
        self.mask = mask

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not fit its format: left to the handler
            return True
        masked = self.mask.text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask.text(record.exc_text)
        return True


@contextlib.contextmanager
def masked_logs(mask: Mask, loggers: Sequence[str] = ("", "tensorflow_ooc", "distributed")) -> Iterator[None]:
    """Mask secret values in what every handler of ``loggers`` (the root's included) writes while
    the block runs."""
    if not mask:
        yield
        return
    flt = MaskingFilter(mask)
    handlers = {id(h): h for name in loggers for h in logging.getLogger(name or None).handlers}
    for h in handlers.values():
        h.addFilter(flt)
    try:
        yield
    finally:
        for h in handlers.values():
            h.removeFilter(flt)


__all__ = [
    "DEFAULT_SECRET_PATTERNS",
    "MASKED",
    "Mask",
    "MaskingFilter",
    "SECRET_PATTERNS_ENV",
    "is_secret",
    "masked_logs",
    "secret_patterns",
    "split_patterns",
]
