"""``tfooc``: the command-line interface: the top-level parser, its common options, and ``main``.

Every command logs what it is doing to stderr, shows progress bars on long steps (``--quiet``
turns both off), and on bad input prints one ``tfooc: error: ...`` line and exits with status 2.
One module per command family (data, cp, tucker, complete, workflow); shared options in ``options``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from . import complete, cp, data, tucker, workflow
from .complete import cmd_complete
from .cp import cmd_cpd
from .data import cmd_convert, cmd_generate, cmd_info
from .options import (
    DEFAULT_STORAGE,
    EXIT_BAD_INPUT,
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
from .tucker import cmd_tucker
from .workflow import cmd_cancel, cmd_logs, cmd_quickstart, cmd_run, cmd_status, cmd_submit, find_quickstart_spec

__all__ = [
    "DEFAULT_STORAGE",
    "EXIT_BAD_INPUT",
    "EXIT_INTERRUPTED",
    "MAX_COUNT",
    "build_parser",
    "cmd_cancel",
    "cmd_complete",
    "cmd_convert",
    "cmd_cpd",
    "cmd_generate",
    "cmd_info",
    "cmd_logs",
    "cmd_quickstart",
    "cmd_run",
    "cmd_status",
    "cmd_submit",
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
        epilog="Exit status: 0 on success, 2 on bad input (the message names the file, line or field), "
        "1 on internal errors, 130 when interrupted. Docs: README.md and docs/FORMAT.md.",
    )
    p.add_argument("--version", action="version", version=f"tfooc {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and only warnings in the log")
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
        help="no progress bars and only warnings in the log",
    )
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    # monitoring and deployment (tensorflow_ooc/monitoring): log format and Dask TLS, also after the subcommand
    for parser, default in ((p, None), (common, argparse.SUPPRESS)):
        parser.add_argument(
            "--log-format",
            choices=["text", "json"],
            default=default or "text",
            help="log lines as text (default) or one JSON object per line (time, level, logger, "
            "message, run_id, step, iteration)",
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

    data.add_commands(add)  # generate, convert, info
    workflow.add_commands(add)  # quickstart, run, submit, status, logs, cancel
    cp.add_commands(add)  # cpd
    complete.add_commands(add)  # complete
    tucker.add_commands(add)  # tucker (Tucker HOOI)
    return p


def _setup_logging(quiet: bool, verbose: bool, log_format: str = "text") -> None:
    from ..monitoring.logs import setup_logging

    # lines go through tqdm.write: a progress bar is cleared first and redrawn below the line
    setup_logging(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO, log_format)


def main(argv: Sequence[str] | None = None) -> int:
    import dask

    from ..disk import disk_full_error, is_disk_full
    from ..errors import DiskFullError, TfoocError
    from ..monitoring.tls import check_scheduler_address, tls_config

    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet, args.verbose, args.log_format)
    paths_for_workers(args)  # relative paths sent to a cluster's workers: made absolute
    try:
        # Dask's client TLS settings for this command: every Client it makes picks them up
        with dask.config.set(tls_config(args.tls_ca_file, args.tls_cert, args.tls_key)):
            check_scheduler_address(getattr(args, "scheduler", None))
            return int(args.func(args) or 0)
    except DiskFullError as exc:  # not bad input: the command may succeed once there is space
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return 1
    except (TfoocError, ValueError, FileExistsError, FileNotFoundError, TypeError) as exc:
        print(f"tfooc: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"tfooc: error: {disk_full_error(exc, None)}", file=sys.stderr)  # a write no site translated
        return 1
    except KeyboardInterrupt:
        print("tfooc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
