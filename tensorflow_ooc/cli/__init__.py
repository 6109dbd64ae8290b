"""``tfooc``: the command-line interface: the top-level parser, its common options, and ``main``.

Every command logs what it is doing to stderr, shows progress bars on long steps when stderr is a
terminal and the log is text (``--quiet`` turns both off; ``--log-format json`` makes every stderr
line one JSON object, with no bars), and on bad input prints one ``tfooc: error: ...`` line (in
JSON mode one object of level ERROR) and exits with status 2.
One module per command family (data, cp, apr, tucker, tt, complete, workflow); shared options in ``options``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from typing import Sequence

from . import apr, complete, cp, data, tt, tucker, workflow
from .apr import cmd_apr
from .complete import cmd_complete
from .cp import cmd_cpd
from .data import cmd_convert, cmd_generate, cmd_info
from .options import (
    DEFAULT_STORAGE,
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    MAX_COUNT,
    _Parser,
    iteration_bar,
    parse_ranks,
    parse_shape,
    parse_size,
    parse_skew,
    paths_for_workers,
    run_outputs,
)
from .tt import cmd_tt
from .tucker import cmd_tucker
from .workflow import (
    cmd_cancel,
    cmd_logs,
    cmd_quickstart,
    cmd_run,
    cmd_schema,
    cmd_status,
    cmd_submit,
    cmd_validate,
    find_quickstart_spec,
)

__all__ = [
    "DEFAULT_STORAGE",
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "MAX_COUNT",
    "build_parser",
    "cmd_apr",
    "cmd_cancel",
    "cmd_complete",
    "cmd_convert",
    "cmd_cpd",
    "cmd_generate",
    "cmd_info",
    "cmd_logs",
    "cmd_quickstart",
    "cmd_run",
    "cmd_schema",
    "cmd_status",
    "cmd_submit",
    "cmd_validate",
    "cmd_tt",
    "cmd_tucker",
    "find_quickstart_spec",
    "iteration_bar",
    "main",
    "parse_ranks",
    "parse_shape",
    "parse_size",
    "parse_skew",
    "run_outputs",
]


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    p = _Parser(
        prog="tfooc",
        description="Out-of-core sparse tensor decomposition on BLCO Zarr stores.",
        epilog="Progress bars are drawn only when stderr is a terminal and --log-format is text; "
        "log lines are kept either way. Exit status: 0 on success, 2 on bad input (the message names "
        "the file, line or field), 1 on internal errors, 130 when interrupted, 141 when the reader of "
        "the output went away (tfooc status | head -1). Docs: README.md and docs/FORMAT.md.",
    )
    p.add_argument("--version", action="version", version=f"tfooc {__version__}")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars and only warnings and errors in the log"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # -q/-v are accepted after the subcommand too (tfooc cpd STORE -q); SUPPRESS keeps a value given
    # before the subcommand when none is given after it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars and only warnings and errors in the log",
    )
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    # monitoring and deployment (tensorflow_ooc/monitoring): log format and Dask TLS, also after the subcommand
    for parser, default in ((p, None), (common, argparse.SUPPRESS)):
        parser.add_argument(
            "--log-format",
            choices=["text", "json"],
            default=default or "text",
            help="log lines as text (default) or json: every stderr line one JSON object (time, level, "
            "logger, message, run_id, step, iteration; errors too), no progress bars",
        )
        parser.add_argument(
            "--tls-ca-file",
            metavar="CA",
            default=default,
            help="Dask TLS: CA certificate of a tls:// scheduler (with --tls-cert, --tls-key)",
        )
        parser.add_argument("--tls-cert", metavar="CERT", default=default, help="Dask TLS: this client's certificate")
        parser.add_argument(
            "--tls-key",
            metavar="KEY",
            default=default,
            help="Dask TLS: this client's private key (unless CERT holds it)",
        )

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    data.add_commands(add)  # generate, convert, fiber-index, mode-copies, info
    workflow.add_commands(add)  # quickstart, run, submit, validate, schema, status, logs, cancel
    cp.add_commands(add)  # cpd
    apr.add_commands(add)  # apr (CP-APR)
    complete.add_commands(add)  # complete
    tucker.add_commands(add)  # tucker (Tucker HOOI)
    tt.add_commands(add)  # tt (tensor-train ALS)
    return p


def _setup_logging(quiet: bool, verbose: bool, log_format: str = "text") -> None:
    from ..monitoring.logs import setup_logging

    # lines go through tqdm.write: a progress bar is cleared first and redrawn below the line
    setup_logging(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO, log_format)


def _log_format_in(argv: Sequence[str]) -> str:
    """The ``--log-format`` of a command line, read before it is parsed: a JSON reader of stderr
    must get even a usage error as a JSON object. The last one given wins, as with argparse."""
    fmt = "text"
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--log-format" and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif a.startswith("--log-format="):
            fmt = a.split("=", 1)[1]
    return fmt


def _drop_broken_pipes() -> None:
    """After a reader closed our stdout or stderr (``tfooc status | head -1``): point them at
    /dev/null, so that the interpreter's last flush at exit writes nowhere instead of printing
    another BrokenPipeError ("Exception ignored ...")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):  # a test's capture has no descriptor
            pass
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tfooc`` command line (``argv``, default ``sys.argv[1:]``); return its exit status.

    In JSON mode (``--log-format json``) every line written to stderr while it runs is one JSON
    object (:class:`~tensorflow_ooc.monitoring.logs.JsonLinesStream`), an internal error included
    (one object with the traceback in ``exception``). A reader that stops reading (``| head``)
    ends the command quietly with status 141 (128 + SIGPIPE, as a shell's own tools end).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = _log_format_in(argv) == "json"
    stderr = sys.stderr
    if json_mode:
        from ..monitoring.logs import JsonLinesStream

        sys.stderr = JsonLinesStream(stderr)
    try:
        try:
            code = _run(argv, json_mode)
            sys.stdout.flush()  # a closed pipe is found here, not by the interpreter's flush at exit
            return code
        except SystemExit:  # --help, --version, usage errors: flushed the same way
            sys.stdout.flush()
            raise
        finally:
            if json_mode:
                sys.stderr.finish()
    except BrokenPipeError:
        _drop_broken_pipes()
        return EXIT_BROKEN_PIPE
    finally:
        sys.stderr = stderr


def _run(argv: list[str], json_mode: bool) -> int:
    from ..disk import disk_full_error, is_disk_full
    from ..errors import DiskFullError, TfoocError
    from ..monitoring.logs import progress_wanted
    from ..monitoring.tls import check_scheduler_address, tls_config

    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet, args.verbose, args.log_format)
    _warnings_as_log_lines()
    # bars only for a person at a terminal: never in JSON mode or into a file or pipe
    args.progress = progress_wanted(args.quiet, args.log_format)
    paths_for_workers(args)  # relative paths sent to a cluster's workers: made absolute
    try:
        # Dask's client TLS settings for this command: every Client it makes picks them up. Dask
        # is imported only when there are some: status, logs and --help start without it
        tls = tls_config(args.tls_ca_file, args.tls_cert, args.tls_key)
        if tls:
            import dask

            settings = dask.config.set(tls)
        else:
            settings = contextlib.nullcontext()
        # the command's claims on its outputs (locks) are released when it ends, however it ends
        with settings, contextlib.ExitStack() as args.cleanup:
            check_scheduler_address(getattr(args, "scheduler", None))
            return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except DiskFullError as exc:  # not bad input: the command may succeed once there is space
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return 1
    except (TfoocError, ValueError, FileExistsError, FileNotFoundError, TypeError) as exc:
        print(f"tfooc: error: {in_flags(str(exc), parser, args.command)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if is_disk_full(exc):
            print(f"tfooc: error: {disk_full_error(exc, None)}", file=sys.stderr)  # a write no site translated
        else:  # read-only file systems, permissions, paths through a file, names too long: one line
            print(f"tfooc: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tfooc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if not json_mode:
            raise  # a traceback, for a person to report
        return _internal_error(exc)


_KEYWORD = re.compile(r"\b([a-z][a-z0-9_]*)=(True|False|None|'[^']*'|\"[^\"]*\"|[^\s,;)]+)")


def in_flags(message: str, parser: argparse.ArgumentParser, command: str | None) -> str:
    """``message`` with the API keywords it advises (``overwrite=True``, ``duplicates='sum'``)
    written as ``command``'s flags (``--overwrite``, ``--duplicates sum``), for errors raised by the
    API below a command; keywords the command has no flag for are left as they are."""
    sub = next((a.choices.get(command) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return message
    flags = {a.dest: max(a.option_strings, key=len) for a in sub._actions if a.option_strings}

    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if name not in flags:
            return m.group(0)
        if value in ("True", "False", "None"):
            return flags[name] if value == "True" else m.group(0)
        return f"{flags[name]} {value.strip(chr(39) + chr(34))}"

    return _KEYWORD.sub(flag, message)


def os_error_line(exc: OSError) -> str:
    """An OS error as one line naming the path and the cause."""
    import errno

    cause = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        cause = "read-only file system: nothing was written"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        cause = "permission denied: nothing was written"
    elif exc.errno == errno.ENOTDIR:
        cause = "a part of the path is a file, not a folder"
    elif exc.errno == errno.ENAMETOOLONG:
        cause = "file name too long"
    if exc.filename is None:
        return cause if exc.strerror else f"{type(exc).__name__}: {cause}"
    where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
    return f"{where}: {cause}"


def _warnings_as_log_lines() -> None:
    """Python warnings reach a person as one log line (no source line, no file and line number)."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        logging.getLogger("tensorflow_ooc").warning("%s", message)

    warnings.showwarning = show


def _internal_error(exc: BaseException) -> int:
    """JSON mode: an internal error as one log record (its traceback in ``exception``), status 1."""
    logging.getLogger("tensorflow_ooc.cli").error("internal error: %s", exc, exc_info=exc)
    return 1
