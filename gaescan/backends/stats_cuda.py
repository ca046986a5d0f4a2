"""The ``"cuda"`` backend of the statistics functions.

``moments`` and ``whiten`` run the Numba CUDA kernels of
:mod:`gaescan.kernels.cuda_stats` on the caller's stream (CuPy's current
stream; PyTorch's for tensors, see :meth:`gaescan._arrays.Context.stream`).
The statistics stay in device memory: :func:`moments` returns 0-d views of
the kernel's result and :func:`whiten` reads them there, so nothing is read
back to the host.  Arrays reach the kernels as device views built without
synchronising any stream (:func:`gaescan.backends.cuda._device_view`).

``group_normalize`` runs the NumPy-API code of
:mod:`gaescan.backends.stats_numpy` on CuPy: CuPy's sort of the labels and
segment sums over dense group ids of static length ``B``, again with no
value read back to the host.

Under Numba's CUDA simulator the same kernels run on NumPy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import cuda_stats as k
from . import stats_numpy

#: The most partials the first moments pass writes (one per block).
MAX_PARTS = 1024
#: Elements per thread of a partial block, at least.
_PER_THREAD = 8

group_normalize = stats_numpy.group_normalize


def _launcher(xp: Any) -> tuple[Any, Any]:
    """The stream to launch on and the function that makes kernel views of arrays."""
    if xp is np:  # the simulator: kernels take NumPy arrays
        return 0, lambda a: a
    from . import cuda as _cuda

    return _cuda._stream(_cuda.current_stream_ptr()), _cuda._device_view


def _flat(xp: Any, x: Any) -> Any:
    flat = xp.ascontiguousarray(x.reshape(-1))
    if flat.dtype not in (np.float32, np.float64):
        flat = flat.astype(np.float32)
    return flat


def _mask(xp: Any, mask: Any) -> tuple[Any, bool]:
    if mask is None:
        return xp.ones(1, dtype=np.uint8), False
    flat = xp.ascontiguousarray(mask.reshape(-1))
    if flat.dtype.itemsize == 1 and flat.dtype.kind in "biu":
        return flat.view(np.uint8), True
    return (flat != 0).view(np.uint8), True


def _stats(xp: Any, flat: Any, m: Any, has_mask: bool) -> Any:
    """``(count, mean, m2)`` as a float64 device array of length 3."""
    stream, view = _launcher(xp)
    N = int(flat.shape[0])
    stats = xp.zeros(3, dtype=np.float64)
    if N == 0:
        return stats
    nparts = max(1, min(MAX_PARTS, -(-N // (k.THREADS * _PER_THREAD))))
    per_block = -(-N // nparts)
    parts = xp.empty((nparts, 3), dtype=np.float64)
    k.moments_partial[nparts, k.THREADS, stream](view(flat), view(m), has_mask, per_block, view(parts))
    k.moments_final[1, k.THREADS, stream](view(parts), view(stats))
    return stats


def moments(xp: Any, x: Any, mask: Any) -> tuple[Any, Any, Any]:
    """``(count, mean, m2)`` of ``x`` where ``mask`` is true, as 0-d float64 device arrays."""
    m, has_mask = _mask(xp, mask)
    stats = _stats(xp, _flat(xp, x), m, has_mask)
    return stats[0, ...], stats[1, ...], stats[2, ...]


def whiten(xp: Any, x: Any, mask: Any, stats: Any, shift_mean: bool, ddof: int, eps: float, out: Any) -> None:
    """Write the whitened ``x`` into ``out``; ``stats`` is ``None`` or 0-d float64 arrays."""
    flat = _flat(xp, x)
    N = int(flat.shape[0])
    if N == 0:
        return
    m, has_mask = _mask(xp, mask)
    if stats is None:
        st = _stats(xp, flat, m, has_mask)
    else:
        st = xp.ascontiguousarray(xp.stack([xp.asarray(s, dtype=np.float64) for s in stats]))
    direct = out.flags.c_contiguous
    y = out.reshape(-1) if direct else xp.empty(N, dtype=out.dtype)
    stream, view = _launcher(xp)
    blocks = max(1, min(4096, -(-N // k.THREADS)))
    k.normalize[blocks, k.THREADS, stream](view(flat), view(m), has_mask, view(st), bool(shift_mean),
                                           float(ddof), float(eps), view(y))
    if not direct:
        out[...] = y.reshape(out.shape)
