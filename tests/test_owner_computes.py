"""Owner-computes CP-ALS on real multi-process Dask clusters: the same result as one process, the
bytes sent equal to the plan's lower bound plus the small all-reduced terms, checkpoints, clear
refusals, and nothing left on the workers after a run."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster
from paired_stores import paired_store
from test_leverage_sampling import exact_leverage, explicit_krp
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc import synthetic
from tensorflow_ooc.decompositions.cp.cp_owner_sampling import owner_sts_sample, start_sampler
from tensorflow_ooc.execution.memory_plan import MemoryPlanError
from tensorflow_ooc.execution.owner_computes import _RUNS, OwnerComputes, plan_ownership
from tensorflow_ooc.execution.partials import SPREAD_ROWS
from tensorflow_ooc.execution.partitions import split_nonzeros
from tensorflow_ooc.kernels import StackedFactors


def _random_store(rng, tmp_path, order: int, nnz: int, name: str = "x.zarr"):
    shape = tuple(int(s) for s in rng.integers(12, 40, size=order))
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    values = rng.random(nnz) + 0.1
    return tfo.convert((coords, values), tmp_path / name, chunk_nnz=1024, duplicates="sum")


def _assert_same(got, ref, tol=1e-10):
    assert abs(got.fit - ref.fit) < tol
    assert np.abs(got.weights - ref.weights).max() <= tol * max(1.0, np.abs(ref.weights).max())
    for a, b in zip(got.factors, ref.factors):
        assert a.shape == b.shape
        assert np.abs(a - b).max() < tol


# per order: the modes of a few thousand rows (each of them rows some worker does not touch; every
# worker touches every row of the other modes), the message rounds an iteration takes on 2 workers
# and how many modes' terms travel between them (all but a last mode every worker holds whole)
LONG_MODES = {3: ((1, 2), 4, 3), 4: ((0, 1), 4, 3), 5: ((2,), 5, 4)}


@pytest.mark.parametrize("order", [3, 4, 5])
def test_two_workers_equal_one_process(two_workers, rng, tmp_path, order):
    long, rounds, terms = LONG_MODES[order]
    shape = [int(rng.integers(3000, 4000)) if n in long else int(rng.integers(12, 40)) for n in range(order)]
    nnz = 6000
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    store = tfo.convert((coords, rng.random(nnz) + 0.1), tmp_path / "x.zarr", chunk_nnz=1024, duplicates="sum")
    rank, seed = 4, int(rng.integers(1 << 30))
    ref = tfo.cp_als(store, rank, seed=seed, max_iters=5, tol=0, scheduler="inline")
    got = tfo.cp_als(store, rank, seed=seed, max_iters=5, tol=0, client=two_workers, execution="in-memory")
    assert got.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    _assert_same(got, ref)
    # each mode in one round (on 2 workers no row has more workers): the rows both workers touch
    # go to the other one each way, as many as the owner's round trip (the plan's lower bound).
    # A mode's R + R^2 + R terms travel to the other worker with the next mode's partials, or
    # after the last mode in a round of their own, unless every worker holds that mode whole
    N, W = order, 2
    small = terms * W * (W - 1) * (2 * rank + rank * rank) * 8
    for h in got.history:
        assert h["bytes_sent"] == h["bytes_lower_bound"] + small
        assert len(h["mode_bytes_sent"]) == N and len(h["exchange_seconds"]) == N
        assert h["rounds"] == rounds
    assert got.history[-1]["bytes_lower_bound"] > 0  # the workers do share rows here


def _paired_store(rng, tmp_path, order: int):
    """A store whose last two modes take few distinct index pairs (so each worker's partitions
    memoize them), with enough nonzeros that every partition of 2 workers holds some."""
    shape = (60, 50, 40, 7, 5)[:order] if order > 3 else (4000, 9, 7)
    coords, values, store = paired_store(rng, tmp_path / f"p{order}.zarr", shape, 20_000)
    return shape, coords, values, store


def _pairs_on_workers(ws):
    """A worker's memoized pairs (per partition, the modes they hold) and the second modes their
    memos served."""
    return [sorted(src.mode_pairs) for src in ws.sources], sum(m.served for m in ws.memos)


def _sweep_step(ws, previous, seed, rank):
    """A sweep as CP-ALS runs it (the modes in turn, each after the update of the one before),
    each factor replaced by fresh random rows (the same on every worker) before the first mode
    and after its own: every mode's local partial, and what the worker's pairs did."""
    rng = np.random.default_rng(seed)
    views = ws.factors.views
    for v in views:
        v[...] = rng.standard_normal(v.shape)
    partials = []
    for n in range(len(views)):
        partials.append(ws.local_mttkrp(n, in_turn=True))
        views[n][...] = rng.standard_normal(views[n].shape)
    return {"partials": partials, "pairs": _pairs_on_workers(ws)}


@pytest.mark.parametrize("order", [3, 4, 5])
def test_workers_memoize_mode_pairs_over_their_partitions(two_workers, rng, tmp_path, order):
    shape, coords, values, store = _paired_store(rng, tmp_path, order)
    rank, seed = 8, int(rng.integers(1 << 30))
    W = 2
    engine = OwnerComputes(
        two_workers,
        store.path,
        split_nonzeros(store, 2 * W),
        in_memory=True,
        init=StackedFactors.from_list,
        init_args=([np.zeros((s, rank)) for s in shape], "float64"),
        nmodes=order,
        threads={a: 1 for a in two_workers.scheduler_info()["workers"]},
        batch_nnz=1 << 16,
        max_private_bytes=1 << 26,
        mode_copies=True,
        mode_pairs=True,
    )
    try:
        got = engine.iterate(_sweep_step, (seed, rank))
    finally:
        engine.release()
    # each worker's partitions memoized the last two modes' pair, and its second mode read the
    # memo the first filled (one per partition)
    for g in got:
        kept, served = g["pairs"]
        assert len(kept) == 2 and all(order - 2 in m and order - 1 in m for m in kept), kept
        assert served == len(kept)
    # the workers' partials sum to the MTTKRP of the factors as they were at each mode's step
    frng = np.random.default_rng(seed)
    F = [frng.standard_normal((s, rank)) for s in shape]
    for n in range(order):
        total = np.zeros((shape[n], rank))
        for g in got:
            g["partials"][n].add_into(total)
        assert rel_err(total, dense_mttkrp(shape, coords, values, F, n)) < 1e-12
        F[n] = frng.standard_normal((shape[n], rank))


@pytest.mark.parametrize("order", [3, 4, 5])
def test_two_workers_with_mode_pairs_equal_one_process(two_workers, rng, tmp_path, order):
    shape, coords, values, store = _paired_store(rng, tmp_path, order)
    rank, seed = 8, int(rng.integers(1 << 30))
    served = []

    def on_workers():
        from tensorflow_ooc.execution.owner_computes import _RUNS as runs  # the worker's

        return [_pairs_on_workers(st) for st in runs.values()]

    def pairs_served(record):
        served.append(two_workers.run(on_workers))

    got = tfo.cp_als(store, rank, seed=seed, max_iters=4, tol=0, client=two_workers, callback=pairs_served)
    assert got.params["distribution"]["kind"] == "owner-computes"
    assert got.params["memory_plan"]["mode_pairs"]
    # each iteration, each partition's pair served its second mode from the memo (the rest of
    # the iteration's batch and the batch submitted ahead may have run too when the callback looks)
    for k, per_worker in enumerate(served, start=1):
        for ((kept, count),) in per_worker.values():
            assert kept and k * len(kept) <= count <= 4 * len(kept)
    assert all(count == 4 * len(kept) for ((kept, count),) in served[-1].values())
    ref = tfo.cp_als(store, rank, seed=seed, max_iters=4, tol=0, scheduler="inline")
    _assert_same(got, ref)
    plain = tfo.cp_als(store, rank, seed=seed, max_iters=4, tol=0, client=two_workers, execution="streaming")
    assert not plain.params["memory_plan"]["mode_pairs"]
    _assert_same(got, plain)


def test_three_workers_streaming_equal_one_process(three_workers, rng, tmp_path):
    store = _random_store(rng, tmp_path, 4, 9000)
    seed = int(rng.integers(1 << 30))
    ref = tfo.cp_als(store, 3, seed=seed, max_iters=4, tol=0, scheduler="inline")
    for execution in ("streaming", "in-memory"):
        got = tfo.cp_als(store, 3, seed=seed, max_iters=4, tol=0, client=three_workers, execution=execution)
        assert got.params["distribution"]["workers"] == 3
        assert got.params["execution"] == execution
        _assert_same(got, ref)


def test_given_init_and_checkpoint_resume(two_workers, rng, tmp_path):
    store = _random_store(rng, tmp_path, 3, 5000)
    init = [rng.random((s, 3)) for s in store.shape]
    straight = tfo.cp_als(store, 3, init=init, max_iters=6, tol=0, client=two_workers)
    ref = tfo.cp_als(store, 3, init=init, max_iters=6, tol=0, scheduler="inline")
    _assert_same(straight, ref)
    ck = tmp_path / "ck.npz"
    first = tfo.cp_als(store, 3, init=init, max_iters=3, tol=0, client=two_workers, checkpoint=ck)
    assert ck.exists() and first.iterations == 3
    resumed = tfo.cp_als(store, 3, init=init, max_iters=6, tol=0, client=two_workers, checkpoint=ck, resume=True)
    assert resumed.iterations == 6
    _assert_same(resumed, straight)


def test_graph_distribution_still_available(two_workers, rng, tmp_path):
    store = _random_store(rng, tmp_path, 3, 4000)
    a = tfo.cp_als(store, 3, seed=2, max_iters=3, tol=0, client=two_workers, distribution="graph")
    b = tfo.cp_als(store, 3, seed=2, max_iters=3, tol=0, client=two_workers)
    assert "distribution" not in a.params and "bytes_sent" not in a.history[-1]
    _assert_same(a, b)


def test_refusals(rng, tmp_path):
    store = _random_store(rng, tmp_path, 3, 500)
    with pytest.raises(ValueError, match="distribution must be one of"):
        tfo.cp_als(store, 2, max_iters=1, scheduler="inline", distribution="mpi")
    with pytest.raises(ValueError, match="distribution='owner' runs CP-ALS"):
        tfo.cp_als(store, 2, max_iters=1, scheduler="inline", distribution="owner")
    with pytest.raises(ValueError, match="not the inline scheduler, a dense array or CP-ARLS-LEV"):
        tfo.cp_als(store, 2, max_iters=1, scheduler="inline", distribution="owner", method="arls-lev")


def test_nothing_left_on_workers(two_workers, rng, tmp_path):
    store = _random_store(rng, tmp_path, 3, 3000)

    def stop(record):
        raise KeyboardInterrupt  # a user stopping the run from a callback

    with pytest.raises(KeyboardInterrupt):
        tfo.cp_als(store, 2, seed=1, max_iters=5, tol=0, client=two_workers, callback=stop)
    tfo.cp_als(store, 2, seed=1, max_iters=2, tol=0, client=two_workers)
    left = two_workers.run(lambda: len(_RUNS))
    assert set(left.values()) == {0}, left


def test_plan_ownership_most_nonzeros_wins():
    # mode 0: rows 0..4; worker 0 touches 0,1,2 (counts 5,1,2), worker 1 touches 1,2,3 (3,2,1)
    counts = [
        [(np.array([0, 1, 2]), np.array([5, 1, 2]))],
        [(np.array([1, 2, 3]), np.array([3, 2, 1]))],
    ]
    plan, plans = plan_ownership(counts)
    assert plan.owned[0][0].tolist() == [0, 2]  # row 2: a tie, to the lower rank
    assert plan.owned[1][0].tolist() == [1, 3]
    assert plan.shared_rows == [2]  # worker 0 sends row 1, worker 1 sends row 2
    assert plans[0][0].send == {1: np.array([1])} or plans[0][0].send[1].tolist() == [1]
    assert plans[1][0].send[0].tolist() == [2]
    assert plan.lower_bound_bytes(rank=4, itemsize=8) == 2 * 2 * 4 * 8


def test_plan_ownership_one_round_where_it_sends_no_more():
    # 3 workers; mode 0: rows 0..2999 each touched by 2 workers; mode 1: 3000 rows every worker
    # touches (one round would send 6 partials a row against the owner's 4); mode 2: 5 such rows
    t = np.arange(3000)
    halves = [t[:2000], t[1000:], np.r_[t[:1000], t[2000:]]]
    counts = [
        [(halves[w], np.full(2000, w + 1)), (t, np.full(3000, w + 1)), (np.arange(5), np.full(5, w + 1))]
        for w in range(3)
    ]
    plan, plans = plan_ownership(counts)
    assert plan.one_round == [True, False, True]
    assert [p.one_round for p in plans[1]] == [True, False, True]
    assert [p.whole for p in plans[1]] == [False, False, True]  # only mode 2: every worker, every row
    # rows both touch, per pair of workers (mode 0: the thousand rows they share)
    assert plans[0][0].shared[1].tolist() == list(range(1000, 2000))
    assert plans[1][0].shared[2].tolist() == list(range(2000, 3000))
    assert plans[2][0].shared[0].tolist() == list(range(1000))
    assert plans[0][2].shared[2].tolist() == list(range(5))
    assert plans[0][0].touched.tolist() == list(range(2000)) and plans[0][0].touched_span == (0, 2000)
    # two workers: always one round
    two, _ = plan_ownership([[(t, np.ones(3000, np.int64))], [(t, np.ones(3000, np.int64))]])
    assert two.one_round == [True]


def test_three_workers_mixing_one_and_two_round_modes_equal_one_process(three_workers, rng, tmp_path):
    # mode 0 is split between the workers (its top index bits lead the ALTO order), mode 1 has 5
    # rows, mode 2 3,000 rows every worker touches: modes 0 and 1 go in one round each (mode 0's
    # terms with mode 1's partials; mode 1, which every worker holds whole, takes its own), mode 2
    # in two
    shape, nnz = (20_000, 5, 3000), 60_000
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    store = tfo.convert((coords, rng.random(nnz) + 0.1), tmp_path / "mix.zarr", chunk_nnz=4096, duplicates="sum")
    seed = int(rng.integers(1 << 30))
    ref = tfo.cp_als(store, 4, seed=seed, max_iters=4, tol=0, scheduler="inline")
    got = tfo.cp_als(store, 4, seed=seed, max_iters=4, tol=0, client=three_workers, execution="in-memory")
    assert got.params["distribution"]["workers"] == 3
    _assert_same(got, ref)
    assert [h["rounds"] for h in got.history] == [1 + 1 + 2] * 4


def test_converged_run_stops_where_one_process_stops(two_workers, rng, tmp_path):
    # the next iteration is submitted before the driver reads this one: when this one converges,
    # the workers must skip it, leaving the factors of the converged iteration
    store = _random_store(rng, tmp_path, 3, 5000)
    seed = int(rng.integers(1 << 30))
    ref = tfo.cp_als(store, 3, seed=seed, max_iters=60, tol=1e-4, scheduler="inline")
    got = tfo.cp_als(store, 3, seed=seed, max_iters=60, tol=1e-4, client=two_workers)
    assert 1 < ref.iterations < 60
    assert got.iterations == ref.iterations
    _assert_same(got, ref)


def test_iterations_run_in_batches_one_record_and_callback_each(two_workers, rng, tmp_path):
    """After the first iteration (alone, to time one) the workers run batches of iterations as one
    task each, cut at checkpoints; every iteration still has its record and callback, in order,
    timed on the workers' clocks, and the result and checkpoints are one process's."""
    from distributed import get_task_stream

    store = _random_store(rng, tmp_path, 4, 6000)
    seed, iters = int(rng.integers(1 << 30)), 14
    ref = tfo.cp_als(store, 3, seed=seed, max_iters=iters, tol=0, scheduler="inline")
    seen = []
    with get_task_stream(two_workers) as ts:
        got = tfo.cp_als(
            store,
            3,
            seed=seed,
            max_iters=iters,
            tol=0,
            client=two_workers,
            callback=lambda r: seen.append(r["iteration"]),
            checkpoint=str(tmp_path / "ck.npz"),
            checkpoint_every=5,
        )
    _assert_same(got, ref)
    assert seen == list(range(1, iters + 1))
    assert [h["iteration"] for h in got.history] == seen
    tasks = [t for t in ts.data if t["key"].startswith("_iterate")]
    # 1 alone, then batches cut at the checkpoints after iterations 5, 10 and the last: 1+4, 5, 4
    assert 2 * 4 <= len(tasks) < 2 * iters, len(tasks)
    for h in got.history:
        assert 0 < h["seconds"] and all(s >= 0 for s in h["mode_seconds"])


def test_a_wait_for_a_gone_peer_ends(monkeypatch):
    # a worker waiting for a peer whose process ended (a driver killed with its worker cannot
    # abort the run) gives up once the peer stops answering, instead of holding its thread
    from tensorflow_ooc.execution import exchange

    monkeypatch.setattr(exchange, "LIVENESS_EVERY_S", 0.05)
    box = exchange.Mailbox()
    asked = []
    with pytest.raises(exchange.ExchangeAborted, match="rank 1 is gone"):
        box.take("r", (0, 0, "M"), 1, timeout=30, alive=lambda: asked.append(1) or len(asked) < 3)
    assert len(asked) == 3
    box.put("r", (0, 0, "M"), 1, "rows")  # a message that is there is taken without asking
    assert box.take("r", (0, 0, "M"), 1, alive=lambda: False) == "rows"


def test_a_message_arriving_after_its_run_was_released_is_dropped(rng):
    # an iteration does not wait for its last sends' delivery replies, so a row can arrive after
    # the driver released the run: it must not stay in the worker's mailbox
    from tensorflow_ooc.execution import exchange

    box = exchange.Mailbox()
    rows = rng.random((3, 4))
    box.put("kept", (0, 2, "A"), 1, rows)
    box.put("gone", (0, 2, "A"), 1, rows)
    box.forget("gone")
    box.put("gone", (1, 2, "A"), 0, rows)  # late
    assert list(box.box) == [("kept", (0, 2, "A"), 1)]
    assert box.take("kept", (0, 2, "A"), 1) is rows


def _wait_for_a_message_never_sent(addresses):
    from tensorflow_ooc.execution.exchange import Team

    Team("never-sent", 0, addresses).receive(("iteration", 0, "A"), 1)


def test_a_released_task_stops_waiting_for_its_peer(two_workers):
    # a driver that is killed leaves its tasks released by the scheduler; one already running on a
    # worker (a next iteration, started there while its peer's copy was dropped from the queue)
    # must end its wait, or it holds the worker's only thread for the 600 s receive timeout
    import time

    from distributed import wait

    addresses = sorted(two_workers.scheduler_info()["workers"])
    waiting = two_workers.submit(_wait_for_a_message_never_sent, addresses, workers=[addresses[0]], pure=False)
    deadline = time.monotonic() + 60
    busy = lambda: two_workers.run(lambda dask_worker: len(dask_worker.active_threads), workers=[addresses[0]])  # noqa: E731
    while not busy()[addresses[0]]:
        assert time.monotonic() < deadline, "the waiting task never started"
        time.sleep(0.05)
    two_workers.cancel([waiting])
    t0 = time.monotonic()
    after = two_workers.submit(lambda: "ran", workers=[addresses[0]], pure=False)  # the worker's one thread
    wait([after], timeout=60)
    assert after.result() == "ran"
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------- STS-CP across the workers -------


def _draw_step(ws, previous, mode, J, seed, spread_limit=None):
    """An iteration step that only draws: the distributed sampler's SampleSet on this worker (a
    sampler started with ``spread_limit`` where given or none is kept) and the modes it drew
    through the spread rows."""
    if ws.sampler is None:
        ws.sampler = start_sampler(ws, ("sampler",), *([] if spread_limit is None else [spread_limit]))
    S = owner_sts_sample(ws, mode, J, seed, ("draw", mode, seed))
    return {
        "coords": S.coords,
        "counts": S.counts,
        "probs": S.probs,
        "rows": S.rows,
        "weights": S.weights,
        "spread": np.array(sorted(ws.sampler.spread)),
    }


def _start_step(ws, previous, spread_limit):
    """An iteration step that starts the distributed sampler with ``spread_limit``."""
    ws.sampler = start_sampler(ws, ("sampler",), spread_limit)
    return {"stop": False, "fit": float("nan")}


def _nonzero_owned(ws):
    """Per mode, the rows that are not zero among those this worker owns."""
    return [int(np.count_nonzero(ws.owned_rows(m)[1].any(axis=1))) for m in range(ws.nmodes)]


def _check_draws(client, factors, shape, engine, J, seed_of, spread_limit=None):
    """Draws of every mode through ``engine``'s sampler, against the exact leverage scores of
    ``factors``: every worker holds the same set, its rows and probabilities are exact, and the
    counts pass a chi-square test. Returns the modes each mode's draws read spread."""
    from scipy.stats import chisquare

    spread = []
    for mode in range(len(shape)):
        got = engine.iterate(_draw_step, (mode, J, seed_of(mode), spread_limit))
        for g in got[1:]:  # every worker holds the same sample set
            for key in got[0]:
                np.testing.assert_array_equal(g[key], got[0][key])
        s = got[0]
        spread.append(set(s["spread"].tolist()))
        A, _ = explicit_krp(factors, mode)
        ks = [k for k in range(len(shape)) if k != mode]
        cells = np.ravel_multi_index(tuple(s["coords"][:, ks].T), [shape[k] for k in ks])
        assert s["counts"].sum() == J and (s["coords"][:, mode] == 0).all()
        lev = exact_leverage(A)
        np.testing.assert_allclose(s["probs"], lev[cells], rtol=1e-8)
        np.testing.assert_allclose(s["rows"], A[cells], rtol=1e-12)
        counts = np.bincount(cells, weights=s["counts"], minlength=A.shape[0])
        expected = lev * J
        big = expected >= 5
        obs, exp = counts[big], expected[big]
        if not big.all():  # cells expecting fewer than 5 draws, merged
            obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
        assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3, (shape, mode)
    return spread


@pytest.mark.parametrize("spread_limit", [0, "mixed", None])
@pytest.mark.parametrize(
    "shape, rank, cluster",
    [((9, 7, 8), 4, "three_workers"), ((5, 4, 6, 4), 6, "two_workers"), ((4, 3, 4, 3, 4), 3, "two_workers")],
)
def test_distributed_sts_draws_follow_exact_leverage_scores(request, shape, rank, cluster, spread_limit):
    """Draws asked of the rows' owners (``spread_limit`` 0), drawn through every worker's copy of
    the rows (None: the default limit, which these factors are under), or both ("mixed": the
    modes whose owners each hold at most as many rows as those of the mode with the fewest are
    spread) follow the exact leverage scores."""
    client = request.getfixturevalue(cluster)
    rng = np.random.default_rng(4000 + len(shape))  # fixed: a statistical test
    # every cell a nonzero, so every row has an owner; rows are owned by several workers per mode
    coords = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, len(shape))
    path = request.getfixturevalue("tmp_path") / "d.zarr"
    store = tfo.convert((coords, rng.random(coords.shape[0]) + 0.5), path, chunk_nnz=64)
    factors = [rng.standard_normal((s, rank)) for s in shape]
    W = len(client.scheduler_info()["workers"])
    engine = OwnerComputes(
        client,
        store.path,
        split_nonzeros(store, W),
        in_memory=True,
        init=StackedFactors.from_list,
        init_args=(factors, "float64"),
        nmodes=len(shape),
        threads={a: 1 for a in client.scheduler_info()["workers"]},
        batch_nnz=1 << 16,
        max_private_bytes=1 << 26,
    )
    try:
        owners = [sum(len(engine.plan.owned[w][n]) > 0 for w in range(W)) for n in range(len(shape))]
        assert max(owners) >= 2, owners  # a mode's rows really are spread over several owners
        most = [max(len(engine.plan.owned[w][n]) for w in range(W)) for n in range(len(shape))]
        if spread_limit == "mixed":
            spread_limit = min(most)
        spread = _check_draws(client, factors, shape, engine, 100_000, lambda mode: (7, 1, mode), spread_limit)
        held = engine.each(_nonzero_owned)
        limit = 1 << 62 if spread_limit is None else spread_limit
        want = {m for m in range(len(shape)) if max(h[m] for h in held) <= limit}
        assert all(s == want for s in spread), (spread, want)
        if spread_limit == min(most) and max(most) > min(most):
            assert 0 < len(want) < len(shape), want  # both ways in one draw
    finally:
        engine.release()


@pytest.mark.parametrize("nmodes", [3, 4, 5])
def test_sts_on_workers_fits_like_one_process(two_workers, tmp_path, nmodes):
    shape = (14, 12, 10, 9, 8)[:nmodes]
    seed = int(np.random.default_rng().integers(1 << 30))
    print("planted-tensor seed =", seed)
    p = synthetic.planted_cp(shape, 3, 6_000, seed=seed)
    store = tfo.convert((p.coords, p.values), tmp_path / "p.zarr", shape=p.shape, chunk_nnz=1024)
    kw = dict(method="sts", samples=4096, max_iters=60, tol=1e-9)
    one = max(tfo.cp_als(store, 3, seed=s, scheduler="inline", **kw).fit for s in (1, 2))
    runs = [tfo.cp_als(store, 3, seed=s, client=two_workers, **kw) for s in (1, 2)]
    got = max(r.fit for r in runs)
    assert got >= one - 0.05, (got, one)
    r = runs[0]
    assert r.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    h = r.history[-1]
    assert len(h["sampling_seconds"]) == nmodes and all(t > 0 for t in h["sampling_seconds"])
    assert h["bytes_sent"] > 0 and h["fit_evaluated"]


def test_sts_streaming_and_resume_draw_what_the_straight_run_drew(three_workers, tmp_path):
    seed = int(np.random.default_rng().integers(1 << 30))
    p = synthetic.planted_cp((30, 25, 20), 4, 8_000, seed=seed)
    store = tfo.convert((p.coords, p.values), tmp_path / "p.zarr", shape=p.shape, chunk_nnz=1024)
    kw = dict(method="sts", samples=2048, tol=0, seed=seed, client=three_workers)
    straight = tfo.cp_als(store, 4, max_iters=6, execution="in-memory", **kw)
    streamed = tfo.cp_als(store, 4, max_iters=6, execution="streaming", **kw)
    # the same draws (seeded per run, iteration and mode), the same nonzeros: equal to rounding
    _assert_same(streamed, straight, tol=1e-9)
    ck = tmp_path / "ck.npz"
    tfo.cp_als(store, 4, max_iters=3, execution="in-memory", checkpoint=ck, **kw)
    resumed = tfo.cp_als(store, 4, max_iters=6, execution="in-memory", checkpoint=ck, resume=True, **kw)
    assert resumed.iterations == 6
    _assert_same(resumed, straight, tol=1e-9)


def _trees_as_built(ws):
    """Per mode: whether this worker's tree equals a fresh build over its owned rows bitwise (or
    the mode is drawn through its spread rows, which equal the factor's rows that are not zero)."""
    from tensorflow_ooc.kernels.sampling.krp_sampler import build_tree

    out = []
    for mode, tree in enumerate(ws.sampler.trees):
        if mode in ws.sampler.spread:
            out.append(mode in ws.sampler.stale)
            continue
        rows = np.ascontiguousarray(ws.owned_rows(mode)[1], dtype=np.float64)
        out.append(tree is None or np.array_equal(tree.grams, build_tree(rows).grams))
    return out


def _spread_of(ws):
    """Per mode: the spread rows (row numbers, rows) this worker draws from, or None."""
    return [(s.ids, s.rows) if (s := ws.sampler.spread.get(m)) is not None else None for m in range(ws.nmodes)]


def _held_rows(ws):
    """Per mode, the rows this worker owns or touches (row numbers) and their values here."""
    out = []
    for m, plan in enumerate(ws.plans):
        ids = np.union1d(plan.owned, np.concatenate([plan.owned[:0], *plan.send.values()]))
        out.append((ids, ws.factors.views[m][ids]))
    return out


def _sketched_engine(client, tmp_path, shape, nnz, rank=4):
    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 30)))
    coords = np.unique(np.stack([rng.integers(0, s, nnz) for s in shape], axis=1), axis=0)
    store = tfo.convert((coords, rng.random(len(coords)) + 0.5), tmp_path / "s.zarr", shape=shape, chunk_nnz=512)
    factors = [rng.random((s, rank)) for s in shape]
    addresses = list(client.scheduler_info()["workers"])
    engine = OwnerComputes(
        client,
        store.path,
        split_nonzeros(store, len(addresses)),
        in_memory=True,
        init=StackedFactors.from_list,
        init_args=(factors, "float64"),
        nmodes=len(shape),
        threads={a: 1 for a in addresses},
        batch_nnz=1 << 16,
        max_private_bytes=1 << 26,
    )
    return engine, float(store.meta["norm_sq"])


def test_sts_on_workers_update_their_trees_over_the_changed_rows_only(two_workers, tmp_path):
    """After sketched updates (which change the rows their draws hit and those the update before
    hit), each worker's trees, brought up to date over those rows only, equal fresh builds over
    its owned rows bitwise, in every mode (the rows not spread: every draw asks the owners)."""
    from tensorflow_ooc.decompositions.cp.cp_owner import owner_iteration

    engine, normX2 = _sketched_engine(two_workers, tmp_path, (400, 300, 350), 6000)
    try:
        engine.iterate(owner_iteration, (0, True, normX2, 0.0, None))  # the exact warm-up
        engine.iterate(_start_step, (0,))
        for it in range(1, 5):  # 200 draws hit a few hundred rows of each mode
            engine.iterate(owner_iteration, (it, False, normX2, 0.0, (200, 12345, it == 4)))
            assert all(all(ok) for ok in engine.each(_trees_as_built)), it
            assert not any(any(s is not None for s in spread) for spread in engine.each(_spread_of))
    finally:
        engine.release()


@pytest.mark.parametrize("nmodes", [3, 4])
def test_sts_on_workers_spread_the_rows_of_sketched_updates(two_workers, tmp_path, nmodes):
    """Under the spread limit a sketched update's rows reach every worker: each then holds, per
    mode, exactly the factor's rows that are not zero (gathered from their owners), bitwise and
    the same on every worker; the draws through them (modes over the limit still asking their
    owners) follow the exact leverage scores of the factors."""
    from tensorflow_ooc.decompositions.cp.cp_owner import owner_iteration

    shape = (400, 300, 350) if nmodes == 3 else (90, 80, 70, 6)
    engine, normX2 = _sketched_engine(two_workers, tmp_path, shape, 6000)
    try:
        engine.iterate(owner_iteration, (0, True, normX2, 0.0, None))  # the exact warm-up: dense
        # owners hold 100-200 rows of each mode (order 3; order 4: 3-45): after the warm-up, only
        # short modes and those of sketched updates are spread
        limit = 40
        engine.iterate(_start_step, (limit,))
        # the first sketched iteration draws some modes through their owners, some spread
        assert any(s is None for s in engine.each(_spread_of)[0])
        for it in range(1, 4):
            engine.iterate(owner_iteration, (it, False, normX2, 0.0, (200, 777, it == 3)))
            factors = [engine.factor(m, shape, 4, "float64") for m in range(nmodes)]
            spreads = engine.each(_spread_of)
            held = engine.each(_nonzero_owned)
            for m in range(nmodes):
                nz = np.flatnonzero(factors[m].any(axis=1))
                if max(h[m] for h in held) > limit:
                    assert all(s[m] is None for s in spreads)
                    continue
                for s in spreads:
                    np.testing.assert_array_equal(s[m][0], nz)
                    np.testing.assert_array_equal(s[m][1], factors[m][nz])
            assert all(all(ok) for ok in engine.each(_trees_as_built)), it
            for held in engine.each(_held_rows):  # every row a worker's kernels read is current
                for m in range(nmodes):
                    np.testing.assert_array_equal(held[m][1], factors[m][held[m][0]])
        assert any(s is not None for s in spreads[0])
        seed = int(np.random.default_rng().integers(1 << 30))
        print("draw seed =", seed)
        _check_draws(two_workers, factors, shape, engine, 50_000, lambda mode: (seed, 9, mode))
    finally:
        engine.release()


def test_sts_on_workers_keeps_a_factor_no_sampled_fiber_touches(two_workers, tmp_path):
    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 30)))
    shape = (90, 100, 110)
    # no exact warm-up: from random factors 3 draws most often miss every fiber of a mode, which
    # the test needs; the draws are random, so fresh tensors are tried until a run keeps a mode
    for attempt in range(8):
        coords = np.unique(np.stack([rng.integers(0, s, 300) for s in shape], axis=1), axis=0)
        values = rng.random(len(coords)) + 0.5
        store = tfo.convert((coords, values), tmp_path / f"s{attempt}.zarr", shape=shape, chunk_nnz=64)
        r = tfo.cp_als(store, 2, seed=1, method="sts", samples=3, max_iters=4, tol=0, client=two_workers, warmup=0)
        if any(h.get("kept_modes") for h in r.history):
            break
    assert any(h.get("kept_modes") for h in r.history), "8 runs whose draws all hit a fiber in every mode"
    assert r.params["distribution"]["kind"] == "owner-computes"
    assert all(np.isfinite(f).all() and np.abs(f).sum() > 0 for f in r.factors)
    # the fit reported is the returned model's: a mode kept since the start keeps its initial rows
    # where no nonzero is (the run's Grams include them; no worker holds them)
    X = np.zeros(shape)
    X[tuple(coords.T)] = values
    model = np.einsum("r,ir,jr,kr->ijk", r.weights, *r.factors)
    assert r.fit == pytest.approx(1 - np.linalg.norm(X - model) / np.linalg.norm(X), rel=1e-9, abs=1e-9)


def test_owner_computes_plans_its_own_memory_and_holds_only_touched_rows(rng, tmp_path):
    # a long first mode: the task graphs' plan (a state copy and whole factors in transit) does not
    # fit 2 workers of 1.5 GB, owner-computes (each worker's half of mode 0) does
    shape = (2_000_000, 300, 200)
    coords = np.stack([rng.integers(0, s, 100_000) for s in shape], axis=1)
    store = tfo.convert((coords, rng.random(100_000) + 0.1), tmp_path / "long.zarr", duplicates="sum", chunk_nnz=8192)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1.5GB", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        with pytest.raises(MemoryPlanError, match="needs more memory than its limit allows"):
            tfo.cp_als(store, 16, seed=1, max_iters=1, client=client, distribution="graph")
        seen = []

        def untouched_rows_are_never_written(record):
            def check(dask_worker=None):
                from tensorflow_ooc.execution.owner_computes import _RUNS as runs  # the worker's

                (st,) = [s for (a, _), s in runs.items() if a == dask_worker.address]
                out = []
                for n, plan in enumerate(st.plans):
                    touched = np.zeros(st.factors.shape[n], dtype=bool)
                    touched[plan.owned] = True
                    for ids in plan.send.values():
                        touched[ids] = True
                    out.append((int(touched.sum()), bool(np.all(st.factors.views[n][~touched] == 0))))
                return out

            seen.append(client.run(check))

        r = tfo.cp_als(store, 16, seed=1, max_iters=2, tol=0, client=client, callback=untouched_rows_are_never_written)
    assert r.params["distribution"]["kind"] == "owner-computes"
    assert r.params["memory_plan"]["execution"] in ("in-memory", "streaming")
    for per_worker in seen:
        for rows in per_worker.values():
            assert all(clean for _, clean in rows)
            assert rows[0][0] < shape[0] * 0.75  # each worker holds about half of mode 0's rows


@pytest.mark.parametrize("n", [60, 5000])  # most rows sent (dense buffer) / few (sorted sums)
def test_owner_sums_equal_adding_each_ranks_rows_in_turn(n):
    from tensorflow_ooc.execution.owner_computes import owner_sums

    rng = np.random.default_rng()
    R = int(rng.integers(2, 9))
    positions = [np.sort(rng.choice(n, int(rng.integers(0, 40)), replace=False)) for _ in range(3)]
    values = [rng.standard_normal((p.shape[0], R)) for p in positions]
    values[1][: min(2, values[1].shape[0])] = 0.0  # rows sent as zero stay out unless another rank adds
    want = np.zeros((n, R))
    for p, v in zip(positions, values):
        want[p] += v
    got = owner_sums(positions, values, n)
    hit = np.flatnonzero(want.any(axis=1))
    assert got.n == n and np.array_equal(got.hit, hit) and np.array_equal(got.rows, want[hit])


def _recording_iteration(ws, previous, *args):
    """:func:`~tensorflow_ooc.decompositions.cp.cp_owner.owner_iteration` as the run calls it,
    returning beside its summary every mode's draws (the real sampler's SampleSets, in turn)."""
    from tensorflow_ooc.decompositions.cp import cp_owner

    drawn, real = [], cp_owner.owner_sts_sample

    def recorded(*a, **kw):
        S = real(*a, **kw)
        drawn.append((S.mode, S.coords, S.weights, S.rows, S.probs))
        return S

    cp_owner.owner_sts_sample = recorded
    try:
        out = cp_owner.owner_iteration(ws, previous, *args)
    finally:
        cp_owner.owner_sts_sample = real
    return {**out, "drawn": drawn}


def _sketched_update_reference(factors, coords, values, mode, S_coords, S_weights, S_rows):
    """One process's sketched update of ``mode`` in NumPy (not a first iteration): the sampled
    MTTKRP of the nonzeros in the drawn fibers, ``A = M (sum_s w_s h_s h_s^T)^+`` over the rows
    they hit, columns over their max-norm (at least 1), every other row zero; the factor kept
    where no drawn fiber holds a nonzero."""
    ks = [k for k in range(len(factors)) if k != mode]
    dims = [factors[k].shape[0] for k in ks]
    drawn = {key: s for s, key in enumerate(np.ravel_multi_index(tuple(S_coords[:, ks].T), dims))}
    M = np.zeros_like(factors[mode])
    for key, i, x in zip(np.ravel_multi_index(tuple(coords[:, ks].T), dims), coords[:, mode], values):
        if key in drawn:
            s = drawn[key]
            M[i] += x * S_weights[s] * S_rows[s]
    if not M.any():
        return factors[mode]
    A = M @ np.linalg.pinv((S_rows * S_weights[:, None]).T @ S_rows)
    return A / np.maximum(np.abs(A).max(axis=0), 1.0)


@pytest.mark.parametrize("nmodes, spread_limit", [(3, None), (3, 0), (4, None)])
def test_sts_on_workers_update_as_one_process_does_from_the_same_draws(
    two_workers, rng, tmp_path, nmodes, spread_limit
):
    """Two workers' sketched updates (the rows spread to every worker, or with ``spread_limit`` 0
    summed at and sent from their owners) give one process's factors, from the draws they made:
    in every mode of three iterations each draw's Khatri-Rao rows and probabilities are the exact
    leverage scores of the factors as they stand (an explicit SVD), and each update equals a
    NumPy sketched solve over the same draws, with the same rows not zero. With the uniforms'
    mapping to rows the only difference between the samplers (the owners' masses first here, one
    tree there: the draws differ, not their law), this is what makes both trajectories right
    (docs/EXECUTION.md, "Why 2 x 1 and 1 x 2 match different nonzeros")."""
    from tensorflow_ooc.decompositions.cp.cp_owner import owner_iteration

    shape = (400, 300, 350) if nmodes == 3 else (90, 80, 70, 6)
    coords = np.unique(np.stack([rng.integers(0, s, 6000) for s in shape], axis=1), axis=0)
    values = rng.random(len(coords)) + 0.5
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=512)
    addresses = list(two_workers.scheduler_info()["workers"])
    engine = OwnerComputes(
        two_workers,
        store.path,
        split_nonzeros(store, 2),
        in_memory=True,
        init=StackedFactors.from_list,
        init_args=([rng.random((s, 4)) for s in shape], "float64"),
        nmodes=nmodes,
        threads={a: 1 for a in addresses},
        batch_nnz=1 << 16,
        max_private_bytes=1 << 26,
    )
    try:
        normX2 = float(store.meta["norm_sq"])
        engine.iterate(owner_iteration, (0, True, normX2, 0.0, None))  # the exact warm-up
        engine.iterate(_start_step, (SPREAD_ROWS if spread_limit is None else spread_limit,))
        ref = [engine.factor(m, shape, 4, "float64") for m in range(nmodes)]
        entropy = int(rng.integers(1 << 30))
        for it in range(1, 4):  # 200 draws a mode hit a few hundred rows of each
            got = engine.iterate(_recording_iteration, (it, False, normX2, 0.0, (200, entropy, False)))
            for g in got[1:]:  # every worker drew the same
                for a, b in zip(g["drawn"], got[0]["drawn"]):
                    for x, y in zip(a[1:], b[1:]):
                        np.testing.assert_array_equal(x, y)
            for mode, S_coords, S_weights, S_rows, S_probs in got[0]["drawn"]:
                A, _ = explicit_krp(ref, mode)
                ks = [k for k in range(nmodes) if k != mode]
                cells = np.ravel_multi_index(tuple(S_coords[:, ks].T), [shape[k] for k in ks])
                # the rows of a mode updated this iteration are the reference solve's, equal to rounding
                np.testing.assert_allclose(S_rows, A[cells], rtol=1e-9, atol=1e-12 * np.abs(A).max())
                np.testing.assert_allclose(S_probs, exact_leverage(A)[cells], rtol=1e-8)
                ref[mode] = _sketched_update_reference(ref, coords, values, mode, S_coords, S_weights, S_rows)
            for m in range(nmodes):
                f = engine.factor(m, shape, 4, "float64")
                np.testing.assert_array_equal(np.flatnonzero(f.any(axis=1)), np.flatnonzero(ref[m].any(axis=1)))
                np.testing.assert_allclose(f, ref[m], rtol=1e-8, atol=1e-10 * np.abs(ref[m]).max())
                ref[m] = f  # the next iteration from the run's own rows (no drift of rounding)
    finally:
        engine.release()
