"""The ``"numpy"`` backend of :func:`gaescan.vtrace`: the chunk-parallel reverse scan.

V-trace's trace ``D_t = δ_t + γ_t c_t D_{τ(t)}`` is the reverse linear
recurrence of :mod:`gaescan.backends.numpy_chunk` with the per-step decay
``γ_t c_t`` and input ``δ_t``, cut the same way as GAE's: a done or a packed
segment's end sets the decay to 0 (a select), a masked position passes the
carry through (decay 1, input 0).  Every other quantity is elementwise:

1. ``V'`` (``next_values``, or the value at the next valid position, or the
   boundary value: :meth:`numpy_chunk._Frame.next_valid`);
2. the weights ``ρ``, ``c``, ``ρpg`` from one ``exp`` of ``log_rhos``;
3. the scan of ``D``, then ``D_{τ(t)}`` as ``D`` shifted by one step (a masked
   position's ``D`` is that of the next valid one), 0 at sequence ends;
4. ``vs = V + D`` and the advantages, with the bootstrap and done cuts as
   selects, and 0 at masked positions.

Float32 problems compute in float64 here, as the contract's reference does,
and round once when the outputs are stored: the per-step decay ``γ c`` rounded
to float32 would err the same way at every on-policy step (``c = λ``), an
error that grows with the horizon ``1 / (1 − γλ)``, and ``exp`` in float32
overflows above about 88.7 and underflows below about −104, where the float64
weights are still finite and nonzero.

Host problems run in blocks of rows small enough to stay in cache (as the
GAE backend's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._problem import widened
from .._vtrace import VTraceProblem
from .numpy_chunk import (
    _chunk,
    _coeff,
    _cut,
    _data,
    _either,
    _finish,
    _flag,
    _Frame,
    _row_blocks,
    _typed,
    reverse_scan,
)


def vtrace(p: VTraceProblem) -> None:
    for block in _row_blocks(p):
        _vtrace(block, _reverse_scan, wide=True)


def _reverse_scan(xp: Any, a: Any, b: Any, init: Any) -> Any:
    """``y_t = a_t y_{t+1} + b_t`` (``y_T = init``) by :func:`numpy_chunk.reverse_scan`."""
    return reverse_scan(xp, a, b, init, _chunk())


def _vtrace(p: VTraceProblem, scan: Callable[[Any, Any, Any, Any], Any], wide: bool) -> None:
    """V-trace of one problem, every step elementwise in ``p.rows.xp`` but the trace's scan.

    ``scan(xp, a, b, init)`` returns ``y_t = a_t y_{t+1} + b_t`` along axis 1 of
    the ``(R, T)`` arrays ``a`` and ``b`` with ``y_T = init`` (``(R,)``), a zero
    ``a_t`` being a select; the ``"cuda"`` backend passes its scan kernel.
    With ``wide`` a float32 problem computes in float64 (the inputs rounded to
    float32 first, as the reference's); without, in float32.
    """
    if wide and p.rows.dtype == np.float32:
        p = widened(p, ("vs", "advantages"))
    rows, xp, dt = p.rows, p.rows.xp, p.rows.dtype
    zero = dt.type(0)
    frame = _Frame(rows, p.last_value)
    valid = _flag(p.mask)
    term = _flag(p.terminated)
    done = _either(xp, term, _flag(p.truncated))
    r = _data(p.rewards, rows)
    v = _data(p.values, rows)
    g = _typed(_coeff(p.gamma, rows), dt)
    lam = _typed(_coeff(p.lam, rows), dt)
    with np.errstate(invalid="ignore", over="ignore"):
        vnext = _data(p.next_values, rows) if p.next_values is not None else frame.next_valid(v, valid, scan)
        e = xp.exp(_data(p.log_rhos, rows))
        # np.minimum keeps a NaN ratio (a NaN log-ratio reaches its own outputs).
        rho = xp.minimum(dt.type(p.rho_bar), e)
        c = lam * xp.minimum(dt.type(p.c_bar), e)
        rpg = xp.minimum(dt.type(p.pg_rho_bar), e)
        boot = g * vnext
        if term is not None:
            boot = xp.where(term, zero, boot)
        td = boot + r - v
        delta = rho * td
        if valid is not None:
            delta = xp.where(valid, delta, zero)
        # A NaN ratio makes δ_t, hence D_t, NaN whatever the decay; a NaN decay
        # would also spread through the scan's decay products (0·NaN) across
        # a cut, so it is replaced by 0.
        decay = g * c
        decay = xp.where(decay != decay, zero, decay)
        # D past each sequence's end (last_trace): a row's scan starts from it; a packed
        # segment folds it into δ at its last position, where the cut decay restarts the
        # scan (a select on a done; a masked last position hands it on unchanged).
        trace = _Frame(rows, p.last_trace)
        if trace.last is not None:
            fold = decay * trace.after
            if done is not None:
                fold = xp.where(done, zero, fold)
            folded = xp.where(trace.last, delta + fold, delta)
            delta = folded if valid is None else xp.where(trace.last & ~valid, trace.after, folded)
        decay = _cut(xp, rows, decay, done, valid, frame)
        D = scan(xp, decay, delta, trace.init)
        d_next = xp.concatenate([D[:, 1:], trace.init[:, None]], axis=1)
        if frame.last is not None:
            d_next = xp.where(frame.last, trace.after, d_next)
        vsp = vnext + d_next
        if done is not None:
            vsp = xp.where(done, vnext, vsp)
        boot = g * vsp
        if term is not None:
            boot = xp.where(term, zero, boot)
        _finish(xp, rpg * (boot + r - v), valid, p.advantages)
        _finish(xp, D, valid, p.vs, plus=v)

