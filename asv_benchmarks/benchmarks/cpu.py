"""The "numba" CPU backend's targets, each beside a STREAM triad over the same
element count (read the ratio off one run).

Small shapes by default; ``GAESCAN_ASV_FULL=1`` runs the targets' own shapes
(B=256, T=131072 batch-major; T=8192, B=4096 time-major).
"""

from __future__ import annotations

import numpy as np

import gaescan

from .common import FULL

try:
    from numba import njit, prange

    @njit(parallel=True, cache=True)
    def _triad(a, b, c, s):
        for i in prange(a.size):
            a[i] = b[i] + s * c[i]
except ImportError:  # pragma: no cover
    _triad = None


class _Triad:
    def _triad_setup(self, n):
        self._a = np.empty(n, np.float32)
        self._b = np.ones(n, np.float32)
        self._c = np.ones(n, np.float32)
        _triad(self._a, self._b, self._c, np.float32(3.0))

    def time_triad(self, *args):
        _triad(self._a, self._b, self._c, np.float32(3.0))


class GAEBatchMajor(_Triad):
    """Targets 1 and 3: float32 [B, T] (17 bytes/step with dones)."""

    params = [[False, True], ["256x131072"] if FULL else ["64x16384"]]
    param_names = ["dones", "shape"]
    timeout = 300

    def setup(self, dones, shape):
        rng = np.random.default_rng(0)
        B, T = (int(x) for x in shape.split("x"))
        self.r = rng.standard_normal((B, T), dtype=np.float32)
        self.v = rng.standard_normal((B, T), dtype=np.float32)
        self.d = (rng.random((B, T)) < 1e-3) if dones else None
        self.out = (np.empty_like(self.r), np.empty_like(self.r))
        self._triad_setup(B * T)
        self.time_gae(dones, shape)

    def time_gae(self, dones, shape):
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, dones=self.d, out=self.out, backend="numba")


class GAETimeMajor(_Triad):
    """Target 2: float32 [T, B], dones, axis=0."""

    params = [["8192x4096"] if FULL else ["1024x512"]]
    param_names = ["TxB"]
    timeout = 300

    def setup(self, shape):
        rng = np.random.default_rng(0)
        T, B = (int(x) for x in shape.split("x"))
        self.r = rng.standard_normal((T, B), dtype=np.float32)
        self.v = rng.standard_normal((T, B), dtype=np.float32)
        self.d = rng.random((T, B)) < 1e-3
        self.out = (np.empty_like(self.r), np.empty_like(self.r))
        self._triad_setup(T * B)
        self.time_gae(shape)

    def time_gae(self, shape):
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, dones=self.d, axis=0, out=self.out,
                    backend="numba")


class SmallCall:
    """Target 4: B=8, T=1024 float32, validation and dispatch included."""

    def setup(self):
        rng = np.random.default_rng(0)
        self.r = rng.standard_normal((8, 1024), dtype=np.float32)
        self.v = rng.standard_normal((8, 1024), dtype=np.float32)
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, backend="numba")

    def time_gae_small(self):
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, backend="numba")


class GAEMemory:
    """Target 5: peak Python-traced allocations of one call with out= (tracemalloc)."""

    def setup(self):
        rng = np.random.default_rng(0)
        self.r = rng.standard_normal((256, 16384), dtype=np.float32)
        self.v = rng.standard_normal((256, 16384), dtype=np.float32)
        self.d = rng.random((256, 16384)) < 1e-3
        self.out = (np.empty_like(self.r), np.empty_like(self.r))
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, dones=self.d, out=self.out, backend="numba")

    def track_peak_extra_bytes(self):
        import tracemalloc

        tracemalloc.start()
        gaescan.gae(self.r, self.v, gamma=0.99, lam=0.95, dones=self.d, out=self.out, backend="numba")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    track_peak_extra_bytes.unit = "bytes"
