"""GenTen (``pygenten``) MTTKRP and CP-ALS timings on a sparse tensor, in this process.

All peers get the same COO tensor and the same factor matrices
(:func:`random_factors`, uniform in [0, 1), fixed seed), and both report an *all-mode* time: the sum
over modes n of one mode-n MTTKRP.

GenTen
    pygenten exposes no MTTKRP function (``pygenten._pygenten`` only binds tensors, ktensors,
    ``AlgParams``, ``PerfHistory`` and the solver ``driver``), so GenTen's MTTKRP is timed through
    its own kernel timers while it runs a solver from our factors:

    * per-mode methods (``AlgParams.mttkrp_method``): ``cp_als`` with ``maxiters=iters``. One CP-ALS
      iteration does exactly one mode-n MTTKRP per mode, wrapped in GenTen's MTTKRP timer (which also
      covers the factor "export", tens of microseconds per solve on one process); ``PerfHistory`` records the
      cumulative timer per iteration (``Entry.cum_mttkrp_time``), so each iteration gives one
      all-mode sample and we report the best iteration, as the project's own benchmark does.
    * fused all-mode methods (``AlgParams.mttkrp_all_method``): ``cp_opt`` (L-BFGS-B), whose every
      gradient evaluation is one ``mttkrp_all`` call. Its time is only published by GenTen's
      Teuchos stacked timer (``MTTKRP-all: <seconds> [<calls>]``, cumulative over the process),
      printed after each solve; we read it before and after the solve, so this one is a *mean*
      over the solve's gradient evaluations rather than a best.

    With ``timings=True`` the CP-ALS timer fences (on the OpenMP backend kernels are synchronous
    anyway), so these are kernel times. One-off preprocessing (e.g. the permutation arrays of the
    Perm/Iterated methods) is outside the timers, as the project's plan/JIT time is outside its
    numbers. ``Default`` is timed too and reports what GenTen resolved it to (Perm / Iterated with
    several threads, Single with one).

CP-ALS
    :func:`genten_cp_als` times whole CP-ALS iterations (MTTKRPs, Gram products, solves,
    normalisation, fit) from GenTen's ``PerfHistory`` (``Entry.cum_time`` per iteration), so import,
    tensor construction, one-off MTTKRP preprocessing and the initial fit are outside; it reports
    the best iteration. :func:`pyttb_cp_als` times one ``pyttb.cp_als`` call (wall time / iterations,
    so pyttb's per-call overhead is spread over the iterations). Both run exactly the requested
    iterations from the same start; :func:`verify_cp_als` checks that their fits agree.

Threads
    Kokkos (GenTen's parallel layer) is initialised once per process, when ``pygenten`` is first
    imported (its ``__init__`` calls ``initializeGenten()``, which takes no thread count;
    ``initializeKokkos(num_threads)`` exists but cannot run before that import). So the thread
    count is fixed by environment variables at import time: we set ``KOKKOS_NUM_THREADS`` (read by
    ``Kokkos::initialize``, and authoritative over ``OMP_NUM_THREADS``) and ``OMP_NUM_THREADS``
    (read by pygenten's own vendored libgomp when it loads) for the duration of the import and then
    restore the environment, so libraries loaded later (numba's OpenMP layer uses the system
    libgomp, a different library) are not affected. The thread count GenTen actually used is read
    back from its output and returned; a later call asking for another count cannot change it and
    warns.

    With more than one thread on a machine whose cores are shared (2 cores here, one of them busy
    with another process), libgomp's default spin-waiting makes GenTen's timings vary by 2-5x from
    run to run and exceed its 1-thread times; ``wait_policy="passive"`` helps, and is left to the
    caller because it changes GenTen's behaviour on an idle machine.

Noise
    GenTen and Kokkos write to the C-level stdout/stderr (tensor summary, Kokkos ``OMP_PROC_BIND``
    advice, per-iteration fits, timer trees). Every GenTen call here runs with file descriptors 1
    and 2 redirected to a temporary file, which is also how the timer tree and thread count are read.

Exit
    pygenten finalises Kokkos in an ``atexit`` hook, and Kokkos aborts if a GenTen object is freed
    after that; so nothing here keeps a GenTen object beyond the call that made it.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import FACTOR_SEED, _capture_output, _check_init, _check_tensor, _temporary_env, random_factors

GENTEN_MODE_METHODS = ("Atomic", "Duplicated", "Single", "Perm", "OrigKokkos", "RowBased", "Phan", "Default")
"""``MTTKRP_Method`` values, tried with CP-ALS. RowBased and Phan are GenTen's dense-tensor kernels
and are rejected for sparse tensors ("Unknown MTTKRP method"); they are tried anyway, last, as the
failure costs nothing. Single is GenTen's single-thread kernel (no atomics, no duplication): with
more than one thread it races (wrong results, seen here), so it is skipped then."""

GENTEN_ALL_METHODS = ("Atomic", "Duplicated", "Single", "Iterated", "Default")
"""``MTTKRP_All_Method`` values, tried with CP-OPT; reported as ``"All-<name>"``. Single is skipped
with more than one thread, as above."""

AGREEMENT_TOL = 1e-6
"""Largest relative difference between the solution of a method and that of the family's reference
method (Atomic, the simplest kernel) for the method's time to count. Different summation orders
differ by ~1e-14 here; a lost update (a racy kernel) differs by O(1)."""


# --- GenTen --------------------------------------------------------------------------------------------

# Process-wide: Kokkos can be initialised only once, so the first import fixes the thread count.
# Holds only plain Python values, never GenTen objects (see "Exit" in the module docstring).
_GENTEN: dict[str, Any] = {"module": None, "requested_threads": None, "threads": None, "import_log": ""}

_RE_THREADS = re.compile(r"Execution space:\s*\w+\s*\((\d+) threads?\)")
_RE_MODE_METHOD = re.compile(r"MTTKRP method:\s*(\S+)")
_RE_ALL_METHOD = re.compile(r"Gradient method:\s*(.+?)\s*MTTKRP")
_RE_MTTKRP_ALL = re.compile(r"^[|\s]*MTTKRP-all:\s+([-+0-9.eE]+)\b.*\[(\d+)\]\s*$", re.MULTILINE)
_RE_FATAL = re.compile(r"FATAL ERROR:\s*(.*)")


def _load_genten(threads: int, wait_policy: str | None = None) -> Any:
    """Import ``pygenten`` once with ``threads`` Kokkos/OpenMP threads, its output captured.

    Parameters
    ----------
    threads : int
        Threads for Kokkos' OpenMP backend. Only the first call in a process decides.
    wait_policy : str, optional
        ``OMP_WAIT_POLICY`` for pygenten's libgomp (``"passive"`` or ``"active"``); ``None`` inherits
        the environment. Only the first call decides.

    Returns
    -------
    module
        The ``pygenten`` package.
    """
    if _GENTEN["module"] is not None:
        if _GENTEN["requested_threads"] is not None and threads != _GENTEN["requested_threads"]:
            warnings.warn(
                f"GenTen was initialised with {_GENTEN['requested_threads']} threads in this process; "
                f"it cannot change to {threads}",
                RuntimeWarning,
                stacklevel=3,
            )
        return _GENTEN["module"]
    if "pygenten" in sys.modules:  # imported by someone else: its thread count stands; read it from the runs
        _GENTEN["module"] = sys.modules["pygenten"]
        return _GENTEN["module"]
    env = {"KOKKOS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    with _temporary_env(env), _capture_output() as out:
        try:
            import pygenten
        except ImportError as exc:
            failure = exc
        else:
            failure = None
    if failure is not None:
        raise ImportError(f"pygenten failed to import: {failure}; its output: {out.text[-2000:]}") from failure
    _GENTEN.update(module=pygenten, requested_threads=threads, import_log=out.text)
    return pygenten


def _genten_error(msg: str, log: str) -> str:
    """One-line description of a failed GenTen call (GenTen prints the cause as 'FATAL ERROR: ...')."""
    fatal = _RE_FATAL.search(log)
    if fatal and fatal.group(1).strip() not in msg:
        msg += f" ({fatal.group(1).strip()})"
    return msg


def _mttkrp_all_timer(log: str) -> tuple[float, int]:
    """Cumulative (seconds, calls) of GenTen's 'MTTKRP-all' stacked timer in a solve's output.

    All lines named MTTKRP-all are summed, in case the timer appears under several parents of the
    tree; a log without the line means the timer has not run yet in this process.
    """
    hits = _RE_MTTKRP_ALL.findall(log)
    return sum(float(s) for s, _ in hits), sum(int(c) for _, c in hits)


def _genten_probe(gt: Any) -> str:
    """Run a trivial CP-ALS solve only to make GenTen print its (process-cumulative) timer tree."""
    X = gt.Sptensor((2, 2, 2), np.array([[0, 0, 0], [1, 1, 1]], dtype=np.int64), np.array([1.0, 2.0]))
    with _capture_output() as out:
        result = gt.cp_als(X, rank=1, maxiters=1, timings=True, printitn=0)
    del result, X
    return out.text


def _genten_threads(gt: Any) -> int | None:
    """Threads of GenTen's execution space in this process (from its output; cached)."""
    if _GENTEN["threads"] is None:
        found = _RE_THREADS.search(_genten_probe(gt))
        _GENTEN["threads"] = int(found.group(1)) if found else None
    return _GENTEN["threads"]


def _skip_reason(method: str, threads: int | None) -> str | None:
    """Why a method must not be timed with this many threads, or None."""
    if method == "Single" and threads != 1:
        return f"skipped: single-thread kernel (no atomics), races with {threads} threads"
    return None


def _genten_solve(gt: Any, X: Any, factors: Sequence[np.ndarray], family: str, method: str, iters: int) -> dict:
    """Run one GenTen solve from ``factors`` with one MTTKRP method and read GenTen's MTTKRP timer.

    Parameters
    ----------
    gt : module
        ``pygenten``.
    X : pygenten.Sptensor
        The tensor.
    factors : sequence of numpy.ndarray
        Initial guess (weights one); identical for every method so that results can be compared.
    family : {"mode", "all"}
        ``"mode"``: CP-ALS with ``mttkrp_method``; ``"all"``: CP-OPT with ``mttkrp_all_method``.
    method : str
        Method name without prefix, e.g. ``"Perm"``.
    iters : int
        Solver iterations.

    Returns
    -------
    dict
        ``samples`` (all-mode seconds: one per CP-ALS iteration, or one mean over the CP-OPT
        gradient evaluations), ``stat``, ``calls``, ``what``, ``resolved`` (GenTen's own name for the
        method, which tells what ``Default`` became), ``threads`` and the solution (``weights``,
        ``factors``, copied out of GenTen); or ``error``.
    """
    rank = factors[0].shape[1]
    nd = len(factors)
    common = dict(rank=rank, maxiters=iters, timings=True, printitn=1, scale_guess_by_norm_x=False)
    before = _mttkrp_all_timer(_genten_probe(gt)) if family == "all" else (0.0, 0)
    u0 = gt.Ktensor(np.ones(rank), [np.ascontiguousarray(f) for f in factors], copy=True)
    rec: dict[str, Any] = {}
    failure = None
    with _capture_output() as out:
        try:
            if family == "mode":
                # tol > 0 is required; 1e-300 never stops early, so all iters iterations run.
                M, M0, info = gt.cp_als(X, init=u0, tol=1e-300, mttkrp_method=getattr(gt, "Mttkrp" + method), **common)
            else:
                M, M0, info = gt.cp_opt(X, init=u0, mttkrp_all_method=getattr(gt, "MttkrpAll" + method), **common)
        except Exception as exc:  # unsupported method on this build, bad parameters, ...
            # Keep only text: the traceback holds frames that reference GenTen objects.
            failure = f"{type(exc).__name__}: {exc}".strip()
    log = out.text
    if failure is not None:
        del u0
        return {"error": _genten_error(failure, log)}
    # Copy everything needed out of GenTen objects, then free them (Kokkos must outlive them).
    entries = [
        (int(e.iteration), float(e.cum_mttkrp_time), float(e.cum_time), float(e.mttkrp_throughput))
        for e in (info.getEntry(i) for i in range(info.size()))
    ]
    rec["weights"] = np.array(M.weights, dtype=np.float64, copy=True)
    rec["factors"] = [np.array(f, dtype=np.float64, copy=True) for f in M.factor_matrices]
    del M, M0, info, u0
    threads = _RE_THREADS.search(log)
    rec["threads"] = int(threads.group(1)) if threads else None
    resolved = (_RE_MODE_METHOD if family == "mode" else _RE_ALL_METHOD).search(log)
    rec["resolved"] = resolved.group(1) if resolved else None

    if family == "all":
        after = _mttkrp_all_timer(log)
        secs, calls = after[0] - before[0], after[1] - before[1]
        if calls <= 0 or secs <= 0:
            return {"error": f"GenTen's MTTKRP-all timer did not advance ({before} -> {after})"}
        rec.update(samples=[secs / calls], stat="mean", calls=calls, what="mttkrp")
        return rec

    # CP-ALS: entry 0 is the initial guess, then one entry per iteration, then a final summary entry
    # that repeats the last iteration's cumulative times; keep the first entry of each iteration.
    cum_mttkrp: dict[int, float] = {}
    cum_time: dict[int, float] = {}
    for it, mt, tt, _ in entries:
        if 0 <= it <= iters and it not in cum_mttkrp:
            cum_mttkrp[it], cum_time[it] = mt, tt
    its = sorted(cum_mttkrp)
    mttkrp = np.diff([cum_mttkrp[i] for i in its])
    if len(mttkrp) and np.all(mttkrp > 0):
        rec.update(samples=mttkrp.tolist(), stat="min", calls=len(mttkrp) * nd, what="mttkrp")
        return rec
    # Older GenTen builds do not fill cum_mttkrp_time but do publish the MTTKRP throughput, defined
    # in Genten_CpAls.cpp as nnz*R*(N+1) flops / (average mode-n MTTKRP seconds) / 2^30.
    tput = max((e[3] for e in entries), default=0.0)
    if tput > 0:
        avg_mode = X.nnz * rank * (nd + 1) / (tput * 1024.0**3)
        rec.update(samples=[nd * avg_mode], stat="mean", calls=None, what="mttkrp")
        return rec
    # Last resort, and said so: whole CP-ALS iterations.
    rec.update(samples=np.diff([cum_time[i] for i in its]).tolist(), stat="min", calls=None, what="cp_als_iteration")
    return rec


def _relative_difference(a: dict, b: dict) -> float:
    """Largest relative Frobenius difference between two solutions' weights and factor matrices."""
    pairs = [(a["weights"], b["weights"])] + list(zip(a["factors"], b["factors"]))
    return max(float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-300)) for x, y in pairs)


def genten_mttkrp(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    rank: int,
    threads: int = 2,
    iters: int = 3,
    *,
    methods: Sequence[str] | None = None,
    wait_policy: str | None = None,
    seed: int = FACTOR_SEED,
) -> dict:
    """All-mode MTTKRP time of GenTen (pygenten), fastest of its CPU methods.

    Every method runs one solve from the same factors (see the module docstring for how the time
    is read from GenTen's timers). A method counts only if it runs and its solution agrees with
    the family's Atomic solution (:data:`AGREEMENT_TOL`), which guards against racy kernels.

    Parameters
    ----------
    coords : numpy.ndarray
        ``(nnz, nmodes)`` 0-based int64 coordinates.
    values : numpy.ndarray
        ``(nnz,)`` float64 values.
    shape : sequence of int
        Tensor dimensions.
    rank : int
        Columns of the factor matrices.
    threads : int
        Kokkos/OpenMP threads. Fixed by the first call in a process (GenTen initialises once).
    iters : int
        Solver iterations per method: CP-ALS iterations (one all-mode sample each) or L-BFGS-B
        iterations (about ``iters + 1`` ``mttkrp_all`` calls).
    methods : sequence of str, optional
        Subset of ``GENTEN_MODE_METHODS`` and ``"All-" + GENTEN_ALL_METHODS`` to try; default all.
    wait_policy : str, optional
        ``OMP_WAIT_POLICY`` for GenTen's libgomp at first import; ``None`` inherits the environment.
        On an oversubscribed machine, ``"passive"`` can make GenTen several times faster.
    seed : int
        Seed of the factor matrices (:func:`random_factors`).

    Returns
    -------
    dict
        ``seconds``: best all-mode MTTKRP seconds; ``method``: its name (``"Perm"``,
        ``"All-Duplicated"``, ...); ``per_method``: ``{name: seconds or "error: ..."}``; ``what``:
        ``"mttkrp"`` (GenTen's MTTKRP timers) or ``"cp_als_iteration"`` (only if no MTTKRP timer
        could be read); ``threads``: threads GenTen used; ``iters``; ``details``:
        ``{name: {samples, stat, calls, resolved, what, max_rel_diff}}``.

    Raises
    ------
    RuntimeError
        If no method produced a time.
    """
    coords, values, shape = _check_tensor(coords, values, shape)
    gt = _load_genten(threads, wait_policy)
    factors = random_factors(shape, rank, seed)
    wanted = (
        list(methods) if methods is not None else ([f"All-{m}" for m in GENTEN_ALL_METHODS] + list(GENTEN_MODE_METHODS))
    )
    # Fused all-mode methods first: a method that throws inside a timed region could otherwise
    # perturb the stacked timer tree that the all-mode times are read from.
    wanted.sort(key=lambda name: not name.startswith("All-"))
    threads_used = _genten_threads(gt)
    X = gt.Sptensor(shape, coords, values, copy=True)
    runs: dict[str, dict] = {}
    try:
        for name in wanted:
            family, method = ("all", name[4:]) if name.startswith("All-") else ("mode", name)
            if method not in (GENTEN_ALL_METHODS if family == "all" else GENTEN_MODE_METHODS):
                runs[name] = {"error": "unknown method name"}
            elif (reason := _skip_reason(method, threads_used)) is not None:
                runs[name] = {"error": reason}
            else:
                runs[name] = _genten_solve(gt, X, factors, family, method, iters)
    finally:
        del X

    # Agreement with the family's reference (Atomic when it ran, else the first that ran).
    for prefix in ("All-", ""):
        fam = [n for n in runs if n.startswith("All-") == (prefix == "All-") and "error" not in runs[n]]
        ref = prefix + "Atomic" if prefix + "Atomic" in fam else (fam[0] if fam else None)
        for n in fam:
            runs[n]["max_rel_diff"] = _relative_difference(runs[n], runs[ref])
            runs[n]["reference"] = ref

    per_method: dict[str, float | str] = {}
    details: dict[str, dict] = {}
    candidates: list[tuple[int, float, str]] = []
    for name, rec in runs.items():
        if "error" in rec:
            per_method[name] = rec["error"] if rec["error"].startswith("skipped") else "error: " + rec["error"]
            continue
        secs = float(min(rec["samples"]) if rec["stat"] == "min" else np.mean(rec["samples"]))
        if rec["max_rel_diff"] > AGREEMENT_TOL:
            per_method[name] = f"error: solution differs from {rec['reference']} by {rec['max_rel_diff']:.1e}"
        else:
            per_method[name] = secs
            # Prefer true MTTKRP times over the whole-iteration fallback, then the fastest.
            candidates.append((rec["what"] != "mttkrp", secs, name))
        details[name] = {k: rec[k] for k in ("samples", "stat", "calls", "resolved", "what", "max_rel_diff")}
    if not candidates:
        raise RuntimeError(f"no GenTen MTTKRP method produced a time: {per_method}")
    _, best, method = min(candidates)
    return {
        "seconds": best,
        "method": method,
        "per_method": per_method,
        "what": runs[method]["what"],
        "threads": runs[method]["threads"] or threads_used,
        "iters": iters,
        "details": details,
    }


# --- GenTen CP-ALS -------------------------------------------------------------------------------------

GENTEN_CP_ALS_METHODS = ("Default", "Perm", "Atomic", "Duplicated", "OrigKokkos", "Single")
"""Per-mode ``MTTKRP_Method`` values that ``genten_cp_als(method="fastest")`` tries: those that ran
and matched NumPy in :func:`verify` (RowBased and Phan are dense-only). Single only with one thread."""

NEVER_STOP_TOL = 1e-300
"""CP-ALS stopping tolerance on the fit change: GenTen needs tol > 0; this one never stops early."""


def _genten_cp_als_run(gt: Any, X: Any, factors: Sequence[np.ndarray], method: str, iters: int) -> dict:
    """One GenTen CP-ALS solve of exactly ``iters`` iterations from ``factors`` (unit weights).

    Returns
    -------
    dict
        ``per_iter``: seconds of each iteration, from ``PerfHistory`` (differences of
        ``Entry.cum_time``, GenTen's timer around the whole solver loop); ``fit``: GenTen's fit after
        the last iteration; ``resolved``: GenTen's name for the MTTKRP method it ran; ``threads``;
        ``weights`` and ``factors`` of the solution (copied out of GenTen); or ``error``.
    """
    rank = factors[0].shape[1]
    u0 = gt.Ktensor(np.ones(rank), [np.ascontiguousarray(f) for f in factors], copy=True)
    failure = None
    with _capture_output() as out:
        try:
            # printitn = iters + 1: GenTen prints its header (which names the MTTKRP method it
            # resolved) but no per-iteration line inside the timed loop. The guess is used as given
            # (scale_guess_by_norm_x=False); timings=True fences every kernel, so the timer sees
            # finished work on any backend (the OpenMP one is synchronous anyway).
            M, M0, info = gt.cp_als(
                X,
                init=u0,
                rank=rank,
                maxiters=iters,
                tol=NEVER_STOP_TOL,
                printitn=iters + 1,
                timings=True,
                scale_guess_by_norm_x=False,
                mttkrp_method=getattr(gt, "Mttkrp" + method),
            )
        except Exception as exc:  # keep only text: the traceback references GenTen objects
            failure = f"{type(exc).__name__}: {exc}".strip()
    log = out.text
    if failure is not None:
        del u0
        return {"error": _genten_error(failure, log)}
    entries = [
        (int(e.iteration), float(e.cum_time), float(e.fit)) for e in (info.getEntry(i) for i in range(info.size()))
    ]
    rec: dict[str, Any] = {
        "weights": np.array(M.weights, dtype=np.float64, copy=True),
        "factors": [np.array(f, dtype=np.float64, copy=True) for f in M.factor_matrices],
    }
    del M, M0, info, u0
    # Entry 0: after the initial guess's fit (timer started); entry i: end of iteration i (after its
    # fit); then a summary entry (iteration iters + 1) that adds the final normalize/arrange.
    cum: dict[int, tuple[float, float]] = {}
    for it, t, fit in entries:
        if 0 <= it <= iters and it not in cum:
            cum[it] = (t, fit)
    if sorted(cum) != list(range(iters + 1)):
        return {"error": f"PerfHistory holds iterations {sorted(cum)}, expected 0..{iters}"}
    per_iter = np.diff([cum[i][0] for i in range(iters + 1)])
    if not np.all(per_iter > 0):
        return {"error": f"PerfHistory cumulative times do not increase: {per_iter.tolist()}"}
    threads = _RE_THREADS.search(log)
    resolved = _RE_MODE_METHOD.search(log)
    rec.update(
        per_iter=per_iter.tolist(),
        fit=cum[iters][1],
        resolved=resolved.group(1) if resolved else None,
        threads=int(threads.group(1)) if threads else None,
    )
    return rec


def genten_cp_als(
    coords: np.ndarray,
    values: np.ndarray,
    shape: Sequence[int],
    rank: int,
    iters: int = 3,
    threads: int = 2,
    init: Sequence[np.ndarray] | None = None,
    method: str | None = None,
    *,
    wait_policy: str | None = None,
    seed: int = FACTOR_SEED,
) -> dict:
    """Per-iteration time of GenTen's (pygenten's) CP-ALS, exactly ``iters`` iterations from ``init``.

    Times come from GenTen's own ``PerfHistory``: ``Entry.cum_time`` is GenTen's timer around its
    solver loop, recorded at the end of every iteration, so an iteration's time is the difference of
    consecutive entries. One iteration = for each mode: MTTKRP, Hadamard product of Gram matrices,
    ``rank x rank`` solve, column normalisation, Gram update; then the fit (GenTen computes the
    inner product with the tensor, one more pass over the nonzeros). Not included: the pygenten
    import and Kokkos start-up, building the ``Sptensor``, GenTen's one-off MTTKRP preprocessing
    (e.g. Perm's permutation arrays, built before the solver timer starts), the initial guess's fit,
    and the final normalisation. The first GenTen solve of the process (thread-pool start-up) is a
    tiny untimed one.

    Parameters
    ----------
    coords : numpy.ndarray
        ``(nnz, nmodes)`` 0-based int64 coordinates.
    values : numpy.ndarray
        ``(nnz,)`` float64 values.
    shape : sequence of int
        Tensor dimensions.
    rank : int
        CP rank.
    iters : int
        CP-ALS iterations; GenTen never stops early (tolerance :data:`NEVER_STOP_TOL`).
    threads : int
        Kokkos/OpenMP threads. Fixed by the first GenTen call in a process.
    init : sequence of numpy.ndarray, optional
        Initial factor matrices, ``(shape[n], rank)`` each, with unit weights, used as given (no
        scaling by the tensor's norm). Default: :func:`random_factors` (uniform, seed ``seed``).
    method : str, optional
        An ``MTTKRP_Method`` name (``"Perm"``, ``"Atomic"``, ...). ``None``: ``"Default"``, what GenTen
        picks by itself (Perm with several threads here). ``"fastest"``: every method of
        :data:`GENTEN_CP_ALS_METHODS` (Single only with one thread), each from the same ``init``;
        the fastest whose solution agrees with Atomic's (:data:`AGREEMENT_TOL`) is reported.
    wait_policy : str, optional
        ``OMP_WAIT_POLICY`` at GenTen's first import (see :func:`genten_mttkrp`).
    seed : int
        Seed of the default initial factors.

    Returns
    -------
    dict
        ``seconds_per_iter``: best (``stat="min"``) iteration's seconds; ``mean_seconds_per_iter``;
        ``stat``; ``per_iter``: every iteration's seconds; ``method``: the MTTKRP method asked for
        (the winner with ``"fastest"``); ``resolved``: GenTen's own name for what it ran (what
        ``Default`` became); ``fit``: GenTen's fit after the last iteration; ``what``:
        ``"cp_als_iteration"``; ``threads``; ``iters``; with ``"fastest"`` also ``per_method``:
        ``{name: seconds or "error: ..."}``.

    Raises
    ------
    RuntimeError
        If the solve (every solve, with ``"fastest"``) failed.
    """
    coords, values, shape = _check_tensor(coords, values, shape)
    if iters < 1:
        raise ValueError("iters must be at least 1")
    factors = _check_init(init, shape, rank, seed)
    names = list(GENTEN_CP_ALS_METHODS) if method == "fastest" else [method or "Default"]
    for name in names:
        if name not in GENTEN_MODE_METHODS:
            raise ValueError(f"unknown GenTen MTTKRP method {name!r}; choose from {GENTEN_MODE_METHODS} or 'fastest'")
    gt = _load_genten(threads, wait_policy)
    threads_used = _genten_threads(gt)  # also the process's first (warm-up) solve
    if method != "fastest" and (reason := _skip_reason(names[0], threads_used)) is not None:
        raise ValueError(f"GenTen method {names[0]}: {reason}")
    X = gt.Sptensor(shape, coords, values, copy=True)
    runs: dict[str, dict] = {}
    try:
        for name in names:
            reason = _skip_reason(name, threads_used)
            runs[name] = {"error": reason} if reason else _genten_cp_als_run(gt, X, factors, name, iters)
    finally:
        del X

    ok = [n for n in runs if "error" not in runs[n]]
    ref = "Atomic" if "Atomic" in ok else (ok[0] if ok else None)
    per_method: dict[str, float | str] = {}
    for name, rec in runs.items():
        if "error" in rec:
            per_method[name] = rec["error"] if rec["error"].startswith("skipped") else "error: " + rec["error"]
            continue
        diff = _relative_difference(rec, runs[ref])
        if diff > AGREEMENT_TOL:
            per_method[name] = f"error: solution differs from {ref}'s by {diff:.1e}"
        else:
            per_method[name] = min(rec["per_iter"])
    timed = {n: s for n, s in per_method.items() if isinstance(s, float)}
    if not timed:
        raise RuntimeError(f"GenTen CP-ALS produced no time: {per_method}")
    best = min(timed, key=timed.__getitem__)
    rec = runs[best]
    out = {
        "seconds_per_iter": timed[best],
        "mean_seconds_per_iter": float(np.mean(rec["per_iter"])),
        "stat": "min",
        "per_iter": rec["per_iter"],
        "method": best,
        "resolved": rec["resolved"],
        "fit": rec["fit"],
        "what": "cp_als_iteration",
        "threads": rec["threads"] or threads_used,
        "iters": iters,
    }
    if method == "fastest":
        out["per_method"] = per_method
    return out
