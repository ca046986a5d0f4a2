"""The public functions: validate, normalise, dispatch, hand back."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _dispatch
from . import _validate as v
from ._arrays import Context, any_dask, may_overlap, resolve
from ._problem import GAEProblem, ReturnsProblem, Rows, ScanProblem

__all__ = ["GAEResult", "gae", "discounted_returns", "linear_scan"]


class GAEResult(NamedTuple):
    """Result of :func:`gae`."""

    advantages: Any
    """``A_t``, the generalised advantage estimates."""
    returns: Any
    """``R_t = A_t + V_t``, the TD(λ) returns (value-function targets)."""


def _start(named: dict[str, Any], out: Any, count: int, backend: str) -> tuple[Context, str]:
    arrays = dict(named)
    if out is not None:
        outs = list(out) if count > 1 and isinstance(out, (list, tuple)) else [out]
        for i, o in enumerate(outs):
            arrays[f"out[{i}]" if count > 1 else "out"] = o
    ctx = resolve(arrays)
    return ctx, _dispatch.choose(backend, ctx)


def _computed_out(ctx: Context, out: Any, count: int) -> Any:
    if out is None:
        return None
    if count > 1:
        if not isinstance(out, (list, tuple)):
            raise ValueError(f"out must be a sequence of {count} arrays (one per output)")
        return [ctx.to_compute(o) for o in out]
    return ctx.to_compute(out)


_HOST_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_numba_cpu: Any = None
_cuda: Any = None


def _lean_last_value(t: type, rewards: Any, values: Any, gamma: Any, lam: Any, dones: Any, mask: Any,
                     last_value: Any) -> Any:
    """The checks both lean paths share: ``rewards`` and ``values`` C-contiguous
    float32/float64 arrays of one dtype and shape, flags of type ``t`` (1 byte,
    C-contiguous) or none, Python-scalar γ, λ in [0, 1] and ``last_value``.
    Returns ``last_value`` as a number (0.0 for ``None``), or ``None`` when the
    call is not for a lean path."""
    dt = rewards.dtype
    shape = rewards.shape
    if (values.dtype != dt or dt not in _HOST_FLOATS or values.shape != shape or not shape
            or not rewards.size or not rewards.flags.c_contiguous or not values.flags.c_contiguous):
        return None
    for c in (gamma, lam):
        if (type(c) is not float and type(c) is not int) or not 0 <= c <= 1:
            return None
    if last_value is None:
        last_value = 0.0
    elif type(last_value) is not float and type(last_value) is not int:
        return None
    for f in (dones, mask):
        if f is not None and (type(f) is not t or f.shape != shape or f.dtype.itemsize != 1
                              or f.dtype.kind not in "biu" or not f.flags.c_contiguous):
            return None
    return last_value


def _gae_host_fast(rewards: Any, values: Any, gamma: Any, lam: Any, dones: Any, mask: Any,
                   last_value: Any) -> Any:
    """The commonest call — C-contiguous NumPy float32/float64 arrays of one
    dtype and shape, time last, 1-byte ``dones`` and ``mask`` or none, Python-scalar γ, λ
    and ``last_value`` — validated in a few comparisons and sent straight to
    the Numba kernels.  Returns ``None`` for anything else (or anything
    doubtful, such as a γ outside [0, 1]): the general path then handles the
    call, and raises its errors.  Both paths run the same kernels."""
    global _numba_cpu
    if type(rewards) is not np.ndarray or type(values) is not np.ndarray:
        return None
    last_value = _lean_last_value(np.ndarray, rewards, values, gamma, lam, dones, mask, last_value)
    if last_value is None:
        return None
    if _numba_cpu is None:
        _numba_cpu = _dispatch.load("numba")
    return GAEResult(*_numba_cpu.gae_host_fast(rewards, values, dones, mask, gamma, lam, last_value))


def _gae_device_fast(rewards: Any, values: Any, gamma: Any, lam: Any, dones: Any, mask: Any,
                     last_value: Any, out: Any, backend: str) -> Any:
    """The commonest GPU call — C-contiguous CuPy float32/float64 arrays of one
    dtype, shape and device, time last, 1-byte ``dones`` and ``mask`` or none,
    Python-scalar γ, λ and ``last_value``, and ``out=`` (if given) two
    C-contiguous arrays of the result's shape and dtype that overlap nothing —
    checked in a few comparisons and sent straight to the ``"cuda"`` backend.
    NumPy arrays with ``backend="cuda"`` take it as well under Numba's CUDA
    simulator.  Returns ``None`` for anything else: the general path then
    handles the call, and raises its errors.  Both paths launch the same kernel
    with the same arguments."""
    global _cuda
    t = type(rewards)
    if type(values) is not t:
        return None
    if t is np.ndarray:
        if backend != "cuda" or not _dispatch.cuda_simulator():
            return None
        xp = np
    elif t.__module__.partition(".")[0] == "cupy":
        xp = sys.modules["cupy"]
    else:
        return None
    last_value = _lean_last_value(t, rewards, values, gamma, lam, dones, mask, last_value)
    if last_value is None:
        return None
    dt = rewards.dtype
    shape = rewards.shape
    arrays = [x for x in (rewards, values, dones, mask) if x is not None]
    if out is not None:
        if type(out) not in (tuple, list) or len(out) != 2:
            return None
        for o in out:
            if (type(o) is not t or o.shape != shape or o.dtype != dt or not o.flags.c_contiguous
                    or (xp is np and not o.flags.writeable)):
                return None
        if any(may_overlap(xp, o, x) for o in out for x in arrays) or may_overlap(xp, out[0], out[1]):
            return None
        adv, ret = out
    if xp is not np:
        dev = rewards.data.device_id
        if any(x.data.device_id != dev for x in arrays[1:]) or (
                out is not None and (adv.data.device_id != dev or ret.data.device_id != dev)):
            return None
    if out is None:
        adv = xp.empty(shape, dtype=dt)
        ret = xp.empty(shape, dtype=dt)
    T = shape[-1]
    R = rewards.size // T
    cast = dt.type
    p = GAEProblem(
        rows=Rows(xp=xp, dtype=dt, R=R, T=T, cu_seqlens=None, nseg=R),
        rewards=rewards.reshape(R, T), values=values.reshape(R, T), next_values=None,
        terminated=None if dones is None else dones.reshape(R, T), truncated=None,
        mask=None if mask is None else mask.reshape(R, T),
        gamma=float(cast(gamma)), lam=float(cast(lam)), last_value=float(cast(last_value)),
        advantages=adv.reshape(R, T), returns=ret.reshape(R, T),
    )
    if _cuda is None:
        _cuda = _dispatch.load("cuda")
    _cuda.gae(p)
    return GAEResult(*out) if out is not None else GAEResult(adv, ret)


def gae(
    rewards: Any,
    values: Any,
    *,
    gamma: Any,
    lam: Any,
    next_values: Any = None,
    last_value: Any = None,
    last_advantage: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Sequence[Any] | None = None,
    backend: str = "auto",
) -> GAEResult:
    r"""Generalized advantage estimation (GAE) and TD(λ) returns.

    For each row (one sequence of steps along ``axis``), backwards in time:

    .. math::

        \delta_t &= r_t + \gamma_t\,(1 - \mathrm{term}_t)\,V'_t - V_t \\
        A_t &= \delta_t + \gamma_t \lambda_t\,(1 - \mathrm{done}_t)\,A_{t+1},
        \qquad A_T = \text{last\_advantage} \ (\text{default } 0) \\
        R_t &= A_t + V_t

    where ``V'_t`` is ``next_values[t]`` when given, else ``V_{t+1}``, and
    ``last_value`` after the last step.  ``done_t = term_t or trunc_t``: a
    truncated step bootstraps from ``V'_t`` but cuts the advantage sum.  The
    bootstrap and the cut are selects, so a NaN in one episode never reaches
    another one.

    Parameters
    ----------
    rewards, values : array_like
        ``r_t`` and ``V_t = V(s_t)``, of the same shape.
    gamma : float or array
        Discount γ in [0, 1]; a scalar or an array broadcastable to the input
        shape (per row, e.g. ``(B, 1)``, or per step).
    lam : float or array
        GAE λ in [0, 1], same forms as ``gamma``.
    next_values : array, optional
        ``V'_t = V(s_{t+1})``, the value of the observation that followed step
        ``t`` (at an episode end: the final observation, not the reset one).
        Required with ``truncated``; exclusive with ``last_value``.
    last_value : float or array, optional
        Bootstrap value after the last step of each row: a scalar or an
        array of the batch shape (the input shape without ``axis``); with
        ``cu_seqlens``, shape ``(S,)``.  Default 0.
    last_advantage : float or array, optional
        ``A_T``, the advantage carried in from after the last step of each
        row (same forms as ``last_value``; default 0): the carry-in of a
        sequence computed in time slices.  The slice before another one gets
        ``last_advantage`` = the advantage at the later slice's first step
        and ``last_value`` = the value there (see :func:`gaescan.gae_summary`
        and :func:`gaescan.carry_in`).  With ``mask``, it is ``A`` at the next
        valid position after the row.
    dones : array, optional
        Episode ends, all treated as terminations.  Exclusive with
        ``terminated``/``truncated``.
    terminated, truncated : array, optional
        Terminal states (no bootstrap) and cut-offs such as time limits
        (bootstrap from ``next_values``).  Flags may be bool, integer or
        float; nonzero means true.
    mask : array, optional
        ``False`` marks positions that are not steps (padding, prompt or
        tool tokens): they are skipped — ``V'`` and ``A_{t+1}`` come from the
        next unmasked position — never read, and their outputs are 0.
    cu_seqlens : array of int, optional
        Offsets ``[0, c_1, ..., N]`` packing ``S`` variable-length sequences
        into 1-D inputs of length ``N``; equivalent to one call per segment.
    axis : int, default -1
        The time axis; every other axis is a batch axis.
    out : pair of arrays, optional
        Preallocated ``(advantages, returns)`` of the result's shape and dtype,
        overlapping no input.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` follows the array type (NumPy → ``"numba"``, GPU → ``"cuda"``).

    Returns
    -------
    GAEResult
        ``(advantages, returns)``, float64 if any float input array is float64,
        else float32, in the inputs' array library.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> r = np.array([[1.0, 0.0, 1.0]]); v = np.array([[0.5, 0.5, 0.5]])
    >>> adv, ret = gaescan.gae(r, v, gamma=1.0, lam=1.0, dones=np.array([[0, 1, 0]]))
    >>> adv
    array([[ 0.5, -0.5,  0.5]])
    """
    if (next_values is None and last_advantage is None and terminated is None and truncated is None
            and cu_seqlens is None and type(axis) is int and axis == -1):
        if out is None and (backend == "auto" or backend == "numba"):
            fast = _gae_host_fast(rewards, values, gamma, lam, dones, mask, last_value)
            if fast is not None:
                return fast
        if backend == "auto" or backend == "cuda":
            fast = _gae_device_fast(rewards, values, gamma, lam, dones, mask, last_value, out, backend)
            if fast is not None:
                return fast
    if any_dask(rewards, values, next_values, last_value, last_advantage, dones, terminated,
                truncated, mask, gamma, lam, cu_seqlens, out):
        from .backends import dask as _dask

        return _dask.gae(rewards, values, gamma=gamma, lam=lam, next_values=next_values,
                         last_value=last_value, last_advantage=last_advantage, dones=dones,
                         terminated=terminated, truncated=truncated, mask=mask, cu_seqlens=cu_seqlens,
                         axis=axis, out=out, backend=backend)
    named = dict(
        rewards=rewards, values=values, next_values=next_values, last_value=last_value,
        last_advantage=last_advantage, dones=dones, terminated=terminated, truncated=truncated, mask=mask,
        cu_seqlens=cu_seqlens, gamma=gamma, lam=lam,
    )
    ctx, name = _start(named, out, 2, backend)
    with ctx.call(named) as (xp, c):
        v.check_episode_ends(dones, terminated, truncated, next_values, last_value)
        r = v.data_array(xp, c["rewards"], "rewards")
        val = v.data_array(xp, c["values"], "values")
        if r is None or val is None:
            raise TypeError("rewards and values are required arrays")
        nv = v.data_array(xp, c["next_values"], "next_values")
        term = v.data_array(xp, c["dones"] if dones is not None else c["terminated"],
                            "dones" if dones is not None else "terminated")
        trunc = v.data_array(xp, c["truncated"], "truncated")
        mask_ = v.data_array(xp, c["mask"], "mask")
        v.check_same_shape("rewards", r, values=val, next_values=nv, mask=mask_,
                           **{"dones" if dones is not None else "terminated": term, "truncated": trunc})
        dtype = v.result_dtype(r, val, nv, c["last_value"], c["last_advantage"], c["gamma"], c["lam"])
        cu = None
        if cu_seqlens is not None:
            cu = v.packed_offsets(xp, c["cu_seqlens"], tuple(r.shape), axis)
        layout = v.layout_of(tuple(r.shape), axis)
        rows = v.make_rows(xp, dtype, layout, cu)
        shape = layout.shape
        gamma_ = v.coefficient(xp, c["gamma"], "gamma", shape, layout, dtype, unit_range=True)
        lam_ = v.coefficient(xp, c["lam"], "lam", shape, layout, dtype, unit_range=True)
        batch = layout.batch_shape if cu is None else (rows.nseg,)
        last = v.boundary_value(xp, c["last_value"], "last_value", batch, rows.nseg, dtype)
        last_adv = v.boundary_value(xp, c["last_advantage"], "last_advantage", batch, rows.nseg, dtype)
        inputs = [(k, c[k]) for k in ("rewards", "values", "next_values", "dones", "terminated",
                                      "truncated", "mask", "gamma", "lam", "last_value", "last_advantage",
                                      "cu_seqlens")]
        outs = v.outputs(xp, _computed_out(ctx, out, 2), 2, layout, dtype, inputs)
        if layout.R and layout.T:
            p = GAEProblem(
                rows=rows,
                rewards=layout.rows(xp, r),
                values=layout.rows(xp, val),
                next_values=None if nv is None else layout.rows(xp, nv),
                terminated=None if term is None else layout.rows(xp, term),
                truncated=None if trunc is None else layout.rows(xp, trunc),
                mask=None if mask_ is None else layout.rows(xp, mask_),
                gamma=gamma_, lam=lam_, last_value=last,
                advantages=outs[0].rows, returns=outs[1].rows, last_advantage=last_adv,
            )
            _dispatch.load(name).gae(p)
            v.finish(xp, layout, outs)
        if out is not None:
            return GAEResult(*out)
        return GAEResult(*(ctx.from_compute(o.array) for o in outs))


def discounted_returns(
    rewards: Any,
    *,
    gamma: Any,
    dones: Any = None,
    last_value: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
) -> Any:
    r"""Discounted rewards-to-go.

    .. math::

        G_t = r_t + \gamma_t\,(1 - \mathrm{done}_t)\,G_{t+1}, \qquad G_T = \text{last\_value}

    A done cuts the sum (a select: values after it are never mixed in).

    Parameters
    ----------
    rewards : array_like
        ``r_t``.
    gamma : float or array
        Discount γ in [0, 1]: a scalar or an array broadcastable to
        ``rewards`` (per row or per step).
    dones : array, optional
        Episode ends (bool, integer or float; nonzero means true).
    last_value : float or array, optional
        ``G`` after the last step of each row (scalar, batch shape, or ``(S,)``
        with ``cu_seqlens``).  Default 0.
    mask : array, optional
        Positions that are not steps: skipped, never read, output 0.
    cu_seqlens : array of int, optional
        Offsets packing variable-length sequences into 1-D inputs.
    axis : int, default -1
        The time axis.
    out : array, optional
        Preallocated result (its shape and dtype), overlapping no input.
    backend : {"auto", "numba", "numpy", "cuda"}
        Backend override.

    Returns
    -------
    array
        ``G``, float64 if any float input array is float64, else float32.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> gaescan.discounted_returns(np.array([1.0, 1.0, 1.0]), gamma=0.5)
    array([1.75, 1.5 , 1.  ])
    """
    if any_dask(rewards, dones, last_value, mask, gamma, cu_seqlens, out):
        from .backends import dask as _dask

        return _dask.discounted_returns(rewards, gamma=gamma, dones=dones, last_value=last_value, mask=mask,
                                        cu_seqlens=cu_seqlens, axis=axis, out=out, backend=backend)
    named = dict(rewards=rewards, dones=dones, last_value=last_value, mask=mask,
                 cu_seqlens=cu_seqlens, gamma=gamma)
    ctx, name = _start(named, out, 1, backend)
    with ctx.call(named) as (xp, c):
        r = v.data_array(xp, c["rewards"], "rewards")
        if r is None:
            raise TypeError("rewards is a required array")
        d = v.data_array(xp, c["dones"], "dones")
        mask_ = v.data_array(xp, c["mask"], "mask")
        v.check_same_shape("rewards", r, dones=d, mask=mask_)
        dtype = v.result_dtype(r, c["last_value"], c["gamma"])
        cu = None
        if cu_seqlens is not None:
            cu = v.packed_offsets(xp, c["cu_seqlens"], tuple(r.shape), axis)
        layout = v.layout_of(tuple(r.shape), axis)
        rows = v.make_rows(xp, dtype, layout, cu)
        gamma_ = v.coefficient(xp, c["gamma"], "gamma", layout.shape, layout, dtype, unit_range=True)
        batch = layout.batch_shape if cu is None else (rows.nseg,)
        last = v.boundary_value(xp, c["last_value"], "last_value", batch, rows.nseg, dtype)
        inputs = list(c.items())
        outs = v.outputs(xp, _computed_out(ctx, out, 1), 1, layout, dtype, inputs)
        if layout.R and layout.T:
            p = ReturnsProblem(
                rows=rows,
                rewards=layout.rows(xp, r),
                dones=None if d is None else layout.rows(xp, d),
                mask=None if mask_ is None else layout.rows(xp, mask_),
                gamma=gamma_, last_value=last, returns=outs[0].rows,
            )
            _dispatch.load(name).discounted_returns(p)
            v.finish(xp, layout, outs)
        return out if out is not None else ctx.from_compute(outs[0].array)


def linear_scan(
    a: Any,
    b: Any,
    *,
    reverse: bool = False,
    initial: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
) -> Any:
    r"""First-order linear recurrence, the primitive under every discounted scan.

    .. math::

        \text{forward:}\quad y_t = a_t\,y_{t-1} + b_t,\quad y_{-1} = \text{initial} \\
        \text{reverse:}\quad y_t = a_t\,y_{t+1} + b_t,\quad y_{T} = \text{initial}

    Two steps compose as affine maps, ``(a1, b1) ∘ (a2, b2) = (a1·a2, b1 + a1·b2)``,
    which is what the chunk-parallel backends exploit.

    Parameters
    ----------
    a : float or array
        Decay: a scalar or an array broadcastable to ``b`` (any real values).
    b : array_like
        Inputs.
    reverse : bool, default False
        Scan from the end of the time axis.
    initial : float or array, optional
        Boundary value: a scalar or an array of the batch shape.  Default 0.
    axis : int, default -1
        The time axis.
    out : array, optional
        Preallocated result, overlapping no input.
    backend : {"auto", "numba", "numpy", "cuda"}
        Backend override.

    Returns
    -------
    array
        ``y``, float64 if any float input array is float64, else float32.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> gaescan.linear_scan(0.5, np.array([1.0, 1.0, 1.0]))
    array([1.  , 1.5 , 1.75])
    """
    if not isinstance(reverse, (bool,)) and not (hasattr(reverse, "dtype") and reverse.dtype == bool):
        raise TypeError(f"reverse must be a bool, got {reverse!r}")
    if any_dask(a, b, initial, out):
        from .backends import dask as _dask

        return _dask.linear_scan(a, b, reverse=reverse, initial=initial, axis=axis, out=out, backend=backend)
    named = dict(a=a, b=b, initial=initial)
    ctx, name = _start(named, out, 1, backend)
    with ctx.call(named) as (xp, c):
        b_ = v.data_array(xp, c["b"], "b")
        if b_ is None:
            raise TypeError("b is a required array")
        dtype = v.result_dtype(c["a"], b_, c["initial"])
        layout = v.layout_of(tuple(b_.shape), axis)
        rows = v.make_rows(xp, dtype, layout, None)
        a_ = v.coefficient(xp, c["a"], "a", layout.shape, layout, dtype, unit_range=False)
        init = v.boundary_value(xp, c["initial"], "initial", layout.batch_shape, rows.nseg, dtype)
        outs = v.outputs(xp, _computed_out(ctx, out, 1), 1, layout, dtype, list(c.items()))
        if layout.R and layout.T:
            p = ScanProblem(rows=rows, a=a_, b=layout.rows(xp, b_), reverse=bool(reverse),
                            initial=init, out=outs[0].rows)
            _dispatch.load(name).linear_scan(p)
            v.finish(xp, layout, outs)
        return out if out is not None else ctx.from_compute(outs[0].array)
