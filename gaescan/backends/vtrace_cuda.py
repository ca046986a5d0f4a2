"""The ``"cuda"`` backend of :func:`gaescan.vtrace`: the ``"numpy"`` algorithm on the CUDA scan kernel.

V-trace is elementwise but for two reverse linear recurrences, so this
backend runs the elementwise algorithm of
:mod:`gaescan.backends.vtrace_numpy` in the compute namespace (CuPy on a
GPU, NumPy in Numba's simulator) and solves each recurrence with one launch
of :func:`gaescan.backends.cuda.linear_scan`:

1. with a ``mask`` and no ``next_values``, ``V'`` (the value at the next
   valid position of the same sequence, else the boundary value) is a
   reverse fill (:meth:`gaescan.backends.numpy_chunk._Frame.next_valid`);
2. the trace ``D`` is the reverse scan with decay ``γ c`` (0 at dones and
   sequence ends, 1 through masked positions) and input ``δ``.

Nothing is read back to the host: every step is an array operation or a
kernel launch queued on the current stream, and packed offsets
(``cu_seqlens``) are only used as device indices.  The scans run in the
output dtype, as the CUDA GAE kernel does.
"""

from __future__ import annotations

from typing import Any

from .._problem import Rows, ScanProblem
from .._vtrace import VTraceProblem
from . import cuda
from .vtrace_numpy import _vtrace


def _scan(xp: Any, a: Any, b: Any, init: Any) -> Any:
    """``y_t = a_t y_{t+1} + b_t`` (``y_T = init``, ``(R,)``) along axis 1, by the CUDA scan kernel."""
    R, T = b.shape
    y = xp.empty((R, T), dtype=b.dtype)
    # Every row is one sequence here: segment ends are already cuts in ``a``.
    rows = Rows(xp=xp, dtype=b.dtype, R=R, T=T, cu_seqlens=None, nseg=R)
    cuda.linear_scan(ScanProblem(rows, a, b, True, init, y))
    return y


def vtrace(p: VTraceProblem) -> None:
    """Write ``p.vs`` and ``p.advantages`` (see :class:`gaescan._vtrace.VTraceProblem`).

    A float32 problem with scalar ``γ`` and ``λ`` whose product lies above
    :data:`gaescan.backends.cuda.F32_STATE_MAX_DECAY` (and below 1) computes in
    float64, its scans included, as the GAE kernels do there: the on-policy
    decay ``γλ`` would drift in float32.
    """
    _vtrace(p, _scan, wide=cuda._near_one(p, p.gamma, p.lam))
