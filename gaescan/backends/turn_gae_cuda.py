"""The ``"cuda"`` backend of :func:`gaescan.turn_gae`: fixed-shape steps on ``(R, T)`` and the CUDA kernels.

The ``"numpy"`` backend compacts the valid tokens (``numpy.nonzero``), whose
count only the host knows.  Here every step keeps the ``(R, T)`` shape, so
the whole call is array operations and kernel launches queued on the
current stream, with nothing read back to the host:

1. turn starts: a valid token starts a turn when it is the row's first
   valid token or its id differs from the previous valid token's id.  The
   previous valid index is a forward fill (the CUDA scan kernel with decay
   0 and input ``t`` at valid tokens, decay 1 and input 0 at masked ones,
   initial -1); its id is gathered.  A turn but a row's last ends at the
   previous valid token of the next turn's start (a scatter of ``True``);
2. ``R_k`` at each start: a reverse scan of the rewards (0 at masked
   tokens and after the row) cut after each turn's last token, in float64;
3. the turn-level GAE: the CUDA GAE kernel with ``mask`` = the start flags
   (its ``V'`` is then the value at the next start, or ``last_value``),
   ``γ`` and ``λ`` per row, in float64: ``A_k`` and ``A_k + U_k`` at the
   starts, 0 elsewhere;
4. each token gets its turn's values by a forward fill (decay 0 at starts,
   1 elsewhere, the GAE outputs as inputs) into the output dtype, and 0 at
   masked tokens.

Every cut is a select in the kernels, so a NaN or an infinity stays within
its turn (and, through the recurrence, earlier turns of its row), as on the
host.  The ids' order is not checked (that would need a read on the host):
ids that decrease along time start a new turn wherever they change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._problem import Coeff, GAEProblem, Rows, ScanProblem
from .._turn_gae import TurnGAEProblem
from . import cuda

_F8 = np.dtype(np.float64)


def _rows(xp: Any, dtype: np.dtype, R: int, T: int) -> Rows:
    return Rows(xp=xp, dtype=np.dtype(dtype), R=R, T=T, cu_seqlens=None, nseg=R)


def _scan(xp: Any, a: Any, b: Any, reverse: bool, initial: float, dtype: np.dtype, out: Any = None) -> Any:
    """``y_t = a_t y_{t∓1} + b_t`` along axis 1 of ``(R, T)`` arrays, by the CUDA scan kernel."""
    R, T = b.shape
    y = xp.empty((R, T), dtype=dtype) if out is None else out
    cuda.linear_scan(ScanProblem(_rows(xp, dtype, R, T), a, b, reverse, initial, y))
    return y


def _per_row(xp: Any, c: Coeff, R: int, T: int) -> Coeff:
    """A per-row coefficient ``(R,)`` as the ``(R, T)`` view the GAE kernel reads (zero time stride)."""
    return c if isinstance(c, float) else xp.broadcast_to(c[:, None], (R, T))


def _starts(xp: Any, ids: Any, valid: Any | None) -> tuple[Any, Any]:
    """``(start, end)``, ``(R, T)`` bool: the first token of each turn, and the last token of each
    turn but a row's last (only masked tokens, which add 0 to the sums, follow that one)."""
    R, T = ids.shape
    if valid is None:
        change = ids[:, 1:] != ids[:, :-1]
        flag = xp.ones((R, 1), dtype=bool)
        return xp.concatenate([flag, change], axis=1), xp.concatenate([change, ~flag], axis=1)
    t = xp.arange(T, dtype=_F8)
    zero, one = _F8.type(0), _F8.type(1)
    # fill_t: the last valid index <= t, -1 before the row's first valid token (exact in float64).
    fill = _scan(xp, xp.where(valid, zero, one), xp.where(valid, t, zero), False, -1.0, _F8)
    prev = xp.concatenate([xp.full((R, 1), -1, dtype=np.int64), fill[:, :-1].astype(np.int64)], axis=1)
    has_prev = prev >= 0
    prev_id = xp.take_along_axis(ids, xp.where(has_prev, prev, 0), axis=1)
    start = valid & (~has_prev | (prev_id != ids))
    # A turn (but a row's last) ends at the valid token before the next turn's start;
    # positions that mark nothing write into a spare column T.
    end = xp.zeros((R, T + 1), dtype=bool)
    end[xp.arange(R)[:, None], xp.where(start & has_prev, prev, T)] = True
    return start, end[:, :T]


def turn_gae(p: TurnGAEProblem) -> None:
    """Write ``p.advantages`` and ``p.returns`` (see :class:`gaescan._turn_gae.TurnGAEProblem`)."""
    rows = p.rows
    xp, dt, R, T = rows.xp, np.dtype(rows.dtype), rows.R, rows.T
    valid = None if p.mask is None else p.mask != 0
    start, end = _starts(xp, p.turn_ids, valid)
    zero, one = _F8.type(0), _F8.type(1)
    r = p.rewards.astype(_F8)
    if valid is not None:
        r = xp.where(valid, r, zero)
    # R_k at the turn's first token: the sum of its tokens' rewards (masked tokens add 0).
    rk = _scan(xp, xp.where(end, zero, one), r, True, 0.0, _F8)
    adv_k = xp.empty((R, T), dtype=_F8)
    ret_k = xp.empty((R, T), dtype=_F8)
    cuda.gae(GAEProblem(
        rows=_rows(xp, _F8, R, T), rewards=rk, values=p.values, next_values=None, terminated=None,
        truncated=None, mask=start, gamma=_per_row(xp, p.gamma, R, T), lam=_per_row(xp, p.lam, R, T),
        last_value=p.last_value, advantages=adv_k, returns=ret_k))
    # The GAE outputs are 0 off the starts: a start takes its own value, every other token the carry.
    fill = xp.where(start, dt.type(0), dt.type(1))
    for src, out in ((adv_k, p.advantages), (ret_k, p.returns)):
        if valid is None:
            _scan(xp, fill, src, False, 0.0, dt, out=out)
        else:
            out[...] = xp.where(valid, _scan(xp, fill, src, False, 0.0, dt), dt.type(0))
