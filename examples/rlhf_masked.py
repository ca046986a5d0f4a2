"""Token-level GAE for an RLHF-style batch with response masks.

A batch of ``B`` sequences laid out as ``[prompt | response | padding]`` in one
``[B, L]`` array (prompts of different lengths, left-aligned, responses right
after them, then padding).  Some responses are multi-turn: a tool output sits in
the middle, tokens the policy did not generate.  The mask is true exactly on the
generated tokens, so prompt, tool and padding positions are skipped: they are not
steps, their inputs are never read and their outputs are 0.

Rewards follow the usual PPO-for-LLMs shape: a per-token KL penalty ``-beta*KL``
on every generated token plus the reward model's score on the last generated
token; ``gamma = 1``, ``lam = 0.95``.  The script checks gaescan against a plain
loop and prints, per sequence, where the response is, its score and the
advantage and return of its first generated token.

Run:  python examples/rlhf_masked.py
"""

from __future__ import annotations

import numpy as np

import gaescan


def make_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    B, L = 6, 48
    prompt_len = rng.integers(4, 12, size=B)
    response_len = rng.integers(10, 30, size=B)
    pos = np.arange(L)[None, :]
    start, stop = prompt_len[:, None], (prompt_len + response_len)[:, None]
    mask = (pos >= start) & (pos < stop)                 # generated tokens only
    tool = np.zeros((B, L), bool)
    for b in (1, 4):                                     # multi-turn: a tool output inside
        mid = prompt_len[b] + response_len[b] // 3
        tool[b, mid:mid + 3] = True
    mask &= ~tool

    values = rng.normal(0.0, 0.5, size=(B, L)).astype(np.float32)
    values[~mask] = np.nan                               # never read: NaN changes nothing
    kl = rng.exponential(0.02, size=(B, L)).astype(np.float32)
    scores = rng.normal(0.0, 1.0, size=B).astype(np.float32)
    beta = 0.05
    rewards = np.where(mask, -beta * kl, 0.0).astype(np.float32)
    last = np.array([np.flatnonzero(mask[b])[-1] for b in range(B)])
    rewards[np.arange(B), last] += scores
    return rewards, values, mask, scores, prompt_len, response_len


def masked_gae_loop(rewards, values, mask, gamma, lam):
    """Reverse loop over each row's unmasked positions only."""
    adv = np.zeros(rewards.shape, np.float64)
    for b in range(rewards.shape[0]):
        a, v_next = 0.0, 0.0
        for t in reversed(np.flatnonzero(mask[b])):
            delta = float(rewards[b, t]) + gamma * v_next - float(values[b, t])
            a = delta + gamma * lam * a
            adv[b, t] = a
            v_next = float(values[b, t])
    return adv


def main() -> None:
    gamma, lam = 1.0, 0.95
    rewards, values, mask, scores, prompt_len, response_len = make_batch()
    adv, ret = gaescan.gae(rewards, values, gamma=gamma, lam=lam, mask=mask)

    assert np.all(adv[~mask] == 0) and np.all(ret[~mask] == 0)
    assert np.isfinite(adv).all(), "a masked NaN leaked into the result"
    np.testing.assert_allclose(adv, masked_gae_loop(rewards, values, mask, gamma, lam), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret[mask], (adv + values)[mask], rtol=1e-6, atol=1e-6)

    print(f"batch [B, L] = {list(rewards.shape)}, gamma={gamma}, lam={lam}, "
          f"{int(mask.sum())} generated tokens of {mask.size}")
    print(f"{'seq':>3} {'prompt':>6} {'response':>8} {'tool':>4} {'score':>7} {'A(first)':>9} {'R(first)':>9}")
    for b in range(rewards.shape[0]):
        first = np.flatnonzero(mask[b])[0]
        n_tool = int(response_len[b] - mask[b].sum())
        print(f"{b:>3} {prompt_len[b]:>6} {response_len[b]:>8} {n_tool:>4} {scores[b]:>+7.3f} "
              f"{adv[b, first]:>+9.3f} {ret[b, first]:>+9.3f}")

    valid = adv[mask]
    white = (valid - valid.mean()) / (valid.std() + 1e-8)
    print(f"whitened over generated tokens: mean {white.mean():+.1e}, std {white.std():.3f}")

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t_adv, _ = gaescan.gae(torch.from_numpy(rewards), torch.from_numpy(values), gamma=gamma, lam=lam,
                               mask=torch.from_numpy(mask))
        torch.testing.assert_close(t_adv, torch.from_numpy(adv))
        print("torch tensors in, torch tensors out: same advantages")
    print("checked against a plain Python loop: OK")


if __name__ == "__main__":
    main()
