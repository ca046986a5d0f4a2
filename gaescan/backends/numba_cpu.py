"""The ``"numba"`` backend: Numba CPU kernels on NumPy arrays.

Casting to the kernels' uniform argument kinds happens here (see
:mod:`gaescan.kernels.cpu`); the kernels only loop.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .._problem import Coeff, GAEProblem, ReturnsProblem, Rows, ScanProblem
from ..kernels import cpu

_NO_OFFSETS = np.zeros(1, dtype=np.int64)


def _data(x: Any, rows: Rows) -> np.ndarray:
    return x.astype(rows.dtype, copy=False)


def _coeff(c: Coeff, rows: Rows) -> np.ndarray:
    if isinstance(c, float):
        return np.broadcast_to(rows.dtype.type(c), (rows.R, rows.T))
    return _data(c, rows)


def _flag(x: Optional[Any], rows: Rows, absent: bool) -> np.ndarray:
    if x is None:
        return np.broadcast_to(np.bool_(absent), (rows.R, rows.T))
    return x if x.dtype == np.bool_ else x != 0


def _bound(v: Coeff, rows: Rows) -> np.ndarray:
    if isinstance(v, float):
        return np.full(rows.nseg, v, dtype=rows.dtype)
    return v.astype(rows.dtype, copy=False)


def _offsets(rows: Rows) -> tuple[np.ndarray, bool]:
    if rows.cu_seqlens is None:
        return _NO_OFFSETS, False
    return rows.cu_seqlens, True


def gae(p: GAEProblem) -> None:
    rows = p.rows
    values = _data(p.values, rows)
    cu, packed = _offsets(rows)
    cpu.gae_rows(
        _data(p.rewards, rows), values,
        values if p.next_values is None else _data(p.next_values, rows),
        _coeff(p.gamma, rows), _coeff(p.lam, rows),
        _flag(p.terminated, rows, False), _flag(p.truncated, rows, False), _flag(p.mask, rows, True),
        p.next_values is not None, _bound(p.last_value, rows), cu, packed,
        rows.dtype.type(0), p.advantages, p.returns,
    )


def discounted_returns(p: ReturnsProblem) -> None:
    rows = p.rows
    cu, packed = _offsets(rows)
    cpu.returns_rows(
        _data(p.rewards, rows), _coeff(p.gamma, rows),
        _flag(p.dones, rows, False), _flag(p.mask, rows, True),
        _bound(p.last_value, rows), cu, packed, rows.dtype.type(0), p.returns,
    )


def linear_scan(p: ScanProblem) -> None:
    rows = p.rows
    cpu.scan_rows(_coeff(p.a, rows), _data(p.b, rows), p.reverse, _bound(p.initial, rows), p.out)
