"""The ``"numba"`` backend of the statistics functions: Numba CPU kernels on NumPy arrays.

:mod:`gaescan._stats` validates the arguments and allocates the output; this
module casts them to the kernels' argument kinds (see
:mod:`gaescan.kernels.cpu_stats`) and runs the kernels.

* Data not of a float dtype the kernels take (float16, integer, bool) is cast
  to float32, an O(n) temporary.  Inputs of any layout are flattened, a copy
  only when they are not contiguous.
* The flat kernels take contiguous arrays (a unit stride lets them
  vectorise): a non-contiguous input is copied, and a non-contiguous
  ``out`` is written through a contiguous scratch array.
* Masks that are bool or one-byte integers are free uint8 views (nonzero =
  true); wider masks are compared to 0, an O(n) temporary.  Without a mask
  the kernels skip the mask test.
* Arbitrary group labels are sorted on the host (a stable argsort, so each
  group keeps its index order); the groups' offsets follow from where the
  sorted labels change.  The kernels then run one group per parallel
  iteration: there is no Python loop over groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import data_dtype
from ..kernels import cpu_stats as k

#: The chunk length of the moments and normalisation kernels.  It fixes the
#: order of every sum (so results do not depend on the thread count) and is
#: small enough that a chunk's second pass, where one is needed, reads it from cache.
CHUNK = 1 << 14

#: Below this many elements a call runs the kernel's serial build on the
#: calling thread: waking the thread pool costs more than the work, and on a
#: busy machine a woken pool can wait for a scheduler slot.
SERIAL_MAX = 1 << 16

_SERIAL: dict[tuple, Any] = {}


def _run(kernel: Any, n: int, *args: Any) -> None:
    """Run ``kernel`` on ``args``: its serial build for fewer than ``SERIAL_MAX`` elements."""
    if n >= SERIAL_MAX:
        kernel(*args)
        return
    key = (kernel, args[-1].dtype)
    build = _SERIAL.get(key)
    if build is None:
        build = _SERIAL[key] = kernel.compile(args[-1].dtype, serial=True)
    build(*args)


_ONE8 = np.ones(1, dtype=np.uint8)
_ONE8.flags.writeable = False
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _data(x: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """A 1-D view (or copy) of ``x`` of a dtype the kernels take."""
    flat = x.reshape(-1)
    if dtype is not None and flat.dtype != dtype:
        return flat.astype(dtype)
    if flat.dtype not in _KERNEL_DTYPES:
        # float16, integers, bool, and floats in the other byte order or wider
        return flat.astype(data_dtype(flat))
    return flat


def _flat(x: Any) -> np.ndarray:
    """A contiguous 1-D view (or copy) of ``x`` of a dtype the kernels take."""
    return np.ascontiguousarray(_data(x))


def _mask(mask: Any) -> tuple[np.ndarray, bool]:
    """A contiguous 1-D uint8 view of ``mask`` (nonzero = valid) and whether there is one."""
    if mask is None:
        return _ONE8, False
    flat = np.ascontiguousarray(mask.reshape(-1))
    if flat.dtype.itemsize == 1 and flat.dtype.kind in "biu":
        return flat.view(np.uint8), True
    return (flat != 0).view(np.uint8), True


def group_normalize(xp: Any, scores: Any, labels: Any, group_size: int | None, loo: bool, scale: bool,
                    ddof: int, eps: float, out: Any) -> None:
    """Write the group-normalised advantages of ``scores`` into ``out`` (1-D, the output dtype)."""
    s = _data(scores, out.dtype)
    if labels is None:
        _run(k.group_norm_fixed, s.shape[0], s, int(group_size), bool(loo), bool(scale), int(ddof), float(eps), out)
        return
    order = np.argsort(labels, kind="stable")
    ordered = labels[order]
    starts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    offsets = np.empty(starts.shape[0] + 2, dtype=np.int64)
    offsets[0] = 0
    offsets[1:-1] = starts
    offsets[-1] = ordered.shape[0]
    _run(k.group_norm_sorted, s.shape[0], s, order.astype(np.int64, copy=False), offsets, bool(loo), bool(scale),
         int(ddof), float(eps), out)


def moments(xp: Any, x: Any, mask: Any) -> tuple[float, float, float]:
    """``(count, mean, m2)`` of ``x`` where ``mask`` is true, as Python floats."""
    flat = _flat(x)
    res = np.zeros(3, dtype=np.float64)
    if flat.shape[0]:
        _run(k.masked_moments, flat.shape[0], *_mask(mask), CHUNK, res, flat)
    return float(res[0]), float(res[1]), float(res[2])


def whiten(xp: Any, x: Any, mask: Any, stats: Any, shift_mean: bool, ddof: int, eps: float, out: Any) -> None:
    """Write the whitened ``x`` into ``out`` (the shape of ``x``, the output dtype).

    ``stats`` is ``None`` (the local moments) or ``(count, mean, m2)`` as floats.
    """
    flat = _flat(x)
    n = flat.shape[0]
    if n == 0:
        return
    m, has_mask = _mask(mask)
    if stats is None:
        res = np.zeros(3, dtype=np.float64)
        _run(k.masked_moments, n, m, has_mask, CHUNK, res, flat)
        count, mean, m2 = float(res[0]), float(res[1]), float(res[2])
    else:
        count, mean, m2 = stats
    direct = out.flags.c_contiguous
    y = out.reshape(-1) if direct else np.empty(n, dtype=out.dtype)
    if count == 0:
        # No valid element: every output is 0 (no statistics to apply).
        y[...] = 0
    else:
        var = m2 / (count - ddof) if count > ddof else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            # var + eps == 0 gives inf (0/0 = NaN where x == mean), as the formula does.
            inv = np.float64(1.0) / np.sqrt(np.float64(var + eps))
        _run(k.masked_normalize, n, flat, m, has_mask, mean, float(inv), 0.0 if shift_mean else mean, CHUNK, y)
    if not direct:
        out[...] = y.reshape(out.shape)
