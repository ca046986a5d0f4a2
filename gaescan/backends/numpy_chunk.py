"""The ``"numpy"`` backend: a chunk-parallel scan written against the array API.

Every call reduces to one reverse linear recurrence per row,
``y_t = a_t · y_{t+1} + b_t`` with ``y_T = init``, solved in three steps:

1. *in-chunk scan*: time is cut into chunks of ``C`` steps (``_config``
   tunable ``numpy_chunk``).  Each chunk is scanned with a zero carry-in —
   with a constant ``a`` as one matrix product against the ``C × C`` kernel
   ``K[i, j] = a^(j−i)`` (the published chunk-scan; inputs holding NaN or
   infinities, which the kernel's zeros would spread, scan their finite part
   and add the non-finite part by a cumulative sum); with per-step ``a`` as
   ``C`` vectorised steps over all chunks at once, keeping the running decay
   product ``P_i = a_i ··· a_{C−1}``;
2. *carry pass*: the chunk summaries ``(P_0, y_0)`` form the same recurrence
   one level up (``T / C`` steps), solved recursively, in float64 for
   float32 data;
3. *fix-up*: ``y_i += P_i · carry_in``.

Memory is a few times the input, never ``T × T`` nor ``C × C`` per chunk.
The code only uses functions shared by NumPy and CuPy, so it runs on both
(CuPy arrays stay on the device; nothing is read back to the host).
Flags, masks and packing become coefficients: a done sets ``a_t = 0`` (a
select, so nothing crosses it), a masked position passes the carry through
(``a_t = 1``, ``b_t = 0``) and its output is zeroed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from .. import _config
from .._problem import Coeff, GAEProblem, ReturnsProblem, Rows, ScanProblem

# --------------------------------------------------------------------------- the scan


def _step(xp: Any, a: Any, y: Any, b: Any) -> Any:
    """``a·y + b`` where a zero ``a`` is a select (``b``): nothing crosses a cut,
    not even a NaN or an infinity."""
    return b + xp.where(a == 0, a.dtype.type(0), a * y)


def _product(xp: Any, a: Any, p: Any) -> Any:
    """``a·p``, the decay of a run of steps, for the chunk-scan's carries.

    A zero factor (a cut) gives exactly 0, whatever the other one (a select:
    0 · NaN would pass a NaN across the cut).  A product of nonzero factors
    that rounds to zero gives the smallest subnormal of its sign instead: the
    carry's weight then hands a NaN or an infinity on as the step-by-step
    recurrence does (a tiny decay is no cut), and adds to a finite carry no
    more than that subnormal's share of it.
    """
    q = a * p
    tiny = q.dtype.type(np.finfo(q.dtype).smallest_subnormal)
    cut = a == 0
    cut |= p == 0
    if xp is np:  # in place, no temporaries but the masks
        np.copysign(tiny, q, out=q, where=q == 0)
        np.copyto(q, q.dtype.type(0), where=cut)
        return q
    q = xp.where(q == 0, xp.copysign(tiny, q), q)
    return xp.where(cut, q.dtype.type(0), q)


def _serial(xp: Any, a: Coeff, b: Any, init: Any) -> Any:
    """Reference-order loop over the (short) time axis, vectorised over rows.

    The state runs in the carry pass's dtype (:func:`_wide`), as do the
    decays; only the stored steps round to ``b``'s dtype.
    """
    T = b.shape[1]
    y = xp.empty_like(b)
    carry = init.astype(_wide(b.dtype))
    scalar = isinstance(a, float)
    for t in range(T - 1, -1, -1):
        carry = a * carry + b[:, t] if scalar else _step(xp, a[:, t], carry, b[:, t])
        y[:, t] = carry
    return y


def _chunk_kernel(xp: Any, a: float, C: int, dtype: np.dtype) -> Any:
    """The ``C × C`` matrix ``K[i, j] = a^(j − i)`` for ``j ≥ i``, else 0: row
    ``i`` of a chunk's product sums its future.  The powers are taken in the
    carry pass's dtype and each rounded once to ``dtype``."""
    wide = _wide(dtype)
    expo = xp.arange(C)[None, :] - xp.arange(C)[:, None]
    return xp.where(expo >= 0, wide.type(a) ** xp.maximum(expo, 0).astype(wide), wide.type(0)).astype(dtype)


def _powers(xp: Any, a: float, C: int, dtype: np.dtype) -> Any:
    """``a^(C − i)`` for ``i = 0 .. C − 1``, taken in the carry pass's dtype, each rounded once to ``dtype``."""
    wide = _wide(dtype)
    return (wide.type(a) ** xp.arange(C, 0, -1).astype(wide)).astype(dtype)


def _const_scan(xp: Any, ar: float, b: Any, init: Any, C: int, out: Any, finite_only: bool,
                scratch: bool = False) -> Any:
    """:func:`reverse_scan` with the constant decay ``ar`` (``T > C``), by the chunk matmul.

    ``ar`` is a Python float, not rounded to ``b``'s dtype: the powers of it
    in the chunk kernel and the carry pass are taken in float64 (a float32
    decay, rounded once, would weigh every step with the same error, and the
    error of ``a^k`` grows with ``k``).

    The kernel's zeros below the diagonal multiply the steps a row of the chunk
    does not depend on, so a NaN or an infinity in ``b`` reaches later steps of
    its chunk (``0 · NaN``).  With ``finite_only`` the scan therefore returns
    ``None`` as soon as it meets a non-finite chunk head or ``init`` (a chunk's
    head weighs every step of the chunk, so it is finite exactly when they all
    are, barring overflow), before anything depends on them.

    With ``finite_only`` and a ``b`` the scan may overwrite (``scratch``, or
    a padded copy), :func:`_cut_scan` without dones runs it: the carries go
    into the chunks before the product, with no pass over the result
    afterwards.
    """
    R, T = b.shape
    dtype = b.dtype
    nC = -(-T // C)
    pad = nC * C - T
    if finite_only and (scratch or pad):
        return _cut_scan(b, None, ar, init, C, out, finite_only=True)
    b3 = _pad_front(xp, b, pad).reshape(R, nC, C)
    K = _chunk_kernel(xp, ar, C, dtype)
    into_out = out is not None and pad == 0 and out.flags.c_contiguous
    if into_out:
        local = out.reshape(R, nC, C)
        xp.matmul(b3.reshape(R * nC, C), K.T, out=local.reshape(R * nC, C))
    else:
        local = xp.matmul(b3.reshape(R * nC, C), K.T).reshape(R, nC, C)
    heads = xp.ascontiguousarray(local[:, :, 0])
    if finite_only and not (xp.isfinite(heads).all() and xp.isfinite(init).all()):
        return None
    # The carry pass runs in float64 (on T / C numbers): a float32 a^C, raised
    # again at every level, would round the same way each time and drift.
    wide = _wide(dtype)
    y_heads = reverse_scan(xp, float(wide.type(ar) ** C), heads.astype(wide), init.astype(wide), C)
    carry = xp.concatenate([y_heads[:, 1:], init[:, None]], axis=1).astype(dtype)
    local += carry[:, :, None] * _powers(xp, ar, C, dtype)
    return out if into_out else local.reshape(R, nC * C)[:, pad:]


def _cut_scan(b: np.ndarray, done: np.ndarray | None, ar: float, init: np.ndarray, C: int,
              out: np.ndarray | None, finite_only: bool = False) -> np.ndarray | None:
    """:func:`reverse_scan` on host arrays with the decay ``ar`` at every step
    but 0 (a select) where ``done`` is set (none where it is ``None``), for a
    ``b`` the scan may overwrite.

    The heads of all chunks come first, from one matrix-vector product; then
    the carry pass; then each chunk's carry-in goes into its last ``b``
    (``b + a·carry``), so that the chunk matmul itself adds ``a^(C − i)·carry``
    at step ``i``, with no pass over the result afterwards.  The chunks that
    hold a done, and those whose head is not finite (a NaN or an infinity
    inside, which the matmul's zeros would spread), gathered, take ``C``
    vectorised steps instead, whose selects keep a NaN inside its episode; a
    done cuts a chunk's head off its carry-in, so their heads need none.
    Which way a chunk goes depends on its own inputs only, so a NaN changes
    no bit outside its episode.  With ``finite_only`` the scan returns
    ``None`` instead, before writing anything the caller sees, where a head
    or ``init`` is not finite (:func:`_const_scan`).
    """
    R, T = b.shape
    dtype = b.dtype
    nC = -(-T // C)
    pad = nC * C - T
    b3 = _pad_front(np, b, pad).reshape(R, nC, C)
    K = _chunk_kernel(np, ar, C, dtype)
    heads = np.matmul(b3, K[0])
    steps = ~np.isfinite(heads)
    if finite_only and (steps.any() or not np.isfinite(init).all()):
        return None
    wide = _wide(dtype)
    a = wide.type(ar)
    if done is None:
        decay_c: Coeff = float(a ** C)
        ri, ci = np.nonzero(steps)
        ac = np.full((len(ri), C), a, wide)
    else:
        d3 = _pad_front(np, done, pad).reshape(R, nC, C)
        cut = d3.any(axis=2)
        decay_c = np.where(cut, wide.type(0), a ** C)
        steps |= cut
        ri, ci = np.nonzero(steps)
        ac = np.where(d3[ri, ci], wide.type(0), a)
    bc = b3[ri, ci]
    heads[ri, ci] = _serial(np, ac, bc, np.zeros(len(ri), dtype))[:, 0]
    y_heads = reverse_scan(np, decay_c, heads.astype(wide), init.astype(wide), C)
    carry = np.concatenate([y_heads[:, 1:], init[:, None]], axis=1)
    b3[:, :, C - 1] += np.where(steps, 0.0, a * carry).astype(dtype)
    into_out = out is not None and pad == 0 and out.flags.c_contiguous
    y = out if into_out else np.empty((R, nC * C), dtype)
    y3 = y.reshape(R, nC, C)
    np.matmul(b3.reshape(R * nC, C), K.T, out=y3.reshape(R * nC, C))
    y3[ri, ci] = _serial(np, ac, bc, carry[ri, ci])
    return y if into_out else y[:, pad:]


def _cut_scan_ok(rows: Rows, decay: Coeff, done: Any | None, valid: Any | None, frame: _Frame) -> bool:
    """Whether :func:`_cut_scan` serves a GAE or returns problem: host rows
    longer than a chunk, a constant nonzero finite decay cut by dones, no mask
    and no packing."""
    return (rows.xp is np and isinstance(decay, float) and decay != 0 and math.isfinite(decay)
            and done is not None and valid is None and frame.last is None and rows.T > _chunk())


def _const_scan_nonfinite(xp: Any, ar: float, b: Any, init: Any, C: int, out: Any) -> Any:
    """:func:`_const_scan` for inputs that may hold NaN or infinities.

    A finite nonzero decay carries a NaN unchanged, and an infinity unchanged up
    to the sign ``sign(a)^(j − t)``, to every earlier step, where the infinities
    and NaNs of all later steps meet as in a sum (``inf + −inf`` is NaN).  So
    the scan runs on the finite part of ``b`` and ``init``, and the non-finite
    part of ``y_t`` is the (order-free) sum of the non-finite later terms: one
    cumulative sum, which no step before ``t`` enters.
    """
    R, T = b.shape
    zero = b.dtype.type(0)
    fin = xp.isfinite(b)
    fin_init = xp.isfinite(init)
    y = _const_scan(xp, ar, xp.where(fin, b, zero), xp.where(fin_init, init, zero), C, out,
                    finite_only=False)
    tail = xp.concatenate([xp.where(fin, zero, b), xp.where(fin_init, zero, init)[:, None]], axis=1)
    if ar < 0:
        sign = xp.where(xp.arange(T + 1) % 2 == 0, b.dtype.type(1), b.dtype.type(-1))
        tail = tail * sign
    nf = xp.cumsum(tail[:, ::-1], axis=1)[:, ::-1][:, :T]
    if ar < 0:
        nf = nf * sign[:T]
    y[...] = xp.where(nf == 0, y, y + nf)
    return y


def _wide(dtype: np.dtype) -> np.dtype:
    """The carry pass's dtype: float64 for float32 data (see the contract, docs/semantics.md, "Accuracy and determinism")."""
    return np.dtype(np.float64) if dtype == np.float32 else dtype


def _pad_front(xp: Any, x: Any, n: int) -> Any:
    # Steps before t = 0 never influence a reverse scan's outputs.
    if n == 0:
        return x
    head = xp.zeros((x.shape[0], n), dtype=x.dtype)
    return xp.concatenate([head, x], axis=1)


def reverse_scan(xp: Any, a: Coeff, b: Any, init: Any, chunk: int, out: Any = None, scratch: bool = False) -> Any:
    """Solve ``y_t = a_t y_{t+1} + b_t`` (``y_T = init``) along axis 1 of ``(R, T)`` arrays.

    A zero ``a_t`` is a select (``y_t = b_t``), never a multiplication by zero.

    A float32 ``b`` takes its decays in float64 where they are not float32
    values (a product ``γ·λ``, a V-trace weight): a decay rounded to float32
    errs the same way at every step it weighs, and over a horizon of
    ``1 / (1 − a)`` steps that error grows past the contract's tolerance.

    Parameters
    ----------
    a : float or array
        A Python float (taken in float64, whatever ``b``'s dtype), or an
        ``(R, T)`` array of ``b``'s dtype or of float64; with a float64 ``a``
        and a float32 ``b`` the scan runs in float64 and returns float64.
    b : array
        ``(R, T)``.
    init : array
        ``(R,)`` boundary values.
    chunk : int
        Chunk length ``C >= 2``.
    out : array, optional
        A C-contiguous ``(R, T)`` buffer the result may be written into
        (used when the chunks tile ``T`` exactly); check ``result is out``.
    scratch : bool
        Whether ``b`` is the caller's scratch, which the scan may overwrite.
    """
    if not isinstance(a, float) and a.dtype.itemsize > b.dtype.itemsize:
        b, init = b.astype(a.dtype), init.astype(a.dtype)
    R, T = b.shape
    dtype = b.dtype
    if isinstance(a, float) and a == 0:
        return xp.array(b, dtype=dtype, copy=True)
    if T <= (chunk if isinstance(a, float) else min(chunk, int(_config.get("numpy_step_chunk")))):
        return _serial(xp, a, b, init)
    if isinstance(a, float):
        if xp is np and math.isfinite(a):
            y = _const_scan(xp, a, b, init, chunk, out, finite_only=True, scratch=scratch)
            if y is not None:
                return y
        if math.isfinite(a):
            return _const_scan_nonfinite(xp, a, b, init, chunk, out)
        return _const_scan(xp, a, b, init, chunk, out, finite_only=False)
    # Per-step decays: C vectorised steps, each over position i of every chunk.
    C = min(chunk, int(_config.get("numpy_step_chunk")))
    nC = -(-T // C)
    pad = nC * C - T
    b3 = _pad_front(xp, b, pad).reshape(R, nC, C)
    a3 = _pad_front(xp, a, pad).reshape(R, nC, C)
    y3 = xp.array(b3, copy=True)
    P3 = xp.empty_like(y3)
    P3[:, :, C - 1] = a3[:, :, C - 1]
    # The chunks' whole products feed the carry pass, whose levels multiply
    # them again and again: they are kept in float64, because a float32 product
    # of equal factors rounds the same way in every chunk and the error grows
    # with the number of chunks.  The in-chunk products P3 meet a carry once.
    # A product is exactly 0 from a cut on (a select, as in _step): a NaN or
    # an infinity beyond the cut must not reach the carry's weight (0 · NaN).
    # Only a cut: see _product.
    wide = _wide(dtype)
    head_decay = a3[:, :, C - 1].astype(wide)
    for i in range(C - 2, -1, -1):
        ai = a3[:, :, i]
        y3[:, :, i] = _step(xp, ai, y3[:, :, i + 1], y3[:, :, i])
        P3[:, :, i] = _product(xp, ai, P3[:, :, i + 1])
        head_decay = _product(xp, ai.astype(wide), head_decay)
    y_heads = reverse_scan(xp, head_decay, y3[:, :, 0].astype(wide), init.astype(wide), C)
    carry = xp.concatenate([y_heads[:, 1:], init[:, None]], axis=1).astype(dtype)
    return _step(xp, P3, carry[:, :, None], y3).reshape(R, nC * C)[:, pad:]


# --------------------------------------------------------------------------- normalisation


def _data(x: Any, rows: Rows) -> Any:
    return x.astype(rows.dtype, copy=False)


def _coeff(c: Coeff, rows: Rows) -> Any:
    return c if isinstance(c, float) else _data(c, rows)


def _typed(c: Coeff, dtype: np.dtype) -> Any:
    """A scalar coefficient as a NumPy scalar of ``dtype`` (keeps float32 math float32)."""
    return dtype.type(c) if isinstance(c, float) else c


def _flag(x: Any | None) -> Any | None:
    return None if x is None else x != 0


def _bound(v: Coeff, rows: Rows) -> Any:
    if isinstance(v, float):
        return rows.xp.full(rows.nseg, v, dtype=rows.dtype)
    return _data(v, rows)


def _either(xp: Any, x: Any | None, y: Any | None) -> Any | None:
    if x is None:
        return y
    return x if y is None else xp.logical_or(x, y)


def _chunk() -> int:
    C = int(_config.get("numpy_chunk"))
    if C < 2:
        raise ValueError(f"numpy_chunk must be at least 2, got {C}")
    return C


class _Frame:
    """Per-row boundaries of a problem: where sequences end and what follows them.

    For ordinary rows the boundary is the end of the row (scan ``init``).
    For packed rows, the last position of each non-empty segment is marked
    ``last`` and carries its segment's boundary value ``after``; the scan runs
    over the single row with ``init = 0``.
    """

    def __init__(self, rows: Rows, bound: Coeff):
        xp = rows.xp
        self.rows = rows
        b = _bound(bound, rows)
        if rows.cu_seqlens is None:
            self.init = b
            self.last = None
            self.after = None
            return
        cu = rows.cu_seqlens
        T = rows.T
        ends = cu[1:]
        # Empty segments scatter into a dummy slot past the end.
        self._target = xp.where(ends > cu[:-1], ends - 1, T)
        last = xp.zeros(T + 1, dtype=bool)
        last[self._target] = True
        self.init = xp.zeros(1, dtype=rows.dtype)
        self.last = last[None, :T]
        self.after = self.at_ends(b)

    def at_ends(self, b: Any) -> Any:
        """Per-segment values ``b`` placed at their segments' last positions (packed rows)."""
        xp = self.rows.xp
        after = xp.zeros(self.rows.T + 1, dtype=self.rows.dtype)
        after[self._target] = b
        return after[None, : self.rows.T]

    def next_valid(self, x: Any, valid: Any | None, scan: Callable[[Any, Any, Any, Any], Any] | None = None) -> Any:
        """``x`` at the next valid position of the same sequence, else the boundary value.

        ``scan(xp, a, b, init)``, when given, solves the fill's reverse
        recurrence (another backend's kernel) in place of :func:`reverse_scan`.
        """
        xp = self.rows.xp
        dt = self.rows.dtype
        if valid is None:
            shifted = xp.concatenate([x[:, 1:], self.init[:, None]], axis=1)
            return shifted if self.last is None else xp.where(self.last, self.after, shifted)
        # z_t = x_t at valid t, else z_{t+1}; a sequence end restarts from its boundary.
        zero = dt.type(0)
        keep = xp.where(valid, zero, dt.type(1))
        b = xp.where(valid, x, zero)
        if self.last is not None:
            keep = xp.where(self.last, zero, keep)
            b = xp.where(self.last & ~valid, self.after, b)
        z = reverse_scan(xp, keep, b, self.init, _chunk()) if scan is None else scan(xp, keep, b, self.init)
        shifted = xp.concatenate([z[:, 1:], self.init[:, None]], axis=1)
        if self.last is not None:
            shifted = xp.where(self.last, self.after, shifted)
        return shifted


def _finish(xp: Any, y: Any, valid: Any | None, out: Any, plus: Any = None) -> None:
    if plus is not None:
        y = y + plus
    out[...] = y if valid is None else xp.where(valid, y, y.dtype.type(0))


# --------------------------------------------------------------------------- row blocks

P = TypeVar("P", GAEProblem, ReturnsProblem, ScanProblem)


def _row_blocks(p: P) -> Iterator[P]:
    """Split a host problem into groups of rows small enough to stay in cache.

    Every pass of the chunk scan then re-reads cached data instead of main
    memory.  Device problems run as one block: there each pass is one kernel
    launch, and launches, not bandwidth, are what blocks would multiply.
    """
    rows = p.rows
    if rows.xp is not np or rows.cu_seqlens is not None:
        yield p
        return
    per = max(1, int(_config.get("numpy_block_elems")) // max(rows.T, 1))
    if per >= rows.R:
        yield p
        return
    for r0 in range(0, rows.R, per):
        r1 = min(rows.R, r0 + per)
        sub = dataclasses.replace(rows, R=r1 - r0, nseg=r1 - r0)
        fields = {}
        for f in dataclasses.fields(p):
            x = getattr(p, f.name)
            if f.name == "rows":
                fields[f.name] = sub
            elif x is None or isinstance(x, (float, bool)):
                fields[f.name] = x
            else:
                fields[f.name] = x[r0:r1]
        yield dataclasses.replace(p, **fields)


# --------------------------------------------------------------------------- backend functions


def gae(p: GAEProblem) -> None:
    for block in _row_blocks(p):
        _gae(block)


def discounted_returns(p: ReturnsProblem) -> None:
    for block in _row_blocks(p):
        _returns(block)


def linear_scan(p: ScanProblem) -> None:
    for block in _row_blocks(p):
        _scan(block)


def _gae(p: GAEProblem) -> None:
    rows, xp, dt = p.rows, p.rows.xp, p.rows.dtype
    zero = dt.type(0)
    frame = _Frame(rows, p.last_value)
    valid = _flag(p.mask)
    term = _flag(p.terminated)
    done = _either(xp, term, _flag(p.truncated))
    r = _data(p.rewards, rows)
    v = _data(p.values, rows)
    gamma = _coeff(p.gamma, rows)
    lam = _coeff(p.lam, rows)
    with np.errstate(invalid="ignore", over="ignore"):
        g = _typed(gamma, dt)
        if p.next_values is not None:
            boot = g * _data(p.next_values, rows)
        elif valid is None and frame.last is None:
            # V'_t = V_{t+1}: the shift, without materialising it.
            boot = xp.empty_like(r)
            xp.multiply(g if isinstance(gamma, float) else g[:, :-1], v[:, 1:], out=boot[:, :-1])
            boot[:, -1] = (g if isinstance(gamma, float) else g[:, -1]) * frame.init
        else:
            boot = g * frame.next_valid(v, valid)
        if term is not None:
            boot = xp.where(term, zero, boot)
        boot += r
        boot -= v
        delta = boot if valid is None else xp.where(valid, boot, zero)
        decay = _decay(gamma, lam, dt)
        init = xp.zeros(rows.R, dtype=dt)
        if not (isinstance(p.last_advantage, float) and p.last_advantage == 0):
            carry = _bound(p.last_advantage, rows)
            if frame.last is None:
                init = carry
            else:
                delta = _fold_end(xp, rows, frame, frame.at_ends(carry), decay, done, valid, delta)
        if _cut_scan_ok(rows, decay, done, valid, frame):
            # Constant decay cut at dones: the chunk matmul where no done falls.
            adv = _cut_scan(delta, done, decay, init, _chunk(), p.advantages)
        else:
            decay = _cut(xp, rows, decay, done, valid, frame)
            adv = reverse_scan(xp, decay, delta, init, _chunk(),
                               out=p.advantages if valid is None else None, scratch=True)
        if adv is not p.advantages:
            _finish(xp, adv, valid, p.advantages)
        _finish(xp, adv, valid, p.returns, plus=v)


def _fold_end(xp: Any, rows: Rows, frame: _Frame, after: Any, decay: Coeff, done: Any | None,
              valid: Any | None, b: Any) -> Any:
    """Fold each packed segment's carry-in ``after`` into ``b`` at the segment's last position
    (where :func:`_cut` makes the scan restart): ``b + decay·after`` there, a select on ``done``,
    and ``after`` itself at a masked last position, which hands it on unchanged."""
    dt = rows.dtype
    term = decay * after
    if done is not None:
        term = xp.where(done, dt.type(0), term)
    end = frame.last
    if valid is not None:
        return xp.where(end & ~valid, after, xp.where(end, b + term, b))
    return xp.where(end, b + term, b)


def _decay(gamma: Coeff, lam: Coeff, dt: np.dtype) -> Coeff:
    """GAE's decay ``γ·λ`` from the coefficients (already rounded to ``dt``), as
    the contract's reference forms it: in float64.  A float, or an array of
    ``dt`` where one factor is 1, else of the carry pass's dtype (see
    :func:`reverse_scan`)."""
    if isinstance(gamma, float) and isinstance(lam, float):
        return gamma * lam
    if isinstance(lam, float) and lam == 1:
        return gamma
    if isinstance(gamma, float) and gamma == 1:
        return lam
    wide = _wide(dt)
    return (wide.type(gamma) if isinstance(gamma, float) else gamma.astype(wide)) * (
        wide.type(lam) if isinstance(lam, float) else lam.astype(wide))


def _cut(xp: Any, rows: Rows, decay: Coeff, done: Any | None, valid: Any | None, frame: _Frame) -> Coeff:
    """Per-step decay: 0 after a done or a sequence end, 1 through masked positions.

    A float decay becomes an array of the rows' dtype where it is a value of
    that dtype, else of the carry pass's dtype (see :func:`reverse_scan`)."""
    dt = rows.dtype
    if done is None and valid is None and frame.last is None:
        return decay
    if isinstance(decay, float):
        exact = math.isnan(decay) or float(dt.type(decay)) == decay
        decay = xp.full((rows.R, rows.T), decay, dtype=dt if exact else _wide(dt))
    if done is not None:
        decay = xp.where(done, dt.type(0), decay)
    if valid is not None:
        decay = xp.where(valid, decay, dt.type(1))
    if frame.last is not None:
        decay = xp.where(frame.last, dt.type(0), decay)
    return decay


def _returns(p: ReturnsProblem) -> None:
    rows, xp, dt = p.rows, p.rows.xp, p.rows.dtype
    zero = dt.type(0)
    frame = _Frame(rows, p.last_value)
    valid = _flag(p.mask)
    r = _data(p.rewards, rows)
    with np.errstate(invalid="ignore", over="ignore"):
        b = r if valid is None else xp.where(valid, r, zero)
        dn = _flag(p.dones)
        if frame.last is not None:
            # G past a segment end is its last_value: fold it into b at the end step.
            b = _fold_end(xp, rows, frame, frame.after, _typed(_coeff(p.gamma, rows), dt), dn, valid, b)
        gamma = _coeff(p.gamma, rows)
        if _cut_scan_ok(rows, gamma, dn, valid, frame):
            # Constant γ cut at dones: the chunk matmul where no done falls, on a copy of
            # the rewards (the scan overwrites its b).
            y = _cut_scan(np.array(b, dtype=dt), dn, gamma, frame.init, _chunk(), p.returns)
        else:
            y = reverse_scan(xp, _cut(xp, rows, gamma, dn, valid, frame), b, frame.init, _chunk())
        if y is not p.returns:
            _finish(xp, y, valid, p.returns)


def _scan(p: ScanProblem) -> None:
    rows, xp = p.rows, p.rows.xp
    a = _coeff(p.a, rows)
    b = _data(p.b, rows)
    init = _bound(p.initial, rows)
    with np.errstate(invalid="ignore", over="ignore"):
        if p.reverse:
            p.out[...] = reverse_scan(xp, a, b, init, _chunk())
        else:
            flip = a if isinstance(a, float) else a[:, ::-1]
            p.out[...] = reverse_scan(xp, flip, b[:, ::-1], init, _chunk())[:, ::-1]
