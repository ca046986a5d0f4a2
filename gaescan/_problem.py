"""Normalised problems: what every backend module receives.

The public functions validate their arguments and reduce every call to one of
three problems below.  Each one is expressed on 2-D ``(R, T)`` *row views*:
row ``r`` is one independent sequence, time runs along the last axis, and the
views may have any strides (a time-major ``axis=0`` input becomes a view whose
time stride is the batch size; nothing is transposed).  Packed inputs
(``cu_seqlens``) are a single row ``R == 1`` cut into ``nseg`` segments.

Conventions that every backend relies on:

* data arrays (``rewards``, ``values``, ``next_values``, ``b``) keep their
  original float/int dtype: a backend reads them in that dtype and computes in
  ``dtype`` (the output dtype);
* flags (``terminated``, ``truncated``, ``mask``) keep their original dtype too
  (bool, integer or float; nonzero means true) and are ``None`` when absent;
  ``dones=`` has already been folded into ``terminated``;
* coefficients (``gamma``, ``lam``, ``a``) are either a Python ``float`` already
  rounded to ``dtype``, or an ``(R, T)`` view (possibly with zero strides, for
  per-row coefficients);
* ``last_value`` / ``last_advantage`` / ``initial`` is a Python ``float`` or a
  1-D array of length ``nseg``;
* outputs are writable ``(R, T)`` views of ``dtype`` that overlap no input; a
  backend writes every element of them (zeros at masked positions).

A problem is built once per call and read, never changed, by the backend
(``dataclasses.replace`` makes sub-problems); its classes use slots and no
frozen checks, which cost on every small call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import numpy as np

Array = Any  # a NumPy or CuPy ndarray (the compute namespace's array type)
Coeff = Union[float, Array]  # noqa: UP007 - a runtime alias, kept valid on Python 3.10


def widened(p: Any, outputs: tuple[str, ...]) -> Any:
    """Problem ``p`` (any problem dataclass) in float64: its rows' dtype float64
    and every float array but the ``outputs`` fields copied to float64 (in the
    compute namespace: stream-ordered on a GPU).  Scalars are values of ``p``'s
    dtype already and stay as they are; so, exactly, do the arrays' values (a
    float32 problem's float arrays are float32 or narrower)."""
    def widen(x: Any) -> Any:
        return x.astype(np.float64) if hasattr(x, "dtype") and x.dtype.kind == "f" else x

    skip = ("rows", *outputs)
    fields = {f.name: widen(getattr(p, f.name)) for f in dataclasses.fields(p) if f.name not in skip}
    return dataclasses.replace(p, rows=dataclasses.replace(p.rows, dtype=np.dtype(np.float64)), **fields)


@dataclass(frozen=True)
class Rows:
    """Geometry shared by all problems.

    Attributes
    ----------
    xp : module
        Array namespace of every array in the problem (``numpy`` or ``cupy``).
    dtype : numpy.dtype
        Output / accumulation dtype (float32 or float64).
    R, T : int
        Number of rows and their length.
    cu_seqlens : array or None
        Integer offsets ``[0 = c_0 <= ... <= c_S = T]`` cutting the single row
        (``R == 1``) into segments; ``None`` when every row is one sequence.
        On the host they have been checked; on a device they are passed
        unread (reading them would synchronise).
    nseg : int
        Number of independent sequences: ``R``, or ``S = len(cu_seqlens) - 1``.
    """

    xp: Any
    dtype: np.dtype
    R: int
    T: int
    cu_seqlens: Array | None
    nseg: int


@dataclass(slots=True)
class GAEProblem:
    """``A_t = δ_t + γ_t λ_t (1 − done_t) A_{τ(t)}``, ``R_t = A_t + V_t``.

    ``δ_t = r_t + γ_t (1 − term_t) V'_t − V_t`` with ``V'_t = next_values[t]``
    when given, else the value at the next unmasked position of the same
    sequence, else ``last_value``.  ``done_t = term_t or trunc_t``.  Both the
    bootstrap and the done cut are selects, never multiplications by zero.
    ``A`` past a sequence's last (unmasked) step is ``last_advantage``.
    """

    rows: Rows
    rewards: Array
    values: Array
    next_values: Array | None
    terminated: Array | None
    truncated: Array | None
    mask: Array | None
    gamma: Coeff
    lam: Coeff
    last_value: Coeff
    advantages: Array
    returns: Array
    last_advantage: Coeff = 0.0


@dataclass(slots=True)
class ReturnsProblem:
    """``G_t = r_t + γ_t (1 − done_t) G_{τ(t)}``, ``G`` past the end = ``last_value``."""

    rows: Rows
    rewards: Array
    dones: Array | None
    mask: Array | None
    gamma: Coeff
    last_value: Coeff
    returns: Array


@dataclass(slots=True)
class ScanProblem:
    """``y_t = a_t y_{t∓1} + b_t`` (``reverse`` picks ``t+1``), boundary ``initial``."""

    rows: Rows
    a: Coeff
    b: Array
    reverse: bool
    initial: Coeff
    out: Array


class GAEResult(NamedTuple):
    """Result of :func:`gaescan.gae`."""

    advantages: Any
    """``A_t``, the generalised advantage estimates."""
    returns: Any
    """``R_t = A_t + V_t``, the TD(λ) returns (value-function targets)."""
