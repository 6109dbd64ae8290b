"""Subnormals flushed to zero (x86-64 MXCSR FTZ/DAZ) on one thread for a block: inside, numba
kernels' subnormal products are 0 and subnormal inputs read as 0; outside and on other threads,
IEEE gradual underflow as before; the register is restored on leaving, also after an error."""

from __future__ import annotations

import threading

import numba as nb
import numpy as np
import pytest

from tensorflow_ooc.kernels.subnormals import FLUSHES, subnormals_flushed

pytestmark = pytest.mark.skipif(not FLUSHES, reason="MXCSR exists on x86-64 only")

TINY = np.finfo(np.float64).tiny


@nb.njit(nogil=True)
def _products(a, b, out):
    for i in range(a.shape[0]):
        out[i] = a[i] * b[i]


def products(a, b):
    out = np.empty_like(a)
    _products(a, b, out)
    return out


def test_flushed_on_this_thread_only_and_restored(rng):
    # pairs whose product is subnormal, and subnormal inputs times a normal number
    a = 10.0 ** rng.uniform(-170, -150, 64)
    b = 10.0 ** (rng.uniform(-320, -310, 64) - np.log10(a))
    sub = rng.uniform(0.1, 1.0, 64) * TINY * 1e-3
    under = products(a, b)
    assert np.all((under > 0) & (under < TINY))
    seen, go = {}, threading.Event()

    def other_thread():
        go.wait()
        seen["other"] = products(a, b)

    # started before the block (a thread started inside inherits the register, as a pool's
    # threads would if first started there)
    t = threading.Thread(target=other_thread)
    t.start()
    with subnormals_flushed():
        go.set()
        t.join()
        assert np.all(products(a, b) == 0.0)
        assert np.all(products(sub, np.full(64, 1e300)) == 0.0)  # read as 0, not 1e-12
        normal = products(a, 1 / a)
        np.testing.assert_array_equal(normal, a * (1 / a))
    np.testing.assert_array_equal(seen["other"], under)
    np.testing.assert_array_equal(products(a, b), under)
    with pytest.raises(RuntimeError):
        with subnormals_flushed():
            raise RuntimeError("left early")
    np.testing.assert_array_equal(products(a, b), under)
    np.testing.assert_array_equal(products(sub, np.full(64, 1e300)), sub * 1e300)
