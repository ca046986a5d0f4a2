"""Access-pattern probes for ``gaescan gpu-check``: GAE's memory traffic without the scan.

Each kernel reads ``r``, ``v`` (float32) and ``done`` (1 byte) and writes two
float32 outputs per step — the 17 bytes per step of GAE float32 with dones —
with an elementwise body, so its time is the cost of the *access pattern*
alone:

* ``owned``: thread ``i`` owns the ``K`` consecutive steps ``i*K .. i*K+K-1``,
  as a scan kernel's thread does (each warp load instruction touches ``K``
  times more sectors than a coalesced one; L1 must absorb the rest);
* ``coalesced``: consecutive threads take consecutive steps (grid-stride).

Compared with a device-to-device copy of the same bytes, they tell whether the
scan kernels lose time to the way they touch memory or elsewhere (scan,
barriers, look-back, occupancy).  ``cuda`` is a module global, as the
simulator requires; this module is imported only by the GPU check.
"""

from __future__ import annotations

from numba import cuda

_KERNELS: dict = {}


def kernels(K: int) -> tuple:
    """``(owned, coalesced)`` for ``K`` steps per thread (owned); compiled lazily."""
    ks = _KERNELS.get(K)
    if ks is None:
        ks = _KERNELS[K] = _build(K)
    return ks


def _build(K: int) -> tuple:
    @cuda.jit(device=True)
    def step(r, v, d, o1, o2, i):
        delta = r[i] - v[i]
        o1[i] = delta
        o2[i] = r[i] if d[i] != 0 else delta + v[i]

    @cuda.jit
    def owned(r, v, d, o1, o2, n):
        i0 = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * K
        for j in range(K):  # K is a constant: unrolled, the K loads issued back to back
            if i0 + j < n:
                step(r, v, d, o1, o2, i0 + j)

    @cuda.jit
    def coalesced(r, v, d, o1, o2, n):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        stride = cuda.gridDim.x * cuda.blockDim.x
        while i < n:
            step(r, v, d, o1, o2, i)
            i += stride

    return owned, coalesced


def launch(which: str, r, v, d, o1, o2, K: int = 8, threads: int = 128, stream=0, blocks_per_sm: int = 0) -> None:
    """Launch probe ``which`` ("owned" or "coalesced") over the flat arrays.

    ``coalesced`` uses ``blocks_per_sm`` blocks per SM (grid-stride) when given,
    else one thread per step.
    """
    owned, coalesced = kernels(K)
    n = r.shape[0]
    if which == "owned":
        grid = max(1, -(-n // (threads * K)))
        owned[grid, threads, stream](r, v, d, o1, o2, n)
    elif which == "coalesced":
        grid = max(1, -(-n // threads))
        if blocks_per_sm:
            grid = min(grid, blocks_per_sm * cuda.get_current_device().MULTIPROCESSOR_COUNT)
        coalesced[grid, threads, stream](r, v, d, o1, o2, n)
    else:
        raise ValueError(f"unknown probe {which!r}; use 'owned' or 'coalesced'")
