"""The ``"numpy"`` backend of :func:`gaescan.turn_gae`: vectorised NumPy.

Turn-level GAE is GAE on the sequence of turns, so this backend reduces the
tokens to turns, runs the ``"numpy"`` GAE backend on them, and gathers the
results back:

1. the valid tokens in row-major order (``numpy.nonzero`` of the mask), with
   their row, time, id and reward; a turn starts at a row's first valid token
   and wherever the id changes;
2. the ids' order is checked (a decrease between consecutive valid tokens
   of one row is an error, raised before any output is written);
3. ``R_k`` by ``numpy.add.reduceat`` over each turn's rewards (float64, in
   time order), ``U_k`` gathered at each turn's first token;
4. :func:`gaescan.gae` with ``backend="numpy"`` on the 1-D float64 turns,
   one packed segment (``cu_seqlens``) per row, γ and λ per turn and
   ``last_value`` per row: its advantages are ``A_k`` and its returns
   ``A_k + U_k``;
5. each valid token gets its turn's ``A_k`` and ``A_k + U_k`` (rounded to the
   output dtype once), every masked token 0.

Rows are independent packed segments of step 4, so a NaN in one row's turns
never reaches another row.
"""

from __future__ import annotations

import numpy as np

from .._turn_gae import TurnGAEProblem, decreasing_ids, ordered_ids


def _per_row(c, n: int) -> np.ndarray:
    if isinstance(c, float):
        return np.full(n, c)
    return np.asarray(c, dtype=np.float64)


def turn_gae(p: TurnGAEProblem) -> None:
    from .. import _api

    rows = p.rows
    R = rows.R
    if p.mask is None:
        valid = np.ones((R, rows.T), dtype=bool)
    else:
        valid = p.mask != 0
    row, t = np.nonzero(valid)
    ids = ordered_ids(p.turn_ids[row, t])
    same_row = row[1:] == row[:-1]
    dec = same_row & (ids[1:] < ids[:-1])
    if dec.any():
        raise decreasing_ids(p.batch_shape, int(row[1:][np.argmax(dec)]))
    p.advantages[...] = 0
    p.returns[...] = 0
    if row.size == 0:
        return
    new = np.ones(row.size, dtype=bool)
    new[1:] = ~same_row | (ids[1:] != ids[:-1])
    starts = np.flatnonzero(new)
    turn = np.cumsum(new) - 1
    rk = np.add.reduceat(p.rewards[row, t].astype(np.float64), starts)
    uk = p.values[row[starts], t[starts]].astype(np.float64)
    turn_row = row[starts]
    cu = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(np.bincount(turn_row, minlength=R), out=cu[1:])
    g = _per_row(p.gamma, R)[turn_row]
    lam = _per_row(p.lam, R)[turn_row]
    lv = _per_row(p.last_value, R)
    with np.errstate(invalid="ignore", over="ignore"):
        ak, retk = _api.gae(rk, uk, gamma=g, lam=lam, last_value=lv, cu_seqlens=cu, backend="numpy")
    p.advantages[row, t] = ak[turn]
    p.returns[row, t] = retk[turn]
