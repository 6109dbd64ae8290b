"""Peer MTTKRP timings: GenTen (``pygenten``) and pyttb on the same sparse tensor, in this process.

    python benchmarks/peers.py                          # verify against NumPy, then time a small tensor
    python benchmarks/peers.py --nnz 100000 --rank 16   # time a larger one as well

Used by ``bench_mttkrp.py``. Both peers get the same COO tensor and the same factor matrices
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

import argparse
import contextlib
import ctypes
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

FACTOR_SEED = 0
"""Seed of the factor matrices given to every peer (see :func:`random_factors`)."""

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


# --- shared inputs -------------------------------------------------------------------------------------

def random_factors(shape: Sequence[int], rank: int, seed: int = FACTOR_SEED) -> list[np.ndarray]:
    """Factor matrices shared by all peers.

    Parameters
    ----------
    shape : sequence of int
        Tensor dimensions.
    rank : int
        Number of columns of each factor.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    list of numpy.ndarray
        One C-contiguous float64 ``(shape[n], rank)`` matrix per mode, uniform in [0, 1).
    """
    rng = np.random.default_rng(seed)
    return [rng.random((int(s), int(rank))) for s in shape]


def numpy_mttkrp(coords: np.ndarray, values: np.ndarray, factors: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Reference mode-``n`` MTTKRP in plain NumPy (for verification; not fast).

    Parameters
    ----------
    coords : numpy.ndarray
        ``(nnz, nmodes)`` 0-based integer coordinates; duplicates are summed, as every peer does.
    values : numpy.ndarray
        ``(nnz,)`` values.
    factors : sequence of numpy.ndarray
        One ``(shape[k], R)`` matrix per mode; ``factors[n]`` only gives the output's row count.
    n : int
        Output mode.

    Returns
    -------
    numpy.ndarray
        ``(shape[n], R)``: ``out[i, r] = sum over nonzeros with coords[:, n] == i of
        value * prod_{k != n} factors[k][coords[:, k], r]``.
    """
    rows = np.repeat(np.asarray(values, dtype=np.float64)[:, None], factors[n].shape[1], axis=1)
    for k, f in enumerate(factors):
        if k != n:
            rows *= f[coords[:, k]]
    out = np.empty(factors[n].shape)
    for r in range(out.shape[1]):  # bincount per column: a vectorised scatter-add
        out[:, r] = np.bincount(coords[:, n], weights=rows[:, r], minlength=out.shape[0])
    return out


def _check_tensor(coords: Any, values: Any, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Return C-contiguous int64 coordinates, float64 values and a tuple shape, after checking them."""
    coords = np.ascontiguousarray(coords, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    shape = tuple(int(s) for s in shape)
    if coords.ndim != 2 or coords.shape[1] != len(shape):
        raise ValueError(f"coords must be (nnz, {len(shape)}), got {coords.shape}")
    if coords.shape[0] != values.shape[0]:
        raise ValueError(f"{coords.shape[0]} coordinates but {values.shape[0]} values")
    return coords, values, shape


# --- capturing C-level output --------------------------------------------------------------------------

class _Captured:
    """Text written to file descriptors 1 and 2 inside :func:`_capture_output` (set on exit)."""

    text: str = ""


def _flush_all() -> None:
    # Python's buffers, then C stdio's (std::cout is synchronised with stdio, so this covers C++).
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def _capture_output() -> Iterator[_Captured]:
    """Redirect fds 1 and 2 (so C/C++ output too) to a temporary file; its text is on the result."""
    captured = _Captured()
    with tempfile.TemporaryFile() as buf:
        _flush_all()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(buf.fileno(), 1)
            os.dup2(buf.fileno(), 2)
            yield captured
        finally:
            _flush_all()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            buf.seek(0)
            captured.text = buf.read().decode(errors="replace")


@contextlib.contextmanager
def _temporary_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the previous ones."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
            warnings.warn(f"GenTen was initialised with {_GENTEN['requested_threads']} threads in this process; "
                          f"it cannot change to {threads}", RuntimeWarning, stacklevel=3)
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
                M, M0, info = gt.cp_als(X, init=u0, tol=1e-300,
                                        mttkrp_method=getattr(gt, "Mttkrp" + method), **common)
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
    entries = [(int(e.iteration), float(e.cum_mttkrp_time), float(e.cum_time), float(e.mttkrp_throughput))
               for e in (info.getEntry(i) for i in range(info.size()))]
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


def genten_mttkrp(coords: np.ndarray, values: np.ndarray, shape: Sequence[int], rank: int, threads: int = 2,
                  iters: int = 3, *, methods: Sequence[str] | None = None, wait_policy: str | None = None,
                  seed: int = FACTOR_SEED) -> dict:
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
    wanted = list(methods) if methods is not None else (
        [f"All-{m}" for m in GENTEN_ALL_METHODS] + list(GENTEN_MODE_METHODS))
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
    return {"seconds": best, "method": method, "per_method": per_method, "what": runs[method]["what"],
            "threads": runs[method]["threads"] or threads_used, "iters": iters, "details": details}


# --- pyttb ---------------------------------------------------------------------------------------------

def _pyttb_warmup(ttb: Any) -> None:
    # pyttb's first MTTKRP in a process pays for lazy imports and first-use setup (0.5-10 s seen
    # here on 2 shared cores, far above the kernel itself); pay it on a tiny tensor, untimed.
    S = ttb.sptensor(np.array([[0, 0, 0], [1, 1, 1]]), np.array([[1.0], [2.0]]), (2, 2, 2))
    S.mttkrp([np.ones((2, 2))] * 3, 0)


def pyttb_mttkrp(coords: np.ndarray, values: np.ndarray, shape: Sequence[int], rank: int,
                 modes: Sequence[int] | None = None, repeat: int = 1, *, seed: int = FACTOR_SEED) -> dict:
    """All-mode MTTKRP time of ``pyttb.sptensor.mttkrp``, measured on some modes and extrapolated.

    Parameters
    ----------
    coords, values, shape, rank
        As in :func:`genten_mttkrp`.
    modes : sequence of int, optional
        Modes to time; default all. pyttb is slow, so a subset can stand for the rest: the all-mode
        estimate is the mean measured mode time times the number of modes (pyttb's cost, R TTV
        passes over all nonzeros, hardly depends on the mode).
    repeat : int
        Timed calls per mode; the best is kept (after one untimed warm-up call per process).
    seed : int
        Seed of the factor matrices (:func:`random_factors`).

    Returns
    -------
    dict
        ``seconds``: all-mode estimate; ``measured_modes``; ``per_mode``: ``{n: seconds}``;
        ``extrapolated``: whether some modes were not measured; ``repeat``.
    """
    import pyttb as ttb

    coords, values, shape = _check_tensor(coords, values, shape)
    nd = len(shape)
    measured = list(range(nd)) if modes is None else sorted({int(n) for n in modes})
    if not measured or not all(0 <= n < nd for n in measured):
        raise ValueError(f"modes must be a non-empty subset of 0..{nd - 1}, got {modes}")
    _pyttb_warmup(ttb)
    S = ttb.sptensor(coords, values.reshape(-1, 1), shape, copy=False)
    factors = random_factors(shape, rank, seed)
    per_mode: dict[int, float] = {}
    for n in measured:
        best = float("inf")
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            S.mttkrp(factors, n)
            best = min(best, time.perf_counter() - t0)
        per_mode[n] = best
    return {"seconds": sum(per_mode.values()) / len(measured) * nd, "measured_modes": measured,
            "per_mode": per_mode, "extrapolated": len(measured) < nd, "repeat": repeat}


# --- verification and demo -----------------------------------------------------------------------------

def _numpy_cp_als(coords: np.ndarray, values: np.ndarray, factors: Sequence[np.ndarray],
                  iters: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """CP-ALS exactly as Genten_CpAls.cpp does it (2-norm column scaling on the first iteration,
    max-norm floored at 1 afterwards), from ``factors`` with unit weights, on top of :func:`numpy_mttkrp`."""
    U = [f.copy() for f in factors]
    lam = np.ones(U[0].shape[1])
    for it in range(iters):
        for n in range(len(U)):
            V = numpy_mttkrp(coords, values, U, n)
            Y = np.ones((V.shape[1], V.shape[1]))
            for k, Uk in enumerate(U):
                if k != n:
                    Y *= Uk.T @ Uk
            Un = np.linalg.solve(Y, V.T).T  # Y symmetric: U[n] = V Y^-1
            lam = np.linalg.norm(Un, axis=0) if it == 0 else np.maximum(np.abs(Un).max(axis=0), 1.0)
            U[n] = Un / lam
    return lam, U


def _full(weights: np.ndarray, factors: Sequence[np.ndarray]) -> np.ndarray:
    """Dense tensor of a Kruskal tensor (small shapes only)."""
    out = weights[None, :]
    for f in factors:
        out = (out[:, None, :] * f[None, :, :]).reshape(-1, f.shape[1])
    return out.sum(axis=1).reshape([f.shape[0] for f in factors])


def verify(threads: int = 2, tol: float = 1e-10) -> dict:
    """Check both peers against NumPy on a small random tensor (3 modes, 50x60x70, 5000 nonzeros, rank 8).

    * pyttb: each mode's MTTKRP output against :func:`numpy_mttkrp`.
    * GenTen, per-mode methods: pygenten returns no MTTKRP output, so its MTTKRP is checked
      through two CP-ALS iterations from the shared factors, whose result depends on every MTTKRP
      (and on which factors each one used), against :func:`_numpy_cp_als` (full reconstructions).
    * GenTen, fused all-mode methods: CP-OPT's L-BFGS-B result is not reproducible in NumPy here,
      so these are checked by agreement with All-Iterated, whose kernel is the per-mode Perm one
      verified above (``max_rel_diff`` in :func:`genten_mttkrp`'s details).

    Returns
    -------
    dict
        Largest relative errors, per check.
    """
    rng = np.random.default_rng(7)
    shape, nnz, rank = (50, 60, 70), 5000, 8
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1).astype(np.int64)
    values = rng.random(nnz)
    factors = random_factors(shape, rank)
    errors: dict[str, float] = {}

    import pyttb as ttb
    S = ttb.sptensor(coords, values.reshape(-1, 1), shape)
    errors["pyttb"] = max(float(np.abs(S.mttkrp(factors, n) - numpy_mttkrp(coords, values, factors, n)).max()
                                / np.abs(numpy_mttkrp(coords, values, factors, n)).max()) for n in range(3))

    gt = _load_genten(threads)
    lam, U = _numpy_cp_als(coords, values, factors, iters=2)
    ref = _full(lam, U)
    X = gt.Sptensor(shape, coords, values, copy=True)
    try:
        threads_used = _genten_threads(gt)
        for method in GENTEN_MODE_METHODS:
            if _skip_reason(method, threads_used):
                continue
            rec = _genten_solve(gt, X, factors, "mode", method, iters=2)
            if "error" not in rec:
                errors[f"genten {method}"] = float(np.abs(_full(rec["weights"], rec["factors"]) - ref).max()
                                                   / np.abs(ref).max())
        fused = {m: _genten_solve(gt, X, factors, "all", m, iters=2) for m in GENTEN_ALL_METHODS
                 if not _skip_reason(m, threads_used)}
    finally:
        del X
    if "error" in fused["Iterated"]:
        raise AssertionError(f"GenTen All-Iterated failed: {fused['Iterated']['error']}")
    for m, rec in fused.items():
        if m != "Iterated" and "error" not in rec:
            errors[f"genten All-{m} vs All-Iterated"] = _relative_difference(rec, fused["Iterated"])
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        raise AssertionError(f"peers disagree with NumPy beyond {tol}: {bad}")
    return errors


def _demo(shape: tuple[int, ...], nnz: int, rank: int, threads: int, iters: int) -> None:
    """Time both peers on a uniform random tensor and print the results."""
    rng = np.random.default_rng(3)
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1).astype(np.int64)
    values = rng.random(nnz)
    print(f"\ntensor {'x'.join(map(str, shape))}, {nnz} nonzeros, rank {rank}")
    g = genten_mttkrp(coords, values, shape, rank, threads=threads, iters=iters)
    print(f"  GenTen: {g['seconds'] * 1e3:8.3f} ms all-mode ({g['what']}, best method {g['method']}, "
          f"{g['threads']} threads, {iters} iterations per method)")
    for name, v in g["per_method"].items():
        if not isinstance(v, float):
            print(f"    {name:<16}  {v}")
            continue
        d = g["details"][name]
        how = f"best of {len(d['samples'])} iterations" if d["stat"] == "min" else f"mean of {d['calls']} calls"
        print(f"    {name:<16}{v * 1e3:8.3f} ms  ({how}; GenTen ran '{d['resolved']}')")
    p = pyttb_mttkrp(coords, values, shape, rank, repeat=3)
    modes = ", ".join(f"{n}: {s * 1e3:.2f}" for n, s in p["per_mode"].items())
    print(f"  pyttb:  {p['seconds'] * 1e3:8.3f} ms all-mode (per mode ms {modes}; best of {p['repeat']})")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--nnz", type=int, default=0, help="also time a 500x600x700 tensor with this many nonzeros")
    ap.add_argument("--rank", type=int, default=16, help="rank for --nnz")
    args = ap.parse_args(argv)
    errors = verify(args.threads)
    print("verification against NumPy (largest relative error):")
    for k, v in errors.items():
        print(f"  {k:<38}{v:.1e}")
    if _GENTEN["threads"] != 1:
        print(f"  (Single and All-Single not run: single-thread kernels race with {_GENTEN['threads']} threads)")
    _demo((50, 60, 70), 5000, 8, args.threads, args.iters)
    if args.nnz:
        _demo((500, 600, 700), args.nnz, args.rank, args.threads, args.iters)


if __name__ == "__main__":
    main()
