r"""The carry API: exact scans over rows split into contiguous time slices.

Every scan of gaescan is an affine recurrence along time, so the effect of
everything *after* a slice (for the reverse scans) on the slice's outputs is
one number per row: the scan's value just past the slice, the *carry*.  A
slice is summarised by two numbers per row,

.. math::

    \text{decay} = \prod_{t \in \text{slice, valid}} a_t, \qquad
    \text{head} = y_{t_0}\big|_{\text{carry} = 0},

where ``t_0`` is the slice's first valid step (its last one for a forward
:func:`~gaescan.linear_scan`) and ``a_t`` is the step's decay (``γ_t λ_t`` for
GAE, ``γ_t`` for returns, ``a_t`` for ``linear_scan``, ``γ_t c_t`` for the
trace of V-trace; 0 at a done, 1 at a masked position).  The scan's value at
``t_0`` for any carry ``c`` is then ``head + decay · c`` — a *select* when
``decay == 0``, so that a NaN or inf carry never crosses a done or a zero decay; a product of
nonzero decays that underflows keeps the smallest subnormal of its sign
instead of 0, so that such a carry still crosses it, as it does step by step.
:func:`carry_in` chains these maps across the slices (right to left for the
reverse scans) and hands every slice the carry it must pass to the ordinary scan (``last_value``, ``last_advantage``,
``last_trace`` or ``initial``).  Only ``O(rows)`` numbers ever cross between
slices.

This module is the sequence-parallel ("context parallel") recipe of the
documentation and the block-level carry pass of the Dask backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _dispatch, _vtrace
from . import _validate as v
from ._arrays import SCALAR, Context, library_of, resolve

__all__ = [
    "ScanSummary",
    "gae_summary",
    "returns_summary",
    "scan_summary",
    "vtrace_summary",
    "bootstrap_summary",
    "carry_in",
]


class ScanSummary(NamedTuple):
    """Per-row summary of one time slice of a scan (arrays of the batch shape)."""

    decay: Any
    """``∏ a_t`` over the slice's valid steps (0 if a done cuts it, 1 if none is valid)."""
    head: Any
    """The scan's value at the slice's first valid step with a zero carry (0 if none is valid)."""


# ------------------------------------------------------------------ helpers


@contextlib.contextmanager
def _prepared(named: dict[str, Any], backend: str | None = None
              ) -> Iterator[tuple[Context, Any, dict[str, Any], str | None]]:
    """The call's context, namespace, compute views and chosen backend (when ``backend``
    is given), on the caller's stream throughout."""
    ctx = resolve(named)
    name = None if backend is None else _dispatch.choose(backend, ctx)
    with ctx.call(named) as (xp, c):
        yield ctx, xp, c, name


def _is_array(x: Any) -> bool:
    return x is not None and not v._is_scalar(x)


def _cut_rows(xp: Any, layout: v.Layout, cuts: Sequence[Any], mask: Any) -> Any:
    """``(R, T)`` booleans: a cut (any of ``cuts`` nonzero) at a valid step; ``None`` without cuts."""
    cut = None
    for f in cuts:
        if f is not None:
            fr = layout.rows(xp, f)
            # A boolean flag is its own cut (read, never written): no copy.
            fr = fr if fr.dtype == np.bool_ else fr != 0
            cut = fr if cut is None else cut | fr
    if cut is not None and mask is not None:
        cut = cut & (layout.rows(xp, mask) != 0)
    return cut


def _step_decays(xp: Any, layout: v.Layout, dtype: np.dtype, coeffs: Sequence[Any]) -> Any:
    """``a_t = ∏ coeffs`` in float64: a scalar when every coefficient is one, else ``(R, T)``.

    A scalar coefficient is first rounded to ``dtype``, the data's precision (as the
    kernels and the references take γ and λ); arrays enter with their own values
    (V-trace's float64 trace weights are not rounded, so a weight below float32's
    range stays nonzero, as in the references).
    """
    f8 = np.dtype(np.float64)
    scalar = f8.type(1)
    for c in coeffs:
        if not _is_array(c):
            scalar = scalar * f8.type(dtype.type(c))
    a = None
    for c in coeffs:
        if _is_array(c):
            term = layout.rows(xp, xp.broadcast_to(c, layout.shape))
            a = term.astype(f8, copy=False) if a is None else a * term
    if a is None:
        return scalar
    if scalar != 1:
        a = a * scalar
    return xp.broadcast_to(xp.asarray(a, dtype=f8), (layout.R, layout.T))


def _decay_product(
    xp: Any,
    layout: v.Layout,
    dtype: np.dtype,
    coeffs: Sequence[Any],
    cuts: Sequence[Any],
    mask: Any,
    cut: Any = None,
) -> Any:
    """``∏_t a_t`` per row over valid steps, ``a_t = ∏ coeffs`` (0 at a cut or ``a_t == 0``).

    ``cut``, when given, is :func:`_cut_rows` of ``cuts`` (computed once by a
    caller that needs it too).  The product runs in float64 and is rounded to
    ``dtype`` once.
    """
    R, T = layout.R, layout.T
    valid = None if mask is None else layout.rows(xp, mask) != 0
    if cut is None:
        cut = _cut_rows(xp, layout, cuts, mask)
    a = _step_decays(xp, layout, dtype, coeffs)
    if np.ndim(a) == 0:
        # Scalar decays: a power of the count of valid steps, no full-size temporaries.
        n = xp.full((R,), T, dtype=np.int64) if valid is None else xp.count_nonzero(valid, axis=1)
        prod = xp.power(xp.float64(a), n.astype(xp.float64))
        if a == 0:
            prod = xp.where(n > 0, 0.0, 1.0)
        zero = xp.asarray(a == 0)
    else:
        if valid is not None:
            a = xp.where(valid, a, 1.0)
        # A zero decay is a select, as at every step (docs/semantics.md): it must
        # win over an inf or NaN factor elsewhere in the row.
        zero = xp.any(a == 0, axis=1)
        prod = xp.where(zero, 0.0, xp.prod(a, axis=1, dtype=xp.float64))
    # Only a cut or a zero decay is a zero product: one of nonzero factors that
    # underflows, in float64 or when rounded to ``dtype``, keeps the smallest
    # subnormal of its sign (signed zeros keep the sign), so that the select
    # of _combine still hands a NaN or an infinity on, as the step-by-step
    # recurrence does.
    prod = _nonzero(xp, prod, zero)
    if cut is not None:
        prod = xp.where(xp.any(cut, axis=1), 0.0, prod)
    return _nonzero(xp, prod.astype(dtype), prod == 0).reshape(layout.batch_shape)


def _nonzero(xp: Any, x: Any, zero: Any) -> Any:
    """``x`` with each 0 that is not a true zero (``zero`` false; ``None``: none
    is) replaced by the smallest subnormal of its sign."""
    tiny = x.dtype.type(np.finfo(x.dtype).smallest_subnormal)
    under = x == 0
    if zero is not None:
        under &= ~zero
    return xp.where(under, xp.copysign(tiny, x), x)


# The float64 logarithm of the smallest subnormal: past -_LOG_TINY / -log|a| steps,
# a power of a scalar decay |a| < 1 is exactly 0.
_LOG_TINY = 744.5


def _after_last_cut(xp: Any, cut: Any) -> Any:
    """Per row, the step after its last cut (0 without one).

    The last cuts are searched in trailing windows that grow fourfold until
    every row with a cut has one in the window, so rows with frequent cuts
    read only their tails.
    """
    R, T = cut.shape
    has = xp.any(cut, axis=1)
    W = min(T, 1024)
    while True:
        window = cut[:, T - W:]
        hit = xp.any(window, axis=1)
        if W == T or bool(xp.all(hit | ~has)):
            break
        W = min(T, 4 * W)
    last = T - 1 - xp.argmax(window[:, ::-1], axis=1)
    return xp.where(hit, last + 1, 0)


def add_carry(xp: Any, layout: v.Layout, outs: Sequence[Any], a: Any, cut: Any, mask: Any, carry: Any) -> None:
    """Add a carry's contribution to a reverse scan computed with a zero carry, in place.

    For ``y_t = a_t y_{τ(t)} + b_t`` the carry ``c`` past a row's end adds
    ``P_t c`` at every valid step, ``P_t = ∏_{s ≥ t} a_s`` over the valid steps
    from ``t`` to the end (masked steps pass it on), and nothing from the
    row's last cut back.  Only the steps after each row's last cut (and, for a
    scalar ``|a| < 1`` without a mask, before ``P`` underflows to 0) are read
    and written.  A host-only helper: it reads the extent on the host.

    Parameters
    ----------
    xp : module
        NumPy.
    layout : Layout
        The rows' layout.
    outs : sequence of arrays
        ``(R, T)`` views of the results, written through.
    a : scalar or (R, T) array
        :func:`_step_decays`.
    cut : (R, T) bool array or None
        :func:`_cut_rows` (cuts at valid steps).
    mask : array or None
        The validity mask (of the input shape).
    carry : (R,) array
        The carry per row.
    """
    R, T = layout.R, layout.T
    if R == 0 or T == 0:
        return
    carry = xp.asarray(carry, dtype=xp.float64).reshape(R)
    start = xp.zeros(R, dtype=np.int64) if cut is None else _after_last_cut(xp, cut)
    lo = int(start.min())
    # A finite carry's share where P underflows is below every output's
    # rounding, so those steps are skipped; a NaN or an infinity reaches them
    # all, as in the step-by-step recurrence (tiny factors, no cut).
    finite = bool(xp.all(xp.isfinite(carry)))
    if np.ndim(a) == 0 and mask is None and finite:
        mag = abs(float(a))
        if mag == 0.0:
            return
        if mag < 1.0:
            lo = max(lo, T - int(_LOG_TINY / -np.log(mag)) - 2)
    if lo >= T:
        return
    W = T - lo
    aw = xp.broadcast_to(xp.asarray(a if np.ndim(a) == 0 else a[:, lo:], dtype=xp.float64), (R, W))
    valid = None if mask is None else layout.rows(xp, mask)[:, lo:] != 0
    if valid is not None:
        aw = xp.where(valid, aw, 1.0)
    reach = xp.arange(lo, T)[None, :] >= start[:, None]
    aw = xp.where(reach, aw, 0.0)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        P = xp.cumprod(aw[:, ::-1], axis=1)[:, ::-1]
        if not finite:
            # Only a zero factor, never an underflow, makes P a select.
            nonzero = xp.cumsum((aw == 0)[:, ::-1], axis=1)[:, ::-1] == 0
            P = _nonzero(xp, P, ~nonzero)
        # A zero P is a select: an inf or NaN carry never reaches past a cut.
        ok = P != 0
        if valid is not None:
            ok &= valid
        corr = P * carry[:, None]
        for y in outs:
            seg = y[:, lo:]
            seg[...] = xp.where(ok, seg.astype(xp.float64) + corr, seg)


def _head(xp: Any, layout: v.Layout, y: Any, mask: Any, last: bool = False) -> Any:
    """``y`` at each row's first valid step (last step if ``last``); 0 when there is none."""
    R, T = layout.R, layout.T
    if T == 0 or R == 0:
        return xp.zeros(layout.batch_shape, dtype=y.dtype)
    yr = layout.rows(xp, y)
    if mask is None:
        h = yr[:, -1] if last else yr[:, 0]
    else:
        valid = layout.rows(xp, mask) != 0
        idx = xp.argmax(valid, axis=1)
        h = xp.take_along_axis(yr, idx[:, None], axis=1)[:, 0]
        h = xp.where(xp.any(valid, axis=1), h, y.dtype.type(0))
    return xp.ascontiguousarray(h).reshape(layout.batch_shape)


def _combine(xp: Any, decay: Any, head: Any, carry: Any) -> Any:
    """``head + decay · carry``, a select where ``decay == 0`` (no NaN crosses a done)."""
    if carry is None:
        carry = 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # the unselected branch may be 0·inf
        return xp.where(decay == 0, head, head + decay * carry)


# ---------------------------------------------------------------- summaries on resolved views
#
# The public summaries below and the Dask backend's block tasks compute through
# these: ``c`` holds views in the compute namespace ``xp`` and ``name`` is the
# chosen backend (see :func:`gaescan._dispatch.run_gae`).


def _handed_back(ctx: Context, s: ScanSummary) -> ScanSummary:
    return ScanSummary(ctx.from_compute(s.decay), ctx.from_compute(s.head))


def gae_summary_of(xp: Any, name: str, c: dict[str, Any], axis: Any) -> ScanSummary:
    """:func:`gae_summary` on resolved views, in ``xp``."""
    adv, _ = _dispatch.run_gae(xp, name, c, axis)
    layout = v.layout_of(tuple(adv.shape), axis)
    decay = _decay_product(xp, layout, adv.dtype, [c["gamma"], c["lam"]],
                           [c.get("dones"), c.get("terminated"), c.get("truncated")], c.get("mask"))
    return ScanSummary(decay, _head(xp, layout, adv, c.get("mask")))


def returns_summary_of(xp: Any, name: str, c: dict[str, Any], axis: Any) -> ScanSummary:
    """:func:`returns_summary` on resolved views, in ``xp``."""
    g = _dispatch.run_returns(xp, name, c, axis)
    layout = v.layout_of(tuple(g.shape), axis)
    decay = _decay_product(xp, layout, g.dtype, [c["gamma"]], [c.get("dones")], c.get("mask"))
    return ScanSummary(decay, _head(xp, layout, g, c.get("mask")))


def vtrace_summary_of(xp: Any, name: str, c: dict[str, Any], axis: Any, rho_bar: Any,
                      c_bar: Any) -> ScanSummary:
    """:func:`vtrace_summary` on resolved views, in ``xp``."""
    vs, _ = _vtrace._run(xp, name, c, axis, None, rho_bar, c_bar, None)
    layout = v.layout_of(tuple(vs.shape), axis)
    dtype = vs.dtype
    mask = c.get("mask")
    # The trace weights c_t = λ_t min(c̄, e^{ℓ_t}): the exponential in float64, as in the kernels.
    cb = _vtrace._threshold(c_bar, "c_bar", dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        e = xp.exp(xp.asarray(c["log_rhos"], dtype=xp.float64))
        # xp.minimum keeps a NaN ratio, which makes the decay (and D) NaN.
        cw = xp.minimum(xp.float64(cb), e)
        decay = _decay_product(xp, layout, dtype, [c["gamma"], c["lam"], cw],
                               [c.get("dones"), c.get("terminated"), c.get("truncated")], mask)
        # D = vs − V, in float64, at each row's first valid step.
        head = _head(xp, layout, vs, mask).astype(xp.float64) - _head(xp, layout, v.data_array(
            xp, c["values"], "values").astype(xp.float64), mask)
    return ScanSummary(decay, head.astype(dtype))


def scan_summary_of(xp: Any, name: str, c: dict[str, Any], reverse: bool, axis: Any) -> ScanSummary:
    """:func:`scan_summary` on resolved views (``reverse`` already checked), in ``xp``."""
    y = _dispatch.run_scan(xp, name, c, reverse, axis)
    layout = v.layout_of(tuple(y.shape), axis)
    decay = _decay_product(xp, layout, y.dtype, [c["a"]], [], None)
    return ScanSummary(decay, _head(xp, layout, y, None, last=not reverse))


# ---------------------------------------------------------------- summaries


def gae_summary(
    rewards: Any,
    values: Any,
    *,
    gamma: Any,
    lam: Any,
    next_values: Any = None,
    last_value: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    axis: int = -1,
    backend: str = "auto",
) -> ScanSummary:
    r"""Summary of one time slice for sequence-parallel :func:`~gaescan.gae`.

    For each row of the slice, with ``t_0`` its first valid (unmasked) step:

    .. math::

        \text{decay} = \prod_{t\ \text{valid}} \gamma_t \lambda_t (1 - \text{done}_t),
        \qquad
        \text{head} = A_{t_0}\big|_{\text{last\_advantage} = 0}

    so that ``A_{t_0} = head + decay · A_next`` for the advantage ``A_next`` at
    the first valid step after the slice (a select when ``decay == 0``).  Pass
    the slice's true bootstrap as ``last_value``: the value ``V`` at the first
    valid step of the later slices (from :func:`bootstrap_summary` and
    :func:`carry_in`), or the row's own ``last_value`` for the last slice;
    with ``next_values`` no bootstrap is needed.

    Parameters
    ----------
    rewards, values, gamma, lam, next_values, last_value, dones, terminated, truncated, mask, axis, backend
        As for :func:`~gaescan.gae`, restricted to the slice (``cu_seqlens``
        is not supported).

    Returns
    -------
    ScanSummary
        ``(decay, head)``, arrays of the batch shape in the output dtype of
        ``gae`` and the inputs' array library.

    Notes
    -----
    Cost: one :func:`~gaescan.gae` call on the slice plus one reduction over
    the flags (and over the coefficients when they are arrays), i.e. about
    one to two passes over the slice.
    """
    named = dict(rewards=rewards, values=values, next_values=next_values, last_value=last_value,
                 dones=dones, terminated=terminated, truncated=truncated, mask=mask,
                 gamma=gamma, lam=lam)
    with _prepared(named, backend) as (ctx, xp, c, name):
        return _handed_back(ctx, gae_summary_of(xp, name, c, axis))


def returns_summary(
    rewards: Any,
    *,
    gamma: Any,
    dones: Any = None,
    mask: Any = None,
    axis: int = -1,
    backend: str = "auto",
) -> ScanSummary:
    r"""Summary of one time slice for sequence-parallel :func:`~gaescan.discounted_returns`.

    .. math::

        \text{decay} = \prod_{t\ \text{valid}} \gamma_t (1 - \text{done}_t), \qquad
        \text{head} = G_{t_0}\big|_{\text{last\_value} = 0}

    so that ``G_{t_0} = head + decay · G_next`` (a select when ``decay == 0``).

    Parameters
    ----------
    rewards, gamma, dones, mask, axis, backend
        As for :func:`~gaescan.discounted_returns`, restricted to the slice.

    Returns
    -------
    ScanSummary
        ``(decay, head)`` of the batch shape.

    Notes
    -----
    Cost: one ``discounted_returns`` call on the slice plus one reduction.
    """
    named = dict(rewards=rewards, dones=dones, mask=mask, gamma=gamma)
    with _prepared(named, backend) as (ctx, xp, c, name):
        return _handed_back(ctx, returns_summary_of(xp, name, c, axis))


def scan_summary(
    a: Any,
    b: Any,
    *,
    reverse: bool = False,
    axis: int = -1,
    backend: str = "auto",
) -> ScanSummary:
    r"""Summary of one time slice for :func:`~gaescan.linear_scan`.

    .. math::

        \text{decay} = \prod_{t} a_t, \qquad
        \text{head} = y_{t_0}\big|_{\text{initial} = 0}

    with ``t_0`` the slice's first step for a reverse scan and its last step
    for a forward one, so that ``y_{t_0} = head + decay · carry`` (a select
    when ``decay == 0``, as in the kernels).

    Parameters
    ----------
    a, b, reverse, axis, backend
        As for :func:`~gaescan.linear_scan`, restricted to the slice.

    Returns
    -------
    ScanSummary
        ``(decay, head)`` of the batch shape.

    Notes
    -----
    Cost: one ``linear_scan`` call plus, for array ``a``, one product reduction.
    """
    reverse = v.reverse_flag(reverse)
    with _prepared(dict(a=a, b=b), backend) as (ctx, xp, c, name):
        return _handed_back(ctx, scan_summary_of(xp, name, c, reverse, axis))


def vtrace_summary(
    rewards: Any,
    values: Any,
    log_rhos: Any,
    *,
    gamma: Any,
    lam: Any = 1.0,
    rho_bar: Any = 1.0,
    c_bar: Any = 1.0,
    next_values: Any = None,
    last_value: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    axis: int = -1,
    backend: str = "auto",
) -> ScanSummary:
    r"""Summary of one time slice for sequence-parallel :func:`~gaescan.vtrace`.

    For each row of the slice, with ``t_0`` its first valid (unmasked) step
    and ``c_t = λ_t min(c̄, e^{ℓ_t})`` the trace weights:

    .. math::

        \text{decay} = \prod_{t\ \text{valid}} \gamma_t c_t (1 - \text{done}_t),
        \qquad
        \text{head} = D_{t_0}\big|_{\text{last\_trace} = 0}

    with ``D_t = v_{s,t} − V_t`` the trace, so that ``D_{t_0} = head + decay · D_next``
    for the trace ``D_next`` at the first valid step after the slice (a
    select when ``decay == 0``): :func:`carry_in` over the slices' summaries,
    with the rows' ``last_trace`` as the boundary, gives each slice its
    ``last_trace``.  Pass the slice's true bootstrap as ``last_value``, as for
    :func:`gae_summary` (from :func:`bootstrap_summary` and :func:`carry_in`);
    with ``next_values`` no bootstrap is needed.

    Parameters
    ----------
    rewards, values, log_rhos, gamma, lam, rho_bar, c_bar, next_values, last_value, dones, terminated, truncated, mask, axis, backend
        As for :func:`~gaescan.vtrace`, restricted to the slice (``cu_seqlens``
        is not supported; ``pg_rho_bar`` does not enter ``D``).

    Returns
    -------
    ScanSummary
        ``(decay, head)``, arrays of the batch shape in the output dtype of
        ``vtrace`` and the inputs' array library.

    Raises
    ------
    TypeError, ValueError
        As :func:`~gaescan.vtrace`.

    Notes
    -----
    Cost: one :func:`~gaescan.vtrace` call on the slice plus one product
    reduction of the trace weights (one exponential per step).

    Examples
    --------
    A row of four steps split into two slices of two, on-policy (``log_rhos = 0``);
    with ``V = 0`` the first slice's bootstrap ``last_value`` is 0:

    >>> import numpy as np, gaescan
    >>> r, v, lr = np.ones((1, 4)), np.zeros((1, 4)), np.zeros((1, 4))
    >>> late = gaescan.vtrace_summary(r[:, 2:], v[:, 2:], lr[:, 2:], gamma=0.5)
    >>> late
    ScanSummary(decay=array([0.25]), head=array([1.5]))
    >>> lt = gaescan.carry_in([gaescan.vtrace_summary(r[:, :2], v[:, :2], lr[:, :2], gamma=0.5), late])
    >>> np.concatenate([gaescan.vtrace(r[:, :2], v[:, :2], lr[:, :2], gamma=0.5, last_trace=lt[0]).vs,
    ...                 gaescan.vtrace(r[:, 2:], v[:, 2:], lr[:, 2:], gamma=0.5, last_trace=lt[1]).vs], axis=1)
    array([[1.875, 1.75 , 1.5  , 1.   ]])
    """
    named = dict(rewards=rewards, values=values, log_rhos=log_rhos, next_values=next_values,
                 last_value=last_value, dones=dones, terminated=terminated, truncated=truncated, mask=mask,
                 gamma=gamma, lam=lam)
    with _prepared(named, backend) as (ctx, xp, c, name):
        return _handed_back(ctx, vtrace_summary_of(xp, name, c, axis, rho_bar, c_bar))


def bootstrap_summary(values: Any, *, mask: Any = None, axis: int = -1) -> ScanSummary:
    r"""Summary of one slice for the ``V'`` bootstrap of :func:`~gaescan.gae`.

    The bootstrap of a slice (its ``last_value``) is ``V`` at the first valid
    step of the later slices.  That is itself a carried quantity with

    .. math::

        \text{decay} = [\text{no valid step in the slice}], \qquad
        \text{head} = V_{t_0}\ (0 \text{ if there is none}),

    so :func:`carry_in` over these summaries, with the rows' ``last_value`` as
    the boundary, gives every slice its ``last_value``.  Without a mask the
    head is just the slice's first value.  Not needed with ``next_values``.

    Parameters
    ----------
    values : array
        ``V_t`` on the slice.
    mask : array, optional
        As for :func:`~gaescan.gae`; masked values are never read.
    axis : int, default -1
        The time axis.

    Returns
    -------
    ScanSummary
        ``(decay, head)`` of the batch shape, float64 if ``values`` is float64,
        else float32.
    """
    if values is None:
        raise TypeError("bootstrap_summary needs values, the array V_t on the slice; got None")
    with _prepared(dict(values=values, mask=mask)) as (ctx, xp, c, _):
        return _handed_back(ctx, bootstrap_summary_of(xp, c, axis))


def bootstrap_summary_of(xp: Any, c: dict[str, Any], axis: Any) -> ScanSummary:
    """:func:`bootstrap_summary` on resolved views ``c`` (``values``, ``mask``), in ``xp``."""
    val = v.data_array(xp, c["values"], "values")
    if val is None:
        raise TypeError("values is a required array")
    m = v.data_array(xp, c["mask"], "mask")
    v.check_same_shape("values", val, mask=m)
    dtype = v.result_dtype(val)
    layout = v.layout_of(tuple(val.shape), axis)
    if layout.R == 0 or layout.T == 0:
        head = xp.zeros(layout.batch_shape, dtype=dtype)
        decay = xp.ones(layout.batch_shape, dtype=dtype)
    else:
        rows = layout.rows(xp, val)
        if m is None:
            head = rows[:, 0].astype(dtype)
            decay = xp.zeros(layout.R, dtype=dtype)
        else:
            valid = layout.rows(xp, m) != 0
            anyv = xp.any(valid, axis=1)
            h = xp.take_along_axis(rows, xp.argmax(valid, axis=1)[:, None], axis=1)[:, 0].astype(dtype)
            head = xp.where(anyv, h, dtype.type(0))
            decay = xp.where(anyv, dtype.type(0), dtype.type(1))
        head = xp.ascontiguousarray(head).reshape(layout.batch_shape)
        decay = decay.reshape(layout.batch_shape)
    return ScanSummary(decay, head)


# ---------------------------------------------------------------- the carry pass


def carry_in(summaries: Any, boundary: Any = None, *, reverse: bool = True) -> Any:
    r"""Each slice's carry-in from the summaries of all slices of the same rows.

    With slices ``0 .. k-1`` in time order and ``(d_i, h_i)`` their summaries,
    the carry into slice ``i`` of a reverse scan is (an exclusive scan across
    slices, right to left)

    .. math::

        c_{k-1} = \text{boundary}, \qquad
        c_i = \begin{cases} h_{i+1} & d_{i+1} = 0 \\
                            h_{i+1} + d_{i+1}\, c_{i+1} & \text{otherwise} \end{cases}

    and for a forward scan (``reverse=False``) left to right,
    ``c_0 = boundary``, ``c_i = h_{i-1} + d_{i-1} c_{i-1}`` (same select).

    Pass ``c_i`` to slice ``i``'s scan as ``last_advantage`` (GAE), as
    ``last_trace`` (V-trace, with :func:`vtrace_summary`), as
    ``last_value`` (returns, and the GAE bootstrap with
    :func:`bootstrap_summary`), or as ``initial`` (``linear_scan``).

    Parameters
    ----------
    summaries : ScanSummary of stacked arrays, or sequence of ScanSummary
        ``decay`` and ``head`` of shape ``(k, *batch)`` (slice index first),
        or a time-ordered sequence of ``k`` per-slice summaries.
    boundary : float or array, optional
        The value past the end of the rows (before their start, forward):
        the rows' ``last_value``, ``last_advantage``, ``last_trace`` or ``initial``; a scalar
        or an array of the batch shape.  Default 0.
    reverse : bool, default True
        False for a forward ``linear_scan``.

    Returns
    -------
    array
        The carries, shape ``(k, *batch)``, in the summaries' array library.

    Notes
    -----
    ``k`` vectorised steps over ``O(rows)`` numbers; nothing else crosses
    between slices.

    Examples
    --------
    One row of four rewards split into two slices of two steps:

    >>> import numpy as np, gaescan
    >>> r = np.ones((1, 4))
    >>> s = [gaescan.returns_summary(r[:, :2], gamma=0.5), gaescan.returns_summary(r[:, 2:], gamma=0.5)]
    >>> s[1]
    ScanSummary(decay=array([0.25]), head=array([1.5]))
    >>> c = gaescan.carry_in(s)
    >>> c
    array([[1.5],
           [0. ]])
    >>> np.concatenate([gaescan.discounted_returns(r[:, :2], gamma=0.5, last_value=c[0]),
    ...                 gaescan.discounted_returns(r[:, 2:], gamma=0.5, last_value=c[1])], axis=1)
    array([[1.875, 1.75 , 1.5  , 1.   ]])
    """
    reverse = v.reverse_flag(reverse)
    is_seq = (
        isinstance(summaries, Sequence) and not isinstance(summaries, (str, bytes)) and len(summaries) > 0
        and all(isinstance(s, tuple) for s in summaries)
    )
    if is_seq:
        for i, s in enumerate(summaries):
            if len(s) != 2:
                raise TypeError(f"summaries[{i}] must be a ScanSummary (decay, head), got {len(s)} items")
        named = {f"summaries[{i}].{f}": x for i, s in enumerate(summaries)
                 for f, x in zip(("decay", "head"), s, strict=True)}
        named["boundary"] = boundary
    elif isinstance(summaries, tuple) and len(summaries) == 2:
        named = dict(decay=summaries[0], head=summaries[1], boundary=boundary)
    else:
        raise TypeError(
            "summaries must be a ScanSummary of stacked (k, *batch) arrays or a non-empty sequence of "
            f"ScanSummary, got {type(summaries).__name__}"
        )
    with _prepared(named) as (ctx, xp, c, _):
        if is_seq:
            k = len(summaries)
            shapes = {}
            for i in range(k):
                for f in ("decay", "head"):
                    x = c[f"summaries[{i}].{f}"]
                    shapes[f"summaries[{i}].{f}"] = tuple(getattr(x, "shape", ()))
            first = shapes["summaries[0].decay"]
            for nm, sh in shapes.items():
                if sh != first:
                    raise ValueError(
                        f"{nm} has shape {sh} but summaries[0].decay has shape {first}; the summaries of "
                        "one carry_in call must cover the same rows (one batch shape), each slice of every row"
                    )
            decay = xp.stack([xp.asarray(c[f"summaries[{i}].decay"]) for i in range(k)])
            head = xp.stack([xp.asarray(c[f"summaries[{i}].head"]) for i in range(k)])
        else:
            decay, head = c["decay"], c["head"]
        if library_of(decay) == SCALAR or decay.ndim < 1:
            raise ValueError("stacked summaries need a leading slice axis: decay and head of shape "
                             "(k, *batch)")
        if tuple(decay.shape) != tuple(head.shape):
            raise ValueError(
                f"decay has shape {tuple(decay.shape)} but head has shape {tuple(head.shape)}; "
                "they must match"
            )
        for name, x in (("decay", decay), ("head", head)):
            v._check_numeric(x, name)
        k, batch = decay.shape[0], tuple(decay.shape[1:])
        if k == 0:
            raise ValueError("carry_in needs the summary of at least one slice (k = 0)")
        bnd = c["boundary"]
        if bnd is None:
            bnd = 0.0
        elif v._is_scalar(bnd):
            bnd = v.boundary_value(xp, bnd, "boundary", batch, 1, np.dtype(np.float64))
        else:
            v._check_numeric(bnd, "boundary")
            if tuple(bnd.shape) != batch:
                raise ValueError(
                    f"boundary has shape {tuple(bnd.shape)}; it must be a scalar or have the batch "
                    f"shape {batch}"
                )
        dtype = xp.result_type(decay, head, *([bnd] if _is_array(bnd) else []))
        if dtype.kind != "f":
            dtype = np.dtype(np.float32)
        out = xp.empty((k, *batch), dtype=dtype)
        carry = xp.asarray(bnd, dtype=dtype)
        order = range(k - 1, -1, -1) if reverse else range(k)
        for i in order:
            out[i] = carry
            carry = _combine(xp, decay[i], head[i], carry).astype(dtype, copy=False)
        return ctx.from_compute(out)
