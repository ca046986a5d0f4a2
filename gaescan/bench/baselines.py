"""The methods gaescan is measured against, written as their users write them.

Both work on NumPy or CuPy arrays (``xp`` is the array's namespace), for
``[B, T]`` float inputs, constant ``gamma``/``lam`` and optional ``dones``.
They are baselines, not references: the float64 references live in
:mod:`gaescan.testing`.
"""

from __future__ import annotations

from typing import Any


def serial_gae(xp: Any, rewards: Any, values: Any, gamma: float, lam: float,
               dones: Any | None = None, mask: Any | None = None) -> Any:
    """The textbook loop: vectorised over the batch, a Python loop over time.

    With ``mask`` (false = padding / prompt step, skipped), the carried
    advantage and next value stay put across masked steps and those outputs are
    0, as a careful user writes it (the contract's skip semantics).
    """
    B, T = rewards.shape
    dt = rewards.dtype
    g = dt.type(gamma)
    gl = dt.type(gamma) * dt.type(lam)
    adv = xp.empty_like(rewards)
    last = xp.zeros(B, dtype=dt)
    v_next = xp.zeros(B, dtype=dt)
    for t in range(T - 1, -1, -1):
        live = 1 if dones is None else 1 - dones[:, t].astype(dt)
        delta = rewards[:, t] + g * v_next * live - values[:, t]
        if mask is None:
            last = delta + gl * live * last
            adv[:, t] = last
            v_next = values[:, t]
        else:
            m = mask[:, t]
            step = delta + gl * live * last
            adv[:, t] = xp.where(m, step, dt.type(0))
            last = xp.where(m, step, last)
            v_next = xp.where(m, values[:, t], v_next)
    return adv


def chunk_scan_gae(xp: Any, rewards: Any, values: Any, gamma: float, lam: float,
                   chunk: int = 256) -> Any:
    """The published chunk-scan (no dones): a ``C × C`` kernel matmul per chunk,
    then a serial carry between chunks."""
    B, T = rewards.shape
    dt = rewards.dtype
    C = chunk
    g = dt.type(gamma)
    c = dt.type(gamma) * dt.type(lam)
    v_next = xp.concatenate([values[:, 1:], xp.zeros((B, 1), dtype=dt)], axis=1)
    delta = rewards + g * v_next - values
    n = -(-T // C)
    pad = n * C - T
    if pad:
        delta = xp.concatenate([delta, xp.zeros((B, pad), dtype=dt)], axis=1)
    i = xp.arange(C)
    expo = i[None, :] - i[:, None]
    kernel = xp.where(expo >= 0, c ** xp.maximum(expo, 0).astype(dt), dt.type(0)).astype(dt)
    local = delta.reshape(B, n, C) @ kernel.T
    decay = (c ** xp.arange(C, 0, -1).astype(dt)).astype(dt)
    carry = xp.zeros(B, dtype=dt)
    for k in range(n - 1, -1, -1):
        local[:, k, :] += carry[:, None] * decay
        carry = local[:, k, 0]
    return local.reshape(B, n * C)[:, :T]
