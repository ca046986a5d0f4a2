"""Core benchmarks: every public function on every host backend.

Inputs are seeded and built once per parameter set (``setup``); the first call
in ``setup`` compiles the kernels so that timings never include the JIT.
"""

import numpy as np

import gaescan


class GAE:
    params = (["numba", "numpy"], ["float32", "float64"], [(256, 4096), (8, 1024)], ["none", "dones", "mask"])
    param_names = ["backend", "dtype", "shape", "flags"]

    def setup(self, backend, dtype, shape, flags):
        rng = np.random.default_rng(0)
        self.r = rng.standard_normal(shape).astype(dtype)
        self.v = rng.standard_normal(shape).astype(dtype)
        self.kw = {"gamma": 0.99, "lam": 0.95, "backend": backend}
        if flags == "dones":
            self.kw["dones"] = rng.random(shape) < 1e-3
        elif flags == "mask":
            self.kw["mask"] = rng.random(shape) < 0.8
        gaescan.gae(self.r, self.v, **self.kw)

    def time_gae(self, backend, dtype, shape, flags):
        gaescan.gae(self.r, self.v, **self.kw)

    def peakmem_gae(self, backend, dtype, shape, flags):
        gaescan.gae(self.r, self.v, **self.kw)


class DiscountedReturns:
    params = (["numba", "numpy"], [(256, 4096)])
    param_names = ["backend", "shape"]

    def setup(self, backend, shape):
        self.r = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        gaescan.discounted_returns(self.r, gamma=0.99, backend=backend)

    def time_discounted_returns(self, backend, shape):
        gaescan.discounted_returns(self.r, gamma=0.99, backend=backend)


class LinearScan:
    params = (["numba", "numpy"], [False, True])
    param_names = ["backend", "reverse"]

    def setup(self, backend, reverse):
        rng = np.random.default_rng(0)
        self.a = rng.random((256, 4096)).astype(np.float32)
        self.b = rng.standard_normal((256, 4096)).astype(np.float32)
        gaescan.linear_scan(self.a, self.b, reverse=reverse, backend=backend)

    def time_linear_scan(self, backend, reverse):
        gaescan.linear_scan(self.a, self.b, reverse=reverse, backend=backend)
