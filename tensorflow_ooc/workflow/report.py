"""Text views of run records and events for ``tfooc run``, ``status`` and ``logs``."""

from __future__ import annotations

import json
import re
import shlex
import time

from .records import RunRecord, StepRecord, parse_iso


def _seconds(rec: RunRecord) -> float | None:
    start = parse_iso(rec.started_at or rec.created_at)
    end = parse_iso(rec.finished_at) or (time.time() if not rec.final else None)
    return None if start is None or end is None else end - start


def _step_summary(st: StepRecord) -> str:
    m = st.metrics
    if st.state == "failed":
        return st.error or "failed"
    if st.state in ("skipped", "not run", "pending", "cancelled"):
        return st.message or st.error or ""
    if st.state == "running" and st.progress:
        p = st.progress
        if "test_rmse" in p:  # a completion run's epoch
            return f"epoch {p.get('iteration')}: test RMSE {p['test_rmse']:.6g}"
        if "loglik" in p:  # a CP-APR outer iteration
            return (
                f"iteration {p.get('iteration')}: log-likelihood {p['loglik']:.8e}, KKT violation "
                f"{p.get('kkt_violation', float('nan')):.2e}"
            )
        return f"iteration {p.get('iteration')}: fit {p.get('fit', float('nan')):.6f}"
    if st.kind == "decompose" and "test_rmse" in m:
        out = (
            f"test RMSE {m['test_rmse']:.6g} (MAE {m.get('test_mae', float('nan')):.6g}) at epoch "
            f"{m.get('best_epoch')} of {m.get('epochs')}; {m.get('seconds_per_epoch', 0):.3f} s per epoch"
        )
        return out + ("; warm start" if m.get("warm_start") else "")
    if st.kind == "decompose" and "fit" in m:
        first = m.get("first_iteration_seconds")
        if "loglik" in m:  # CP-APR: the Poisson figures first, the least-squares fit for comparison
            out = (
                f"log-likelihood {m['loglik']:.8e}, KKT violation {m.get('kkt_violation', float('nan')):.2e} after "
                f"{m.get('iterations')} outer iterations ({m.get('algorithm')}); fit {m['fit']:.6f}; "
                f"{m.get('seconds_per_iteration', 0):.3f} s per iteration steady state"
            )
        else:
            unit = "sweep" if m.get("method") == "tt" else "iteration"  # a TT-ALS iteration is a sweep
            out = (
                f"fit {m['fit']:.6f} after {m.get('iterations')} {unit}s; "
                f"{m.get('seconds_per_iteration', 0):.3f} s per {unit} steady state"
            )
        if first is not None:
            out += f", first {first:.2f} s (includes compilation)"
        if m.get("nnz_modes_per_second"):
            out += f"; {m['nnz_modes_per_second'] / 1e6:.1f} M nonzero-modes/s"
        if m.get("warm_start"):
            out += "; warm start"
        return out
    if st.kind == "evaluate":
        parts = []
        if "loglik" in m:
            parts.append(f"log-likelihood {m['loglik']:.8e}")
        if "fit" in m:
            parts.append(f"fit {m['fit']:.6f}")
        if "rmse" in m:
            parts.append(f"RMSE {m['rmse']:.6g} (MAE {m.get('mae', float('nan')):.6g})")
        if "fms" in m:
            parts.append(
                f"factor match score {m['fms']:.4f} (congruence {m['congruence']:.4f}) against {m.get('reference')}"
            )
        return "; ".join(parts)
    if "nnz" in m:
        extra = f", version {m['version']} ({m.get('new_files', 0)} new files)" if "version" in m else ""
        return f"{m['nnz']:,} nonzeros, shape {'x'.join(map(str, m.get('shape', [])))}{extra}"
    if st.kind == "predict" and "predictions" in m:
        return f"{m['predictions']:,} predictions -> {next(iter(st.outputs.values()), '')}"
    if st.kind == "export":
        return f"{m.get('format')} -> {next(iter(st.outputs.values()), '')}"
    return st.message or ""


def run_summary(rec: RunRecord) -> str:
    """Multi-line summary of a run: state, time, every step with its outcome, outputs."""
    secs = _seconds(rec)
    state = rec.display_state()
    lines = [
        f"run {rec.run_id}: {state}"
        + (f" in {secs:.1f} s" if secs is not None else "")
        + f"  ({rec.workflow}, {rec.mode} on {rec.cluster}, storage {rec.storage})"
    ]
    width = max((len(n) for n in rec.steps), default=4)
    for name, st in rec.steps.items():
        sec = f"{st.seconds:7.1f} s" if st.seconds is not None else " " * 9
        lines.append(f"  {name:<{width}}  {st.state:<9} {sec}  {_step_summary(st)}")
    if rec.error and state != "done":
        lines.append(f"  error: {rec.error}")
    lost = [a for a in rec.attempts if a.outcome and a.outcome.startswith("lost")]
    for a in lost:
        lines.append(f"  attempt {a.attempt}: {a.outcome}")
    if state == "retrying" and rec.requeued:
        lines.append(f"  retrying: {rec.requeued}")
    if rec.took_over:
        lines.append(f"  took over the outputs of lost run(s): {', '.join(rec.took_over)}")
    if rec.dashboard:
        lines.append(f"  dashboard: {rec.dashboard}")
    outs = [o for st in rec.steps.values() if st.state == "done" for o in st.outputs.values()]
    if outs:
        lines.append("  outputs: " + ", ".join(outs))
    return "\n".join(lines)


def status_table(records: list[RunRecord]) -> str:
    if not records:
        return "no runs recorded"
    rows = [("RUN", "STATE", "WORKFLOW", "CREATED", "SECONDS", "STEP", "NOTE")]
    for r in records:
        secs = _seconds(r)
        step = r.current_step or ""
        note = ""
        if r.display_state() == "retrying":
            note = "its worker was lost: waits for the first free slot"
        elif step and r.steps[step].progress:
            p = r.steps[step].progress
            if "test_rmse" in p:
                note = f"epoch {p.get('iteration')} test RMSE {p['test_rmse']:.4g}"
            elif "loglik" in p:
                note = f"iteration {p.get('iteration')} log-likelihood {p['loglik']:.6e}"
            else:
                note = f"iteration {p.get('iteration')} fit {p.get('fit', float('nan')):.4f}"
        elif r.error:
            note = r.error.splitlines()[0][:60]
        else:
            # the last decomposition's or evaluation's figure: a CP-APR step's log-likelihood
            figures = [
                f"log-likelihood {m['loglik']:.6e}" if "loglik" in m else f"fit {m['fit']:.4f}"
                for m in (st.metrics for st in r.steps.values())
                if "fit" in m or "loglik" in m
            ]
            note = figures[-1] if figures else ""
        rows.append(
            (
                r.run_id,
                r.display_state(),
                r.workflow,
                (r.created_at or "")[:19].replace("T", " "),
                f"{secs:.1f}" if secs is not None else "",
                step,
                note,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)


def format_event(ev: dict) -> str:
    """One event as a log line."""
    t = (ev.get("time") or "")[11:23]
    step = f"[{ev['step']}] " if ev.get("step") else ""
    kind = ev.get("event", "")
    if kind == "iteration" and "test_rmse" in ev:  # a completion run's epoch
        msg = (
            f"epoch {ev.get('iteration')}: test RMSE {ev.get('test_rmse', float('nan')):.6g} (MAE "
            f"{ev.get('test_mae', float('nan')):.6g}), train RMSE {ev.get('train_rmse', float('nan')):.6g}, "
            f"{ev.get('seconds', float('nan')):.3f} s"
        )
    elif kind == "iteration" and "loglik" in ev:  # a CP-APR outer iteration
        msg = (
            f"iteration {ev.get('iteration')}: log-likelihood {ev['loglik']:.8e} (change "
            f"{ev.get('loglik_change', float('nan')):.2e}), KKT violation {ev.get('kkt_violation', float('nan')):.2e}, "
            f"{ev.get('inner_iterations', 0)} inner, fit {ev.get('fit', float('nan')):.6f}, "
            f"{ev.get('seconds', float('nan')):.3f} s"
        )
    elif kind == "iteration":
        msg = (
            f"iteration {ev.get('iteration')}: fit {ev.get('fit', float('nan')):.6f} (change "
            f"{ev.get('fit_change', float('nan')):.2e}), {ev.get('seconds', float('nan')):.3f} s"
        )
    else:
        msg = ev.get("message") or kind
    level = ev.get("level", "info").upper()
    out = f"{t} {level:<7} {step}{msg}"
    if ev.get("traceback"):
        out += "\n" + ev["traceback"].rstrip()
    return out


# a decomposition's own line for an iteration, as runs recorded before it was left out of the events
_ITERATION_LINE = re.compile(r"iteration (\d+): fit ")


def iteration_duplicates(events: list[dict]) -> set[int]:
    """Positions in ``events`` of ``log`` events that repeat an ``iteration`` event of the same
    step (runs recorded by older versions kept both, so ``tfooc logs`` showed each iteration twice)."""
    recorded = {(e.get("step"), e.get("iteration")) for e in events if e.get("event") == "iteration"}
    out = set()
    for i, e in enumerate(events):
        if e.get("event") != "log" or e.get("level", "info") not in ("info", "debug"):
            continue
        m = _ITERATION_LINE.match(e.get("message") or "")
        if m and (e.get("step"), int(m.group(1))) in recorded:
            out.add(i)
    return out


def shell_command(*words: str) -> str:
    """A ``tfooc`` command line that works when pasted into a shell: each word quoted as it needs
    (a storage root with a space, a URL with ``?``), for the hints the CLI and errors print."""
    return shlex.join(["tfooc", *map(str, words)])


def to_json(rec: RunRecord) -> str:
    return json.dumps(json.loads(rec.model_dump_json()), indent=1)
