"""GPU execution: the stream schedule, out-of-memory streaming, CP-ALS on GPU workers.

Without a GPU the device code runs in numba's CUDA simulator (tiny inputs)."""

import numpy as np
import pytest
from conftest import random_coo
from test_mttkrp import dense_mttkrp, rel_err

import tensorflow_ooc as tfo
from tensorflow_ooc.execution import DeviceOptions, StreamSchedule
from tensorflow_ooc.kernels.gpu.device import gpu_unavailable

needs_gpu = pytest.mark.skipif(bool(gpu_unavailable()), reason=f"GPU kernels cannot run: {gpu_unavailable()}")
SMALL = dict(warps=1, coarsen=2, decode_threads=32, copies=2)


@pytest.mark.parametrize("nbatches,streams", [(1, 8), (3, 8), (8, 8), (9, 2), (20, 3)])
def test_schedule_never_reuses_a_buffer_early(nbatches, streams):
    sched = StreamSchedule(nbatches, streams)
    sched.check()
    assert sched.streams == min(streams, nbatches)
    computed = [st.batch for st in sched.steps if st.kind == "compute"]
    assert computed == list(range(nbatches))
    for st in sched.steps:
        assert st.slot == st.batch % sched.streams
    waits = [st for st in sched.steps if st.kind == "wait"]
    assert len(waits) == max(0, nbatches - sched.streams)


def test_schedule_check_catches_an_early_reuse():
    sched = StreamSchedule(5, 2)
    sched.steps = [st for st in sched.steps if not (st.kind == "wait" and st.batch == 1)]
    with pytest.raises(AssertionError, match="buffer 1 reused by batch 3 before batch 1"):
        sched.check()


def _small_limit(store, rank, rows, chunks_per_stream, streams, copies):
    """A device memory limit that holds the factors, the output and its copies, and
    ``chunks_per_stream`` chunks in each of ``streams`` buffer sets, nothing more."""
    fixed = (sum(store.shape) + rows * (1 + copies)) * rank * 8
    return fixed + streams * chunks_per_stream * store.chunk_nnz * (8 + 8)


@needs_gpu
@pytest.mark.parametrize("nmodes", [3, 4])
def test_streaming_with_more_batches_than_buffers_equals_resident(rng, tmp_path, nmodes):
    from tensorflow_ooc.execution import mttkrp_gpu

    shape = tuple(int(s) for s in rng.integers(6, 30, nmodes))  # at least 216 cells: 150 nonzeros fit
    coords, values = random_coo(rng, shape, 150)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=32)
    t = tfo.encode_coo(coords, values, shape)
    assert store.nnz == 150 and store.nchunks == 5
    R = 3
    factors = [rng.standard_normal((s, R)) for s in shape]
    for mode in range(nmodes):
        limit = _small_limit(store, R, shape[mode], 1, 2, SMALL["copies"])
        stats = {}
        streamed = mttkrp_gpu(store, factors, mode, DeviceOptions(**SMALL, streams=2, device_memory_limit=limit), stats)
        assert stats["batches"] == 5 and stats["streams"] == 2 and stats["batches"] > stats["streams"]
        resident = mttkrp_gpu(t, factors, mode, DeviceOptions(**SMALL))
        assert rel_err(streamed, resident) < 1e-12
        assert rel_err(streamed, dense_mttkrp(shape, coords, values, factors, mode)) < 1e-12


@needs_gpu
def test_device_memory_limit_too_small_names_the_numbers(rng, tmp_path):
    from tensorflow_ooc.execution import mttkrp_gpu

    shape = (20, 30, 40)
    coords, values = random_coo(rng, shape, 100)
    store = tfo.convert((coords, values), tmp_path / "s.zarr", shape=shape, chunk_nnz=64)
    factors = [rng.standard_normal((s, 4)) for s in shape]
    with pytest.raises(MemoryError, match="device memory limit .* one chunk needs"):
        mttkrp_gpu(store, factors, 0, DeviceOptions(**SMALL, device_memory_limit=4096))


@needs_gpu
def test_cp_als_on_gpu_matches_cpu(rng, tmp_path):
    shape = (9, 11, 7)
    coords, values = random_coo(rng, shape, 80)
    store = tfo.convert((coords, values), tmp_path / "cp.zarr", shape=shape, chunk_nnz=64)
    init = [rng.random((s, 3)) for s in shape]
    cpu = tfo.cp_als(store, 3, init=init, max_iters=5, tol=0, device="cpu")
    gpu = tfo.cp_als(
        store,
        3,
        init=init,
        max_iters=5,
        tol=0,
        device="gpu",
        execution="in-memory",
        device_options=DeviceOptions(**SMALL),
    )
    assert gpu.params["device"] == "gpu" and cpu.params["device"] == "cpu"
    assert gpu.iterations == cpu.iterations == 5
    assert abs(gpu.fit - cpu.fit) < 1e-10
    np.testing.assert_allclose(gpu.weights, cpu.weights, rtol=1e-10)
    for a, b in zip(gpu.factors, cpu.factors):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@needs_gpu
@pytest.mark.parametrize("execution", ["in-memory", "streaming"])
def test_owner_computes_on_two_gpu_workers_matches_cpu(rng, tmp_path, execution):
    """One worker per GPU, owner-computes: each GPU runs its chunks' MTTKRP, the rows go worker
    to worker; the result is the CPU's."""
    from distributed import Client, LocalCluster

    shape = (9, 11, 7)
    coords, values = random_coo(rng, shape, 120)
    store = tfo.convert((coords, values), tmp_path / "cp.zarr", shape=shape, chunk_nnz=32)
    init = [rng.random((s, 3)) for s in shape]
    cpu = tfo.cp_als(store, 3, init=init, max_iters=3, tol=0, device="cpu")
    # worker processes: the CUDA simulator cannot run kernels from two threads of one process
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        gpu = tfo.cp_als(
            store,
            3,
            init=init,
            max_iters=3,
            tol=0,
            client=client,
            device="gpu",
            execution=execution,
            device_options=DeviceOptions(**SMALL),
        )
    assert gpu.params["device"] == "gpu" and gpu.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    assert gpu.history[-1]["bytes_sent"] >= gpu.history[-1]["bytes_lower_bound"] > 0
    assert abs(gpu.fit - cpu.fit) < 1e-10
    for a, b in zip(gpu.factors, cpu.factors):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_device_auto_without_physical_gpu_runs_on_cpu(tmp_path, rng):
    shape = (6, 7, 8)
    coords, values = random_coo(rng, shape, 60)
    store = tfo.convert((coords, values), tmp_path / "a.zarr", shape=shape)
    r = tfo.cp_als(store, 2, seed=0, max_iters=2, device="auto")
    assert r.params["device"] == "cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        tfo.cp_als(store, 2, max_iters=1, device="tpu")


@pytest.mark.skipif(not gpu_unavailable(), reason="GPU kernels can run here")
def test_device_gpu_without_numba_cuda_says_why(tmp_path, rng):
    shape = (6, 7, 8)
    store = tfo.convert(random_coo(rng, shape, 60), tmp_path / "g.zarr", shape=shape)
    with pytest.raises(RuntimeError, match="no Dask worker can run GPU kernels"):
        tfo.cp_als(store, 2, max_iters=1, device="gpu")


@pytest.mark.parametrize("first_iteration", [True, False])
@pytest.mark.parametrize("deficient", [False, True])
def test_update_on_the_array_api_path_equals_the_numpy_fast_path(rng, monkeypatch, first_iteration, deficient):
    """The device (CuPy) update runs the array-API branch of ``update_mode``; here it runs with
    NumPy's array-API namespace and must equal the LAPACK fast path, Cholesky or pseudo-inverse."""
    from tensorflow_ooc.decompositions.cp import updates as U
    from tensorflow_ooc.execution.partials import Partial
    from tensorflow_ooc.kernels import StackedFactors

    shape, R = (7, 9, 5), 4
    state = U.CPState.of(StackedFactors.from_list([rng.random((s, R)) for s in shape]))
    if deficient:  # a zero column: V has a zero pivot, every Cholesky fails, the pseudo-inverse is used
        for v in state.views:
            v[:, 1] = 0
        state.grams = [v.T @ v for v in state.views]
    parts = [Partial(0, rng.standard_normal((4, R))), Partial(3, rng.standard_normal((6, R)))]
    fast = U.update_mode(state, parts, 1, first_iteration, True)
    monkeypatch.setattr(U, "is_numpy_array", lambda x: False)
    generic = U.update_mode(state, parts, 1, first_iteration, True)
    np.testing.assert_allclose(generic.data, fast.data, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(generic.weights, fast.weights, rtol=1e-9)
    np.testing.assert_allclose(generic.inner, fast.inner, rtol=1e-9, atol=1e-12)
    for g, h in zip(generic.grams, fast.grams):
        np.testing.assert_allclose(g, h, rtol=1e-9, atol=1e-12)
