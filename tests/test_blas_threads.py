"""The mode updates' BLAS guard (:mod:`tensorflow_ooc.kernels.update.blas_threads`). In a module of
its own: in a process that also hosts an in-process Dask worker (the ``client`` fixture of other
modules), OpenBLAS kept reporting 2 threads after being set to 1, threadpoolctl's own limiter alike."""

import pytest
from threadpoolctl import ThreadpoolController, threadpool_limits

from tensorflow_ooc.kernels.update.blas_threads import one_blas_thread


def _counts():
    return [lib["num_threads"] for lib in ThreadpoolController().select(user_api="blas").info()]


def test_one_blas_thread_sets_and_restores():
    """One thread inside the block, each library's own count after it (also when the block raises),
    as threadpoolctl reads them; a library loaded after the first use (SciPy's) is held too."""
    with one_blas_thread():
        pass
    import scipy.linalg  # noqa: F401  (its OpenBLAS, where SciPy has its own)

    with threadpool_limits(limits=2, user_api="blas"):
        before = _counts()
        if not before or any(n != 2 for n in before):
            pytest.skip(f"BLAS does not take 2 threads here: {before}")
        with one_blas_thread():
            assert all(n == 1 for n in _counts())
        assert _counts() == before
        with pytest.raises(RuntimeError):
            with one_blas_thread():
                raise RuntimeError("inside")
        assert _counts() == before
