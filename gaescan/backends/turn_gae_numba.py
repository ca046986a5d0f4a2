"""The ``"numba"`` backend of :func:`gaescan.turn_gae`: Numba CPU kernels on NumPy arrays.

Casting to the kernels' argument kinds happens here (see
:mod:`gaescan.kernels.cpu_turn`); the kernel only loops.  Data not of the
output dtype (float16, integer) is cast and a mask wider than one byte is
compared to 0, each an O(R·T) temporary, as for the GAE kernels
(:mod:`gaescan.backends.numba_cpu`); int32 and int64 ids are read in place,
other integer ids are cast to int64.  C-contiguous rows (every array,
the usual batch-major case) go to the kernels' "C" builds, which LLVM
vectorises; other strides to the "A" builds.  γ, λ and ``last_value`` become one value
per row.  Row views whose tokens are not adjacent in memory (time-major,
``axis=0``) are copied to contiguous rows (and the outputs back), an O(R·T)
cost each: a walk along such a row would use one element of each cache line
it loads.  Below ``SERIAL_MAX_STEPS`` steps a call runs on the calling
thread: waking the thread pool costs more than the work.  Outputs of
``numba_cpu.STREAM_MIN_BYTES`` and up, their tokens adjacent, are written by
non-temporal stores (see :mod:`gaescan.kernels.cpu_turn`).

The kernel flags each row whose ids decrease along time at valid tokens;
the first such row is reported with :func:`gaescan._turn_gae.decreasing_ids`
after the pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._turn_gae import TurnGAEProblem, decreasing_ids, ordered_ids
from ..kernels import cpu_turn as k
from . import numba_cpu
from .numba_cpu import SERIAL_MAX_STEPS, _const_col, _data, _flag

_SERIAL: dict[Any, Any] = {}


def _kernel(kernel: Any, n: int, dtype: np.dtype) -> Any:
    if n > SERIAL_MAX_STEPS:
        return kernel
    key = (kernel, dtype)
    build = _SERIAL.get(key)
    if build is None:
        build = _SERIAL[key] = kernel.compile(dtype, serial=True)
    return build


def _col(c: Any, n: int, dtype: np.dtype) -> np.ndarray:
    if isinstance(c, float):
        return _const_col(c, n, dtype)
    return c.astype(dtype, copy=False)


def _stream(adv: np.ndarray, ret: np.ndarray) -> bool:
    """Whether the kernel may write the outputs' whole lines by
    non-temporal stores: each output ``numba_cpu.STREAM_MIN_BYTES`` or more (a smaller
    one is likely still in cache when the caller reads it), its tokens
    adjacent in memory and its items aligned to their size."""
    return all(a.nbytes >= numba_cpu.STREAM_MIN_BYTES and a.strides[1] == a.itemsize
               and a.__array_interface__["data"][0] % a.itemsize == 0 for a in (adv, ret))


def _strided(a: np.ndarray) -> bool:
    """Whether consecutive tokens of a row are not adjacent in memory."""
    return a.strides[1] != a.itemsize and a.shape[0] > 1


_NO_MASK = np.ones((1, 1), dtype=np.uint8)
_NO_MASK.flags.writeable = False


def turn_gae(p: TurnGAEProblem) -> None:
    rows = p.rows
    dt = rows.dtype
    ids = p.turn_ids
    if ids.dtype != np.int32 and ids.dtype != np.int64:
        ids = ordered_ids(ids)
    r, v = _data(p.rewards, rows), _data(p.values, rows)
    has_mask = p.mask is not None
    mask = _flag(p.mask, rows, True) if has_mask else _NO_MASK
    adv, ret = p.advantages, p.returns
    inputs = (r, v, ids) + ((mask,) if has_mask else ())
    if rows.T > 1 and any(_strided(a) for a in inputs + (adv, ret)):
        # Rows whose tokens are not adjacent in memory (time-major views):
        # a walk along one row would use one element of each cache line it
        # loads.  Contiguous copies, and scratch outputs copied back, cost
        # less than that.
        r, v, ids = (np.ascontiguousarray(a) for a in (r, v, ids))
        if has_mask:
            mask = np.ascontiguousarray(mask)
        adv, ret = np.empty((rows.R, rows.T), dt), np.empty((rows.R, rows.T), dt)
    arrays = (r, v, ids, adv, ret) + ((mask,) if has_mask else ())
    kernel = k.turn_gae_rows(ids.dtype, all(a.flags.c_contiguous for a in arrays), has_mask)
    bad = np.zeros(rows.R, dtype=np.uint8)
    _kernel(kernel, rows.R * rows.T, dt)(
        r, v, ids, mask, _col(p.gamma, rows.R, dt), _col(p.lam, rows.R, dt),
        _col(p.last_value, rows.R, dt), bad, _stream(adv, ret), dt.type(0), adv, ret)
    if adv is not p.advantages:
        p.advantages[...] = adv
        p.returns[...] = ret
    if bad.any():
        raise decreasing_ids(p.batch_shape, int(np.argmax(bad)))
