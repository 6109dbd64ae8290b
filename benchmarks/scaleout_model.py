"""A cost model of one owner-computes CP-ALS iteration: fitted to the runs this machine can make,
used to predict the clusters it cannot (8, 16, 64 workers at billions of nonzeros).

The iteration time on ``W`` workers of ``c`` cores each, for a tensor of ``N`` modes::

    t(W) = a * nnz * N / (W * c)                  compute
         + [W > 1] * N * rounds * latency          exchange latency
         + (bytes_sent / W) / bandwidth            exchange volume
         + c0                                      fixed

Why these terms, and what they assume:

- compute: the MTTKRP of every mode touches each nonzero once, and owner-computes splits the
  nonzeros into nonzero-balanced runs pinned to the workers, so the work divides evenly over all
  ``W * c`` cores. ``a`` is seconds per nonzero, per mode, per core. The row updates
  (``I_n * R**2`` per mode) are folded in: beside ``nnz * R`` they are a few percent on sparse
  tensors. Threads are assumed to scale linearly within a worker, and workers not to share
  cores: a point with more busy threads than the machine's cores (4 x 1 on 2 cores) breaks the
  compute term and should be left out of a fit.
- exchange latency: each mode exchanges ``rounds = 2`` times (partial MTTKRP rows to their
  owners, a sparse reduce-scatter; updated rows back to the workers that touch them, a sparse
  all-gather), each time waiting for the slowest peer at least one link latency. One worker
  does not exchange.
- exchange volume: every worker sends ``bytes_sent / W`` (balanced partitions balance the
  traffic) over its own link, all links at once: a non-blocking switch, full duplex, no link
  shared. Serialization is zero-copy, so its cost lands in ``bandwidth`` when that is fitted
  (loopback) and in ``c0`` otherwise. Compute and exchange do not overlap (the iteration runs
  them one after the other), so the terms add.
- fixed: task dispatch, the driver's one summary per iteration, the all-reduce of ``R x R``
  Grams and the per-message software cost that does not shrink with ``W``.
- not modeled: memory limits and spilling, stragglers, stores read from disk or object storage
  during the iteration (streaming), and links slower than the cores can feed.

``fit`` takes measured points and solves for ``a`` and ``c0`` (and ``1 / bandwidth`` for points
on loopback, whose bandwidth is unknown) by non-negative least squares on the relative error:
the points span milliseconds to minutes, and plain least squares would fit only the slowest.
A point's link latency, when given, is subtracted as known; on loopback it is folded into ``c0``
(with a fixed number of modes the two cannot be told apart).

``predict_bytes`` estimates ``bytes_sent`` for a tensor the benchmark cannot hold, for a
BLCO/ALTO-ordered store split into ``W`` contiguous nonzero-balanced runs:

- a mode of ``I`` rows receives the ``nnz / W`` nonzeros of one run as balls into bins: the run
  touches ``I * (1 - exp(-nnz / (W * I)))`` distinct rows;
- rows are spread over all workers (the runs do not align with rows), so a touched row is owned
  by another worker with probability ``(W - 1) / W``, and each such row is sent twice: its partial
  to its owner, its update back;
- ``bytes = 2 * sum over modes of (W * touched * (W - 1) / W) * rank * itemsize``, all workers
  together, in the same units as the history's ``bytes_sent``.

Both simplifications make it an upper estimate: heavy-tailed rows (many nonzeros on few rows)
touch fewer distinct rows than uniform balls, and the ordering's runs cover ranges of the modes
whose top index bits split them. ``grid`` models that locality, or a medium-grained grid as in
SPLATT's MPI code: with ``p_n`` slabs in mode ``n`` (``prod p_n = W``) a run covers ``I_n / p_n``
rows of mode ``n``, shared by the ``W / p_n`` workers of its slab. ``best_grid`` finds the grid
that moves the fewest bytes.

    python benchmarks/scaleout_model.py                   # the demo: synthetic points, predictions
    python benchmarks/scaleout_model.py --points pts.json # fit measured points (a JSON list of dicts)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

ROUNDS = 2  # exchanges per mode: reduce-scatter of partials, all-gather of updated rows
POINT_KEYS = ("nnz", "nmodes", "workers", "cores_per_worker", "seconds", "bytes_sent")

AMAZON = ((4_821_207, 1_774_269, 1_805_187), 1.74e9)
REDDIT = ((8_211_298, 176_962, 8_116_559), 4.7e9)


@dataclasses.dataclass(frozen=True)
class Model:
    """Fitted costs of one owner-computes CP-ALS iteration (see the module docstring for the terms).

    ``bandwidth`` (bytes/s, each worker's link) and ``latency`` (s, one way) are the link that
    predictions assume: the fitted one for loopback points, the points' own when they all shared
    one; ``predict`` takes another per call.
    """

    a: float  # seconds per nonzero, per mode, per core
    c0: float  # seconds per iteration, fixed
    bandwidth: float | None = None  # bytes/s per worker link; None: the points did not determine it
    latency: float = 0.0  # seconds, one way
    rounds: int = ROUNDS
    bandwidth_fitted: bool = False  # True when bandwidth came from the fit (loopback points)
    rms_relative_error: float = 0.0  # of the fit, over its points
    n_points: int = 0

    def terms(
        self,
        nnz: float,
        nmodes: int,
        workers: int,
        cores_per_worker: int,
        bytes_sent: float,
        *,
        link_bandwidth: float | None = None,
        link_latency: float | None = None,
    ) -> dict[str, float]:
        """The iteration's seconds by term: compute, latency, transfer and fixed."""
        bandwidth = self.bandwidth if link_bandwidth is None else link_bandwidth
        latency = self.latency if link_latency is None else link_latency
        if workers < 1 or cores_per_worker < 1:
            raise ValueError(f"need workers >= 1 and cores_per_worker >= 1, not {workers} and {cores_per_worker}")
        if bandwidth is None and workers > 1 and bytes_sent > 0:
            raise ValueError("no link bandwidth: the fit had none (no multi-worker loopback points); pass one")
        transfer = 0.0 if workers == 1 or bytes_sent == 0 else bytes_sent / workers / bandwidth
        return {
            "compute": self.a * nnz * nmodes / (workers * cores_per_worker),
            "latency": nmodes * self.rounds * latency if workers > 1 else 0.0,
            "transfer": transfer,
            "fixed": self.c0,
        }

    def predict(
        self,
        nnz: float,
        nmodes: int,
        workers: int,
        cores_per_worker: int,
        bytes_sent: float,
        *,
        link_bandwidth: float | None = None,
        link_latency: float | None = None,
    ) -> float:
        """Seconds per iteration on ``workers`` workers of ``cores_per_worker`` cores, moving
        ``bytes_sent`` bytes (all workers, as in the history; ``predict_bytes`` estimates it)."""
        t = self.terms(
            nnz, nmodes, workers, cores_per_worker, bytes_sent, link_bandwidth=link_bandwidth, link_latency=link_latency
        )
        return sum(t.values())

    def with_link(self, bandwidth: float, latency: float) -> Model:
        """The same costs on another link (a model fitted on loopback, predicting a real network)."""
        return dataclasses.replace(self, bandwidth=bandwidth, latency=latency, bandwidth_fitted=False)


def _check_point(p: dict[str, Any]) -> None:
    missing = [k for k in POINT_KEYS if p.get(k) is None]
    if missing:
        raise ValueError(f"point {p} lacks {', '.join(missing)}")
    if p["workers"] < 1 or p["cores_per_worker"] < 1 or p["seconds"] <= 0:
        raise ValueError(f"point {p}: workers and cores_per_worker must be >= 1 and seconds > 0")


def fit(points: Sequence[dict[str, Any]], rounds: int = ROUNDS) -> Model:
    """Fit ``a``, ``c0`` (and the bandwidth of loopback points) to measured iterations.

    Each point: ``nnz``, ``nmodes``, ``workers``, ``cores_per_worker``, ``seconds`` (one
    iteration), ``bytes_sent`` (one iteration, all workers), ``link_bandwidth`` (bytes/s; None on
    loopback: fitted) and ``link_latency`` (s; None: folded into ``c0``). Non-negative least
    squares on the relative error (rows divided by the measured seconds).
    """
    if not points:
        raise ValueError("no points to fit")
    for p in points:
        _check_point(p)
    seconds = np.array([p["seconds"] for p in points], dtype=float)
    compute = np.array([p["nnz"] * p["nmodes"] / (p["workers"] * p["cores_per_worker"]) for p in points], float)
    if np.unique(compute).size < 2:
        raise ValueError("need points at two or more values of nnz * N / (W * c) to tell compute from fixed cost")
    known = np.zeros(len(points))  # the link terms of points whose link is known, subtracted
    unknown_bytes = np.zeros(len(points))  # per-worker bytes of loopback points: times 1 / bandwidth
    for i, p in enumerate(points):
        W, N = p["workers"], p["nmodes"]
        if W > 1 and p.get("link_latency") is not None:
            known[i] += N * rounds * p["link_latency"]
        per_worker = p["bytes_sent"] / W if W > 1 else 0.0
        if p.get("link_bandwidth") is not None:
            known[i] += per_worker / p["link_bandwidth"]
        else:
            unknown_bytes[i] = per_worker
    columns = [compute, np.ones(len(points))]
    fit_bandwidth = bool(unknown_bytes.any())
    if fit_bandwidth:
        columns.append(unknown_bytes)
    X = np.column_stack(columns) / seconds[:, None]
    y = (seconds - known) / seconds
    scale = np.linalg.norm(X, axis=0)  # columns differ by 1e9 in size; nnls is better conditioned scaled
    coef, _ = nnls(X / scale, y)
    coef = coef / scale
    rms = float(np.sqrt(np.mean((X @ coef - y) ** 2)))

    bandwidth: float | None
    if fit_bandwidth:
        bandwidth = math.inf if coef[2] == 0 else 1.0 / coef[2]
    else:
        links = {p.get("link_bandwidth") for p in points if p["workers"] > 1}
        bandwidth = links.pop() if len(links) == 1 else None
    latencies = {p.get("link_latency") for p in points if p["workers"] > 1}
    latency = latencies.pop() if len(latencies) == 1 else None
    return Model(
        a=float(coef[0]),
        c0=float(coef[1]),
        bandwidth=bandwidth,
        latency=float(latency or 0.0),
        rounds=rounds,
        bandwidth_fitted=fit_bandwidth,
        rms_relative_error=rms,
        n_points=len(points),
    )


def touched_rows(rows: float, nnz: float) -> float:
    """Distinct rows of ``rows`` that ``nnz`` nonzeros land on, thrown uniformly (balls in bins)."""
    return -rows * math.expm1(-nnz / rows) if rows > 0 else 0.0


def predict_bytes(
    shape: Sequence[int],
    nnz: float,
    rank: int,
    workers: int,
    itemsize: int = 8,
    grid: Sequence[int] | None = None,
) -> int:
    """Bytes one iteration sends, all workers together: the rows each worker touches but another
    owns, each way, times ``rank * itemsize``. ``grid`` (slabs per mode, product ``workers``)
    models runs that cover only part of each mode; None: every run spans every mode (see the
    module docstring)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, not {workers}")
    if grid is None:
        grid = (1,) * len(shape)  # no slabs: every run's rows spread over the whole of every mode
    elif len(grid) != len(shape) or math.prod(grid) != workers:
        raise ValueError(f"grid {tuple(grid)} must have one entry per mode of {tuple(shape)} and product {workers}")
    shared = 0.0
    for rows, slabs in zip(shape, grid):
        sharers = workers // slabs  # workers whose runs cover the same rows of this mode
        if sharers > 1:
            touched = touched_rows(rows / slabs, nnz / workers)
            shared += workers * touched * (sharers - 1) / sharers
    return int(round(2 * shared * rank * itemsize))


def alto_grid(shape: Sequence[int], workers: int) -> tuple[int, ...]:
    """The grid that ``workers`` (a power of two) contiguous, nonzero-balanced runs of the ALTO
    order make: the order interleaves the modes' bits, least significant level first, so its top
    ``log2(workers)`` bits, which the runs split, are the top levels of the longest modes (for
    evenly spread nonzeros). Amazon's shape on 8 workers: (4, 1, 2), not (1, 1, 1)."""
    k = workers.bit_length() - 1
    if workers < 1 or 1 << k != workers:
        raise ValueError(f"workers must be a power of two, not {workers}")
    bits = [max(0, (int(s) - 1).bit_length()) for s in shape]
    order = [(level, n) for level in range(max(bits, default=0)) for n in range(len(shape)) if level < bits[n]]
    grid = [1] * len(shape)
    for _, n in order[len(order) - k :] if k else []:
        grid[n] *= 2
    return tuple(grid)


def _grids(workers: int, nmodes: int) -> Iterable[tuple[int, ...]]:
    """Every way to write ``workers`` as an ordered product of ``nmodes`` factors."""
    divisors = [d for d in range(1, workers + 1) if workers % d == 0]
    for head in itertools.product(divisors, repeat=nmodes - 1):
        rest, r = divmod(workers, math.prod(head))
        if r == 0:
            yield (*head, rest)


def best_grid(shape: Sequence[int], nnz: float, rank: int, workers: int, itemsize: int = 8) -> tuple[int, ...]:
    """The grid of slabs per mode that moves the fewest bytes (SPLATT's medium-grained choice)."""
    return min(_grids(workers, len(shape)), key=lambda g: predict_bytes(shape, nnz, rank, workers, itemsize, g))


# --- the demo ------------------------------------------------------------------------------------


def synthetic_points(
    model: Model, link_bandwidth: float | None, link_latency: float | None, noise: float = 0.03, seed: int = 0
) -> list[dict[str, Any]]:
    """Iterations as the benchmark would measure them on this 2-core machine (its tensors and
    1 x 1, 1 x 2, 2 x 1), timed by ``model`` with multiplicative noise: a check that ``fit``
    recovers the costs that made them."""
    from_presets = {
        "uber": ((183, 24, 1140, 1717), 3_309_490),
        "vast": ((165_427, 11_374, 2), 26_021_854),
        "amazon86": (AMAZON[0], 86_000_000),
    }
    rng = np.random.default_rng(seed)
    points = []
    for shape, nnz in from_presets.values():
        for workers, cores in ((1, 1), (1, 2), (2, 1)):
            sent = predict_bytes(shape, nnz, 16, workers) * rng.uniform(0.5, 1.0)  # orderings send less
            t = model.predict(
                nnz, len(shape), workers, cores, sent, link_bandwidth=link_bandwidth, link_latency=link_latency
            )
            point = {"nnz": nnz, "nmodes": len(shape), "workers": workers, "cores_per_worker": cores}
            point |= {"seconds": t * (1 + noise * rng.standard_normal()), "bytes_sent": sent}
            points.append(point | {"link_bandwidth": link_bandwidth, "link_latency": link_latency})
    return points


def describe(model: Model) -> str:
    """One line: the model's costs and, for a fitted one, how well it fits."""
    bw = "none" if model.bandwidth is None else f"{model.bandwidth * 8 / 1e9:.3g} Gbit/s"
    how = "fitted" if model.bandwidth_fitted else "given"
    return (
        f"a = {model.a:.3g} s/(nonzero mode core), c0 = {model.c0 * 1e3:.3g} ms, link {bw} ({how}), "
        f"latency {model.latency * 1e3:.3g} ms"
    ) + (f"; {model.n_points} points, rms relative error {model.rms_relative_error:.3f}" if model.n_points else "")


def prediction_table(
    model: Model,
    tensors: dict[str, tuple[tuple[int, ...], float]],
    workers: Sequence[int],
    rank: int,
    cores_per_worker: int,
    link_bandwidth: float,
    link_latency: float,
) -> list[dict[str, Any]]:
    """Predicted seconds per iteration, by term, for each tensor and worker count, both for runs
    spanning every mode (the ordering's contiguous runs, as estimated) and for the best grid."""
    rows = []
    for name, (shape, nnz) in tensors.items():
        t1 = model.predict(nnz, len(shape), 1, cores_per_worker, 0)
        for W in workers:
            for layout, grid in (("runs", None), ("grid", best_grid(shape, nnz, rank, W))):
                sent = predict_bytes(shape, nnz, rank, W, grid=grid)
                terms = model.terms(
                    nnz, len(shape), W, cores_per_worker, sent, link_bandwidth=link_bandwidth, link_latency=link_latency
                )
                t = sum(terms.values())
                rows.append(
                    {"tensor": name, "workers": W, "layout": layout, "grid": grid or (1,) * len(shape)}
                    | {"bytes_sent": sent, "seconds": t, **terms, "speedup": t1 / t, "efficiency": t1 / (W * t)}
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", help="JSON list of measured points to fit (default: synthetic ones)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--cores", type=int, default=16, help="cores per worker in the predictions")
    ap.add_argument("--gbit", type=float, default=10.0, help="link rate for the predictions, Gbit/s")
    ap.add_argument("--latency-ms", type=float, default=0.1, help="one-way link latency for the predictions")
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 16, 64])
    args = ap.parse_args(argv)
    bandwidth, latency = args.gbit * 1e9 / 8, args.latency_ms * 1e-3

    if args.points:
        with open(args.points) as fh:
            model = fit(json.load(fh))
        print(f"fit: {describe(model)}")
    else:
        # costs of the order the runs show: 36 ms/it for uber's 3.3 M x 4 modes on 2 cores
        truth = Model(a=5.4e-9, c0=4e-3, bandwidth=bandwidth, latency=latency)
        print(f"truth:         {describe(truth)}")
        model = fit(synthetic_points(truth, bandwidth, latency))
        print(f"fit (shaped):  {describe(model)}")
        loop = fit(synthetic_points(dataclasses.replace(truth, bandwidth=3e9, latency=0.0), None, None, seed=1))
        print(f"fit (loopback, 24 Gbit/s): {describe(loop)}")

    rows = prediction_table(
        model, {"amazon": AMAZON, "reddit": REDDIT}, args.workers, args.rank, args.cores, bandwidth, latency
    )
    print(
        f"\npredicted s/iteration, rank {args.rank}, {args.cores} cores per worker, "
        f"{args.gbit:g} Gbit/s {args.latency_ms:g} ms links (speedup, efficiency: against 1 worker)"
    )
    head = f"{'tensor':<7} {'W':>3} {'layout':<6} {'grid':<12} {'GB sent':>8} {'s/it':>7}"
    print(head + f" {'compute':>8} {'latency':>8} {'transfer':>9} {'fixed':>7} {'speedup':>8} {'eff':>5}")
    for r in rows:
        grid = "x".join(map(str, r["grid"])) if r["layout"] == "grid" else "-"
        print(
            f"{r['tensor']:<7} {r['workers']:>3} {r['layout']:<6} {grid:<12} {r['bytes_sent'] / 1e9:>8.2f}"
            f" {r['seconds']:>7.3f} {r['compute']:>8.3f} {r['latency']:>8.4f} {r['transfer']:>9.3f} {r['fixed']:>7.3f}"
            f" {r['speedup']:>8.1f} {r['efficiency']:>5.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
