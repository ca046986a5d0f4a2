"""Compile-time facts of the CUDA kernels: problem kinds, drivers, option bits, :class:`KernelSpec`.

Every kernel is specialised by a :class:`KernelSpec`: the problem kind, the
driver, the direction of time, the compute dtype, the block's thread count,
the steps per thread ``K`` and the compile-time option bits (those in
:data:`CT_BITS`).  The spec derives the other compile-time facts from those
(the map's width, the staging buffers' lengths, which variant's code is
compiled) and rejects combinations no kernel implements.  The role modules'
factories (:mod:`gaescan.kernels.cuda_maps`, :mod:`~gaescan.kernels.cuda_tile`,
:mod:`~gaescan.kernels.cuda_rows`, :mod:`~gaescan.kernels.cuda_lookback`) read
every compile-time constant from it.

:mod:`gaescan.kernels.cuda` re-exports the constants defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Problem kinds (compile-time constants of a kernel).
GAE_V = 0  # GAE, bootstrap from the value at the next unmasked position
GAE_NEXT = 1  # GAE with next_values given
RET = 2  # discounted returns
SCAN = 3  # linear scan

MODE_ROWS = 0
MODE_LOOKBACK = 1

# Runtime option bits (one int argument).
OPT_TERM = 1
OPT_TRUNC = 2
OPT_MASK = 4
OPT_GARR = 8
OPT_LARR = 16
OPT_LVARR = 32
OPT_PACKED = 64
OPT_UNPUBLISHED = 128  # test hook: most tiles never publish their state (longer look-backs)
OPT_LAARR = 256  # GAE: lv[nseg + s] holds last_advantage (A past sequence s), else 0
# Compile-time variants (tunables "prefetch", "fast_lookback", "vector_access"; see the backend).
OPT_PREFETCH = 512  # MODE_ROWS: the next tile's loads are issued before this tile is scanned
OPT_FASTLB = 1024  # MODE_LOOKBACK, float32, (alpha, c) maps, one row per block: fence-free words
OPT_VECTOR = 8192  # 16-byte loads and stores (see vector_ok in the backend)
#: The option bits that select a compiled kernel (the others are runtime switches).
CT_BITS = OPT_MASK | OPT_PACKED | OPT_PREFETCH | OPT_FASTLB | OPT_VECTOR

FLAG_AGG = 1
FLAG_INCL = 2
# The fast look-back's back-off between fruitless polling rounds, in nanoseconds.
BACKOFF_MIN_NS = 32
BACKOFF_MAX_NS = 1024
MAP_SLOTS = 8  # elements per row in a record's map section (5 used)


@dataclass(frozen=True)
class KernelSpec:
    """The compile-time parameters of one kernel, and the facts derived from them.

    Parameters
    ----------
    kind : int
        ``GAE_V``, ``GAE_NEXT``, ``RET`` or ``SCAN``.
    mode : int
        The driver: ``MODE_ROWS`` or ``MODE_LOOKBACK``.
    fwd : bool
        Forward time (the linear scan reads physical time ``t = T-1-u``).
    dtype : numpy.dtype
        The compute and output dtype (float32 or float64).
    nsh : int
        Threads per block (``RW * TW``), the length of the shared map arrays.
    k : int
        Consecutive steps per thread.
    ct : int
        The compile-time option bits (a subset of :data:`CT_BITS`).

    Raises
    ------
    ValueError
        For the fast look-back of anything but float32 ``(alpha, c)`` maps, and
        for 16-byte accesses with a ``k`` that is not a multiple of :attr:`vw`.
    """

    kind: int
    mode: int
    fwd: bool
    dtype: np.dtype
    nsh: int
    k: int
    ct: int

    @classmethod
    def of(cls, kind, mode, fwd, dtype, nsh, k, opts=0) -> KernelSpec:
        """The spec of a launch's kernel: arguments normalised, runtime bits of ``opts`` dropped."""
        return cls(int(kind), int(mode), bool(fwd), np.dtype(dtype), int(nsh), int(k), int(opts) & CT_BITS)

    def __post_init__(self):
        if self.fastlb and (self.use_v or self.dtype != np.float32):
            raise ValueError("the fast look-back packs a float32 and a flag in one 64-bit word: "
                             "float32 outputs and (alpha, c) maps only (not masked GAE)")
        if self.vector and self.k % self.vw:
            raise ValueError(f"16-byte accesses read a thread's steps {self.vw} at a time from the arrays: "
                             f"they need K={self.k} to be a multiple of {self.vw}")

    @property
    def masked(self) -> bool:
        """A mask input is compiled in (masked steps are the identity map)."""
        return bool(self.ct & OPT_MASK)

    @property
    def packed(self) -> bool:
        """Rows hold several sequences (``cu_seqlens``); their ends restart the state."""
        return bool(self.ct & OPT_PACKED)

    @property
    def cast(self):
        """The compute dtype's scalar type (casts in device code)."""
        return np.float32 if self.dtype == np.float32 else np.float64

    @property
    def nbt(self):
        """The element type of the shared and local arrays."""
        return np.float32 if self.dtype == np.float32 else np.float64

    @property
    def use_v(self) -> bool:
        """The state carries the next unmasked value: five-number maps (masked GAE only).

        Without a mask, the value after step t is v[t+1] (or the boundary value):
        δ is computed directly and the map is the affine pair (alpha, c).  Only a
        mask (the next *unmasked* value) needs the value carried in the state.
        """
        return self.kind == GAE_V and self.masked

    @property
    def direct_v(self) -> bool:
        """GAE without a mask: δ is formed from the next step's value when the steps are loaded."""
        return self.kind == GAE_V and not self.masked

    @property
    def nf(self) -> int:
        """Numbers of a map held in shared memory: 5, or 2 for ``(alpha, c)`` maps."""
        return 5 if self.use_v else 2

    @property
    def line(self) -> int:
        """Elements per 128-byte line."""
        return 128 // self.dtype.itemsize

    @property
    def gae(self) -> bool:
        """GAE (either kind): two outputs, and a value input."""
        return self.kind in (GAE_V, GAE_NEXT)

    @property
    def lookback(self) -> bool:
        """The look-back driver (a block per tile), else the row-resident one."""
        return self.mode == MODE_LOOKBACK

    @property
    def prefetch(self) -> bool:
        """``OPT_PREFETCH`` (row-resident driver only)."""
        return bool(self.ct & OPT_PREFETCH) and not self.lookback

    @property
    def fastlb(self) -> bool:
        """``OPT_FASTLB`` (look-back driver only)."""
        return bool(self.ct & OPT_FASTLB) and self.lookback

    @property
    def vector(self) -> bool:
        """``OPT_VECTOR``: 16-byte loads of a thread's steps and stores of the staged outputs."""
        return bool(self.ct & OPT_VECTOR)

    @property
    def vw(self) -> int:
        """Elements of one 16-byte access (see :mod:`gaescan.kernels.cuda_vector`)."""
        return 16 // self.dtype.itemsize

    @property
    def vk(self) -> int:
        """Length of load's vector-loaded step arrays (1 without ``OPT_VECTOR``)."""
        return self.k if self.vector else 1

    @property
    def tb_len(self) -> int:
        """Output staging for coalesced stores (see emit): ``nsh*k`` slots plus padding (2-D, one row)."""
        return self.nsh * self.k + (self.nsh * self.k) // 32 + 1

    @property
    def tb2_len(self) -> int:
        """The second staging buffer: the second outputs (GAE)."""
        return self.tb_len if self.gae else 1
