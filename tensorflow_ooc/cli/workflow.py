"""``tfooc quickstart``, ``run``, ``submit``, ``validate``, ``schema``, ``status``, ``logs`` and ``cancel``:
workflow specs and their runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from .options import DEFAULT_STORAGE, _tolerance, log


def find_quickstart_spec() -> Path:
    """``workflows/quickstart.yaml``: from ``$TFOOC_WORKFLOWS``, the source tree this package runs
    from, or the current directory."""
    candidates = [Path(os.environ["TFOOC_WORKFLOWS"]) / "quickstart.yaml"] if os.environ.get("TFOOC_WORKFLOWS") else []
    candidates += [
        Path(__file__).resolve().parents[2] / "workflows" / "quickstart.yaml",
        Path("workflows") / "quickstart.yaml",
    ]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(
        "workflows/quickstart.yaml not found (looked in "
        + ", ".join(map(str, candidates))
        + "); run tfooc run PATH/TO/quickstart.yaml, or set TFOOC_WORKFLOWS"
    )


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The main job: ``tfooc run workflows/quickstart.yaml``."""
    spec = find_quickstart_spec()
    log.info("quickstart: tfooc run %s", spec)
    args.spec, args.scheduler, args.force = str(spec), None, args.force
    return cmd_run(args)


# --- workflows ----------------------------------------------------------------------------------------


def _load(args: argparse.Namespace):
    from ..workflow import load_spec
    from ..workflow.spec_source import RUN_DATE, run_date

    variables = {}
    if getattr(args, "run_date", None) is not None:
        variables[RUN_DATE] = run_date(args.run_date, "--run-date", args.spec)
    return load_spec(
        args.spec,
        storage=args.storage,
        allow_paths=getattr(args, "allow_paths", None),
        overrides=getattr(args, "overrides", None) or (),
        variables=variables,
        secret_patterns=getattr(args, "secret_patterns", None),
    )


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a spec as ``tfooc run`` would, starting nothing: exit 0, or 2 with run's messages."""
    from ..workflow.runner import check_cluster

    workflow = _load(args)  # a bad spec raises SpecError: the message run prints, exit 2
    check_cluster(workflow, args.scheduler)  # run refuses a scheduler nobody answers at: so does this
    names = ", ".join(s.name for s in workflow.steps)
    print(f"{args.spec}: valid ({len(workflow.steps)} steps in run order: {names}; storage root {workflow.root})")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema of workflow specs."""
    from ..workflow.json_schema import spec_schema

    print(json.dumps(spec_schema(), indent=2))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    workflow = _load(args)  # a bad spec raises SpecError: exit 2, nothing started (nor loaded)
    from ..workflow.report import run_summary, shell_command
    from ..workflow.runner import execute

    outcome = execute(workflow, cluster=args.scheduler, force=args.force)
    mask = workflow.source.mask
    if not args.quiet:  # quiet means quiet: the exit status and the record tell the outcome
        print(mask.text(run_summary(outcome.record)))
    if outcome.state == "failed":
        print(
            f"tfooc: run {outcome.run_id} failed: {mask.text(outcome.record.error or '')}\n  details: "
            f"{shell_command('logs', outcome.run_id, '--storage', workflow.root)}\n  after fixing the cause, "
            "run the spec again: finished steps are skipped and CP-ALS resumes from its checkpoint",
            file=sys.stderr,
        )
    return outcome.exit_code


def cmd_submit(args: argparse.Namespace) -> int:
    from ..workflow.report import shell_command
    from ..workflow.submit import submit

    workflow = _load(args)
    try:
        run_id = submit(workflow, args.scheduler, force=args.force)
    except (OSError, TimeoutError) as exc:
        print(f"tfooc: error: could not submit to {args.scheduler}: {exc}", file=sys.stderr)
        return 1
    # hints that work as pasted: the storage root the run writes to, quoted as the shell needs it
    log.info(
        "submitted run %s to %s; follow it with: %s  (or %s)",
        run_id,
        args.scheduler,
        shell_command("status", run_id, "--storage", workflow.root),
        shell_command("logs", "-f", run_id, "--storage", workflow.root),
    )
    print(run_id)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ..workflow.records import EXIT_CODES, RunStore
    from ..workflow.report import run_summary, status_table, to_json

    runs = RunStore(args.storage)
    if not args.run:
        records = runs.list(limit=None if args.all else 20)
        print(
            json.dumps([json.loads(r.model_dump_json()) for r in records], indent=1)
            if args.json
            else status_table(records)
        )
        return 0
    if args.wait:
        from ..workflow.submit import wait

        rec = wait(args.storage, args.run, timeout=args.timeout)
    else:
        rec = runs.read(args.run)
    print(to_json(rec) if args.json else run_summary(rec))
    if args.wait:
        return EXIT_CODES.get(rec.state, 1) if rec.exit_code is None else rec.exit_code
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from ..workflow.records import RunStore
    from ..workflow.report import format_event, iteration_duplicates

    runs = RunStore(args.storage)
    run_id = runs.resolve(args.run)
    shown = 0

    def show_new() -> None:
        nonlocal shown
        events = runs.events(run_id)
        repeats = iteration_duplicates(events)  # older runs recorded each iteration twice
        for i in range(shown, len(events)):
            if i not in repeats:
                print(json.dumps(events[i]) if args.json else format_event(events[i]), flush=True)
        shown = len(events)

    while True:
        show_new()
        if not args.follow:
            return 0
        rec = runs.read(run_id)
        if rec.final or rec.display_state() == "lost":
            show_new()
            return 0
        time.sleep(0.5)


def cmd_cancel(args: argparse.Namespace) -> int:
    from ..workflow.submit import cancel, wait

    rec = cancel(args.storage, args.run)
    if rec.final and rec.state != "cancelled":
        print(f"run {rec.run_id} already {rec.state}: nothing to cancel")
        return 0
    if rec.state == "cancelled":
        print(f"run {rec.run_id} cancelled")
        return 0
    print(f"run {rec.run_id}: cancel requested; it stops before its next step or CP-ALS iteration")
    if args.wait:
        rec = wait(args.storage, rec.run_id, timeout=args.timeout)
        print(f"run {rec.run_id} {rec.display_state()}")
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``quickstart``, ``run``, ``submit``, ``validate``, ``schema``, ``status``, ``logs`` and
    ``cancel`` with the CLI's ``add`` (a subparser factory)."""
    root_help = "storage root (default ./storage or $TFOOC_STORAGE)"
    storage_help = (
        "storage root: a folder or fsspec URL (default: the spec's 'storage', else $TFOOC_STORAGE, else ./storage)"
    )
    # --set: repeatable dotted-path overrides of the spec (run, submit, validate)
    set_args = ("--set",)
    set_kw = dict(
        dest="overrides",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="override a setting of the spec: KEY is a dotted path into it (steps.decompose.rank, "
        "cluster, steps.generate.shape.0), VALUE is read as YAML (32, 1e-6, true, [10, 20]; quote a "
        "number to give text); an upper-case KEY sets the variable ${KEY} instead (RUN_DATE=2026-11-20); "
        "repeatable. Specs also take ${VAR} and ${VAR:-default} from the environment",
    )
    # secrets and the run date (run, submit, validate)
    secret_args = ("--secret-pattern",)
    secret_kw = dict(
        dest="secret_patterns",
        action="append",
        default=None,
        metavar="PATTERNS",
        help="variables whose names match these shell patterns (comma-separated, case-insensitive; "
        "repeatable) are secret besides the defaults (*TOKEN*, *PASSWORD*, *PASSWD*, *SECRET*, "
        "*CREDENTIAL*, *API_KEY*, *APIKEY*, *ACCESS_KEY*, *PRIVATE_KEY*), $TFOOC_SECRET_PATTERNS and the "
        "spec's secrets: list: their values are never written to run records, events, logs or webhooks",
    )
    date_args = ("--run-date",)
    date_kw = dict(
        default=None,
        metavar="YYYY-MM-DD",
        help="the run date, ${RUN_DATE} in the spec (default today; or --set RUN_DATE=...): run a "
        "missed night again for its own date",
    )
    q = add(
        "quickstart",
        help="the main job: tfooc run workflows/quickstart.yaml",
        description="Run workflows/quickstart.yaml on the embedded default: generate a planted low-rank "
        "heavy-tailed tensor with noise (uber-shaped, 3.3 M nonzeros) as a .tns file, convert it "
        "to a store, decompose it with rank-16 CP-ALS, and report the fit and the factor match "
        "against the planted model. Steps that are up to date are skipped (exit status 3).",
    )
    q.add_argument("--storage", default=None, help=storage_help)
    q.add_argument("--force", action="store_true", help="run every step even when up to date")
    q.set_defaults(func=cmd_quickstart)

    exits = (
        "Exit status: 0 done, 1 failed, 2 bad spec or input (nothing started), 3 skipped because every "
        "step was up to date."
    )
    allow_help = (
        "a folder or URL besides the storage root that the spec may read and write (repeatable; also "
        "$TFOOC_ALLOW_PATHS, os.pathsep-separated, and allow_paths in $TFOOC_CONFIG or "
        "~/.config/tfooc/config.yaml). A spec's own allow_paths can only pick folders inside these"
    )
    r = add(
        "run",
        help="run a workflow spec in the foreground",
        description="Run a workflow spec (YAML; see workflows/README.md) in this process: steps in dependency "
        "order, each skipped when its outputs exist with matching input fingerprints; a failed "
        "run resumes from its last finished step (CP-ALS from its checkpoint). Records go under "
        "STORAGE/.tfooc/runs.",
        epilog=exits,
    )
    r.add_argument("spec", help="workflow spec (YAML)")
    r.add_argument("--storage", default=None, help=storage_help)
    r.add_argument(
        "--scheduler",
        default=None,
        help="run step graphs on this Dask scheduler, or 'embedded' / 'gpu' (default: the spec's cluster)",
    )
    r.add_argument("--force", action="store_true", help="run every step even when up to date")
    r.add_argument("--allow-path", dest="allow_paths", action="append", default=None, metavar="PATH", help=allow_help)
    r.add_argument(*set_args, **set_kw)
    r.add_argument(*secret_args, **secret_kw)
    r.add_argument(*date_args, **date_kw)
    r.set_defaults(func=cmd_run)

    sb = add(
        "submit",
        help="submit a workflow spec to a Dask cluster and return its run id",
        description="Validate the spec here, then submit its driver as a Dask task (fire and forget) to the "
        "scheduler: prints the run id at once; the run goes on on the cluster after this command "
        "exits. Follow it with tfooc status / logs, stop it with tfooc cancel. The storage root "
        "must be reachable from the workers (a shared folder or an fsspec URL).",
        epilog="Exit status: 0 submitted, 2 bad spec or input (nothing submitted), 1 scheduler unreachable.",
    )
    sb.add_argument("spec", help="workflow spec (YAML)")
    sb.add_argument("--scheduler", required=True, help="Dask scheduler address, e.g. tcp://host:8786")
    sb.add_argument("--storage", default=None, help=storage_help)
    sb.add_argument("--force", action="store_true", help="run every step even when up to date")
    sb.add_argument("--allow-path", dest="allow_paths", action="append", default=None, metavar="PATH", help=allow_help)
    sb.add_argument(*set_args, **set_kw)
    sb.add_argument(*secret_args, **secret_kw)
    sb.add_argument(*date_args, **date_kw)
    sb.set_defaults(func=cmd_submit)

    v = add(
        "validate",
        help="check a workflow spec without running it",
        description="Read, validate and plan a workflow spec exactly as tfooc run does (YAML, keys and types, "
        "${VAR} references, --set overrides, paths inside the storage root or allowed folders, inputs "
        "that exist or are made by a step, dependency cycles, a reachable scheduler address), and "
        "start nothing. Every problem is printed with the spec file, its line and the dotted field.",
        epilog="Exit status: 0 valid, 2 invalid (the messages tfooc run would print).",
    )
    v.add_argument("spec", help="workflow spec (YAML)")
    v.add_argument("--storage", default=None, help=storage_help)
    v.add_argument(
        "--scheduler",
        default=None,
        help="check this scheduler address instead of the spec's cluster, as tfooc run --scheduler would",
    )
    v.add_argument("--allow-path", dest="allow_paths", action="append", default=None, metavar="PATH", help=allow_help)
    v.add_argument(*set_args, **set_kw)
    v.add_argument(*secret_args, **secret_kw)
    v.add_argument(*date_args, **date_kw)
    v.set_defaults(func=cmd_validate)

    sc = add(
        "schema",
        help="print the JSON Schema of workflow specs",
        description="Print the JSON Schema (draft 2020-12) of workflow specs, made from the pydantic models "
        "tfooc validates specs with: for an editor's YAML language server (# yaml-language-server: "
        "$schema=tfooc.schema.json) or checks outside tfooc. Checks beyond one file's shape (paths, "
        "inputs, cycles) are tfooc validate's.",
    )
    sc.set_defaults(func=cmd_schema)

    st = add(
        "status",
        help="list runs, or show one run",
        description="Without RUN: the latest runs under the storage root. With RUN (an id or a unique prefix): "
        "its steps, states, times, fits, errors and outputs. A running run whose driver stopped "
        "heartbeating shows as lost.",
        epilog="With --wait, the exit status is the run's: " + exits,
    )
    st.add_argument("run", nargs="?", help="run id (or a unique prefix)")
    st.add_argument("--storage", default=str(DEFAULT_STORAGE), help=root_help)
    st.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    st.add_argument("--all", action="store_true", help="list every run, not only the latest 20")
    st.add_argument("--wait", action="store_true", help="wait until RUN ends; exit with its exit status")
    st.add_argument("--timeout", type=_tolerance, default=None, help="seconds to wait at most with --wait")
    st.set_defaults(func=cmd_status)

    lg = add(
        "logs",
        help="print a run's events",
        description="Print a run's events (step transitions, CP-ALS iterations, log lines, errors with "
        "tracebacks) from STORAGE/.tfooc/runs/RUN/events.jsonl.",
    )
    lg.add_argument("run", help="run id (or a unique prefix)")
    lg.add_argument("--storage", default=str(DEFAULT_STORAGE), help=root_help)
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    lg.add_argument("--json", action="store_true", help="one JSON object per line")
    lg.set_defaults(func=cmd_logs)

    cn = add(
        "cancel",
        help="stop a run",
        description="Ask a run to stop: a queued run is dropped from the scheduler; a running one stops "
        "before its next step or CP-ALS iteration (its record ends cancelled, and running the "
        "spec again resumes it).",
    )
    cn.add_argument("run", help="run id (or a unique prefix)")
    cn.add_argument("--storage", default=str(DEFAULT_STORAGE), help=root_help)
    cn.add_argument("--wait", action="store_true", help="wait until the run has stopped")
    cn.add_argument("--timeout", type=_tolerance, default=None, help="seconds to wait at most with --wait")
    cn.set_defaults(func=cmd_cancel)
