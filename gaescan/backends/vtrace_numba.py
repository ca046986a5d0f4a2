"""The ``"numba"`` backend of :func:`gaescan.vtrace`: Numba CPU kernels on NumPy arrays.

Casting to the kernels' argument kinds happens here (see
:mod:`gaescan.kernels.cpu_vtrace`); the kernels only loop.  The same
conversions as the GAE kernels' (:mod:`gaescan.backends.numba_cpu`): data not
of the output dtype (float16, integer) is cast, and flags wider than one byte
are compared to 0, each an O(R·T) temporary; scalar and per-row coefficients
are ``(R,)`` columns or zero-stride views.

Dispatch: calls with scalar or per-row γ and λ and no mask or packing take
the fused kernels: C-contiguous batch-major rows the tiled one
(``vtrace_fused``), or, for float32 rows without ``next_values`` above
``SERIAL_MAX_STEPS`` steps, the one that runs eight rows at a time in SIMD
lanes (``vtrace_lanes``, the last ``R % 8`` rows in ``vtrace_fused``);
time-major row views whose transposes are C-contiguous the one that sweeps
the batch at each step (``vtrace_timemajor``), or, on the same terms as
``vtrace_lanes``, the one that runs eight batch columns at a time in SIMD
lanes (``vtrace_timemajor_lanes``).  Batch-major float32 calls with
``next_values`` and both flag arrays (terminations and truncations, each
consecutive along time) above ``SERIAL_MAX_STEPS`` take the lanes kernel
that reads them (``vtrace_lanes_next``).  The lanes kernels carry the trace
in float32 where GAE's kernels would carry theirs (:func:`_state32`); they
serve no call with a zero γλ in a row (their float32 blocks multiply by the
decay, where every other kernel drops the carry at a zero decay).  Every
other call (masks, packing, per-step γ or λ, other strides) takes the
general kernel (``vtrace_rows``), which reads any strides.  Below
``SERIAL_MAX_STEPS`` steps a call runs on the calling thread: waking the
thread pool costs more than the work.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .._vtrace import VTraceProblem
from ..kernels import cpu_vtrace as k
from .numba_cpu import (
    SERIAL_MAX_STEPS,
    _bound,
    _coeff,
    _column,
    _data,
    _flag,
    _flag8,
    _narrow,
    _offsets,
    _stream,
    _sweep_time_major,
)

_NO_FLAGS = np.zeros((1, 1), dtype=np.uint8)
_SERIAL: dict[Any, Any] = {}


def _kernel(kernel: Any, n: int, dtype: np.dtype) -> Any:
    if n > SERIAL_MAX_STEPS:
        return kernel
    key = (kernel.__name__, dtype)
    build = _SERIAL.get(key)
    if build is None:
        build = _SERIAL[key] = kernel.compile(dtype, serial=True)
    return build


def _contiguous(*xs: Any) -> bool:
    return all(x is None or x.flags.c_contiguous for x in xs)


def _lanes_ok(rows: Any, p: VTraceProblem, d: np.ndarray, time_major: bool = False) -> bool:
    """Whether a SIMD-lanes kernel serves a fused call: float32 rows, at least
    8 of them, above ``SERIAL_MAX_STEPS`` steps, no ``next_values``, flags
    consecutive along time (:func:`~gaescan.kernels.cpu_vtrace.vtrace_lanes`)
    or, with ``time_major``, along the batch
    (:func:`~gaescan.kernels.cpu_vtrace.vtrace_timemajor_lanes`)."""
    return (rows.dtype == np.float32 and rows.R >= 8 and rows.R * rows.T > SERIAL_MAX_STEPS
            and p.next_values is None and (p.terminated is None or d.strides[0 if time_major else 1] == 1))


def _lanes_next_ok(rows: Any, p: VTraceProblem, d: np.ndarray, tr: np.ndarray) -> bool:
    """Whether :func:`~gaescan.kernels.cpu_vtrace.vtrace_lanes_next` serves a
    fused batch-major call with ``next_values``: float32 rows, at least 8 of
    them, above ``SERIAL_MAX_STEPS`` steps, both flag arrays given and
    consecutive along time (an absent flag is a zero-stride view)."""
    return (p.next_values is not None and rows.dtype == np.float32 and rows.R >= 8
            and rows.R * rows.T > SERIAL_MAX_STEPS and d.strides[1] == 1 and tr.strides[1] == 1)


def _state32(rows: Any, p: VTraceProblem, gcol: np.ndarray, lcol: np.ndarray) -> bool:
    """Whether the lanes kernels carry the trace in float32: where GAE's
    kernels carry theirs (:func:`gaescan.backends.numba_cpu._narrow`), the
    decay ``γλ·min(c̄, e)`` being at most ``|γλ|·c̄``, and with ``ρ̄ <= 1``,
    so that each step's ``δ = min(ρ̄, e)·w`` is no larger than the bracket
    ``w`` (GAE's δ).  Elsewhere the trace is float64."""
    return p.rho_bar <= 1.0 and _narrow(rows, p.gamma, p.lam, p.c_bar, cols=(gcol, lcol, None))


def _lanes_stream(p: VTraceProblem) -> tuple[int, bool]:
    """``(phase, stream)`` of the batch-major lanes kernels: where both outputs
    may stream (:func:`gaescan.backends.numba_cpu._stream`), their blocks start
    at the outputs' first line and write by non-temporal stores; elsewhere
    they start at step 0 and write by ordinary stores.  The blocks round
    differently from the steps outside them, so the last bits follow the
    outputs' offset within a line: outputs that :func:`gaescan.vtrace`
    allocates always start 16 bytes past one."""
    phase, stream = _stream(p.vs, p.advantages)
    return (phase if stream else 0), stream


def vtrace(p: VTraceProblem) -> None:
    rows = p.rows
    n = rows.R * rows.T
    r, values, lr = _data(p.rewards, rows), _data(p.values, rows), _data(p.log_rhos, rows)
    nv = None if p.next_values is None else _data(p.next_values, rows)
    if rows.cu_seqlens is None and p.mask is None:
        arrays = (r, values, lr, nv, p.vs, p.advantages)
        tm = _sweep_time_major(rows, r) and _contiguous(*(None if x is None else x.T for x in arrays))
        if tm or _contiguous(*arrays):
            gcol = _column(p.gamma, rows)
        else:
            gcol = None
        lcol = None if gcol is None else _column(p.lam, rows)
        if lcol is not None:
            bound, carry = _bound(p.last_value, rows), _bound(p.last_trace, rows)
            if nv is not None:
                d, has_term, tr = _flag(p.terminated, rows, False), p.terminated is not None, _flag(
                    p.truncated, rows, False)
            else:
                d = _NO_FLAGS if p.terminated is None else _flag8(p.terminated)
                has_term, tr = p.terminated is not None, _NO_FLAGS
            nv = values if nv is None else nv
            # The SIMD-lanes kernels' float32 blocks multiply by the decay; a
            # zero γλ takes the kernels that drop the carry there (docs/semantics.md).
            lanes = bool(gcol.all() and lcol.all())
            if tm and lanes and _lanes_ok(rows, p, d, time_major=True):
                # Eight batch columns at a time in SIMD lanes.
                k.vtrace_timemajor_lanes(r.T, values.T, lr.T, d.T, has_term, gcol, lcol, bound, carry, p.rho_bar,
                                         p.c_bar, p.pg_rho_bar, _state32(rows, p, gcol, lcol),
                                         numba.get_num_threads(), p.vs.T, p.advantages.T)
            elif tm:
                _kernel(k.vtrace_timemajor, n, rows.dtype)(
                    r.T, values.T, lr.T, nv.T, p.next_values is not None, d.T, has_term, tr.T, gcol, lcol, bound,
                    carry, p.rho_bar, p.c_bar, p.pg_rho_bar, p.vs.T, p.advantages.T)
            elif lanes and _lanes_next_ok(rows, p, d, tr):
                # next_values with both flag arrays: eight rows at a time in SIMD lanes.
                k.vtrace_lanes_next(r, values, lr, nv, d, tr, gcol, lcol, carry, p.rho_bar, p.c_bar,
                                    p.pg_rho_bar, _state32(rows, p, gcol, lcol), *_lanes_stream(p), p.vs,
                                    p.advantages)
                r8 = rows.R - rows.R % 8
                if r8 < rows.R:
                    s = slice(r8, None)
                    k.vtrace_fused(r[s], values[s], lr[s], nv[s], True, d[s], True, tr[s], gcol[s], lcol[s],
                                   bound[s], carry[s], p.rho_bar, p.c_bar, p.pg_rho_bar, p.vs[s], p.advantages[s])
            elif lanes and _lanes_ok(rows, p, d):
                # Eight rows at a time in SIMD lanes, the last R % 8 rows in pairs.
                k.vtrace_lanes(r, values, lr, d, has_term, gcol, lcol, bound, carry, p.rho_bar, p.c_bar,
                               p.pg_rho_bar, _state32(rows, p, gcol, lcol), *_lanes_stream(p), p.vs, p.advantages)
                r8 = rows.R - rows.R % 8
                if r8 < rows.R:
                    s = slice(r8, None)
                    k.vtrace_fused(r[s], values[s], lr[s], values[s], False, d if d is _NO_FLAGS else d[s],
                                   has_term, tr, gcol[s], lcol[s], bound[s], carry[s], p.rho_bar, p.c_bar,
                                   p.pg_rho_bar, p.vs[s], p.advantages[s])
            else:
                _kernel(k.vtrace_fused, n, rows.dtype)(
                    r, values, lr, nv, p.next_values is not None, d, has_term, tr, gcol, lcol, bound,
                    carry, p.rho_bar, p.c_bar, p.pg_rho_bar, p.vs, p.advantages)
            return
    cu, packed = _offsets(rows)
    _kernel(k.vtrace_rows, n, rows.dtype)(
        r, values, lr, values if nv is None else nv,
        _coeff(p.gamma, rows), _coeff(p.lam, rows),
        _flag(p.terminated, rows, False), _flag(p.truncated, rows, False), _flag(p.mask, rows, True),
        nv is not None, p.rho_bar, p.c_bar, p.pg_rho_bar, _bound(p.last_value, rows),
        _bound(p.last_trace, rows), cu, packed,
        rows.dtype.type(0), p.vs, p.advantages)
