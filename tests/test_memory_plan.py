"""Worker memory plan: the execution chosen fits the worker's limit, in-place updates equal copying
ones, below the floor CP-ALS refuses with the smallest limit that works (CLI exit 2), and a real
worker run just above the floor stays under its limit."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
import psutil
import pytest
from conftest import random_coo
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc import cli
from tensorflow_ooc.decompositions.cp import updates as U
from tensorflow_ooc.execution.memory_plan import MemoryPlanError, candidates, choose, plan_order
from tensorflow_ooc.execution.partials import Partial

AMAZON = (4_821_207, 1_774_269, 1_805_187)


def _plans(limit, **kw):
    args = dict(
        shape=AMAZON,
        rank=16,
        itemsize=8,
        worker_nnz=86_000_000,
        chunk_nnz=1 << 20,
        tasks=1,
        partitions_per_mode=1,
        workers=1,
        baseline=200 << 20,
        limit=limit,
    )
    args.update(kw)
    return candidates(**args)


def test_plan_order_and_choice():
    plans = _plans(None)
    kinds = list(dict.fromkeys((p.execution, p.in_place, p.mode_copies) for p in plans))
    assert kinds[:6] == [
        ("in-memory", False, True),
        ("in-memory", False, False),
        ("in-memory", True, True),
        ("in-memory", True, False),
        ("streaming", False, False),
        ("streaming", True, False),
    ]
    # mode-sorted copies: one more copy of the nonzeros (index + value) per mode, and its run
    # table (at most 1/64 run a nonzero, 24 bytes each), in memory only
    assert plans[0].terms["mode_copies"] == int(86_000_000 * (16 + 24 / 64) * len(AMAZON))
    assert all(not p.mode_copies for p in _plans(None, samples=1 << 16))  # randomized CP: none
    assert choose(plans) is plans[0]  # no limit: the fastest
    peaks = [p.peak for p in plans]
    assert peaks[-1] == min(peaks)  # the last is the leanest
    for limit in (4 << 30, 8 << 30, 16 << 30):
        p = choose(_plans(limit))
        assert p.peak <= p.usable_fraction * limit
        faster = _plans(limit)[: _plans(limit).index(p)] if p in _plans(limit) else []
        assert all(not q.fits for q in faster)
    # factors of an Amazon-shaped rank-16 model are ~1 GiB: the 4 GB run must be in place
    p4 = choose(_plans(4 * 10**9))
    assert p4.in_place and p4.terms["factors"] == sum(AMAZON) * 16 * 8


def test_more_tasks_and_workers_need_more():
    one = _plans(None)[-1]
    two = _plans(None, tasks=2, partitions_per_mode=2, workers=2)[-1]
    # two partials of its own, and the sum of its slice of the reduce-scatter (half an output)
    assert two.terms["outputs"] == 2 * one.terms["outputs"] + -(-one.terms["outputs"] // 2)
    assert two.terms["reduction"] == one.terms["outputs"] and two.terms["transfer"] == two.terms["factors"]
    tree = _plans(None, tasks=1, partitions_per_mode=8, workers=1)[-1]  # one worker: a tree of 4
    assert tree.terms["outputs"] == 4 * one.terms["outputs"] and tree.terms["reduction"] == one.terms["outputs"]


@pytest.mark.parametrize("samples", [0, 1 << 16])
def test_two_threads_run_one_task_at_a_time_where_a_task_per_thread_does_not_fit(samples):
    """A 4 GB worker of 2 Dask threads on 2 cores, Amazon-shaped at 500 M nonzeros, rank 16: a
    task per thread holds two 589 MiB outputs and their sum, over the limit; one task at a time on
    both cores (single_task) holds one, as a worker of one Dask thread does, and is chosen."""
    common = dict(worker_nnz=500_000_000, execution="streaming", samples=samples, limit=4 * 10**9)
    per_thread = _plans(tasks=2, partitions_per_mode=2, kernel_threads=1, **common)
    single = _plans(tasks=1, partitions_per_mode=1, kernel_threads=2, lend_target=True, single_task=True, **common)
    one_thread = _plans(tasks=1, partitions_per_mode=1, kernel_threads=2, lend_target=True, **common)
    out = max(AMAZON) * 16 * 8
    assert all(p.terms["outputs"] == 2 * out and p.terms["reduction"] == out for p in per_thread)
    assert all(p.terms["outputs"] == out and not p.terms["reduction"] for p in single)
    assert not any(p.fits for p in per_thread)
    with pytest.raises(MemoryPlanError) as err:
        choose(per_thread)
    assert err.value.required_limit > 4 * 10**9
    plans = sorted(per_thread + single, key=plan_order)
    chosen = choose(plans)
    assert chosen.single_task and chosen.kernel_threads == 2 and "one task at a time on 2 kernel threads" in chosen.name
    # the same plan, and peak, as a worker of one Dask thread with both cores
    alone = choose(one_thread)
    assert (chosen.in_place, chosen.batch_nnz, chosen.max_private_bytes) == (
        alone.in_place,
        alone.batch_nnz,
        alone.max_private_bytes,
    )
    assert chosen.peak == alone.peak <= chosen.usable_fraction * 4 * 10**9
    # fastest first: within an execution a task per thread before one task; the lean plans last
    keys = [(p.execution, p.in_place) for p in plans]
    assert keys == sorted(keys, key=lambda k: (k[0] == "streaming", k[1]))
    lean = [p for p in plans if ", lean" in p.name]
    assert plans[-len(lean) :] == lean and [p.single_task for p in lean] == [False, True]
    for kind in set(keys):
        flags = [p.single_task for p in plans if (p.execution, p.in_place) == kind and ", lean" not in p.name]
        assert flags == sorted(flags) and flags[0] is False and flags[-1] is True


def test_below_the_floor_names_the_figures():
    with pytest.raises(MemoryPlanError) as err:
        choose(_plans(1 * 10**9), "a rank-16 CP-ALS of x.zarr")
    e = err.value
    msg = str(e)
    assert "x.zarr" in msg and "factors 1," in msg and "needs a worker memory limit of at least" in msg
    assert e.required_limit > 10**9
    assert choose(_plans(e.required_limit + (1 << 20))).peak <= e.required_limit


def _state(rng, shape, R):
    s = U.random_factors(shape, R, int(rng.integers(1 << 30)), "float64")
    return s


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("split", ["whole", "offset", "several", "slices"])
def test_in_place_update_equals_copying(rng, first, split):
    shape, R = (70, 90, 50, 40), int(rng.integers(2, 9))
    for mode in range(len(shape)):
        base = _state(rng, shape, R)
        I = shape[mode]
        M = rng.standard_normal((I, R)) * 5
        if split == "whole":
            parts = [Partial(0, M.copy(), 0.0)]
        elif split == "offset":  # one partial covering rows 7..I-4 (the rest of M is zero)
            M[:7] = 0
            M[I - 3 :] = 0
            parts = [Partial(7, M[7 : I - 3].copy(), 0.0)]
        elif split == "slices":  # a reduce-scatter's disjoint slices, out of order, one empty, a gap
            M[12:15] = 0
            parts = [Partial(15, M[15:].copy(), 0.0), Partial(5, M[5:5], 0.0), Partial(0, M[:12].copy(), 0.0)]
        else:
            parts = [Partial(0, M[:30].copy(), 0.0), Partial(20, M[20:].copy(), 0.0)]
            M = M.copy()
            M[20:30] += M[20:30]
        copy_in = U.CPState(shape, R, np.float64, base.data.copy())
        a = U.update_mode(copy_in, parts, mode, first, mode == len(shape) - 1, in_place=False)
        b_in = U.CPState(shape, R, np.float64, base.data.copy())
        b = U.update_mode(b_in, parts, mode, first, mode == len(shape) - 1, in_place=True)
        assert b.data is b_in.data  # no second copy of the factors
        np.testing.assert_allclose(b.data, a.data, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b.weights, a.weights, rtol=1e-10)
        np.testing.assert_allclose(b.grams[mode], a.grams[mode], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b.inner, a.inner, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(copy_in.data, base.data)  # the copying update left its input alone


def _long_mode_store(tmp_path, rng, **kw):
    """A tensor whose factors dominate memory: modes of 1.2 M, 300 k and 200 k rows, 20 k nonzeros."""
    shape = (1_200_000, 300_000, 200_000)
    nnz = 20_000
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    coords = np.unique(coords, axis=0)
    return tfo.convert((coords, rng.random(len(coords)) + 0.5), tmp_path / "long.zarr", shape=shape, **kw)


@contextlib.contextmanager
def _one_process_worker(threads: int, limit):
    """A cluster of one process worker of ``threads`` Dask threads under memory ``limit``, and its client."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=threads, processes=True, memory_limit=limit, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def _run_watched(cluster, client, fn):
    pid = next(iter(client.run(os.getpid).values()))
    peak = [0]
    stop = threading.Event()

    def watch():
        p = psutil.Process(pid)
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], p.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        return fn(), peak[0]
    finally:
        stop.set()
        t.join()


def test_worker_just_above_the_floor_stays_under_its_limit(tmp_path, rng):
    store = _long_mode_store(tmp_path, rng)
    reference = tfo.cp_als(store, 16, seed=3, max_iters=2, tol=0, scheduler="inline")
    # in one process nothing recomputes earlier states: the unconstrained reference updates in place too
    assert reference.params["in_place_updates"]
    # probe the floor on a worker with an unreachable limit, then start one just above it
    with _one_process_worker(1, "400MB") as (cluster, client):
        with pytest.raises(MemoryPlanError) as err:
            tfo.cp_als(store, 16, client=client, seed=3, max_iters=2, tol=0)
    floor = err.value.required_limit
    limit = int(floor * 1.03)
    with _one_process_worker(1, limit) as (cluster, client):
        result, peak = _run_watched(
            cluster, client, lambda: tfo.cp_als(store, 16, client=client, seed=3, max_iters=2, tol=0)
        )
        restarts = len(cluster.scheduler.workers)
    print(
        f"floor {floor >> 20} MiB, limit {limit >> 20} MiB, plan {result.params['memory_plan']['peak'] >> 20} MiB, "
        f"peak worker RSS {peak >> 20} MiB"
    )
    assert result.params["in_place_updates"]
    assert restarts == 1
    assert 0 < peak < limit, f"peak worker RSS {peak >> 20} MiB over its limit {limit >> 20} MiB"
    assert result.fit == pytest.approx(reference.fit, rel=1e-9, abs=1e-12)
    for a, b in zip(result.factors, reference.factors):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_two_thread_worker_runs_one_task_at_a_time_under_a_limit_a_task_per_thread_exceeds(tmp_path, rng):
    """A worker of 2 Dask threads whose limit fits one output of the 1.2 M-row mode but not a task
    per thread (two outputs and their sum): CP-ALS runs one partition task at a time on all the
    worker's cores, its peak RSS under the limit, with the result of a run in one process."""
    store = _long_mode_store(tmp_path, rng, chunk_nnz=4096)  # chunks for a partition a thread
    seed = int(rng.integers(2**31))
    reference = tfo.cp_als(store, 16, seed=seed, max_iters=2, tol=0, scheduler="inline")
    floors = {}
    with _one_process_worker(2, "400MB") as (cluster, client):
        for asked in (None, 2):  # the planner's choice, and a task per thread (partitions fixed)
            with pytest.raises(MemoryPlanError) as err:
                tfo.cp_als(store, 16, client=client, seed=seed, max_iters=2, tol=0, partitions=asked)
            floors[asked] = err.value
    assert floors[None].plan.single_task and not floors[2].plan.single_task
    limit = int(floors[None].required_limit * 1.03)
    assert limit < floors[2].required_limit
    with _one_process_worker(2, limit) as (cluster, client):
        result, peak = _run_watched(
            cluster, client, lambda: tfo.cp_als(store, 16, client=client, seed=seed, max_iters=2, tol=0)
        )
        restarts = len(cluster.scheduler.workers)
    plan = result.params["memory_plan"]
    print(
        f"floors {floors[None].required_limit >> 20} / {floors[2].required_limit >> 20} MiB, limit {limit >> 20} MiB, "
        f"plan {plan['name']}: {plan['peak'] >> 20} MiB, peak worker RSS {peak >> 20} MiB"
    )
    assert plan["single_task"] and plan["kernel_threads"] >= 2
    assert restarts == 1
    assert 0 < peak < limit, f"peak worker RSS {peak >> 20} MiB over its limit {limit >> 20} MiB"
    assert result.fit == pytest.approx(reference.fit, rel=1e-9, abs=1e-12)
    for a, b in zip(result.factors, reference.factors):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_cli_below_the_floor_exits_2(tmp_path, rng, capsys):
    store = _long_mode_store(tmp_path, rng)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, memory_limit="400MB", dashboard_address=None
    ) as cluster:
        code = cli.main(
            [
                "cpd",
                str(store.path),
                "--rank",
                "16",
                "--max-iters",
                "1",
                "--scheduler",
                cluster.scheduler_address,
                "--out",
                str(tmp_path / "r.zarr"),
            ]
        )
    assert code == 2
    err = capsys.readouterr().err
    assert "needs a worker memory limit of at least" in err
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.parametrize("streamed", [False, True])
def test_lent_target_rows_serve_as_a_thread_copy(tmp_path, rng, monkeypatch, streamed):
    """In-place CP-ALS on one-task workers lends the target mode's factor rows to the MTTKRP as
    the second thread's output copy: the plan counts no copy for it, and a mode update (MTTKRP,
    then the in-place update) with the rows lent equals one without, every mode."""
    import importlib

    from tensorflow_ooc.execution.graph import _mttkrp_then
    from tensorflow_ooc.execution.partitions import plan_partitions
    from tensorflow_ooc.execution.tasks import load_partition
    from tensorflow_ooc.kernels.mttkrp.plan import DEFAULT_MAX_PRIVATE_BYTES

    K = importlib.import_module("tensorflow_ooc.kernels.mttkrp.dispatch")  # the module, not tfo.mttkrp
    plans = _plans(None, kernel_threads=2, lend_target=True)
    assert all(p.max_private_bytes <= DEFAULT_MAX_PRIVATE_BYTES for p in plans if p.in_place)
    assert any(p.max_private_bytes > DEFAULT_MAX_PRIVATE_BYTES for p in plans if not p.in_place)
    monkeypatch.setattr(K, "THREAD_OUTPUT_MIN_ROWS", 1)
    monkeypatch.setattr(K, "THREAD_OUTPUT_NNZ_PER_ROW", 0.0)
    lent = []
    real = K.ThreadOutputs.buffers
    monkeypatch.setattr(K.ThreadOutputs, "buffers", lambda self: lent.append(self.scratch is not None) or real(self))
    shape = (40, 30, 20)
    coords, values = random_coo(rng, shape, 3000)
    store = tfo.convert((coords, values), tmp_path / "t.zarr", shape=shape, chunk_nnz=512)
    part = plan_partitions(store, 1)[0]
    source = (store.path, part) if streamed else load_partition(store.path, part)
    state = U.random_factors(shape, 8, 5, "float64")
    for mode in range(3):
        a = U.CPState(shape, 8, np.float64, state.data.copy(), grams=list(state.grams))
        b = U.CPState(shape, 8, np.float64, state.data.copy(), grams=list(state.grams))
        args = (mode == 0, mode == 2, True)
        new_a = _mttkrp_then(
            U.update_mode, source, a, mode, 2, 1024, "cpu", None, DEFAULT_MAX_PRIVATE_BYTES, args, False
        )
        new_b = _mttkrp_then(
            U.update_mode, source, b, mode, 2, 1024, "cpu", None, DEFAULT_MAX_PRIVATE_BYTES, args, True
        )
        np.testing.assert_allclose(new_b.data, new_a.data, rtol=1e-12, atol=1e-14)
        state = new_a
    assert True in lent and False in lent  # both paths ran (buffers() is asked once a batch)


@pytest.mark.parametrize("nmodes", [3, 4])
def test_partials_are_reduce_scattered_over_workers(tmp_path, rng, nmodes):
    """With several workers each one sums one row slice of every partition's partial: the update
    receives disjoint slices (one output's worth), computed on different workers, whose union is
    the MTTKRP (against einsum); CP-ALS through them matches a one-worker run."""
    from distributed import wait
    from test_mttkrp import dense_mttkrp

    from tensorflow_ooc.execution import MTTKRPGraph
    from tensorflow_ooc.kernels import StackedFactors

    shape = tuple(int(s) for s in rng.integers(20, 40, size=nmodes))
    coords, values = random_coo(rng, shape, 6000)
    store = tfo.convert((coords, values), tmp_path / "x.zarr", chunk_nnz=500)
    factors = [rng.random((s, 5)) for s in shape]
    seed = int(rng.integers(2**31))
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as one,
        Client(one) as c1,
    ):
        reference = tfo.cp_als(store, 4, client=c1, seed=seed, max_iters=6, tol=0)
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        graph = MTTKRPGraph(client, store.path, partitions=6, execution="streaming")
        assert graph.scatter_reduce
        F = client.scatter(StackedFactors.from_list(factors), broadcast=True)
        for mode in range(nmodes):
            futures = graph.partials(F, mode)
            assert len(futures) == 3
            wait(futures)
            where = {next(iter(ws)) for ws in client.who_has(futures).values()}
            assert len(where) == 3  # each slice summed on its own worker
            got = client.gather(futures)
            spans = sorted((p.lo, p.lo + p.rows.shape[0]) for p in got)
            assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))  # disjoint
            full = np.zeros((shape[mode], 5))
            for p in got:
                assert p.rows.shape[0] < shape[mode]
                full[p.lo : p.lo + p.rows.shape[0]] += p.rows
            ref = dense_mttkrp(shape, coords, values, factors, mode)
            assert np.abs(full - ref).max() <= 1e-12 * np.abs(ref).max()
        graph.release()
        spread = tfo.cp_als(store, 4, client=client, seed=seed, max_iters=6, tol=0, partitions=6)
    assert abs(spread.fit - reference.fit) < 1e-9
    for a, b in zip(spread.factors, reference.factors):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


def test_owner_computes_plan_has_no_state_copies_or_factors_in_transit():
    # 2 workers of 11 GB and 2 threads, STS-CP at 86 M: the task graphs' plan streams the whole
    # store each mode (a state copy, whole factors in transit); owner-computes keeps each worker's
    # half in memory (the graphs' in-memory plan needs 11.5 GB, its fiber indexes 20 bytes a
    # nonzero and mode; owner-computes' 10.3 GB)
    kw = dict(
        worker_nnz=43_000_000, workers=2, partitions_per_mode=2, samples=1 << 16, limit=11_000 << 20, kernel_threads=2
    )
    graph = choose(_plans(**kw))
    owner = choose(_plans(owner=True, **kw))
    assert graph.execution == "streaming" and owner.execution == "in-memory"
    plans = _plans(owner=True, **kw)
    assert all(p.in_place and p.terms["state_copy"] == 0 and p.terms["transfer"] == 0 for p in plans)
    half = -(-AMAZON[0] // 2) * 16 * 8  # rows shared with the other worker: a 1/W share by default
    assert owner.terms["reduction"] == half and owner.terms["update"] == half
    assert owner.terms["outputs"] == AMAZON[0] * 16 * 8


def test_randomized_plans_count_the_sampler_they_use_and_the_index_reads():
    from tensorflow_ooc.kernels.sampling.krp_sampler import tree_nbytes

    trees = sum(tree_nbytes(n, 16) for n in AMAZON)
    sts = {(p.execution, p.in_place, p.batch_nnz): p for p in _plans(None, samples=65536, execution="streaming")}
    arls = {
        (p.execution, p.in_place, p.batch_nnz): p
        for p in _plans(None, samples=65536, execution="streaming", trees=False)
    }
    for key, p in sts.items():
        # CP-ARLS-LEV keeps no segment trees: the plan that refused it at 6 GB counted them
        assert p.terms["sampling"] - arls[key].terms["sampling"] == trees
    # fiber-index reads are never live with an exact pass's buffers: only what exceeds them counts
    for key, p in sts.items():
        buffers = p.terms["data"] + p.terms["private"] + p.terms["buckets"]
        small = _plans(None, samples=65536, execution="streaming", index_reads=buffers // 2)
        big = _plans(None, samples=65536, execution="streaming", index_reads=buffers + 12345)
        s = {(q.execution, q.in_place, q.batch_nnz): q for q in small}[key]
        b = {(q.execution, q.in_place, q.batch_nnz): q for q in big}[key]
        assert s.terms["sampling"] == p.terms["sampling"]
        assert b.terms["sampling"] == p.terms["sampling"] + 12345
        # the Bloom filters a worker keeps once read (500 MB a mode at 500 M fibers took a 4 GB
        # worker past its limit when they were not counted): one task, nothing frees room for them
        f = _plans(None, samples=65536, execution="streaming", index_reads=buffers // 2, index_filters=1 << 29)
        got = {(q.execution, q.in_place, q.batch_nnz): q for q in f}[key].terms["sampling"]
        assert got == p.terms["sampling"] + (1 << 29)
    # two tasks: the filters are live only in sampled rounds, whose exact pass is the last mode's,
    # so the warm-up's second output of the longest mode makes room for them
    two = {
        (q.execution, q.in_place, q.batch_nnz): q
        for q in _plans(None, samples=65536, tasks=2, execution="streaming", index_reads=1)
    }
    for key, p in two.items():

        def with_filters(nbytes, key=key):
            f = _plans(None, samples=65536, tasks=2, execution="streaming", index_reads=1, index_filters=nbytes)
            return {(q.execution, q.in_place, q.batch_nnz): q for q in f}[key].terms["sampling"]

        longest, last = AMAZON[0] * 16 * 8, AMAZON[2] * 16 * 8
        room = p.terms["outputs"] + p.terms["reduction"] - max(2 * last, longest * 5 // 4)
        assert room > 0
        assert with_filters(room // 2) == p.terms["sampling"]
        assert with_filters(10 << 30) == p.terms["sampling"] + (10 << 30) - room


def test_in_memory_fiber_indexes_are_counted_as_built():
    """An in-memory randomized plan counts each mode's fiber index at the widths it is built with:
    32-bit keys and rows where they fit (nell2-shaped: 16 bytes a nonzero and mode, not 24)."""
    from tensorflow_ooc.kernels.sampling.fiber_gather import FENCE

    draws = 2 * (1 << 14) * (3 + 16 + 1) * 8  # two sample sets: multi-indices, rows, weights
    nell2, nnz = (12092, 9184, 28818), 76_583_893
    plans = _plans(None, shape=nell2, worker_nnz=nnz, samples=1 << 14, trees=False, execution="in-memory")
    assert plans and all(p.terms["sampling"] == draws + 3 * (nnz * 16 + -(-nnz // FENCE) * 4) for p in plans)
    # keys past 32 bits (Amazon-shaped: the other modes of every mode hold 3e12 or more cells): 20 bytes
    plans = _plans(None, worker_nnz=1000, samples=1 << 14, trees=False, execution="in-memory")
    assert plans and all(p.terms["sampling"] == draws + 3 * (1000 * 20 + -(-1000 // FENCE) * 8) for p in plans)


def test_memoized_mode_pairs_are_counted_and_tried_first_where_a_sweep_is_one_task():
    from tensorflow_ooc.kernels.mttkrp.mode_pairs import pair_bytes

    shape, nnz, R = (3000, 2000, 900, 40), 50_000_000, 64
    plans = _plans(None, shape=shape, worker_nnz=nnz, rank=R, memo_pairs=True)
    kinds = list(dict.fromkeys((p.execution, p.in_place, p.mode_copies, p.mode_pairs) for p in plans))
    assert kinds[:3] == [
        ("in-memory", False, True, True),
        ("in-memory", False, True, False),
        ("in-memory", False, False, False),
    ]
    # two pairs at order 4, each beyond the two mode-sorted copies it replaces, and the wrap
    # pair's copy of the factor rows its memo was made from
    copy = int(nnz * (16 + 24 / 64))
    extra = 2 * (pair_bytes(nnz, 4, R, 8) - 2 * copy) + sum(shape) * R * 8
    assert extra > 0 and plans[0].terms["mode_pairs"] == extra
    assert plans[0].terms["mode_copies"] == plans[1].terms["mode_copies"] and plans[1].terms["mode_pairs"] == 0
    assert "memoized mode pairs" in plans[0].name and plans[0].as_dict()["mode_pairs"]
    # a limit the pairs' peak exceeds but the copies' fits takes the copies
    limit = int((plans[0].peak + plans[1].peak) / 2 / plans[1].usable_fraction)
    got = choose(_plans(limit, shape=shape, worker_nnz=nnz, rank=R, memo_pairs=True))
    assert got.mode_copies and not got.mode_pairs and got.execution == "in-memory"
    # not asked, randomized, several partitions a mode (task graphs), or order 6: no pairs
    for kw in (
        dict(memo_pairs=False),
        dict(samples=1 << 16),
        dict(partitions_per_mode=2),
        dict(shape=(40,) * 6),
        dict(owner=True, workers=2, partitions_per_mode=4, samples=1 << 16),
    ):
        args = {**dict(shape=shape, worker_nnz=nnz, rank=R, memo_pairs=True), **kw}
        assert not any(p.mode_pairs for p in _plans(None, **args)), kw


def test_owner_computes_workers_memoize_pairs_over_all_their_partitions():
    from tensorflow_ooc.kernels.mttkrp.mode_pairs import pair_bytes

    # each worker sweeps its partitions in one task an iteration: pairs whatever the partition count
    shape, nnz, R = (3000, 2000, 900), 13_000_000, 64
    kw = dict(shape=shape, worker_nnz=nnz, rank=R, memo_pairs=True, owner=True, workers=2, partitions_per_mode=6)
    plans = _plans(None, **kw)
    first = plans[0]
    assert first.mode_pairs and first.mode_copies and first.in_place and first.execution == "in-memory"
    copy = int(nnz * (16 + 24 / 64))
    assert first.terms["mode_pairs"] == pair_bytes(nnz, 3, R, 8) - 2 * copy + sum(shape) * R * 8 > 0
    (same,) = [p for p in plans[1:] if p.mode_copies and p.max_private_bytes == first.max_private_bytes]
    assert not same.mode_pairs and sum(first.terms.values()) - sum(same.terms.values()) == first.terms["mode_pairs"]
