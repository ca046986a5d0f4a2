"""Backend selection: which module computes a call.

Each backend is one module in :mod:`gaescan.backends` exposing the same three
functions (``gae``, ``discounted_returns``, ``linear_scan``) over the problems
of :mod:`gaescan._problem`.  Modules are imported on first use only, and a
backend never falls back to another one silently.  :func:`run_gae`,
:func:`run_returns` and :func:`run_scan` are the one route from resolved
arguments through validation to a backend.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from . import _validate as v
from ._arrays import Context
from ._problem import GAEProblem, ReturnsProblem, Rows, ScanProblem

BACKENDS = ("auto", "numba", "numpy", "cuda")

_MODULES = {
    "numba": "gaescan.backends.numba_cpu",
    "numpy": "gaescan.backends.numpy_chunk",
    "cuda": "gaescan.backends.cuda",
}

_EXTRAS = {
    "numba": "pip install numba (a required dependency of gaescan: reinstall gaescan)",
    "numpy": "pip install numpy",
    "cuda": "pip install 'gaescan[cuda12]' or 'gaescan[cuda13]' (numba-cuda and the matching CuPy)",
}


def cuda_simulator() -> bool:
    """True when Numba's CUDA simulator is enabled (kernels then run on host arrays)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def choose(backend: str, ctx: Context) -> str:
    """Resolve ``backend`` (``"auto"`` or a name) for the call's arrays."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends are {', '.join(map(repr, BACKENDS))}")
    if backend == "auto":
        return "cuda" if ctx.on_device else "numba"
    if backend == "numba" and ctx.on_device:
        raise TypeError(
            "backend='numba' runs on the CPU and cannot read GPU arrays; "
            "use backend='cuda' (or 'auto'), or move the arrays to the host first"
        )
    if backend == "cuda" and not ctx.on_device and not cuda_simulator():
        raise TypeError(
            "backend='cuda' needs GPU arrays (CuPy, PyTorch CUDA tensors or any "
            "__cuda_array_interface__ array); move the data with cupy.asarray(...) "
            "or use backend='numba' for host arrays"
        )
    return backend


_LOADED: dict[str, ModuleType] = {}


def load(name: str) -> ModuleType:
    """Import a backend module (once), naming the missing extra if it cannot be."""
    mod = _LOADED.get(name)
    if mod is not None:
        return mod
    try:
        mod = importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise ImportError(f"the {name!r} backend is unavailable ({exc}); {_EXTRAS[name]}") from exc
    _LOADED[name] = mod
    return mod


# --------------------------------------------------------------------------- the internal entry points
#
# The public functions (and the carry API and the Dask blocks, which have
# resolved their arrays already) reach a backend through these three: the
# arguments ``c`` are views in the compute namespace ``xp``, ``name`` is a
# backend chosen by :func:`choose`, and ``out`` is ``None`` or views of the
# caller's outputs.  Each call is validated and normalised into a problem,
# once; the problem goes to the backend.  The results come back in ``xp``.
#
# The structural half of the validation (types, dtypes, shapes, which
# arguments are present, the axis) gives a *plan*: the output dtype, the
# layout and the rows.  A plan depends only on the call's structure, so it is
# kept, keyed on that structure, and a later call of the same structure starts
# from it.  Everything that depends on values (coefficient ranges, boundary
# values, ``cu_seqlens`` offsets, output overlaps) runs on every call.


@dataclass(frozen=True)
class Plan:
    """The structural result of validating a call."""

    dtype: np.dtype
    layout: v.Layout
    rows: Rows | None  # None with cu_seqlens: the rows hold the call's offsets
    extra: str = ""  # gae: the name of the terminations argument ("dones" or "terminated")


_PLANS: dict[tuple, Plan] = {}
_PLANS_MAX = 512
_KEYED_SCALARS = (float, int, bool)
# Every argument of each scan, in a fixed order: callers' dicts may differ in keys and order.
_KEYS = {
    "gae": ("rewards", "values", "next_values", "last_value", "last_advantage", "dones", "terminated",
            "truncated", "mask", "cu_seqlens", "gamma", "lam"),
    "returns": ("rewards", "dones", "last_value", "mask", "cu_seqlens", "gamma"),
    "scan": ("a", "b", "initial"),
}


def _signature(kind: str, name: str, axis: Any, c: dict[str, Any]) -> tuple | None:
    """The call's structure: types, dtypes and shapes of the arguments (``None`` if uncacheable).

    The plan reads no strides and no values, so none are in the key; a
    ``cu_seqlens`` call is not kept (its rows hold the offsets).
    """
    if type(axis) is not int:
        return None
    key: list[Any] = [kind, name, axis]
    for k in _KEYS[kind]:
        x = c.get(k)
        if x is None:
            key.append(None)
            continue
        t = type(x)
        if t is np.ndarray:
            key.append((x.dtype, x.shape))
        elif t in _KEYED_SCALARS or isinstance(x, np.generic):
            key.append(t)
        elif t.__module__[:5] == "cupy.":
            key.append((t, x.dtype, x.shape))
        else:
            return None
    return tuple(key)


def _planned(key: tuple | None, build: Any) -> Plan:
    if key is None:
        return build()
    plan = _PLANS.get(key)
    if plan is None:
        plan = build()
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _gae_plan(xp: Any, c: dict[str, Any], axis: Any) -> Plan:
    dones = c.get("dones")
    v.check_episode_ends(dones, c.get("terminated"), c.get("truncated"), c.get("next_values"),
                         c.get("last_value"))
    term_name = "dones" if dones is not None else "terminated"
    r = v.data_array(xp, c["rewards"], "rewards")
    val = v.data_array(xp, c["values"], "values")
    if r is None or val is None:
        raise TypeError("rewards and values are required arrays")
    v.check_same_shape(
        "rewards", r, values=val, next_values=v.data_array(xp, c.get("next_values"), "next_values"),
        mask=v.data_array(xp, c.get("mask"), "mask"),
        **{term_name: v.data_array(xp, c.get(term_name), term_name),
           "truncated": v.data_array(xp, c.get("truncated"), "truncated")})
    dtype = v.result_dtype(r, val, c.get("next_values"), c.get("last_value"), c.get("last_advantage"),
                           c.get("gamma"), c.get("lam"))
    return _plan_rows(xp, dtype, tuple(r.shape), axis, c.get("cu_seqlens"), term_name)


def _plan_rows(xp: Any, dtype: np.dtype, shape: tuple, axis: Any, cu: Any, extra: str = "") -> Plan:
    layout = v.layout_of(shape, axis)
    rows = v.make_rows(xp, dtype, layout, None) if cu is None else None
    return Plan(dtype, layout, rows, extra)


def _rows(xp: Any, plan: Plan, c: dict[str, Any], axis: Any) -> Rows:
    if plan.rows is not None:
        return plan.rows
    cu = v.packed_offsets(xp, c["cu_seqlens"], plan.layout.shape, axis)
    return v.make_rows(xp, plan.dtype, plan.layout, cu)


def run_gae(xp: Any, name: str, c: dict[str, Any], axis: Any = -1, out: Any = None) -> list[Any]:
    """GAE on already-resolved arguments: ``[advantages, returns]`` in ``xp``."""
    plan = _planned(_signature("gae", name, axis, c), lambda: _gae_plan(xp, c, axis))
    layout, dtype = plan.layout, plan.dtype
    rows = _rows(xp, plan, c, axis)
    shape = layout.shape
    gamma = v.coefficient(xp, c["gamma"], "gamma", shape, layout, dtype, unit_range=True)
    lam = v.coefficient(xp, c["lam"], "lam", shape, layout, dtype, unit_range=True)
    batch = layout.batch_shape if rows.cu_seqlens is None else (rows.nseg,)
    last = v.boundary_value(xp, c.get("last_value"), "last_value", batch, rows.nseg, dtype)
    last_adv = v.boundary_value(xp, c.get("last_advantage"), "last_advantage", batch, rows.nseg, dtype)
    outs = v.outputs(xp, out, 2, layout, dtype, list(c.items()) if out is not None else ())
    if layout.R and layout.T:
        nv, term, trunc, mask = c.get("next_values"), c.get(plan.extra), c.get("truncated"), c.get("mask")
        p = GAEProblem(
            rows=rows,
            rewards=layout.rows(xp, c["rewards"]),
            values=layout.rows(xp, c["values"]),
            next_values=None if nv is None else layout.rows(xp, nv),
            terminated=None if term is None else layout.rows(xp, term),
            truncated=None if trunc is None else layout.rows(xp, trunc),
            mask=None if mask is None else layout.rows(xp, mask),
            gamma=gamma, lam=lam, last_value=last,
            advantages=outs[0].rows, returns=outs[1].rows, last_advantage=last_adv,
        )
        load(name).gae(p)
        v.finish(xp, layout, outs)
    return [o.array for o in outs]


def _returns_plan(xp: Any, c: dict[str, Any], axis: Any) -> Plan:
    r = v.data_array(xp, c["rewards"], "rewards")
    if r is None:
        raise TypeError("rewards is a required array")
    v.check_same_shape("rewards", r, dones=v.data_array(xp, c.get("dones"), "dones"),
                       mask=v.data_array(xp, c.get("mask"), "mask"))
    dtype = v.result_dtype(r, c.get("last_value"), c.get("gamma"))
    return _plan_rows(xp, dtype, tuple(r.shape), axis, c.get("cu_seqlens"))


def run_returns(xp: Any, name: str, c: dict[str, Any], axis: Any = -1, out: Any = None) -> Any:
    """Discounted returns on already-resolved arguments: the result in ``xp``."""
    plan = _planned(_signature("returns", name, axis, c), lambda: _returns_plan(xp, c, axis))
    layout, dtype = plan.layout, plan.dtype
    rows = _rows(xp, plan, c, axis)
    gamma = v.coefficient(xp, c["gamma"], "gamma", layout.shape, layout, dtype, unit_range=True)
    batch = layout.batch_shape if rows.cu_seqlens is None else (rows.nseg,)
    last = v.boundary_value(xp, c.get("last_value"), "last_value", batch, rows.nseg, dtype)
    outs = v.outputs(xp, out, 1, layout, dtype, list(c.items()) if out is not None else ())
    if layout.R and layout.T:
        d, mask = c.get("dones"), c.get("mask")
        p = ReturnsProblem(
            rows=rows,
            rewards=layout.rows(xp, c["rewards"]),
            dones=None if d is None else layout.rows(xp, d),
            mask=None if mask is None else layout.rows(xp, mask),
            gamma=gamma, last_value=last, returns=outs[0].rows,
        )
        load(name).discounted_returns(p)
        v.finish(xp, layout, outs)
    return outs[0].array


def _scan_plan(xp: Any, c: dict[str, Any], axis: Any) -> Plan:
    b = v.data_array(xp, c["b"], "b")
    if b is None:
        raise TypeError("b is a required array")
    dtype = v.result_dtype(c.get("a"), b, c.get("initial"))
    return _plan_rows(xp, dtype, tuple(b.shape), axis, None)


def run_scan(xp: Any, name: str, c: dict[str, Any], reverse: bool, axis: Any = -1, out: Any = None) -> Any:
    """``linear_scan`` on already-resolved arguments (``reverse`` already checked): the result in ``xp``."""
    plan = _planned(_signature("scan", name, axis, c), lambda: _scan_plan(xp, c, axis))
    layout, dtype, rows = plan.layout, plan.dtype, plan.rows
    a = v.coefficient(xp, c.get("a"), "a", layout.shape, layout, dtype, unit_range=False)
    init = v.boundary_value(xp, c.get("initial"), "initial", layout.batch_shape, rows.nseg, dtype)
    outs = v.outputs(xp, out, 1, layout, dtype, list(c.items()) if out is not None else ())
    if layout.R and layout.T:
        p = ScanProblem(rows=rows, a=a, b=layout.rows(xp, c["b"]), reverse=reverse, initial=init,
                        out=outs[0].rows)
        load(name).linear_scan(p)
        v.finish(xp, layout, outs)
    return outs[0].array
