r"""Dask arrays: the block-level carry pass, one level above the kernels.

Imported only when a public function sees a Dask array.  A call becomes a
lazy graph over the blocks of the inputs (chunked along time and batch in any
way); every block is computed by the backend of its chunk type (NumPy chunks
→ ``"numba"``, CuPy chunks → ``"cuda"``, or the caller's ``backend=``).

For a reverse scan over time blocks ``0 .. n-1`` of each row-block:

1. *summaries*: for every block ``j ≥ 1``, per row, ``(decay, head)`` of the
   block (see :mod:`gaescan._carry`): ``decay = ∏ a_t`` over its valid steps
   and ``head`` = the scan's value at its first valid step with a zero carry;
2. *carry pass*: ``c_{n-1}`` = the caller's boundary, and
   ``c_j = head_{j+1} + decay_{j+1} · c_{j+1}`` (a select when the decay is
   0) — tiny tasks on arrays of the block's batch shape;
3. *final blocks*: the ordinary scan of block ``j`` with carry-in ``c_j``.

A block needs nothing from other blocks but these per-row carries.  GAE
carries two quantities: the bootstrap ``V'`` of the block's last valid step
(the value at the first valid step of the later blocks, itself carried with
:func:`gaescan.bootstrap_summary`; not needed with ``next_values``) and the
advantage ``A`` after the block (``last_advantage``).  A forward
``linear_scan`` runs the carry pass left to right.

Choices where the contract is silent: NumPy arrays mixed with Dask arrays are
wrapped with the chunks of the first Dask data array; the result has those
chunks.  ``out=`` and ``cu_seqlens`` are rejected.  Array coefficient values
given as Dask arrays are range-checked when their blocks are computed.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from functools import partial
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import _carry, _dispatch, _turn_gae, _vtrace
from .. import _validate as v
from .._arrays import SCALAR, Context, library_of
from .._problem import GAEResult

# --------------------------------------------------------------------------- arguments


def _chunk_library(x: Any) -> str:
    lib = library_of(x)
    if lib == "dask":
        meta = getattr(x, "_meta", None)
        return "cupy" if library_of(meta) == "cupy" else "numpy"
    return lib


def _describe(x: Any) -> str:
    lib = library_of(x)
    if lib == "dask":
        return f"a Dask array of {_chunk_library(x)} chunks"
    return {"numpy": "a NumPy array", "cupy": "a CuPy array", "torch": "a PyTorch tensor"}.get(lib, lib)


@dataclass(frozen=True)
class _Call:
    """What every block task of one call needs to know (pickled to the workers).

    ``backend`` is the backend the dispatcher chose for the chunks; ``on_device``
    whether they are CuPy chunks (each block then runs on CuPy's current stream).
    """

    axis: int
    backend: str
    dtype: np.dtype
    on_device: bool = False

    def stream(self) -> Any:
        return Context("cupy" if self.on_device else "numpy", self.on_device).stream()


def _context(named: dict[str, Any], out: Any, backend: str, cu_seqlens: Any) -> Context:
    if out is not None:
        raise TypeError(
            "out= is not supported with Dask arrays: the result is a lazy Dask array; "
            "write it somewhere with dask.array.store (or .to_zarr) instead"
        )
    if cu_seqlens is not None:
        raise ValueError(
            "cu_seqlens is not supported with Dask arrays; pad the packed sequences to rows with a mask, "
            "or compute the packed 1-D array in memory"
        )
    (lib,) = chunk_libraries(named) or {"numpy": ""}
    return Context(lib, on_device=lib == "cupy")


def chunk_libraries(named: dict[str, Any]) -> dict[str, str]:
    """The chunks' library of a call with Dask arrays (``{library: first name}``,
    empty for scalars only): the ``TypeError`` naming the arrays for any other
    library (a PyTorch tensor) or for NumPy mixed with CuPy."""
    libs: dict[str, str] = {}
    for name, x in named.items():
        if x is None or library_of(x) == SCALAR:
            continue
        lib = _chunk_library(x)
        if lib not in ("numpy", "cupy"):
            raise TypeError(
                f"{name!r} is {_describe(x)}; with Dask arrays, the other arrays of the call must be Dask "
                "arrays or arrays of the chunks' library (NumPy or CuPy)"
            )
        libs.setdefault(lib, name)
    if len(libs) > 1:
        parts = ", ".join(f"{n!r} is {_describe(named[n])}" for n in libs.values())
        raise TypeError(
            f"all arrays of one call must live in the same array library, but {parts}; "
            "use one chunk type (e.g. x.map_blocks(cupy.asarray) or cupy.asarray(...))"
        )
    return libs


def _as_dask(x: Any, chunks: Any) -> Any:
    if library_of(x) == "dask":
        return x if x.chunks == chunks else x.rechunk(chunks)
    return da.from_array(x, chunks=chunks, asarray=False) if library_of(x) == "cupy" else da.from_array(
        np.asarray(x), chunks=chunks
    )


def _known(x: Any, name: str) -> None:
    if any(np.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(
            f"{name!r} has unknown chunk sizes; call {name}.compute_chunk_sizes() first"
        )


def _data(named: dict[str, Any], order: list[str]) -> tuple[dict[str, Any], str]:
    """Check the data/flag arrays and align them to the first Dask one's chunks."""
    present = {k: named[k] for k in order if named[k] is not None}
    for name, x in present.items():
        if library_of(x) == SCALAR or not hasattr(x, "shape"):
            if library_of(x) == SCALAR:
                raise TypeError(f"{name!r} must be an array, got the scalar {x!r}")
            present[name] = x = np.asarray(x)
        v._check_numeric(x, name)
    ref_name = order[0]
    ref = present[ref_name]
    for name, x in present.items():
        if tuple(x.shape) != tuple(ref.shape) and not any(np.isnan(n) for n in x.shape):
            raise ValueError(
                f"{name!r} has shape {tuple(x.shape)} but {ref_name!r} has shape "
                f"{tuple(ref.shape)}; they must match exactly"
            )
    chunk_src = next((k for k, x in present.items() if library_of(x) == "dask"), None)
    if chunk_src is None:
        chunks = da.asarray(ref).chunks  # only coefficients or boundaries are Dask
    else:
        _known(present[chunk_src], chunk_src)
        chunks = present[chunk_src].chunks
    out = {}
    for name, x in present.items():
        out[name] = _as_dask(x, chunks)
        _known(out[name], name)
    return out, ref_name


def _scalar_like(x: Any) -> bool:
    """Whether ``x`` is a scalar or a 0-d NumPy array (a value, not a block array)."""
    return library_of(x) == SCALAR or (isinstance(x, np.ndarray) and x.ndim == 0)


def _coefficient(g: Any, name: str, ref: Any, dtype: np.dtype, unit_range: bool) -> Any:
    """A scalar (checked, passed on as is) or a Dask array with the reference's shape and chunks."""
    if g is None:
        raise TypeError(f"{name!r} is required")
    if _scalar_like(g):
        # Reuse the in-memory checks (type, [0, 1]); the blocks round it again.
        return v.coefficient(np, g, name, tuple(ref.shape), v.layout_of(tuple(ref.shape), -1), dtype, unit_range)
    if not hasattr(g, "shape"):
        g = np.asarray(g)
    shape = tuple(ref.shape)
    v.check_coefficient_array(g, name, shape, unit_range, host=library_of(g) == "numpy")
    gd = g if library_of(g) == "dask" else _as_dask(g, tuple((n,) for n in g.shape))
    gd = gd.reshape((1,) * (len(shape) - gd.ndim) + tuple(gd.shape)) if gd.ndim < len(shape) else gd
    # Non-broadcast axes take the reference's chunks; broadcast ones are one chunk of 1.
    src = tuple(ref.chunks[i] if gd.shape[i] == shape[i] else (1,) for i in range(len(shape)))
    if gd.chunks != src:
        gd = gd.rechunk(src)
    return da.broadcast_to(gd, shape, chunks=ref.chunks)


def _boundary(x: Any, name: str, ref: Any, axis: int) -> Any:
    """A scalar / None (passed on as is) or a Dask array of the batch shape, chunked like the batch."""
    if x is None:
        return None
    if _scalar_like(x):
        return v.boundary_value(np, x, name, (), 1, np.dtype(np.float64)) if not isinstance(
            x, np.ndarray) else x
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    v._check_numeric(x, name)
    batch = tuple(n for i, n in enumerate(ref.shape) if i != axis)
    chunks = tuple(c for i, c in enumerate(ref.chunks) if i != axis)
    if x.ndim == 0:
        x = da.broadcast_to(x if library_of(x) == "dask" else da.from_array(x), batch)
    if tuple(x.shape) != batch:
        raise ValueError(
            f"{name!r} has shape {tuple(x.shape)}; it must be a scalar or have the batch "
            f"shape {batch} (the input shape without the time axis)"
        )
    return _as_dask(x, chunks)


def _axis(ref: Any, axis: Any) -> int:
    return v.layout_of(tuple(ref.shape), axis).axis


# --------------------------------------------------------------------------- block tasks


def _xp(x: Any) -> Any:
    if library_of(x) == "cupy":
        import cupy

        return cupy
    return np


def _combine(dtype: np.dtype, summary: _carry.ScanSummary, carry: Any) -> Any:
    decay, head = summary
    xp = _xp(decay)
    return _carry._combine(xp, decay, head, carry).astype(dtype, copy=False)


def _typed(c: _Call, *xs: Any) -> tuple:
    """The blocks of data arrays ``xs`` in the call's dtype: a block whose own
    arrays are float32 computes in float64 (its summary, γ rounded to float64,
    its carry) where another argument of the call makes the result float64."""
    return tuple(x if x is None or isinstance(x, float) else x.astype(c.dtype, copy=False) for x in xs)


def _gae_args(r, val, nv, term, trunc, mask, g, lam, boot, carry=None) -> dict[str, Any]:
    return dict(rewards=r, values=val, next_values=nv, last_value=boot, last_advantage=carry,
                terminated=term, truncated=trunc, mask=mask, gamma=g, lam=lam)


def _gae_summary(c: _Call, r, val, nv, term, trunc, mask, g, lam, boot):
    r, val, nv = _typed(c, r, val, nv)
    with c.stream():
        return _carry.gae_summary_of(_xp(r), c.backend, _gae_args(r, val, nv, term, trunc, mask, g, lam, boot),
                                     c.axis)


def _gae_block(c: _Call, r, val, nv, term, trunc, mask, g, lam, boot, carry):
    r, val, nv = _typed(c, r, val, nv)
    with c.stream():
        adv, ret = _dispatch.run_gae(_xp(r), c.backend, _gae_args(r, val, nv, term, trunc, mask, g, lam, boot,
                                                                   carry), c.axis)
    return adv.astype(c.dtype, copy=False), ret.astype(c.dtype, copy=False)


def _bootstrap_summary(c: _Call, val, mask):
    (val,) = _typed(c, val)
    with c.stream():
        return _carry.bootstrap_summary_of(_xp(val), dict(values=val, mask=mask), c.axis)


def _vtrace_args(r, val, lr, nv, term, trunc, mask, g, lam, boot, carry=None) -> dict[str, Any]:
    return dict(rewards=r, values=val, log_rhos=lr, next_values=nv, last_value=boot, last_trace=carry,
                terminated=term, truncated=trunc, mask=mask, gamma=g, lam=lam)


def _vtrace_summary(c: _Call, bars, r, val, lr, nv, term, trunc, mask, g, lam, boot):
    r, val, lr, nv = _typed(c, r, val, lr, nv)
    with c.stream():
        return _carry.vtrace_summary_of(_xp(r), c.backend, _vtrace_args(r, val, lr, nv, term, trunc, mask, g, lam,
                                                                        boot), c.axis, bars[0], bars[1])


def _vtrace_block(c: _Call, bars, r, val, lr, nv, term, trunc, mask, g, lam, boot, carry):
    r, val, lr, nv = _typed(c, r, val, lr, nv)
    with c.stream():
        vs, adv = _vtrace._run(_xp(r), c.backend, _vtrace_args(r, val, lr, nv, term, trunc, mask, g, lam, boot,
                                                               carry), c.axis, None, *bars)
    return vs.astype(c.dtype, copy=False), adv.astype(c.dtype, copy=False)


def _returns_summary(c: _Call, r, dones, mask, g):
    (r,) = _typed(c, r)
    with c.stream():
        return _carry.returns_summary_of(_xp(r), c.backend, dict(rewards=r, dones=dones, mask=mask, gamma=g),
                                         c.axis)


def _returns_block(c: _Call, r, dones, mask, g, carry):
    (r,) = _typed(c, r)
    with c.stream():
        out = _dispatch.run_returns(_xp(r), c.backend,
                                    dict(rewards=r, dones=dones, mask=mask, gamma=g, last_value=carry), c.axis)
    return out.astype(c.dtype, copy=False)


def _scan_summary(c: _Call, reverse, a, b):
    a, b = _typed(c, a, b)
    with c.stream():
        return _carry.scan_summary_of(_xp(b), c.backend, dict(a=a, b=b), reverse, c.axis)


def _scan_block(c: _Call, reverse, a, b, carry):
    a, b = _typed(c, a, b)
    with c.stream():
        out = _dispatch.run_scan(_xp(b), c.backend, dict(a=a, b=b, initial=carry), reverse, c.axis)
    return out.astype(c.dtype, copy=False)


# --------------------------------------------------------------------------- the graph


class _Graph:
    """The tasks of one call, keyed by block index ``idx`` (time index at ``axis``)."""

    def __init__(self, ref: Any, axis: int, call: _Call, token: str):
        self.ref, self.axis, self.call, self.token = ref, axis, call, token
        self.numblocks = ref.numblocks
        self.nt = ref.numblocks[axis]
        self.layer: dict[Any, Any] = {}
        self.deps: dict[str, Any] = {}  # by name: `in` on a list would compare arrays

    def blocks(self) -> list[tuple[tuple, list[tuple]]]:
        """``(batch index, [block index for j = 0 .. nt-1])`` for every row-block."""
        ranges = [range(n) for i, n in enumerate(self.numblocks) if i != self.axis]
        out = []
        for b in itertools.product(*ranges):
            out.append((b, [b[: self.axis] + (j,) + b[self.axis:] for j in range(self.nt)]))
        return out

    def ref_of(self, x: Any, idx: tuple, batch: bool = False) -> Any:
        """The task argument for ``x`` at block ``idx``: a key, or ``x`` itself (scalars, None)."""
        if x is None or library_of(x) != "dask":
            return x
        self.deps.setdefault(x.name, x)
        if batch:
            idx = idx[: self.axis] + idx[self.axis + 1:]
        return (x.name, *idx)

    def carried(self, tag: str, summary: Any, boundary: Any, reverse: bool) -> dict[tuple, Any]:
        """Add a summary and a carry chain; return the carry argument of every block.

        ``summary(idx)`` is the task computing block ``idx``'s ScanSummary.
        """
        sname, cname = f"{tag}-summary-{self.token}", f"{tag}-carry-{self.token}"
        carry: dict[tuple, Any] = {}
        for _, idxs in self.blocks():
            seq = list(reversed(idxs)) if reverse else idxs
            prev = None
            for idx in seq:
                if prev is None:
                    carry[idx] = self.ref_of(boundary, idx, batch=True)
                else:
                    self.layer[(sname, *prev)] = summary(prev)
                    self.layer[(cname, *idx)] = (partial(_combine, self.call.dtype), (sname, *prev), carry[prev])
                    carry[idx] = (cname, *idx)
                prev = idx
        return carry

    def output(self, final: str, item: int | None) -> Any:
        name = f"{final}-{item}" if item is not None else f"{final}-out"
        layer = {}
        for _, idxs in self.blocks():
            for idx in idxs:
                layer[(name, *idx)] = (operator.getitem, (final, *idx), item) if item is not None else (
                    final, *idx)
        return name, layer

    def arrays(self, final: str, count: int) -> list[Any]:
        internal = f"gaescan-{self.token}"
        hlg = HighLevelGraph.from_collections(internal, self.layer, dependencies=list(self.deps.values()))
        layers, deps = dict(hlg.layers), {k: set(s) for k, s in hlg.dependencies.items()}
        meta = da.utils.meta_from_array(self.ref, ndim=self.ref.ndim, dtype=self.call.dtype)
        result = []
        for item in range(count) if count > 1 else [None]:
            name, layer = self.output(final, item)
            # Fresh dicts per output: a HighLevelGraph keeps the mappings it is given.
            g = HighLevelGraph({**layers, name: layer}, {**deps, name: {internal}})
            result.append(da.Array(g, name, self.ref.chunks, meta=meta))
        return result


# --------------------------------------------------------------------------- public entry points


def _episode_call(named: dict[str, Any], required: tuple[str, ...], boundaries: tuple[str, str], axis: Any,
                  out: Any, backend: str, cu_seqlens: Any) -> tuple:
    """What :func:`gae` and :func:`vtrace` share before their graphs: the
    context and backend, the episode-end checks, the data arrays (``required``
    first, then ``next_values``, the termination flags, ``truncated`` and
    ``mask``), the axis, the dtype and the two coefficients.

    Returns ``(call, arrs, ref, axis, dtype, gamma, lam, term_name)``.
    """
    ctx = _context(named, out, backend, cu_seqlens)
    name = _dispatch.choose(backend, ctx)
    dones, terminated = named["dones"], named["terminated"]
    v.check_episode_ends(dones, terminated, named["truncated"], named["next_values"], named["last_value"])
    if any(named[k] is None for k in required):
        raise TypeError(f"{', '.join(required[:-1])} and {required[-1]} are required arrays")
    term_name = "dones" if dones is not None else "terminated"
    data_named = {k: named[k] for k in (*required, "next_values", "mask", "truncated")}
    data_named[term_name] = dones if dones is not None else terminated
    arrs, _ = _data(data_named, [*required, "next_values", term_name, "truncated", "mask"])
    ref = arrs["rewards"]
    ax = _axis(ref, axis)
    dtype = v.result_dtype(*(arrs[k] for k in required), arrs.get("next_values"),
                           *(named[k] for k in boundaries), named["gamma"], named["lam"])
    g = _coefficient(named["gamma"], "gamma", ref, dtype, True)
    lm = _coefficient(named["lam"], "lam", ref, dtype, True)
    return _Call(ax, name, dtype, ctx.on_device), arrs, ref, ax, dtype, g, lm, term_name


def _bootstrap(G: _Graph, call: _Call, tag: str, values: Any, mask: Any, next_values: Any, lv: Any) -> dict:
    """Each block's V' after its last step: the next block's first value (the
    next unmasked one, else ``last_value``), carried backwards; ``None`` for
    every block when ``next_values`` gives V' at every step."""
    if next_values is not None:
        return dict.fromkeys(i for _, idxs in G.blocks() for i in idxs)
    return G.carried(
        f"{tag}-bootstrap",
        lambda idx: (partial(_bootstrap_summary, call), G.ref_of(values, idx), G.ref_of(mask, idx)),
        lv, reverse=True,
    )


def gae(rewards, values, *, gamma, lam, next_values, last_value, last_advantage, dones, terminated,
        truncated, mask, cu_seqlens, axis, out, backend) -> Any:
    named = dict(rewards=rewards, values=values, next_values=next_values, last_value=last_value,
                 last_advantage=last_advantage, dones=dones, terminated=terminated, truncated=truncated,
                 mask=mask, gamma=gamma, lam=lam)
    call, arrs, ref, ax, dtype, g, lm, term_name = _episode_call(
        named, ("rewards", "values"), ("last_value", "last_advantage"), axis, out, backend, cu_seqlens)
    lv = _boundary(last_value, "last_value", ref, ax)
    la = _boundary(last_advantage, "last_advantage", ref, ax)
    token = tokenize("gae", arrs, gamma, lam, last_value, last_advantage, ax, backend,
                     {k: getattr(x, "name", x) for k, x in (("g", g), ("l", lm), ("lv", lv), ("la", la))})
    G = _Graph(ref, ax, call, token)
    nv, term, trunc, m = (arrs.get(k) for k in ("next_values", term_name, "truncated", "mask"))

    def inputs(idx):
        return [G.ref_of(x, idx) for x in (arrs["rewards"], arrs["values"], nv, term, trunc, m, g, lm)]

    boot = _bootstrap(G, call, "gae", arrs["values"], m, nv, lv)
    adv_carry = G.carried(
        "gae-advantage",
        lambda idx: (partial(_gae_summary, call), *inputs(idx), boot[idx]),
        la, reverse=True,
    )
    final = f"gae-{token}"
    for _, idxs in G.blocks():
        for idx in idxs:
            G.layer[(final, *idx)] = (partial(_gae_block, call), *inputs(idx), boot[idx], adv_carry[idx])
    adv, ret = G.arrays(final, 2)
    return GAEResult(adv, ret)


def vtrace(rewards, values, log_rhos, *, gamma, lam, rho_bar, c_bar, pg_rho_bar, next_values, last_value,
           last_trace, dones, terminated, truncated, mask, cu_seqlens, axis, out, backend) -> Any:
    """:func:`gaescan.vtrace` on Dask arrays: the V' bootstrap (without ``next_values``)
    and the trace ``D`` carried between time blocks, as GAE's bootstrap and advantage."""
    named = dict(rewards=rewards, values=values, log_rhos=log_rhos, next_values=next_values,
                 last_value=last_value, last_trace=last_trace, dones=dones, terminated=terminated,
                 truncated=truncated, mask=mask, gamma=gamma, lam=lam)
    call, arrs, ref, ax, dtype, g, lm, term_name = _episode_call(
        named, ("rewards", "values", "log_rhos"), ("last_value", "last_trace"), axis, out, backend, cu_seqlens)
    rb = _vtrace._threshold(rho_bar, "rho_bar", dtype)
    bars = (rb, _vtrace._threshold(c_bar, "c_bar", dtype),
            rb if pg_rho_bar is None else _vtrace._threshold(pg_rho_bar, "pg_rho_bar", dtype))
    lv = _boundary(last_value, "last_value", ref, ax)
    lt = _boundary(last_trace, "last_trace", ref, ax)
    token = tokenize("vtrace", arrs, gamma, lam, bars, last_value, last_trace, ax, backend,
                     {k: getattr(x, "name", x) for k, x in (("g", g), ("l", lm), ("lv", lv), ("lt", lt))})
    G = _Graph(ref, ax, call, token)
    nv, term, trunc, m = (arrs.get(k) for k in ("next_values", term_name, "truncated", "mask"))

    def inputs(idx):
        return [G.ref_of(x, idx) for x in (arrs["rewards"], arrs["values"], arrs["log_rhos"], nv, term, trunc, m,
                                           g, lm)]

    boot = _bootstrap(G, call, "vtrace", arrs["values"], m, nv, lv)
    trace = G.carried(
        "vtrace-trace",
        lambda idx: (partial(_vtrace_summary, call, bars), *inputs(idx), boot[idx]),
        lt, reverse=True,
    )
    final = f"vtrace-{token}"
    for _, idxs in G.blocks():
        for idx in idxs:
            G.layer[(final, *idx)] = (partial(_vtrace_block, call, bars), *inputs(idx), boot[idx], trace[idx])
    vs, adv = G.arrays(final, 2)
    return _vtrace.VTraceResult(vs, adv)


def discounted_returns(rewards, *, gamma, dones, last_value, mask, cu_seqlens, axis, out, backend) -> Any:
    named = dict(rewards=rewards, dones=dones, last_value=last_value, mask=mask, gamma=gamma)
    ctx = _context(named, out, backend, cu_seqlens)
    name = _dispatch.choose(backend, ctx)
    if rewards is None:
        raise TypeError("rewards is a required array")
    arrs, _ = _data(dict(rewards=rewards, dones=dones, mask=mask), ["rewards", "dones", "mask"])
    ref = arrs["rewards"]
    ax = _axis(ref, axis)
    dtype = v.result_dtype(ref, last_value, gamma)
    g = _coefficient(gamma, "gamma", ref, dtype, True)
    lv = _boundary(last_value, "last_value", ref, ax)
    call = _Call(ax, name, dtype, ctx.on_device)
    token = tokenize("returns", arrs, gamma, last_value, ax, backend,
                     {k: getattr(x, "name", x) for k, x in (("g", g), ("lv", lv))})
    G = _Graph(ref, ax, call, token)
    d, m = arrs.get("dones"), arrs.get("mask")

    def inputs(idx):
        return [G.ref_of(x, idx) for x in (ref, d, m, g)]

    carry = G.carried("returns", lambda idx: (partial(_returns_summary, call), *inputs(idx)), lv, reverse=True)
    final = f"discounted-returns-{token}"
    for _, idxs in G.blocks():
        for idx in idxs:
            G.layer[(final, *idx)] = (partial(_returns_block, call), *inputs(idx), carry[idx])
    (res,) = G.arrays(final, 1)
    return res


def linear_scan(a, b, *, reverse, initial, axis, out, backend) -> Any:
    reverse = v.reverse_flag(reverse)
    named = dict(a=a, b=b, initial=initial)
    ctx = _context(named, out, backend, None)
    name = _dispatch.choose(backend, ctx)
    if b is None:
        raise TypeError("b is a required array")
    if library_of(b) != "dask" and library_of(a) == "dask" and hasattr(b, "shape") and a.shape == b.shape:
        # A NumPy b next to a full-shape Dask a takes a's chunks (as data arrays do in gae).
        _known(a, "a")
        b = _as_dask(b, a.chunks)
    arrs, _ = _data(dict(b=b), ["b"])
    ref = arrs["b"]
    ax = _axis(ref, axis)
    dtype = v.result_dtype(a, ref, initial)
    a_ = _coefficient(a, "a", ref, dtype, False)
    init = _boundary(initial, "initial", ref, ax)
    call = _Call(ax, name, dtype, ctx.on_device)
    token = tokenize("scan", arrs, a, initial, reverse, ax, backend,
                     {k: getattr(x, "name", x) for k, x in (("a", a_), ("init", init))})
    G = _Graph(ref, ax, call, token)

    def inputs(idx):
        return [G.ref_of(a_, idx), G.ref_of(ref, idx)]

    carry = G.carried("scan", lambda idx: (partial(_scan_summary, call, reverse), *inputs(idx)), init,
                      reverse=reverse)
    final = f"linear-scan-{token}"
    for _, idxs in G.blocks():
        for idx in idxs:
            G.layer[(final, *idx)] = (partial(_scan_block, call, reverse), *inputs(idx), carry[idx])
    (res,) = G.arrays(final, 1)
    return res


# --------------------------------------------------------------------------- turn-level GAE
#
# turn_gae on Dask arrays is the "cuda" backend's decomposition
# (gaescan.backends.turn_gae_cuda) written with the lazy scans above, so that
# a turn may span any number of time blocks:
#
# 1. the id of the last valid token before each token: a forward fill (decay 0
#    and input id at valid tokens, decay 1 and input 0 at masked ones, initial
#    -inf), exact in float64 for ids within ±2^53; a token starts a turn when it
#    is valid and that id is -inf or differs from its own;
# 2. R_k at each start: a reverse scan of the rewards (0 at masked tokens) whose
#    decay is 0 where the next token starts a turn;
# 3. A_k and A_k + U_k at the starts: GAE with ``mask`` = the start flags, in
#    float64;
# 4. each token's values: a forward fill from the starts, 0 at masked tokens.

_ID_EXACT = 2 ** 53  # every integer of magnitude up to 2^53 is a float64


def _shift(x: Any, ax: int, fill: Any, from_next: bool) -> Any:
    """``x`` one step along ``ax`` with ``x``'s chunks: ``y_t = x_{t+1}`` (``from_next``)
    or ``x_{t−1}``, and ``fill`` at the end left open."""
    n = x.shape[ax]

    def cut(lo: int, hi: int) -> Any:
        return x[tuple(slice(lo, hi) if i == ax else slice(None) for i in range(x.ndim))]

    edge = cut(0, 1).map_blocks(np.full_like, fill_value=fill, dtype=x.dtype)
    parts = [cut(1, n), edge] if from_next else [edge, cut(0, n - 1)]
    return da.concatenate(parts, axis=ax).rechunk(x.chunks)


def _turn_starts(batch_shape: tuple, ax: int, ids: Any, prev: Any, valid: Any = None,
                 block_info: Any = None) -> Any:
    """One block's turn starts from its ids and the id of each token's previous valid
    token (``prev``, -inf where there is none); on the host, the checks of the ids'
    range and order at valid tokens (on CuPy chunks, no check: it would read the device)."""
    xp = _xp(prev)
    has_prev = prev != -xp.inf
    start = ~has_prev | (prev != ids.astype(np.float64))
    if valid is not None:
        start &= valid
    if xp is np and ids.size:
        ok = np.ones(ids.shape, bool) if valid is None else valid
        big = ids > _ID_EXACT
        if ids.dtype.kind == "i":
            big |= ids < -_ID_EXACT
        if np.any(big & ok):
            raise ValueError(
                f"turn_ids with Dask arrays must lie within ±2^53 at valid tokens (the time blocks pass "
                f"ids on as float64), got {ids[big & ok].flat[0]}; number the turns of each row from 0")
        bad = ok & has_prev & (prev > ids)
        if np.any(bad):
            pos = np.argwhere(bad)[0] + [lo for lo, _ in block_info[None]["array-location"]]
            row = np.ravel_multi_index(tuple(np.delete(pos, ax)), batch_shape) if batch_shape else 0
            raise _turn_gae.decreasing_ids(batch_shape, int(row))
    return start


def _turn_coefficient(g: Any, name: str, ref: Any, ax: int, dtype: np.dtype) -> Any:
    """γ or λ of turn_gae: a scalar or per-row array, rounded to the result's dtype
    (the inner float64 GAE then takes it as it is)."""
    if g is None:
        raise TypeError(f"{name!r} is required")
    if _scalar_like(g):
        return float(dtype.type(_coefficient(g, name, ref, dtype, True)))
    if not hasattr(g, "shape"):
        g = np.asarray(g)
    _turn_gae.check_per_row(name, tuple(g.shape), tuple(ref.shape), ax)
    return g.astype(dtype).astype(np.float64) if g.dtype.kind == "f" else g


def turn_gae(rewards, values, turn_ids, *, gamma, lam, mask, last_value, axis, out, backend) -> Any:
    """:func:`gaescan.turn_gae` on Dask arrays: turn starts, per-turn sums, the
    turn-level GAE and the fill back to the tokens, each a lazy scan (see above)."""
    named = dict(rewards=rewards, values=values, turn_ids=turn_ids, mask=mask, last_value=last_value,
                 gamma=gamma, lam=lam)
    ctx = _context(named, out, backend, None)
    _dispatch.choose(backend, ctx)
    if rewards is None or values is None or turn_ids is None:
        raise TypeError("rewards, values and turn_ids are required arrays")
    _turn_gae.check_turn_ids(turn_ids)
    arrs, _ = _data(dict(rewards=rewards, values=values, turn_ids=turn_ids, mask=mask),
                    ["rewards", "values", "turn_ids", "mask"])
    ref = arrs["rewards"]
    ax = _axis(ref, axis)
    dtype = v.result_dtype(ref, arrs["values"], last_value, gamma, lam)
    g = _turn_coefficient(gamma, "gamma", ref, ax, dtype)
    lm = _turn_coefficient(lam, "lam", ref, ax, dtype)
    lv = last_value
    if lv is not None and _scalar_like(lv):
        lv = v.boundary_value(np, lv, "last_value", (), 1, dtype)
    if ref.size == 0:
        empty = da.zeros_like(ref, dtype=dtype)
        return GAEResult(empty, empty.copy())
    valid = None if arrs.get("mask") is None else arrs["mask"] != 0
    ids = arrs["turn_ids"]
    if valid is None:
        last = ids.astype(np.float64)
    else:
        last = linear_scan(da.where(valid, 0.0, 1.0), da.where(valid, ids.astype(np.float64), 0.0),
                           reverse=False, initial=-np.inf, axis=ax, out=None, backend=backend)
    prev = _shift(last, ax, -np.inf, from_next=False)
    batch_shape = tuple(n for i, n in enumerate(ref.shape) if i != ax)
    start = da.map_blocks(partial(_turn_starts, batch_shape, ax), ids, prev,
                          *(() if valid is None else (valid,)), dtype=bool)
    r = ref.astype(np.float64)
    r = r if valid is None else da.where(valid, r, 0.0)
    rk = linear_scan(da.where(_shift(start, ax, False, from_next=True), 0.0, 1.0), r, reverse=True,
                     initial=None, axis=ax, out=None, backend=backend)
    at_starts = gae(rk, arrs["values"], gamma=g, lam=lm, next_values=None, last_value=lv, last_advantage=None,
                    dones=None, terminated=None, truncated=None, mask=start, cu_seqlens=None, axis=ax, out=None,
                    backend=backend)
    fill = da.where(start, 0.0, 1.0)
    outs = []
    for x in at_starts:
        y = linear_scan(fill, x, reverse=False, initial=None, axis=ax, out=None, backend=backend)
        outs.append((y if valid is None else da.where(valid, y, 0.0)).astype(dtype))
    return GAEResult(*outs)
