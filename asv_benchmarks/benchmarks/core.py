"""``discounted_returns`` and ``linear_scan`` on every backend (small shapes).

Same conventions as :mod:`.gae`: seeded inputs, a warm call in ``setup``,
``NotImplementedError`` for a backend that cannot run here, the GPU stream
synchronised inside GPU timings.
"""

from __future__ import annotations

import numpy as np

import gaescan

from .common import BACKENDS, DTYPES, FULL, GAMMA, require

SHAPES = ["256x4096"] + (["256x131072"] if FULL else [])


def _inputs(shape, dtype, backend, seed):
    B, T = (int(x) for x in shape.split("x"))
    rng = np.random.default_rng([seed, B, T])
    a = rng.random((B, T)).astype(dtype)
    b = rng.standard_normal((B, T)).astype(dtype)
    if backend != "cuda":
        return a, b, lambda: None
    import cupy as cp

    return cp.asarray(a), cp.asarray(b), cp.cuda.get_current_stream().synchronize


class DiscountedReturns:
    params = (BACKENDS, DTYPES, SHAPES)
    param_names = ["backend", "dtype", "shape"]

    def setup(self, backend, dtype, shape):
        require(backend)
        _, self.r, self.sync = _inputs(shape, dtype, backend, 1)
        self.time_discounted_returns(backend, dtype, shape)

    def time_discounted_returns(self, backend, dtype, shape):
        gaescan.discounted_returns(self.r, gamma=GAMMA, backend=backend)
        self.sync()


class LinearScan:
    params = (BACKENDS, DTYPES, [False, True])
    param_names = ["backend", "dtype", "reverse"]

    def setup(self, backend, dtype, reverse):
        require(backend)
        self.a, self.b, self.sync = _inputs("256x4096", dtype, backend, 2)
        self.time_linear_scan(backend, dtype, reverse)

    def time_linear_scan(self, backend, dtype, reverse):
        gaescan.linear_scan(self.a, self.b, reverse=reverse, backend=backend)
        self.sync()
