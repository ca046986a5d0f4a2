"""Validation and normalisation: public arguments → a backend problem.

Everything a backend may rely on (see :mod:`gaescan._problem`) is established
here, once, for every backend: shapes, dtypes, the time axis, flags,
coefficients, packing and the output views.  Nothing here reads array *values*
on a device (that would synchronise the host); on the host, cheap value checks
(coefficient ranges, ``cu_seqlens`` offsets) are made.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import may_overlap
from ._problem import Rows

_NUMERIC_KINDS = "biuf"


# --------------------------------------------------------------------------- dtypes


def _check_numeric(x: Any, name: str) -> None:
    if x.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(
            f"{name!r} must hold real numbers (bool, integer or float), got dtype {x.dtype}"
        )


def result_dtype(*arrays: Any) -> np.dtype:
    """float64 if any float array is 64-bit or wider, else float32 (scalars are weak)."""
    for x in arrays:
        if x is not None and not _is_scalar(x) and data_dtype(x) == np.float64:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def data_dtype(x: Any) -> np.dtype:
    """The result dtype of a function of one data array ``x`` (``whiten``'s
    ``x``, ``group_normalize``'s ``scores``): :func:`result_dtype` without the
    weak-scalar rule, which is for coefficients, so a 0-d ``x`` counts too."""
    return np.dtype(np.float64) if x.dtype.kind == "f" and x.dtype.itemsize >= 8 else np.dtype(np.float32)


def _is_scalar(x: Any) -> bool:
    if type(x) is np.ndarray:
        return x.ndim == 0
    return isinstance(x, (float, int, np.generic, numbers.Number)) or (isinstance(x, np.ndarray) and x.ndim == 0)


is_scalar = _is_scalar


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where the time axis is and how the input folds into ``(R, T)`` rows."""

    shape: tuple
    axis: int
    R: int
    T: int
    batch_shape: tuple

    def rows(self, xp: Any, x: Any) -> Any:
        """An ``(R, T)`` view of ``x`` (a copy only when the batch axes cannot merge)."""
        if x.ndim == 2 and self.axis == 1:
            return x
        return xp.moveaxis(x, self.axis, -1).reshape(self.R, self.T)

    def writable_rows(self, xp: Any, out: Any) -> Any | None:
        """An ``(R, T)`` view that writes through to ``out``, or ``None`` if none exists."""
        if out.ndim == 2 and self.axis == 1:
            return out
        moved = xp.moveaxis(out, self.axis, -1)
        view = moved.reshape(self.R, self.T)
        if view.size == 0 or xp.may_share_memory(view, moved):
            return view
        return None

    def scatter_back(self, xp: Any, rows: Any, out: Any) -> None:
        """Copy an ``(R, T)`` scratch result into ``out`` (non-mergeable layouts only)."""
        moved = xp.moveaxis(out, self.axis, -1)
        moved[...] = rows.reshape(moved.shape)


def normalize_axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (numbers.Integral, np.integer)):
        raise TypeError(f"axis must be an integer, got {type(axis).__name__}")
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis {axis} is out of range for {ndim}-dimensional inputs "
            f"(valid: {-ndim} .. {ndim - 1})"
        )
    return axis % ndim


def layout_of(shape: tuple, axis: Any) -> Layout:
    if len(shape) == 0:
        raise ValueError("inputs must have at least one dimension (the time axis); got a 0-d array")
    ax = normalize_axis(axis, len(shape))
    T = int(shape[ax])
    batch = tuple(int(n) for i, n in enumerate(shape) if i != ax)
    return Layout(tuple(shape), ax, math.prod(batch), T, batch)


# --------------------------------------------------------------------------- arguments


def data_array(xp: Any, x: Any, name: str) -> Any:
    """A required or optional data/flag array: numeric, never a bare scalar."""
    if x is None:
        return None
    if _is_scalar(x) and not isinstance(x, np.ndarray):
        raise TypeError(f"{name!r} must be an array, got the scalar {x!r}")
    _check_numeric(x, name)
    return x


def check_episode_ends(dones: Any, terminated: Any, truncated: Any, next_values: Any,
                       last_value: Any) -> None:
    """The ways GAE's episode ends and bootstrap values may be given together."""
    if dones is not None and (terminated is not None or truncated is not None):
        raise ValueError("pass either dones or terminated/truncated, not both (dones means terminated)")
    if next_values is not None and last_value is not None:
        raise ValueError(
            "next_values and last_value are exclusive: next_values already holds the bootstrap "
            "value of every step, including the last"
        )
    if truncated is not None and next_values is None:
        raise ValueError(
            "truncated needs next_values: bootstrapping a cut-off episode needs the value of its "
            "final observation, which only the caller knows"
        )


def check_same_shape(ref_name: str, ref: Any, **others: Any) -> None:
    for name, x in others.items():
        if x is not None and tuple(x.shape) != tuple(ref.shape):
            raise ValueError(
                f"{name!r} has shape {tuple(x.shape)} but {ref_name!r} has shape "
                f"{tuple(ref.shape)}; they must match exactly"
            )


def reverse_flag(reverse: Any) -> bool:
    """``linear_scan``'s ``reverse``: a Python or NumPy bool (or a 0-d bool array)."""
    if reverse is True or reverse is False:
        return reverse
    if isinstance(reverse, np.bool_) or (
            getattr(reverse, "dtype", None) == np.bool_ and getattr(reverse, "ndim", None) == 0):
        return bool(reverse)
    raise TypeError(f"reverse must be a bool, got {reverse!r}")


def scalar_coefficient(g: Any, name: str, dtype: np.dtype, unit_range: bool) -> float:
    """A scalar coefficient, checked (type, and [0, 1] when ``unit_range``) and rounded to ``dtype``."""
    if type(g) is not float:
        if isinstance(g, (bool, np.bool_)) or not isinstance(g, (numbers.Real, np.number, np.ndarray)):
            raise TypeError(f"{name!r} must be a real number or an array, got {g!r}")
        if isinstance(g, np.ndarray):
            _check_numeric(g, name)
        g = float(g)
    if unit_range and not 0.0 <= g <= 1.0:
        raise ValueError(f"{name!r} must lie in [0, 1], got {g!r}")
    return float(dtype.type(g))


def check_coefficient_structure(g: Any, name: str, shape: tuple) -> None:
    """An array coefficient's structure: numeric, and broadcastable to ``shape``."""
    _check_numeric(g, name)
    try:
        full = np.broadcast_shapes(tuple(g.shape), tuple(shape))
    except ValueError:
        full = None
    if full != tuple(shape):
        raise ValueError(
            f"{name!r} of shape {tuple(g.shape)} does not broadcast to the input shape "
            f"{tuple(shape)} (use a scalar, a per-row shape such as (B, 1), or the full shape)"
        )


def check_unit_range(g: Any, name: str) -> None:
    """Every element of a host array coefficient lies in [0, 1] (a NaN fails both comparisons)."""
    if g.size:
        lo, hi = g.min(), g.max()
        if not (lo >= 0 and hi <= 1):
            raise ValueError(f"every element of {name!r} must lie in [0, 1] (got min {lo}, max {hi})")


def check_coefficient_array(g: Any, name: str, shape: tuple, unit_range: bool, host: bool) -> None:
    """An array coefficient: numeric, broadcastable to ``shape``, and (``host`` only) in [0, 1].

    Device and lazy arrays are not range-checked here: reading their values
    would synchronise with the device or compute the graph.
    """
    check_coefficient_structure(g, name, shape)
    if unit_range and host:
        check_unit_range(g, name)


# float32 roundings of Python floats: training loops pass the same few γ, λ
# and boundary values call after call.  A zero is never kept (``-0.0 == 0.0``
# would share one entry, and the rounding keeps the sign of a zero), so a
# lookup of either zero misses.
ROUNDED32: dict[float, float] = {}
_ROUNDED32_MAX = 256


def rounded(g: float, cast: type) -> float:
    """The Python float ``g`` rounded to the scalar type ``cast`` (``numpy.float32``
    or ``numpy.float64``), as a Python float."""
    if cast is np.float64:
        return g
    r = ROUNDED32.get(g)
    if r is None:
        r = float(cast(g))
        if g != 0.0:
            if len(ROUNDED32) >= _ROUNDED32_MAX:
                ROUNDED32.clear()
            ROUNDED32[g] = r
    return r


def coefficient(
    xp: Any, g: Any, name: str, shape: tuple, layout: Layout, dtype: np.dtype, unit_range: bool,
    structure: bool = True,
) -> Any:
    """A Python float rounded to ``dtype``, or an ``(R, T)`` view broadcast from ``g``.

    ``structure=False`` skips an array's structural checks (dtype, broadcast
    shape), which a plan has made for this structure; its values (the range,
    on the host) are checked on every call.
    """
    if g is None:
        raise TypeError(f"{name!r} is required")
    if _is_scalar(g):
        return scalar_coefficient(g, name, dtype, unit_range)
    if structure:
        check_coefficient_structure(g, name, shape)
    if unit_range and xp is np:
        check_unit_range(g, name)
    return layout.rows(xp, g if tuple(g.shape) == tuple(shape) else xp.broadcast_to(g, shape))


def boundary_value(xp: Any, v: Any, name: str, batch_shape: tuple, nseg: int, dtype: np.dtype) -> Any:
    """``last_value`` / ``initial``: a float, or a length-``nseg`` array."""
    if v is None:
        return 0.0
    if _is_scalar(v) and (xp is np or not hasattr(v, "__cuda_array_interface__")):
        if isinstance(v, np.ndarray):
            _check_numeric(v, name)
        elif not isinstance(v, (numbers.Real, np.number, np.bool_)):
            raise TypeError(f"{name!r} must be a real number or an array, got {v!r}")
        return float(dtype.type(v))
    _check_numeric(v, name)
    if tuple(v.shape) != tuple(batch_shape) and v.ndim != 0:
        raise ValueError(
            f"{name!r} has shape {tuple(v.shape)}; it must be a scalar or have the batch "
            f"shape {tuple(batch_shape)} (the input shape without the time axis)"
        )
    return xp.broadcast_to(v, batch_shape).reshape(nseg)


def packed_offsets(xp: Any, cu: Any, shape: tuple, axis: Any) -> Any:
    """Validate ``cu_seqlens`` for 1-D inputs; return them as int64."""
    if _is_scalar(cu) or cu.ndim != 1 or cu.dtype.kind not in "iu":
        dt = getattr(cu, "dtype", type(cu).__name__)
        nd = getattr(cu, "ndim", 0)
        raise TypeError(
            f"cu_seqlens must be a 1-D integer array [0, c_1, ..., N], got {nd}-D of dtype {dt}"
        )
    if len(shape) != 1:
        raise ValueError(
            f"cu_seqlens packs 1-D inputs; got inputs of shape {tuple(shape)} "
            "(flatten the packed sequences to one axis)"
        )
    normalize_axis(axis, 1)
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must hold at least one offset ([0] for no sequence)")
    N = shape[0]
    if xp is np:
        c = cu.astype(np.int64, copy=False)
        if c[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {c[0]}")
        if c[-1] != N:
            raise ValueError(f"cu_seqlens must end at the input length {N}, got {c[-1]}")
        if c.shape[0] > 1 and np.any(np.diff(c) < 0):
            i = int(np.argmax(np.diff(c) < 0))
            raise ValueError(
                f"cu_seqlens must be non-decreasing, but cu_seqlens[{i}]={c[i]} > cu_seqlens[{i + 1}]={c[i + 1]}"
            )
        return np.ascontiguousarray(c)
    return xp.ascontiguousarray(cu.astype(xp.int64, copy=False))


def make_rows(xp: Any, dtype: np.dtype, layout: Layout, cu: Any) -> Rows:
    nseg = layout.R if cu is None else int(cu.shape[0]) - 1
    return Rows(xp=xp, dtype=dtype, R=layout.R, T=layout.T, cu_seqlens=cu, nseg=nseg)


# --------------------------------------------------------------------------- outputs


@dataclass(slots=True)
class Output:
    """One output: the array the caller gets, and the rows view a backend writes."""

    array: Any
    rows: Any
    scratch: bool  # rows is a separate buffer to copy back into array


# Allocated outputs from this size up start where ``line_offset`` asks (see empty).
PLACED_MIN_BYTES = 1 << 20


def empty(xp: Any, shape: tuple, dtype: np.dtype, line_offset: int | None = None) -> Any:
    """An uninitialised C-contiguous array; with ``line_offset``, a NumPy array
    of ``PLACED_MIN_BYTES`` or more starts that many bytes past a 64-byte
    line, whatever the allocator gives (which places arrays of some sizes at
    varying offsets)."""
    n = math.prod(shape) * np.dtype(dtype).itemsize
    if line_offset is None or xp is not np or n < PLACED_MIN_BYTES:
        return xp.empty(shape, dtype=dtype)
    buf = np.empty(n + 64, np.uint8)
    skip = (line_offset - buf.__array_interface__["data"][0]) % 64
    return buf[skip:skip + n].view(dtype).reshape(shape)


def outputs(
    xp: Any,
    out: Any,
    count: int,
    layout: Layout,
    dtype: np.dtype,
    inputs: Sequence[tuple[str, Any]],
    line_offset: int | None = None,
) -> list[Output]:
    """Allocate (or check the caller's ``out=``) and build writable row views;
    ``line_offset``: see :func:`empty`."""
    if out is None:
        arrays = [empty(xp, layout.shape, dtype, line_offset) for _ in range(count)]
    else:
        arrays = list(out) if count > 1 else [out]
        if count > 1 and (isinstance(out, (str, bytes)) or len(arrays) != count):
            raise ValueError(f"out must be a sequence of {count} arrays (one per output)")
        for i, o in enumerate(arrays):
            name = f"out[{i}]" if count > 1 else "out"
            if o is None or _is_scalar(o):
                raise TypeError(
                    f"{name} must be an array, got {o!r}; pass {'all ' + str(count) if count > 1 else 'an'} "
                    "output array(s), or out=None to allocate the result"
                )
            if tuple(o.shape) != tuple(layout.shape) or o.dtype != dtype:
                raise ValueError(
                    f"{name} must have the result's shape {tuple(layout.shape)} and dtype {dtype}, "
                    f"got shape {tuple(o.shape)} and dtype {o.dtype}"
                )
            if xp is np and not o.flags.writeable:
                raise ValueError(f"{name} is read-only")
            for in_name, x in inputs:
                if x is not None and not _is_scalar(x) and x.size and o.size and may_overlap(xp, o, x):
                    raise ValueError(f"{name} overlaps the input {in_name!r}; outputs must not alias inputs")
        for i in range(count):
            for j in range(i):
                if arrays[i].size and may_overlap(xp, arrays[i], arrays[j]):
                    raise ValueError(f"out[{j}] and out[{i}] overlap; each output needs its own memory")
    result = []
    for a in arrays:
        rows = layout.writable_rows(xp, a)
        if rows is None:
            result.append(Output(a, xp.empty((layout.R, layout.T), dtype=dtype), True))
        else:
            result.append(Output(a, rows, False))
    return result


def finish(xp: Any, layout: Layout, outs: list[Output]) -> None:
    for o in outs:
        if o.scratch:
            layout.scatter_back(xp, o.rows, o.array)
