r"""The scans over rows split along time across ``torch.distributed`` ranks.

Context (sequence) parallelism splits each row along time: rank ``r`` of the
process group holds the ``r``-th slice, in time order, of the same rows
(slices may differ in length, and may be empty).  Each function here takes
the arguments of the one-process function of the same name plus ``group``,
and returns on every rank that rank's slice of the one-process result on the
concatenated rows (within the contract's accuracy).

What crosses ranks is the carry API's summaries (:mod:`gaescan._carry`):
each rank contributes one ``(2, *batch)`` tensor per round to an all-gather,

* :func:`gae`: two rounds, the ``V'`` bootstrap (:func:`~gaescan.bootstrap_summary`)
  and the advantage (:func:`~gaescan.gae_summary`); one round with
  ``next_values``, which holds the bootstrap of every step;
* :func:`vtrace`: as :func:`gae`, with the trace's summary
  (:func:`~gaescan.vtrace_summary`) in the second round;
* :func:`discounted_returns` and :func:`linear_scan`: one round;
* :func:`moments` and :func:`whiten`: one all-gather of three numbers
  (``count, mean, m2``), merged on every rank by :func:`gaescan.combine_moments`;

so a rank sends at most ``4·B`` numbers per scan call and three per
statistics call, whatever the slice length.
The exchange runs on the tensors' device (gloo for CPU tensors, NCCL for
CUDA tensors) and reads no value on the host.  Row-level arguments
(``last_value``, ``last_advantage``, ``last_trace``, ``initial``, per-row γ
and λ, the clipping thresholds) are passed
identically on every rank; per-step arrays are each rank's own slice.  For
the statistics, every rank's elements belong to one population (data ×
context parallel), split in any way.

Arrays may be PyTorch tensors (the usual case) or NumPy arrays, whose
summaries travel as CPU tensors.  ``torch`` is imported by these functions,
not by ``import gaescan``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _api, _carry, _stats, _validate, _vtrace
from ._arrays import resolve
from ._carry import ScanSummary
from ._stats import Moments

__all__ = ["gae", "vtrace", "discounted_returns", "linear_scan", "moments", "whiten"]


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("gaescan.distributed needs PyTorch: pip install torch") from exc
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gaescan.distributed needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) first (or use gaescan.gae for one process)"
        )
    return dist


def _rank_world(dist: Any, group: Any) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _gathered(dist: Any, group: Any, world: int, s: ScanSummary) -> ScanSummary:
    """Every rank's summary, stacked in rank (= time) order: one all-gather of
    the local ``(2, *batch)`` tensor."""
    import torch

    numpy_in = isinstance(s.decay, np.ndarray)
    decay = torch.from_numpy(s.decay) if numpy_in else s.decay
    head = torch.from_numpy(s.head) if numpy_in else s.head
    local = torch.stack([decay, head])
    out = local.new_empty((world * 2,) + tuple(local.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, local, group=group)
    out = out.view((world, 2) + tuple(local.shape[1:]))
    if numpy_in:
        return ScanSummary(out[:, 0].numpy(), out[:, 1].numpy())
    return ScanSummary(out[:, 0], out[:, 1])


def _bootstrap(dist: Any, group: Any, world: int, rank: int, values: Any, mask: Any, axis: int,
               next_values: Any, last_value: Any) -> Any:
    """This slice's ``last_value``: ``V`` at the first valid step after it (one
    all-gather of :func:`~gaescan.bootstrap_summary`), or the rows' own
    ``last_value`` with ``next_values`` (exclusive with it: the scans raise on both)."""
    if next_values is not None:
        return last_value
    s = _carry.bootstrap_summary(values, mask=mask, axis=axis)
    return _carry.carry_in(_gathered(dist, group, world, s), boundary=last_value)[rank]


def _no_packing(cu_seqlens: Any) -> None:
    if cu_seqlens is not None:
        raise ValueError(
            "gaescan.distributed does not take cu_seqlens: split packed sequences per segment, or pad "
            "them to rows with a mask"
        )


def gae(
    rewards: Any,
    values: Any,
    *,
    gamma: Any,
    lam: Any,
    next_values: Any = None,
    last_value: Any = None,
    last_advantage: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
    group: Any = None,
) -> _api.GAEResult:
    r""":func:`gaescan.gae` on rows split along time across the ranks of ``group``.

    Rank ``r`` passes its time slice of every per-step array; the result is its
    slice of ``gaescan.gae`` on the concatenated rows.  With ``V'`` and the
    advantage past each slice carried in by the summaries of the later slices
    (:func:`gaescan.carry_in`):

    .. math::

        \text{last\_value}_r = V \text{ at the first valid step after slice } r,
        \qquad
        \text{last\_advantage}_r = A \text{ there}.

    Parameters
    ----------
    rewards, values, gamma, lam, next_values, last_value, last_advantage, dones, terminated, truncated, mask, axis, out, backend
        As for :func:`gaescan.gae`, per-step arrays restricted to this rank's
        slice (possibly empty); ``last_value`` and ``last_advantage`` are the
        rows' own, the same on every rank.
    cu_seqlens : None
        Not supported (a ``ValueError``): split packed sequences per segment.
    group : torch.distributed.ProcessGroup, optional
        The ranks holding the slices, in time order; default the world.

    Returns
    -------
    GAEResult
        This rank's ``(advantages, returns)``.

    Raises
    ------
    RuntimeError
        When no process group is initialised.
    ValueError, TypeError
        As :func:`gaescan.gae`.

    Notes
    -----
    Two all-gathers of ``(2, *batch)`` tensors (one with ``next_values``).
    On host arrays, one ``gae`` pass over the local slice with a zero carry,
    whose result gives the summary; the carry is then added to the steps it
    reaches, those after each row's last done (all of them in a row without
    dones, up to where its weight underflows).  On device arrays, a summary
    pass and the final pass, so that no value is read on the host.
    """
    _no_packing(cu_seqlens)
    dist = _dist()
    rank, world = _rank_world(dist, group)
    ends = dict(dones=dones, terminated=terminated, truncated=truncated, mask=mask)
    boot = _bootstrap(dist, group, world, rank, values, mask, axis, next_values, last_value)
    if not resolve(dict(rewards=rewards, values=values)).on_device:
        return _gae_host(dist, group, world, rank, dict(
            rewards=rewards, values=values, gamma=gamma, lam=lam, next_values=next_values, last_value=boot,
            axis=axis, backend=backend, **ends), last_advantage, out)
    s = _carry.gae_summary(rewards, values, gamma=gamma, lam=lam, next_values=next_values, last_value=boot,
                           axis=axis, backend=backend, **ends)
    a_in = _carry.carry_in(_gathered(dist, group, world, s), boundary=last_advantage)[rank]
    return _api.gae(rewards, values, gamma=gamma, lam=lam, next_values=next_values, last_value=boot,
                    last_advantage=a_in, axis=axis, out=out, backend=backend, **ends)


def vtrace(
    rewards: Any,
    values: Any,
    log_rhos: Any,
    *,
    gamma: Any,
    lam: Any = 1.0,
    rho_bar: Any = 1.0,
    c_bar: Any = 1.0,
    pg_rho_bar: Any = None,
    next_values: Any = None,
    last_value: Any = None,
    last_trace: Any = None,
    dones: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
    group: Any = None,
) -> _vtrace.VTraceResult:
    r""":func:`gaescan.vtrace` on rows split along time across the ranks of ``group``.

    Rank ``r`` passes its time slice of every per-step array; the result is its
    slice of ``gaescan.vtrace`` on the concatenated rows.  ``V'`` and the trace
    ``D`` past each slice are carried in by the summaries of the later slices
    (:func:`gaescan.bootstrap_summary`, :func:`gaescan.vtrace_summary` and
    :func:`gaescan.carry_in`):

    .. math::

        \text{last\_value}_r = V \text{ at the first valid step after slice } r,
        \qquad
        \text{last\_trace}_r = D \text{ there}.

    Parameters
    ----------
    rewards, values, log_rhos, gamma, lam, rho_bar, c_bar, pg_rho_bar, next_values, last_value, last_trace, dones, terminated, truncated, mask, axis, out, backend
        As for :func:`gaescan.vtrace`, per-step arrays restricted to this
        rank's slice (possibly empty); ``last_value`` and ``last_trace`` are
        the rows' own, the same on every rank.
    cu_seqlens : None
        Not supported (a ``ValueError``): split packed sequences per segment.
    group : torch.distributed.ProcessGroup, optional
        The ranks holding the slices, in time order; default the world.

    Returns
    -------
    VTraceResult
        This rank's ``(vs, advantages)``.

    Raises
    ------
    RuntimeError
        When no process group is initialised.
    ValueError, TypeError
        As :func:`gaescan.vtrace`.

    Notes
    -----
    Two all-gathers of ``(2, *batch)`` tensors (one with ``next_values``), a
    summary pass (one ``vtrace`` call on the local slice) and the final pass.
    """
    _no_packing(cu_seqlens)
    dist = _dist()
    rank, world = _rank_world(dist, group)
    kw = dict(gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar, next_values=next_values, dones=dones,
              terminated=terminated, truncated=truncated, mask=mask, axis=axis, backend=backend)
    boot = _bootstrap(dist, group, world, rank, values, mask, axis, next_values, last_value)
    s = _carry.vtrace_summary(rewards, values, log_rhos, last_value=boot, **kw)
    d_in = _carry.carry_in(_gathered(dist, group, world, s), boundary=last_trace)[rank]
    return _vtrace.vtrace(rewards, values, log_rhos, pg_rho_bar=pg_rho_bar, last_value=boot, last_trace=d_in,
                          out=out, **kw)


def _gae_host(dist: Any, group: Any, world: int, rank: int, kw: dict[str, Any], last_advantage: Any,
              out: Any) -> _api.GAEResult:
    """:func:`gae` on host arrays in one pass over the slice.

    The local ``gae`` runs once with a zero carry; its summary is read off its
    result; the exchanged carry is then added where it reaches (the steps
    after each row's last done, :func:`gaescan._carry.add_carry`), instead of
    a second ``gae`` pass.
    """
    res = _api.gae(**kw, out=out)
    named = dict(advantages=res.advantages, returns=res.returns, gamma=kw["gamma"], lam=kw["lam"],
                 dones=kw["dones"], terminated=kw["terminated"], truncated=kw["truncated"], mask=kw["mask"],
                 last_advantage=last_advantage)
    ctx = resolve(named)
    with ctx.call(named) as (xp, c):
        adv, mask = c["advantages"], c["mask"]
        layout = _validate.layout_of(tuple(adv.shape), kw["axis"])
        cut = _carry._cut_rows(xp, layout, [c["dones"], c["terminated"], c["truncated"]], mask)
        decay = _carry._decay_product(xp, layout, adv.dtype, [c["gamma"], c["lam"]], [], mask, cut=cut)
        s = ScanSummary(decay, _carry._head(xp, layout, adv, mask))
        carry = _carry.carry_in(_gathered(dist, group, world, s), boundary=c["last_advantage"])[rank]
        if xp.any(carry != 0):
            rows = [layout.writable_rows(xp, y) for y in (adv, c["returns"])]
            if any(r is None for r in rows):
                # No (R, T) view writes through: the second pass, into the same arrays.
                return _api.gae(**kw, last_advantage=ctx.from_compute(carry), out=res)
            a = _carry._step_decays(xp, layout, adv.dtype, [c["gamma"], c["lam"]])
            _carry.add_carry(xp, layout, rows, a, cut, mask, carry)
    return res


def discounted_returns(
    rewards: Any,
    *,
    gamma: Any,
    dones: Any = None,
    last_value: Any = None,
    mask: Any = None,
    cu_seqlens: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
    group: Any = None,
) -> Any:
    r""":func:`gaescan.discounted_returns` on rows split along time across ``group``.

    One all-gather: the return past slice ``r`` is
    ``G_{r+1} = head_{r+1} + decay_{r+1} · G_{r+2}`` over the later slices'
    summaries (:func:`gaescan.returns_summary`), ``last_value`` past the last.

    Parameters
    ----------
    rewards, gamma, dones, last_value, mask, axis, out, backend
        As for :func:`gaescan.discounted_returns`, per-step arrays restricted
        to this rank's slice; ``last_value`` the rows' own.
    cu_seqlens : None
        Not supported (a ``ValueError``).
    group : torch.distributed.ProcessGroup, optional
        The ranks holding the slices, in time order; default the world.

    Returns
    -------
    array
        This rank's slice of the returns.
    """
    _no_packing(cu_seqlens)
    dist = _dist()
    rank, world = _rank_world(dist, group)
    s = _carry.returns_summary(rewards, gamma=gamma, dones=dones, mask=mask, axis=axis, backend=backend)
    g_in = _carry.carry_in(_gathered(dist, group, world, s), boundary=last_value)[rank]
    return _api.discounted_returns(rewards, gamma=gamma, dones=dones, last_value=g_in, mask=mask, axis=axis,
                                   out=out, backend=backend)


def linear_scan(
    a: Any,
    b: Any,
    *,
    reverse: bool = False,
    initial: Any = None,
    axis: int = -1,
    out: Any = None,
    backend: str = "auto",
    group: Any = None,
) -> Any:
    r""":func:`gaescan.linear_scan` on rows split along time across ``group``.

    One all-gather of the slices' summaries (:func:`gaescan.scan_summary`):
    a forward scan chains them left to right from ``initial``, a reverse one
    right to left.

    Parameters
    ----------
    a, b, reverse, initial, axis, out, backend
        As for :func:`gaescan.linear_scan`, per-step arrays restricted to this
        rank's slice; ``initial`` the rows' own.
    group : torch.distributed.ProcessGroup, optional
        The ranks holding the slices, in time order; default the world.

    Returns
    -------
    array
        This rank's slice of ``y``.
    """
    dist = _dist()
    rank, world = _rank_world(dist, group)
    s = _carry.scan_summary(a, b, reverse=reverse, axis=axis, backend=backend)
    y_in = _carry.carry_in(_gathered(dist, group, world, s), boundary=initial, reverse=reverse)[rank]
    return _api.linear_scan(a, b, reverse=reverse, initial=y_in, axis=axis, out=out, backend=backend)


def moments(x: Any, mask: Any = None, *, backend: str = "auto", group: Any = None) -> Moments:
    r""":func:`gaescan.moments` of the valid elements of every rank of ``group``.

    Each rank's ``(count, mean, m2)`` (:func:`gaescan.moments`, centred) is
    all-gathered, three float64 numbers per rank, and every rank merges them
    in rank order with the pairwise update (:func:`gaescan.combine_moments`):
    the same bits on every rank, and the one-process moments of the union to
    rounding.  A rank with no valid element (an empty shard) contributes
    ``count = 0`` and changes nothing.  (An all-reduce of sums, ``Σx`` and
    ``Σx²``, would give the cancelling ``E[x²] − E[x]²``.)

    Parameters
    ----------
    x, mask, backend
        As for :func:`gaescan.moments`, this rank's elements.
    group : torch.distributed.ProcessGroup, optional
        The ranks sharing the population; default the world.

    Returns
    -------
    Moments
        The moments of the union, float64 0-d arrays in ``x``'s library.
    """
    import torch

    dist = _dist()
    _, world = _rank_world(dist, group)
    m = _stats.moments(x, mask, backend=backend)
    numpy_in = isinstance(m.count, np.ndarray)
    local = torch.stack([torch.from_numpy(f) if numpy_in else f for f in m]).reshape(3)
    out = local.new_empty(world * 3)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, local, group=group)
    parts = out.view(world, 3)
    if numpy_in:
        parts = parts.numpy()
    return _stats.combine_moments(Moments(parts[:, 0], parts[:, 1], parts[:, 2]))


def whiten(
    x: Any,
    mask: Any = None,
    *,
    shift_mean: bool = True,
    ddof: int = 1,
    eps: float = 1e-8,
    out: Any = None,
    backend: str = "auto",
    group: Any = None,
) -> Any:
    r""":func:`gaescan.whiten` of this rank's elements with the statistics of every rank.

    ``whiten(x, mask, moments=m)`` with ``m`` the :func:`moments` of ``group``
    (one all-gather of three numbers per rank).

    Parameters
    ----------
    x, mask, shift_mean, ddof, eps, out, backend
        As for :func:`gaescan.whiten`, this rank's elements.
    group : torch.distributed.ProcessGroup, optional
        The ranks sharing the population; default the world.

    Returns
    -------
    array
        This rank's whitened elements.
    """
    m = moments(x, mask, backend=backend, group=group)
    return _stats.whiten(x, mask, shift_mean=shift_mean, ddof=ddof, eps=eps, moments=m, out=out,
                         backend=backend)
