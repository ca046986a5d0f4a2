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
import operator
import os
from types import ModuleType
from typing import Any

import numpy as np

from . import _kept
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
# caller's outputs; ``types``, when given, holds the types of the arguments
# in the scan's key order (:func:`arg_types`; the public functions have them
# from resolving the call).
# Each call is validated and normalised into a problem, once; the problem goes
# to the backend.  The results come back in ``xp``.
#
# The structural half of the validation (types, dtypes, shapes, which
# arguments are present, the axis; array coefficients' dtypes and broadcast
# shapes) gives a *plan*: the output dtype, the layout, the rows and how the
# row views are made.  A plan depends only on the call's structure, so it is
# kept, keyed on that structure (see :func:`_plan`), and a later call of the
# same structure starts from it.  Everything that depends on values
# (coefficient types and ranges, boundary values, ``cu_seqlens`` offsets,
# ``out=`` shapes, dtypes and overlaps) runs on every call.


class Plan:
    """The structural result of validating a call, and what follows from it.

    Attributes
    ----------
    dtype : numpy.dtype
        The output dtype.
    cast : type
        ``dtype.type``, rounding scalar coefficients and boundary values.
    f32 : bool
        The output dtype is float32 (Python floats need rounding).
    layout : Layout
        Where the time axis is.
    rows : Rows or None
        The problem's geometry; ``None`` with ``cu_seqlens`` (the rows hold the
        call's offsets).
    flat : bool
        The inputs are ``(R, T)`` already (2-D, time last): each argument is its
        own row view.
    last : bool
        Time is the last axis: a C-contiguous output is a row view by a reshape.
    """

    __slots__ = ("dtype", "cast", "f32", "layout", "rows", "flat", "last")

    def __init__(self, dtype: np.dtype, layout: v.Layout, rows: Rows | None):
        self.dtype, self.cast, self.layout, self.rows = dtype, dtype.type, layout, rows
        self.f32 = dtype == np.float32
        ndim = len(layout.shape)
        self.flat = ndim == 2 and layout.axis == 1
        self.last = layout.axis == ndim - 1

    def view(self, xp: Any, x: Any) -> Any:
        """The ``(R, T)`` row view of an input of the call's shape."""
        return x if self.flat else self.layout.rows(xp, x)


_NONE = type(None)
# Types a key holds as themselves: the plan reads nothing else of them (their
# values are checked on every call).
_KEYED_TYPES = frozenset({_NONE, float, int, bool})
# Every argument of each scan, in a fixed order: callers' dicts may differ in keys and order.
_GAE_KEYS = ("rewards", "values", "next_values", "last_value", "last_advantage", "dones", "terminated",
             "truncated", "mask", "cu_seqlens", "gamma", "lam")
_RETURNS_KEYS = ("rewards", "dones", "last_value", "mask", "cu_seqlens", "gamma")
_SCAN_KEYS = ("a", "b", "initial")
_DTYPE_SHAPE = operator.attrgetter("dtype.num", "shape")
_GAE_GET = operator.itemgetter(*_GAE_KEYS)
_RETURNS_GET = operator.itemgetter(*_RETURNS_KEYS)
_SCAN_GET = operator.itemgetter(*_SCAN_KEYS)
_GETTERS = {"gae": _GAE_GET, "returns": _RETURNS_GET, "scan": _SCAN_GET}
_ROUNDED32 = v.ROUNDED32


class _ByTypes:
    """The plans of one call structure's argument types, keyed on the arrays'
    dtype numbers and shapes.

    ``arrays`` picks the array arguments out of the call's values (``None``:
    the types are not cacheable); ``many`` says whether it returns a tuple.
    """

    __slots__ = ("arrays", "many", "plans")

    def __init__(self, types: tuple):
        idx = [i for i, t in enumerate(types) if t is np.ndarray or (
            t.__module__[:5] == "cupy." and t.__name__ == "ndarray")]
        cacheable = idx and all(
            i in idx or t in _KEYED_TYPES or issubclass(t, np.generic) for i, t in enumerate(types))
        self.arrays = operator.itemgetter(*idx) if cacheable else None
        self.many = len(idx) > 1
        self.plans: dict[Any, Plan] = {}


_BY_TYPES: dict[tuple, _ByTypes] = {}
_BY_TYPES_MAX = 256
_PLANS_MAX = 64  # per argument types


def _values(c: dict[str, Any], keys: tuple, get: Any) -> tuple:
    """The arguments in the scan's fixed key order."""
    try:
        return get(c)
    except KeyError:  # a caller's dict without some absent arguments
        return tuple(map(c.get, keys))


def arg_types(kind: str, c: dict[str, Any]) -> tuple:
    """The types of a public function's arguments ``c`` (every key present) in
    the fixed key order of ``kind`` (``"gae"``, ``"returns"``, ``"scan"``): the
    ``types`` of :func:`run_gae` and the others."""
    return tuple(map(type, _GETTERS[kind](c)))


def _plan(kind: str, name: str, axis: Any, vals: tuple, types: tuple | None, build: Any, xp: Any,
          c: dict[str, Any]) -> Plan:
    """The call's plan: kept, keyed on the call's structure, or built by ``build``.

    The structure is the backend, the axis, the type of each argument (``vals``,
    in the scan's fixed key order; ``types``, their types, if given) and the
    dtype number and shape of each array.  The plan reads no strides and no
    values, so none are in the key; nor the byte order, which the plan does
    not depend on (the backends cast).
    """
    if type(axis) is not int:
        return build(xp, c, axis)
    k1 = (kind, name, axis) + (tuple(map(type, vals)) if types is None else types)
    by_types = _BY_TYPES.get(k1)
    if by_types is None:
        if len(_BY_TYPES) >= _BY_TYPES_MAX:
            _BY_TYPES.clear()
        by_types = _BY_TYPES[k1] = _ByTypes(k1[3:])
    arrays = by_types.arrays
    if arrays is None:
        return build(xp, c, axis)
    picked = arrays(vals)
    k2 = tuple(map(_DTYPE_SHAPE, picked)) if by_types.many else _DTYPE_SHAPE(picked)
    plans = by_types.plans
    plan = plans.get(k2)
    if plan is None:
        plan = build(xp, c, axis)
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[k2] = plan
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
    plan = _plan_rows(xp, dtype, tuple(r.shape), axis, c.get("cu_seqlens"))
    _coefficient_structure(c, ("gamma", "lam"), plan)
    return plan


def _plan_rows(xp: Any, dtype: np.dtype, shape: tuple, axis: Any, cu: Any) -> Plan:
    layout = v.layout_of(shape, axis)
    rows = v.make_rows(xp, dtype, layout, None) if cu is None else None
    return Plan(dtype, layout, rows)


def _coefficient_structure(c: dict[str, Any], names: tuple, plan: Plan) -> None:
    """The structural checks of array coefficients (dtype, broadcast shape);
    their values are checked on every call."""
    for name in names:
        g = c.get(name)
        if g is not None and not v.is_scalar(g):
            v.check_coefficient_structure(g, name, plan.layout.shape)


def _coefficient(xp: Any, g: Any, name: str, plan: Plan, unit_range: bool) -> Any:
    """A coefficient's per-call part (see :func:`gaescan._validate.coefficient`):
    the plan has checked an array's structure."""
    if type(g) is float:
        if unit_range and not 0.0 <= g <= 1.0:
            v.scalar_coefficient(g, name, plan.dtype, unit_range)  # raises, naming the argument
        return v.rounded(g, plan.cast)
    layout = plan.layout
    return v.coefficient(xp, g, name, layout.shape, layout, plan.dtype, unit_range, structure=False)


def _boundary(xp: Any, x: Any, name: str, plan: Plan, batch: tuple, nseg: int) -> Any:
    if x is None:
        return 0.0
    if type(x) is float:
        return v.rounded(x, plan.cast)
    return v.boundary_value(xp, x, name, batch, nseg, plan.dtype)


def _rows(xp: Any, plan: Plan, c: dict[str, Any], axis: Any) -> Rows:
    if plan.rows is not None:
        return plan.rows
    cu = v.packed_offsets(xp, c["cu_seqlens"], plan.layout.shape, axis)
    return v.make_rows(xp, plan.dtype, plan.layout, cu)


def _outputs(xp: Any, plan: Plan, out: Any, count: int, c: dict[str, Any],
             line_offset: int | None = None) -> tuple[list, list, list]:
    """The caller's arrays, the rows a backend writes, and the ``Output`` records
    needing a copy back (checks of ``out=`` on every call).  ``line_offset``:
    where large NumPy outputs this call allocates start (:func:`gaescan._validate.empty`)."""
    layout, dtype = plan.layout, plan.dtype
    if out is None:
        if plan.flat or plan.last:
            shape = layout.shape
            arrays = [v.empty(xp, shape, dtype, line_offset) for _ in range(count)]
            if plan.flat:
                return arrays, arrays, []
            shape = (layout.R, layout.T)
            return arrays, [a.reshape(shape) for a in arrays], []
        outs = v.outputs(xp, None, count, layout, dtype, (), line_offset)
    else:
        outs = v.outputs(xp, out, count, layout, dtype, list(c.items()))
    return [o.array for o in outs], [o.rows for o in outs], [o for o in outs if o.scratch]


def run_gae(xp: Any, name: str, c: dict[str, Any], axis: Any = -1, out: Any = None,
            types: tuple | None = None, keep: tuple | None = None) -> list[Any]:
    """GAE on already-resolved arguments: ``[advantages, returns]`` in ``xp``.

    With ``keep`` (a key of :mod:`gaescan._kept`), a backend that defines
    ``gae_kept`` runs the problem through it, and the replay it returns is kept
    under that key: only for inputs that are their own row views (``(R, T)``,
    time last), since a replay receives the caller's arrays.
    """
    vals = _values(c, _GAE_KEYS, _GAE_GET)
    r, val, nv, lv, la, dones, term, trunc, mask, cu, g, lam = vals
    plan = _plan("gae", name, axis, vals, types, _gae_plan, xp, c)
    rows = plan.rows if cu is None else _rows(xp, plan, c, axis)
    if type(g) is float and type(lam) is float and 0.0 <= g <= 1.0 and 0.0 <= lam <= 1.0:
        if plan.f32:
            gamma, lam = (_ROUNDED32.get(g) or v.rounded(g, plan.cast),
                          _ROUNDED32.get(lam) or v.rounded(lam, plan.cast))
        else:
            gamma = g
    else:
        gamma = _coefficient(xp, g, "gamma", plan, True)
        lam = _coefficient(xp, lam, "lam", plan, True)
    if lv is not None or la is not None:
        batch = plan.layout.batch_shape if cu is None else (rows.nseg,)
        lv = _boundary(xp, lv, "last_value", plan, batch, rows.nseg)
        la = _boundary(xp, la, "last_advantage", plan, batch, rows.nseg)
    else:
        lv = la = 0.0
    if out is None and plan.flat:
        shape, dtype = plan.layout.shape, plan.dtype
        arrays = views = [xp.empty(shape, dtype), xp.empty(shape, dtype)]
        scratch = None
    else:
        arrays, views, scratch = _outputs(xp, plan, out, 2, c)
    if rows.R and rows.T:
        if dones is not None:
            term = dones
        if not plan.flat:
            view = plan.layout.rows
            r, val = view(xp, r), view(xp, val)
            nv, term, trunc, mask = (None if x is None else view(xp, x) for x in (nv, term, trunc, mask))
        problem = GAEProblem(rows, r, val, nv, term, trunc, mask, gamma, lam, lv, views[0], views[1], la)
        mod = load(name)
        kept = getattr(mod, "gae_kept", None) if keep is not None and plan.flat and out is None else None
        if kept is None:
            mod.gae(problem)
        else:
            _kept.keep(keep, kept(problem))
        if scratch:
            v.finish(xp, plan.layout, scratch)
    return arrays


def _returns_plan(xp: Any, c: dict[str, Any], axis: Any) -> Plan:
    r = v.data_array(xp, c["rewards"], "rewards")
    if r is None:
        raise TypeError("rewards is a required array")
    v.check_same_shape("rewards", r, dones=v.data_array(xp, c.get("dones"), "dones"),
                       mask=v.data_array(xp, c.get("mask"), "mask"))
    dtype = v.result_dtype(r, c.get("last_value"), c.get("gamma"))
    plan = _plan_rows(xp, dtype, tuple(r.shape), axis, c.get("cu_seqlens"))
    _coefficient_structure(c, ("gamma",), plan)
    return plan


def run_returns(xp: Any, name: str, c: dict[str, Any], axis: Any = -1, out: Any = None,
                types: tuple | None = None) -> Any:
    """Discounted returns on already-resolved arguments: the result in ``xp``."""
    vals = _values(c, _RETURNS_KEYS, _RETURNS_GET)
    r, dones, lv, mask, cu, g = vals
    plan = _plan("returns", name, axis, vals, types, _returns_plan, xp, c)
    rows = plan.rows if cu is None else _rows(xp, plan, c, axis)
    if type(g) is float and 0.0 <= g <= 1.0:
        gamma = (_ROUNDED32.get(g) or v.rounded(g, plan.cast)) if plan.f32 else g
    else:
        gamma = _coefficient(xp, g, "gamma", plan, True)
    if lv is not None:
        batch = plan.layout.batch_shape if cu is None else (rows.nseg,)
        lv = _boundary(xp, lv, "last_value", plan, batch, rows.nseg)
    else:
        lv = 0.0
    arrays, views, scratch = _outputs(xp, plan, out, 1, c)
    if rows.R and rows.T:
        if not plan.flat:
            view = plan.layout.rows
            r = view(xp, r)
            dones, mask = (None if x is None else view(xp, x) for x in (dones, mask))
        load(name).discounted_returns(ReturnsProblem(rows, r, dones, mask, gamma, lv, views[0]))
        if scratch:
            v.finish(xp, plan.layout, scratch)
    return arrays[0]


def _scan_plan(xp: Any, c: dict[str, Any], axis: Any) -> Plan:
    b = v.data_array(xp, c["b"], "b")
    if b is None:
        raise TypeError("b is a required array")
    dtype = v.result_dtype(c.get("a"), b, c.get("initial"))
    plan = _plan_rows(xp, dtype, tuple(b.shape), axis, None)
    _coefficient_structure(c, ("a",), plan)
    return plan


def run_scan(xp: Any, name: str, c: dict[str, Any], reverse: bool, axis: Any = -1, out: Any = None,
             types: tuple | None = None) -> Any:
    """``linear_scan`` on already-resolved arguments (``reverse`` already checked): the result in ``xp``."""
    vals = _values(c, _SCAN_KEYS, _SCAN_GET)
    a, b, init = vals
    plan = _plan("scan", name, axis, vals, types, _scan_plan, xp, c)
    rows = plan.rows
    a = _coefficient(xp, a, "a", plan, False)
    init = 0.0 if init is None else _boundary(xp, init, "initial", plan, plan.layout.batch_shape, rows.nseg)
    arrays, views, scratch = _outputs(xp, plan, out, 1, c)
    if rows.R and rows.T:
        load(name).linear_scan(ScanProblem(rows, a, plan.view(xp, b), reverse, init, views[0]))
        if scratch:
            v.finish(xp, plan.layout, scratch)
    return arrays[0]
