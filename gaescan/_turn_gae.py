r"""Turn-level GAE: each turn of a multi-turn episode is one decision step.

:func:`turn_gae` resolves its arrays (:mod:`gaescan._arrays`), validates them
with the same functions as :func:`gaescan.gae` (:mod:`gaescan._validate` and
the plan, coefficient, boundary and output helpers of
:mod:`gaescan._dispatch`), reduces the call to one :class:`TurnGAEProblem`
on ``(R, T)`` row views, and hands it to a backend module:

* ``"numba"``: :mod:`gaescan.backends.turn_gae_numba` (one fused backward
  pass per row, rows in parallel);
* ``"numpy"``: :mod:`gaescan.backends.turn_gae_numpy` (segment sums per turn,
  the ``"numpy"`` GAE backend on the compact turns, and a gather back to the
  tokens; host arrays only, as the compaction reads the mask on the host);
* ``"cuda"``: :mod:`gaescan.backends.turn_gae_cuda` (fixed-shape steps on the
  device: turn starts, per-turn sums and the fill back to the tokens on the
  CUDA scan kernel, the turn-level GAE on the CUDA GAE kernel).

Both host backends check that the ids are non-decreasing along time at
valid tokens and report the first row where they are not through
:func:`decreasing_ids`; the ``"cuda"`` backend does not check them (a check
would read the device on the host).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _dispatch as d
from . import _validate as v
from ._arrays import any_dask, resolve, takes_dask
from ._problem import Coeff, GAEResult, Rows

__all__ = ["turn_gae"]

_MODULES = {
    "numba": "gaescan.backends.turn_gae_numba",
    "numpy": "gaescan.backends.turn_gae_numpy",
    "cuda": "gaescan.backends.turn_gae_cuda",
}
_KEYS = ("rewards", "values", "turn_ids", "mask", "last_value", "gamma", "lam")
_NUMPY_HOST = ("backend='numpy' of turn_gae compacts the valid tokens on the host and cannot run on GPU "
               "arrays without synchronising; use backend='cuda' (the default for GPU arrays) or 'auto'")


@dataclass(slots=True)
class TurnGAEProblem:
    """Turn-level GAE on ``(R, T)`` row views.

    The conventions of :mod:`gaescan._problem` hold for ``rewards``,
    ``values`` and ``mask`` (original dtypes; ``mask`` ``None`` when absent).
    ``turn_ids`` is an integer ``(R, T)`` view of the caller's dtype.
    ``gamma`` and ``lam`` are Python floats rounded to ``dtype`` or ``(R,)``
    arrays (one per row), ``last_value`` a float or an ``(R,)`` array.
    ``batch_shape`` names rows in error messages.
    """

    rows: Rows
    rewards: Any
    values: Any
    turn_ids: Any
    mask: Any
    gamma: Coeff
    lam: Coeff
    last_value: Coeff
    batch_shape: tuple
    advantages: Any
    returns: Any


def decreasing_ids(batch_shape: tuple, row: int) -> ValueError:
    """The error for ids that decrease along time at valid tokens of row ``row``
    (rows numbered in C order over ``batch_shape``)."""
    where = (f"row {row}" if len(batch_shape) <= 1
             else f"row {row} (batch index {tuple(int(i) for i in np.unravel_index(row, batch_shape))})")
    return ValueError(
        f"turn_ids must be non-decreasing along time at valid (mask-true) tokens, but they decrease in "
        f"{where}; give the turns of a row increasing ids in time order (masked tokens' ids are not read)")


def _load(name: str) -> Any:
    return importlib.import_module(_MODULES[name])


def check_turn_ids(ids: Any) -> None:
    """The ``TypeError`` for ``turn_ids`` that are not an integer array (every path's check)."""
    if getattr(ids, "ndim", 1) == 0 and getattr(ids, "dtype", None) is not None and ids.dtype.kind in "iu":
        raise ValueError("'turn_ids' must have at least one dimension (the time axis), as rewards and "
                         "values; got a 0-d array")
    if v.is_scalar(ids) or getattr(ids, "dtype", None) is None or ids.dtype.kind not in "iu":
        dt = getattr(ids, "dtype", type(ids).__name__)
        raise TypeError(
            f"'turn_ids' must be an integer array (one turn id per token), got {dt}; "
            "pass integer ids, e.g. turn_ids.astype(numpy.int32) (NumPy, CuPy) or "
            "turn_ids.to(torch.int32) (PyTorch)")


def ordered_ids(ids: np.ndarray) -> np.ndarray:
    """Host turn ids as int64 in the same order: uint64 ids less 2**63 (their
    top bit flipped, then read as int64: an order-preserving map), others cast."""
    if ids.dtype == np.uint64:
        return (ids ^ np.uint64(1 << 63)).view(np.int64)
    return ids.astype(np.int64, copy=False)


def check_per_row(name: str, shape: tuple, data_shape: tuple, axis: int) -> None:
    """The ``ValueError`` for a γ or λ array of ``shape`` that varies along the time
    ``axis`` of inputs of ``data_shape`` (broadcast from the right; every path's check)."""
    full = (1,) * (len(data_shape) - len(shape)) + shape
    if len(full) == len(data_shape) and full[axis] != 1 and data_shape[axis] != 1:
        raise ValueError(
            f"{name!r} of shape {shape} varies along the time axis; turn_gae takes a "
            f"scalar or per-row {name} (size 1 along the time axis, e.g. shape (B, 1))")


def _plan(xp: Any, c: dict[str, Any], axis: Any) -> d.Plan:
    r = v.data_array(xp, c["rewards"], "rewards")
    val = v.data_array(xp, c["values"], "values")
    ids = c["turn_ids"]
    if r is None or val is None or ids is None:
        raise TypeError("rewards, values and turn_ids are required arrays")
    check_turn_ids(ids)
    v.check_same_shape("rewards", r, values=val, turn_ids=ids, mask=v.data_array(xp, c.get("mask"), "mask"))
    dtype = v.result_dtype(r, val, c.get("last_value"), c.get("gamma"), c.get("lam"))
    plan = d._plan_rows(xp, dtype, tuple(r.shape), axis, None)
    d._coefficient_structure(c, ("gamma", "lam"), plan)
    for name in ("gamma", "lam"):
        g = c.get(name)
        if g is not None and not v.is_scalar(g):
            check_per_row(name, tuple(g.shape), plan.layout.shape, plan.layout.axis)
    return plan


def _per_row(c: Coeff, rows: Rows) -> Coeff:
    """A coefficient as a float or one value per row (``(R,)``, of ``dtype``)."""
    if isinstance(c, float):
        return c
    return np.ascontiguousarray(c[:, 0], dtype=rows.dtype) if rows.xp is np else c[:, 0]


@takes_dask
def turn_gae(
    rewards: Any,
    values: Any,
    turn_ids: Any,
    *,
    gamma: Any,
    lam: Any,
    mask: Any = None,
    last_value: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
) -> GAEResult:
    r"""GAE with each turn of a multi-turn episode as one step.

    In each row (one conversation along ``axis``), turn ``k`` is the set of
    valid (``mask``-true) tokens whose ``turn_ids`` equal ``k``; ids are
    non-decreasing along time at valid tokens (checked on the host; not on
    the GPU, where a turn starts wherever the id changes), so each turn is
    one run of valid tokens.  Turns are taken in id order, and ``k + 1`` is the next
    turn present in the row (ids need not be consecutive):

    .. math::

        R_k &= \sum_{t \in k} r_t, \qquad U_k = V_{\text{first token of } k} \\
        \delta_k &= R_k + \gamma\, U_{k+1} - U_k,
        \qquad U \text{ after the last turn} = \text{last\_value} \\
        A_k &= \delta_k + \gamma \lambda\, A_{k+1},
        \qquad A \text{ after the last turn} = 0 \\
        \mathrm{adv}_t &= A_k, \qquad \mathrm{ret}_t = A_k + U_k
        \qquad \text{for every token } t \text{ of turn } k

    and 0 at masked tokens.  This is :func:`gaescan.gae` on the sequence of
    turns (rewards ``R_k``, values ``U_k``), broadcast back to the turns'
    tokens.  A NaN or inf in a turn's rewards (or its first value) reaches
    that turn and, through the recurrence, earlier turns of the same row,
    never later turns or other rows; values at a turn's other tokens and
    everything at masked tokens are never read.

    Parameters
    ----------
    rewards, values : array_like
        ``r_t`` and ``V_t`` per token, of the same shape.
    turn_ids : array of int
        The turn of each token, of the same shape; read at valid tokens only
        (masked tokens may hold any id, e.g. -1).
    gamma : float or array
        Discount γ in [0, 1] between turns: a scalar or one per row (an array
        with size 1 along the time axis, e.g. ``(B, 1)``).
    lam : float or array
        GAE λ in [0, 1] between turns, same forms as ``gamma``.
    mask : array, optional
        ``False`` marks tokens that are not actions (prompt, padding, tool
        observations): they belong to no turn, are never read, and their
        outputs are 0.  Bool, integer or float; nonzero means true.
    last_value : float or array, optional
        ``U`` after the last turn of each row (the value of the state that
        follows the conversation): a scalar or an array of the batch shape.
        Default 0.
    axis : int, default -1
        The time axis; every other axis is a batch axis.
    out : pair of arrays, optional
        Preallocated ``(advantages, returns)`` of the result's shape and
        dtype, overlapping no input.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` is ``"numba"`` for host arrays and ``"cuda"`` for GPU
        arrays (CuPy, PyTorch CUDA tensors).  ``"numpy"`` takes host arrays
        only.  On the GPU nothing is read back to the host and no stream is
        synchronised; the ids' order is not checked there.  Dask arrays
        (chunked along time and batch in any way) give lazy results; their
        blocks run on the backend of the chunk type.

    Returns
    -------
    GAEResult
        ``(advantages, returns)``, float64 if any float input array is
        float64, else float32, in the inputs' array library.  The sums and
        the recurrence are carried in float64.

    Raises
    ------
    TypeError
        For arguments of the wrong type, naming them: ``turn_ids`` not an
        integer array, mixed array libraries or devices, ``backend="numba"``
        or ``"numpy"`` with GPU arrays, ``backend="cuda"`` with host arrays.
    ValueError
        For arguments of the wrong shape or value, naming them: shapes that
        differ, ids that decrease along time at valid tokens (naming the
        row; host arrays only), γ or λ outside [0, 1] or varying along time, tensors that require
        grad.  When ``out=`` is given and the ids are found to decrease, the
        contents of ``out`` are unspecified.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> r = np.array([0.0, 1.0, 0.0, 0.0, 2.0])
    >>> v = np.array([0.5, 9.0, 1.0, 9.0, 9.0])
    >>> ids = np.array([0, 0, 1, 1, 1])
    >>> adv, ret = gaescan.turn_gae(r, v, ids, gamma=1.0, lam=1.0)
    >>> adv
    array([2.5, 2.5, 1. , 1. , 1. ])
    >>> ret
    array([3., 3., 2., 2., 2.])
    """
    if "dask" in sys.modules and any_dask(rewards, values, turn_ids, mask, last_value, gamma, lam, out):
        from .backends import dask as _dask

        return _dask.turn_gae(rewards, values, turn_ids, gamma=gamma, lam=lam, mask=mask, last_value=last_value,
                              axis=axis, out=out, backend=backend)
    named = dict(rewards=rewards, values=values, turn_ids=turn_ids, mask=mask, last_value=last_value,
                 gamma=gamma, lam=lam)
    if out is None:
        ctx = resolve(named)
    else:
        arrays = dict(named)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        for i, o in enumerate(outs):
            arrays[f"out[{i}]"] = o
        ctx = resolve(arrays)
    name = d.choose(backend, ctx)
    if name == "numpy" and ctx.on_device:
        raise TypeError(_NUMPY_HOST)
    with ctx.call(named) as (xp, c):
        comp_out = None
        if out is not None:
            if not isinstance(out, (list, tuple)):
                raise ValueError("out must be a sequence of 2 arrays (advantages, returns)")
            comp_out = [ctx.to_compute(o) for o in out]
        adv, ret = _run(xp, name, c, axis, comp_out)
        if out is not None:
            return GAEResult(*out)
        return GAEResult(ctx.from_compute(adv), ctx.from_compute(ret))


def _run(xp: Any, name: str, c: dict[str, Any], axis: Any, out: Any) -> list[Any]:
    """Turn-level GAE on resolved arguments: ``[advantages, returns]`` in ``xp``."""
    vals = tuple(map(c.get, _KEYS))
    r, val, ids, mask, lv, g, lam = vals
    plan = d._plan("turn_gae", name, axis, vals, None, _plan, xp, c)
    rows = plan.rows
    gamma = _per_row(d._coefficient(xp, g, "gamma", plan, True), rows)
    lam = _per_row(d._coefficient(xp, lam, "lam", plan, True), rows)
    lv = d._boundary(xp, lv, "last_value", plan, plan.layout.batch_shape, rows.nseg)
    arrays, views, scratch = d._outputs(xp, plan, out, 2, c)
    if rows.R and rows.T:
        if not plan.flat:
            view = plan.layout.rows
            r, val, ids = view(xp, r), view(xp, val), view(xp, ids)
            mask = None if mask is None else view(xp, mask)
        _load(name).turn_gae(TurnGAEProblem(rows, r, val, ids, mask, gamma, lam, lv, plan.layout.batch_shape,
                                            views[0], views[1]))
        if scratch:
            v.finish(xp, plan.layout, scratch)
    return arrays
