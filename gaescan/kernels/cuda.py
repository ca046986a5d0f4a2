"""Numba CUDA kernels: one-pass tile scans of ``(R, T)`` rows.

Every problem is run as a *reverse* scan over a logical time index ``u``
(``u = T-1`` first).  GAE and discounted returns are reverse scans of physical
time (``t = u``); the forward ``linear_scan`` reads physical time ``t = T-1-u``
(a compile-time switch, so no negative-stride views are ever built).

The state carried from later to earlier steps is a pair ``(A, Vn)``: the
accumulator (``A_{τ(t)}`` for GAE, ``G`` for returns, ``y`` for the scan) and,
for GAE without ``next_values``, the value ``V`` at the next unmasked position
of the sequence.  A run of steps acts on that state as the map::

    (A, Vn) -> (alpha*A + beta*Vn + c,  Vf if hv else Vn)

so a run is five numbers ``(alpha, beta, c, hv, Vf)``.  Only a mask makes
"the next unmasked value" depend on the data; without one, ``Vn`` at step
``t`` is ``v[t+1]`` (or the boundary value), δ is formed directly when the
steps are loaded, and the map shrinks to the pair ``(alpha, c)`` — as for
GAE with ``next_values``, returns and the linear scan.  A masked step is the
identity, a segment boundary of a packed row the constant map
``(0, 0, A0, 1, last_value[s])``.  Two runs compose as (``M1`` earlier in time,
applied after ``M2``)::

    alpha = alpha1*alpha2
    beta  = alpha1*beta2 + (0 if hv2 else beta1)
    c     = c1 + alpha1*c2 + (beta1*Vf2 if hv2 else 0)
    hv    = hv1 or hv2,   Vf = Vf1 if hv1 else Vf2

Products with ``alpha1 == 0`` / ``beta1 == 0`` are *skipped*, not computed: a
done cut (``alpha = 0``) and a terminal bootstrap (``beta = 0``) are selects,
so a NaN or inf after an episode end never reaches the episode before it.
(A consequence: a zero ``gamma*lam`` inside an episode also stops a NaN, where
a plain multiply would have propagated it.)

A tile is ``RW`` rows x ``TW * K`` steps; thread ``(x, y)`` owns row ``x`` and
the ``K`` consecutive steps ``y*K .. y*K+K-1`` of the tile.  Per tile:

1. each thread composes the maps of its ``K`` steps (serial, in registers);
2. a suffix scan over ``y`` — warp shuffles inside a warp, then the warps'
   aggregates through shared memory — gives every thread the composition of
   the later threads' maps (the simulator, which has no shuffles, gets one
   from :mod:`gaescan.kernels._cudasim`, so it runs this same code);
3. each thread applies that to the tile's carry-in state, then re-runs its
   ``K`` steps concretely; the outputs pass through shared memory so that the
   stores are coalesced (consecutive lanes write consecutive steps).

Two drivers share the tile code:

* ``MODE_ROWS`` — a block per row group walks its rows' tiles from the end,
  carrying the state in registers (many rows, or rows of one tile).
* ``MODE_LOOKBACK`` — a block per tile; tiles are handed out by an atomic
  ticket counter in reverse time order, so a block only ever waits for blocks
  that started before it (this is also why it runs in the simulator, which
  runs blocks one after another).  Each block publishes its tile map, then
  looks back over the maps of later tiles until it finds a published state
  (the ``TW`` threads of a row poll ``TW`` flags at once; the maps in between
  are prefetched into shared memory ``TW`` at a time), and applies those maps
  *one by one, in time order*, to that state.  The
  state every block computes for a tile is therefore the same sequence of
  floating-point operations however far the look-back went: results are
  bit-identical run after run (the look-back only changes who does the work).

Three compile-time variants (tunables ``prefetch``, ``fast_lookback`` and
``vector_access`` of the backend; all give the default kernels' bits):

* ``OPT_PREFETCH`` — in ``MODE_ROWS`` a thread issues the loads of its steps
  in the *next* tile before this tile's scan, so the block's loads are in
  flight while it scans (a few blocks per SM must otherwise wait out the
  memory latency once per tile).
* ``OPT_FASTLB`` — the look-back of one-row blocks with float32 (alpha, c)
  maps: a tile's record is three 64-bit words (alpha, c, state), each holding
  a flag in its high half and a float32 in its low half, written with one
  atomic exchange and read with atomics.  A flag can never be seen without
  its value, so no memory fence is needed; warp 0 polls 32 tiles per round
  (``ballot_sync``), backs off (``nanosleep``) after a round that finds
  nothing new, and hands the maps out with ``shfl_sync``, with one block
  barrier after the look-back instead of several per round.
* ``OPT_VECTOR`` — 16-byte accesses (:mod:`gaescan.kernels.cuda_vector`;
  ``VW`` = 4 float32 or 2 float64 elements): :func:`load` reads a thread's ``K``
  steps of rewards, values and next values ``VW`` at a time with
  ``ld.global.nc`` vector loads into per-thread arrays, and :func:`emit` stores
  the staged outputs ``VW`` consecutive steps per lane with ``st.global``
  vector stores.  Both drivers (the prefetch too).  Valid only where every
  array's rows start on 16-byte boundaries, are contiguous along time and
  hold the compute dtype, and ``T`` and ``K`` are multiples of ``VW``: the
  backend checks that on the host (``vector_ok``, ``vector_steps``).  Flags,
  per-step coefficients and boundary values are read as elements.

Look-back records (one per tile and row group, see :func:`group_record`) keep
the maps and the states of the group's rows in separate 128-byte-aligned
sections; each section is fully written (then ``threadfence`` and a block
barrier) before any of its rows' flags is raised, and read only after its
flag is seen (flags are read with atomics): no stale L1 line can be hit.

The code is split by role, each module documenting its part:

* :mod:`gaescan.kernels.cuda_spec` — :class:`KernelSpec`, the compile-time
  parameters of one kernel and the facts derived from them, and the
  constants (kinds, modes, option bits) this module re-exports;
* :mod:`gaescan.kernels.cuda_maps` — the map algebra (compose, apply) and the
  maps of single steps, segment ends and boundaries;
* :mod:`gaescan.kernels.cuda_tile` — a tile's load, fold, block scan and emit;
* :mod:`gaescan.kernels.cuda_rows` — the ``MODE_ROWS`` kernel;
* :mod:`gaescan.kernels.cuda_lookback` — the ``MODE_LOOKBACK`` kernel,
  fast look-back included;
* :mod:`gaescan.kernels.cuda_vector` — the 16-byte loads and stores.

Each role module's factory takes the spec (and the device functions of the
layer below) and returns its device functions; :func:`get_kernel` builds the
layers for one spec and caches the kernel by it.  Both drivers' kernels take
the same launch parameters.

``cuda`` is a module-level global of every kernel module, as the simulator
requires.  Kernels are compiled lazily (no signatures), on first launch.
"""

from __future__ import annotations

import numpy as np
from numba.core import config as _numba_config

from .cuda_lookback import build_lookback
from .cuda_maps import build_maps
from .cuda_rows import build_rows
from .cuda_spec import (  # noqa: F401 - the kernels' constants, re-exported for the backend and tests
    BACKOFF_MAX_NS,
    BACKOFF_MIN_NS,
    CT_BITS,
    FLAG_AGG,
    FLAG_INCL,
    GAE_NEXT,
    GAE_V,
    MAP_SLOTS,
    MODE_LOOKBACK,
    MODE_ROWS,
    OPT_FASTLB,
    OPT_GARR,
    OPT_LAARR,
    OPT_LARR,
    OPT_LVARR,
    OPT_MASK,
    OPT_PACKED,
    OPT_PREFETCH,
    OPT_TERM,
    OPT_TRUNC,
    OPT_UNPUBLISHED,
    OPT_VECTOR,
    RET,
    SCAN,
    KernelSpec,
)
from .cuda_tile import build_tile

#: Numba's CUDA simulator runs the kernels (``NUMBA_ENABLE_CUDASIM=1``, read at import).
SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

if SIMULATOR:
    # The simulator has no warp intrinsics: give it the shuffles, ballot and bit casts the kernels use.
    from . import _cudasim

    _cudasim.install()


def group_record(itemsize: int, rw: int) -> tuple[int, int]:
    """Look-back record of one (tile, row group): ``(map section, record)`` lengths in elements.

    The map section holds ``rw`` rows x ``MAP_SLOTS`` fields, the state section
    ``rw`` x 2; each section is padded to whole 128-byte lines, so each line
    is written once (by one block, before the flags of its rows are raised).
    """
    line = 128 // itemsize
    mapw = -(-rw * MAP_SLOTS // line) * line
    incw = -(-rw * 2 // line) * line
    return mapw, mapw + incw


_CACHE: dict = {}


def get_kernel(kind: int, mode: int, fwd: bool, dtype: np.dtype, nsh: int, k: int, opts: int = 0):
    """The (lazily compiled) kernel for a problem kind, driver mode and output dtype.

    Of the option bits, those in :data:`CT_BITS` are compile-time (a mask or
    packed rows cost registers when compiled in; the prefetch and the fast
    look-back are other code); the others are runtime switches.  Kernels are
    cached by their :class:`KernelSpec`.
    """
    spec = KernelSpec.of(kind, mode, fwd, dtype, nsh, k, opts)
    kern = _CACHE.get(spec)
    if kern is None:
        kern = _CACHE[spec] = build_kernel(spec)
    return kern


def build_kernel(spec: KernelSpec, parts: dict | None = None):
    """Compile-time specialisation of the kernel ``spec`` (see :func:`get_kernel`): not cached.

    ``parts``, a dict, receives the look-back's device functions (tests drive the
    fast look-back against a concurrent publisher in the simulator).
    """
    maps = build_maps(spec)
    tile = build_tile(spec, maps)
    if spec.lookback:
        return build_lookback(spec, maps, tile, parts)
    return build_rows(spec, maps, tile)


def _build(kind, mode, fwd, dtype, nsh, k, ct, parts=None):
    """:func:`build_kernel` of the spec of these arguments (the tests' private, uncached builds)."""
    return build_kernel(KernelSpec.of(kind, mode, fwd, dtype, nsh, k, ct), parts)
