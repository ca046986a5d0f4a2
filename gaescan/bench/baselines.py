"""The methods gaescan is measured against, written as their users write them.

Both work on NumPy or CuPy arrays (``xp`` is the array's namespace), for
``[B, T]`` float inputs, constant ``gamma``/``lam`` and optional ``dones``.
They are baselines, not references: the tests' float64 oracle lives in
``tests/``.
"""

from __future__ import annotations

from typing import Any


def serial_gae(xp: Any, rewards: Any, values: Any, gamma: float, lam: float,
               dones: Any | None = None) -> Any:
    """The textbook loop: vectorised over the batch, a Python loop over time."""
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
        last = delta + gl * live * last
        adv[:, t] = last
        v_next = values[:, t]
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
