r"""V-trace (IMPALA): off-policy corrected value targets and policy-gradient advantages.

:func:`vtrace` resolves its arrays (:mod:`gaescan._arrays`), validates them with
the same functions as :func:`gaescan.gae` (:mod:`gaescan._validate` and the
plan, coefficient, boundary and output helpers of :mod:`gaescan._dispatch`),
reduces the call to one :class:`VTraceProblem` on ``(R, T)`` row views, and
hands it to a backend module:

* ``"numba"``: :mod:`gaescan.backends.vtrace_numba` (one fused backward pass
  per row, rows in parallel);
* ``"numpy"``: :mod:`gaescan.backends.vtrace_numpy` (the chunk-parallel
  reverse scan of the ``"numpy"`` GAE backend; array-API code, so it also
  runs on CuPy arrays without synchronising);
* ``"cuda"``: :mod:`gaescan.backends.vtrace_cuda` (the ``"numpy"``
  algorithm's elementwise steps on the device, its scans on the CUDA scan
  kernel).

Dask arrays go to :func:`gaescan.backends.dask.vtrace`, whose blocks carry
the bootstrap and the trace between time blocks (:func:`gaescan.vtrace_summary`).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import _dispatch as d
from . import _validate as v
from ._arrays import any_dask, resolve, takes_dask
from ._problem import Coeff, Rows

__all__ = ["VTraceResult", "vtrace"]

_MODULES = {
    "numba": "gaescan.backends.vtrace_numba",
    "numpy": "gaescan.backends.vtrace_numpy",
    "cuda": "gaescan.backends.vtrace_cuda",
}
_KEYS = ("rewards", "values", "log_rhos", "next_values", "last_value", "last_trace", "dones", "terminated",
         "truncated", "mask", "cu_seqlens", "gamma", "lam")


class VTraceResult(NamedTuple):
    """Result of :func:`gaescan.vtrace`."""

    vs: Any
    """``v_s``, the V-trace value targets."""
    advantages: Any
    """``ρpg_t (r_t + γ_t (1 − term_t) v_{s,t}' − V_t)``, the policy-gradient advantages."""


@dataclass(slots=True)
class VTraceProblem:
    """``D_t = δ_t + γ_t (1 − done_t) c_t D_{τ(t)}`` with ``δ_t = ρ_t (r_t + γ_t (1 − term_t) V'_t − V_t)``;
    ``vs_t = V_t + D_t``, ``adv_t = ρpg_t (r_t + γ_t (1 − term_t) (V'_t + (1 − done_t) D_{τ(t)}) − V_t)``.

    The conventions of :mod:`gaescan._problem` hold: ``(R, T)`` row views of
    the original dtypes, flags ``None`` when absent (``dones`` folded into
    ``terminated``), ``gamma``/``lam`` Python floats rounded to ``dtype`` or
    ``(R, T)`` views, ``last_value`` and ``last_trace`` floats or length-``nseg``
    arrays.  The clipping thresholds are Python floats rounded to ``dtype``
    (``inf`` for no clipping).  ``D`` past a sequence's last valid step is
    ``last_trace``.
    """

    rows: Rows
    rewards: Any
    values: Any
    log_rhos: Any
    next_values: Any
    terminated: Any
    truncated: Any
    mask: Any
    gamma: Coeff
    lam: Coeff
    rho_bar: float
    c_bar: float
    pg_rho_bar: float
    last_value: Coeff
    vs: Any
    advantages: Any
    last_trace: Coeff = 0.0


def _load(name: str) -> Any:
    return importlib.import_module(_MODULES[name])


def _threshold(x: Any, name: str, dtype: np.dtype) -> float:
    """A clipping threshold: a positive real scalar (``inf`` allowed), rounded to ``dtype``."""
    if not v.is_scalar(x):
        raise TypeError(f"{name!r} must be a positive real number (a scalar), got {type(x).__name__}")
    t = v.scalar_coefficient(x, name, dtype, False)
    if not t > 0:  # also rejects NaN
        raise ValueError(f"{name!r} must be positive (a clipping threshold; inf for no clipping), got {x!r}")
    return t


def _plan(xp: Any, c: dict[str, Any], axis: Any) -> d.Plan:
    dones = c.get("dones")
    v.check_episode_ends(dones, c.get("terminated"), c.get("truncated"), c.get("next_values"),
                         c.get("last_value"))
    term_name = "dones" if dones is not None else "terminated"
    r = v.data_array(xp, c["rewards"], "rewards")
    val = v.data_array(xp, c["values"], "values")
    lr = v.data_array(xp, c["log_rhos"], "log_rhos")
    if r is None or val is None or lr is None:
        raise TypeError("rewards, values and log_rhos are required arrays")
    v.check_same_shape(
        "rewards", r, values=val, log_rhos=lr,
        next_values=v.data_array(xp, c.get("next_values"), "next_values"),
        mask=v.data_array(xp, c.get("mask"), "mask"),
        **{term_name: v.data_array(xp, c.get(term_name), term_name),
           "truncated": v.data_array(xp, c.get("truncated"), "truncated")})
    dtype = v.result_dtype(r, val, lr, c.get("next_values"), c.get("last_value"), c.get("last_trace"),
                           c.get("gamma"), c.get("lam"))
    plan = d._plan_rows(xp, dtype, tuple(r.shape), axis, c.get("cu_seqlens"))
    d._coefficient_structure(c, ("gamma", "lam"), plan)
    return plan


@takes_dask
def vtrace(
    rewards: Any,
    values: Any,
    log_rhos: Any,
    *,
    gamma: Any,
    lam: Any = 1.0,
    rho_bar: Any = 1.0,
    c_bar: Any = 1.0,
    pg_rho_bar: Any = None,
    next_values: Any = None,
    last_value: Any = None,
    last_trace: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
) -> VTraceResult:
    r"""V-trace value targets and policy-gradient advantages (IMPALA).

    With the importance ratios :math:`e^{\ell_t}` of the target policy π over
    the behaviour policy μ (``log_rhos``), for each row backwards in time:

    .. math::

        \rho_t &= \min(\bar\rho, e^{\ell_t}), \qquad
        c_t = \lambda_t \min(\bar c, e^{\ell_t}), \qquad
        \rho^{pg}_t = \min(\bar\rho^{pg}, e^{\ell_t}) \\
        \delta_t &= \rho_t \left(r_t + \gamma_t (1 - \mathrm{term}_t) V'_t - V_t\right) \\
        D_t &= \delta_t + \gamma_t (1 - \mathrm{done}_t)\, c_t\, D_{\tau(t)},
        \qquad D = \text{last\_trace} \text{ past the row's last valid step} \\
        v_{s,t} &= V_t + D_t, \qquad v'_{s,t} = V'_t + (1 - \mathrm{done}_t)\, D_{\tau(t)} \\
        A_t &= \rho^{pg}_t \left(r_t + \gamma_t (1 - \mathrm{term}_t)\, v'_{s,t} - V_t\right)

    where ``V'_t`` is ``next_values[t]`` when given, else the value at the next
    valid step ``τ(t)``, else ``last_value``; ``done_t = term_t or trunc_t``
    (a truncated step bootstraps from ``V'_t`` but cuts the trace).  The
    bootstrap cut and the done cut are selects: a NaN or inf in one episode
    never reaches another one.  With ``log_rhos = 0`` and ``rho_bar, c_bar >= 1``
    (on-policy data), ``vs`` equals ``gaescan.gae(...).returns`` with the same
    λ.

    Parameters
    ----------
    rewards, values : array_like
        ``r_t`` and ``V_t = V(s_t)``, of the same shape.
    log_rhos : array_like
        ``log π(a_t|s_t) − log μ(a_t|s_t)``, of the same shape.
    gamma : float or array
        Discount γ in [0, 1]; a scalar or an array broadcastable to the input
        shape (per row, e.g. ``(B, 1)``, or per step).
    lam : float or array, default 1.0
        The trace λ in [0, 1] (1 is IMPALA's V-trace), same forms as ``gamma``.
    rho_bar, c_bar : float, default 1.0
        Clipping thresholds of the δ weights ρ and the trace weights c:
        positive scalars (``numpy.inf`` for no clipping).
    pg_rho_bar : float, optional
        Clipping threshold of the policy-gradient weights; default ``rho_bar``.
    next_values : array, optional
        ``V'_t = V(s_{t+1})``, the value of the observation that followed step
        ``t`` (at an episode end: the final observation).  Required with
        ``truncated``; exclusive with ``last_value``.
    last_value : float or array, optional
        Bootstrap value after the last step of each row: a scalar or an array
        of the batch shape; with ``cu_seqlens``, shape ``(S,)``.  Default 0.
    last_trace : float or array, optional
        The trace ``D`` after the last step of each row (0 by default, as at
        the end of a trajectory), same forms as ``last_value``: it is
        ``D_{τ(t)}`` of the row's last valid step, in ``D`` and in ``v'_s``,
        unless a done cuts it.  For a row split along time, the later
        slice's ``D`` at its first valid step (:func:`gaescan.vtrace_summary`
        and :func:`gaescan.carry_in`; :func:`gaescan.distributed.vtrace`).
    dones : array, optional
        Episode ends, all treated as terminations.  Exclusive with
        ``terminated``/``truncated``.
    terminated, truncated : array, optional
        Terminal states (no bootstrap) and cut-offs such as time limits
        (bootstrap from ``next_values``).  Flags may be bool, integer or
        float; nonzero means true.
    mask : array, optional
        ``False`` marks positions that are not steps: they are skipped, never
        read, and their outputs are 0.
    cu_seqlens : array of int, optional
        Offsets ``[0, c_1, ..., N]`` packing ``S`` variable-length sequences
        into 1-D inputs of length ``N``; equivalent to one call per segment.
    axis : int, default -1
        The time axis; every other axis is a batch axis.
    out : pair of arrays, optional
        Preallocated ``(vs, advantages)`` of the result's shape and dtype,
        overlapping no input.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` is ``"numba"`` for host arrays and ``"cuda"`` for GPU
        arrays (CuPy, PyTorch CUDA tensors); ``"numpy"`` runs on either.  On
        the GPU nothing is read back to the host and no stream is
        synchronised.  With Dask arrays the result is lazy, each block
        computed by the backend of its chunk type (``out`` and
        ``cu_seqlens`` are refused).

    Returns
    -------
    VTraceResult
        ``(vs, advantages)``, float64 if any float input array is float64,
        else float32, in the inputs' array library.  The CPU backends carry
        the recurrence in float64; the ``"cuda"`` backend in the output dtype,
        as its GAE kernel does.

    Raises
    ------
    TypeError
        For arguments of the wrong type, naming them: mixed array libraries or
        devices, ``backend="numba"`` with GPU arrays or ``backend="cuda"`` with
        host arrays, non-scalar clipping thresholds.
    ValueError
        For arguments of the wrong shape or value, naming them: shapes that
        differ, γ or λ outside [0, 1], a clipping threshold that is not
        positive, ``truncated`` without ``next_values``, tensors that require
        grad.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> r = np.array([1.0, 0.0, 1.0]); v = np.array([0.5, 0.5, 0.5])
    >>> vs, adv = gaescan.vtrace(r, v, np.zeros(3), gamma=1.0, dones=np.array([0, 1, 0]))
    >>> vs
    array([1., 0., 1.])
    >>> adv
    array([ 0.5, -0.5,  0.5])
    """
    if "dask" in sys.modules and any_dask(rewards, values, log_rhos, next_values, last_value, last_trace, dones,
                                          terminated, truncated, mask, gamma, lam, cu_seqlens, out):
        from .backends import dask as _dask

        return _dask.vtrace(rewards, values, log_rhos, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar,
                            pg_rho_bar=pg_rho_bar, next_values=next_values, last_value=last_value,
                            last_trace=last_trace, dones=dones, terminated=terminated, truncated=truncated,
                            mask=mask, cu_seqlens=cu_seqlens, axis=axis, out=out, backend=backend)
    named = dict(rewards=rewards, values=values, log_rhos=log_rhos, next_values=next_values,
                 last_value=last_value, last_trace=last_trace, dones=dones, terminated=terminated,
                 truncated=truncated, mask=mask, cu_seqlens=cu_seqlens, gamma=gamma, lam=lam)
    if out is None:
        ctx = resolve(named)
    else:
        arrays = dict(named)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        for i, o in enumerate(outs):
            arrays[f"out[{i}]"] = o
        ctx = resolve(arrays)
    name = d.choose(backend, ctx)
    with ctx.call(named) as (xp, c):
        comp_out = None
        if out is not None:
            if not isinstance(out, (list, tuple)):
                raise ValueError("out must be a sequence of 2 arrays (vs, advantages)")
            comp_out = [ctx.to_compute(o) for o in out]
        vs, adv = _run(xp, name, c, axis, comp_out, rho_bar, c_bar, pg_rho_bar)
        if out is not None:
            return VTraceResult(*out)
        return VTraceResult(ctx.from_compute(vs), ctx.from_compute(adv))


def _run(xp: Any, name: str, c: dict[str, Any], axis: Any, out: Any, rho_bar: Any, c_bar: Any,
         pg_rho_bar: Any) -> list[Any]:
    """V-trace on resolved arguments: ``[vs, advantages]`` in ``xp``."""
    vals = tuple(map(c.get, _KEYS))
    r, val, lr, nv, lv, lt, dones, term, trunc, mask, cu, g, lam = vals
    plan = d._plan("vtrace", name, axis, vals, None, _plan, xp, c)
    rows = plan.rows if cu is None else d._rows(xp, plan, c, axis)
    gamma = d._coefficient(xp, g, "gamma", plan, True)
    lam = d._coefficient(xp, lam, "lam", plan, True)
    rb = _threshold(rho_bar, "rho_bar", plan.dtype)
    cb = _threshold(c_bar, "c_bar", plan.dtype)
    pb = rb if pg_rho_bar is None else _threshold(pg_rho_bar, "pg_rho_bar", plan.dtype)
    batch = plan.layout.batch_shape if cu is None else (rows.nseg,)
    lv = d._boundary(xp, lv, "last_value", plan, batch, rows.nseg)
    lt = d._boundary(xp, lt, "last_trace", plan, batch, rows.nseg)
    # The batch-major float32 lanes kernels start their blocks where the outputs'
    # 64-byte lines start, and their last bits depend on where that is: outputs
    # allocated here start 16 bytes past a line (where NumPy places most large
    # arrays, so that the inputs' loads align too), so that the same inputs give
    # the same bits on every call (gaescan.backends.vtrace_numba._lanes_stream).
    arrays, views, scratch = d._outputs(xp, plan, out, 2, c, line_offset=16)
    if rows.R and rows.T:
        if dones is not None:
            term = dones
        if not plan.flat:
            view = plan.layout.rows
            r, val, lr = view(xp, r), view(xp, val), view(xp, lr)
            nv, term, trunc, mask = (None if x is None else view(xp, x) for x in (nv, term, trunc, mask))
        _load(name).vtrace(VTraceProblem(rows, r, val, lr, nv, term, trunc, mask, gamma, lam, rb, cb, pb, lv,
                                         views[0], views[1], lt))
        if scratch:
            v.finish(xp, plan.layout, scratch)
    return arrays

