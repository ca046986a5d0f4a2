"""The public functions: resolve the arrays, choose the backend, hand back.

Each public function resolves its arguments' array library (:mod:`gaescan._arrays`),
lets :func:`gaescan._dispatch.choose` pick the backend, and hands the views to
the one internal entry point of its scan (:func:`gaescan._dispatch.run_gae`,
``run_returns``, ``run_scan``), which validates them into a problem and runs
the backend.  Dask arrays go to :mod:`gaescan.backends.dask`, whose blocks
reach the same entry points.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _dispatch, _kept
from . import _validate as v
from ._arrays import Context, any_dask, resolve, takes_dask
from ._problem import GAEResult

__all__ = ["GAEResult", "gae", "discounted_returns", "linear_scan"]

# Nobody holds a Dask array before Dask is imported: one lookup skips the scan of the arguments.
_DASK = "dask"


def _start(kind: str, named: dict[str, Any], out: Any, count: int, backend: str) -> tuple[Context, str, tuple]:
    """The call's context and backend, and its argument types (:func:`gaescan._dispatch.arg_types`)."""
    types = _dispatch.arg_types(kind, named)
    if out is None:
        ctx = resolve(named, types)
    else:
        arrays = dict(named)
        outs = list(out) if count > 1 and isinstance(out, (list, tuple)) else [out]
        for i, o in enumerate(outs):
            arrays[f"out[{i}]" if count > 1 else "out"] = o
        ctx = resolve(arrays)
    return ctx, _dispatch.choose(backend, ctx), types


def _computed_out(ctx: Context, out: Any, count: int) -> Any:
    if out is None:
        return None
    if count > 1:
        if not isinstance(out, (list, tuple)):
            raise ValueError(f"out must be a sequence of {count} arrays (one per output)")
        return [ctx.to_compute(o) for o in out]
    return ctx.to_compute(out)


@takes_dask
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

    Raises
    ------
    TypeError
        For arguments of the wrong type, naming them: mixed array libraries or
        devices, NumPy masked arrays (pass ``x.filled(...)``, or the data with ``mask=``), PyTorch
        tensors on a device other than the CPU or CUDA (such as ``"meta"``).
    ValueError
        For arguments of the wrong shape or value, naming them; and for
        PyTorch tensors with ``requires_grad=True``: the scans are not
        differentiable, so rather than return a result silently cut from the
        autograd graph, the call asks for ``x.detach()``.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> r = np.array([[1.0, 0.0, 1.0]]); v = np.array([[0.5, 0.5, 0.5]])
    >>> adv, ret = gaescan.gae(r, v, gamma=1.0, lam=1.0, dones=np.array([[0, 1, 0]]))
    >>> adv
    array([[ 0.5, -0.5,  0.5]])
    """
    key = None
    if out is None and cu_seqlens is None and last_value is None and last_advantage is None:
        key = _kept.gae_key(backend, axis, gamma, lam, rewards, values, next_values, dones, terminated,
                            truncated, mask)
        if key is not None:
            replay = _kept.KEPT.get(key)
            if replay is not None:
                res = replay(rewards, values, next_values, terminated if dones is None else dones, truncated, mask)
                if res is not None:
                    return GAEResult(*res)
    if _DASK in sys.modules and any_dask(rewards, values, next_values, last_value, last_advantage, dones,
                                         terminated, truncated, mask, gamma, lam, cu_seqlens, out):
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
    ctx, name, types = _start("gae", named, out, 2, backend)
    if ctx.exact:
        # NumPy arrays and Python scalars only: the arguments are their own
        # compute views (the host stream is a shared null context).  A call
        # with a key may be kept (see gaescan._kept).
        with ctx.stream():
            adv, ret = _dispatch.run_gae(np, name, named, axis,
                                         None if out is None else _computed_out(ctx, out, 2), types, key)
        return GAEResult(adv, ret) if out is None else GAEResult(*out)
    with ctx.call(named) as (xp, c):
        adv, ret = _dispatch.run_gae(xp, name, c, axis, _computed_out(ctx, out, 2))
        if out is not None:
            return GAEResult(*out)
        return GAEResult(ctx.from_compute(adv), ctx.from_compute(ret))


@takes_dask
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

    Raises
    ------
    TypeError
        For arguments of the wrong type, naming them: mixed array libraries or
        devices, NumPy masked arrays (pass ``x.filled(...)``, or the data with ``mask=``), PyTorch
        tensors on a device other than the CPU or CUDA (such as ``"meta"``).
    ValueError
        For arguments of the wrong shape or value, naming them; and for
        PyTorch tensors with ``requires_grad=True``: the scans are not
        differentiable, so rather than return a result silently cut from the
        autograd graph, the call asks for ``x.detach()``.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> gaescan.discounted_returns(np.array([1.0, 1.0, 1.0]), gamma=0.5)
    array([1.75, 1.5 , 1.  ])
    """
    if _DASK in sys.modules and any_dask(rewards, dones, last_value, mask, gamma, cu_seqlens, out):
        from .backends import dask as _dask

        return _dask.discounted_returns(rewards, gamma=gamma, dones=dones, last_value=last_value, mask=mask,
                                        cu_seqlens=cu_seqlens, axis=axis, out=out, backend=backend)
    named = dict(rewards=rewards, dones=dones, last_value=last_value, mask=mask,
                 cu_seqlens=cu_seqlens, gamma=gamma)
    ctx, name, types = _start("returns", named, out, 1, backend)
    if ctx.exact:
        with ctx.stream():
            res = _dispatch.run_returns(np, name, named, axis, out, types)
        return res if out is None else out
    with ctx.call(named) as (xp, c):
        res = _dispatch.run_returns(xp, name, c, axis, _computed_out(ctx, out, 1))
        return out if out is not None else ctx.from_compute(res)


@takes_dask
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

    Raises
    ------
    TypeError
        For arguments of the wrong type, naming them: mixed array libraries or
        devices, NumPy masked arrays (pass ``x.filled(...)``), PyTorch
        tensors on a device other than the CPU or CUDA (such as ``"meta"``).
    ValueError
        For arguments of the wrong shape or value, naming them; and for
        PyTorch tensors with ``requires_grad=True``: the scans are not
        differentiable, so rather than return a result silently cut from the
        autograd graph, the call asks for ``x.detach()``.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> gaescan.linear_scan(0.5, np.array([1.0, 1.0, 1.0]))
    array([1.  , 1.5 , 1.75])
    """
    reverse = v.reverse_flag(reverse)
    if _DASK in sys.modules and any_dask(a, b, initial, out):
        from .backends import dask as _dask

        return _dask.linear_scan(a, b, reverse=reverse, initial=initial, axis=axis, out=out, backend=backend)
    named = dict(a=a, b=b, initial=initial)
    ctx, name, types = _start("scan", named, out, 1, backend)
    if ctx.exact:
        with ctx.stream():
            res = _dispatch.run_scan(np, name, named, reverse, axis, out, types)
        return res if out is None else out
    with ctx.call(named) as (xp, c):
        res = _dispatch.run_scan(xp, name, c, reverse, axis, _computed_out(ctx, out, 1))
        return out if out is not None else ctx.from_compute(res)
