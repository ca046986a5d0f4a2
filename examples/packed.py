"""GAE and returns on a packed batch: variable-length sequences back to back.

Sequences of different lengths are concatenated into flat 1-D arrays with no
padding, described by ``cu_seqlens = [0, c_1, ..., N]`` (sequence ``s`` is
``[c_s, c_{s+1})``), the layout variable-length attention kernels use.  Each
sequence is an independent row: here some end in a terminal state, others were
cut (truncated) and bootstrap from the value of their final observation, given
per step in ``next_values``.  One sequence is empty, which is allowed.

The script checks the packed call against a plain loop over each sequence, and
against one gaescan call per sequence, and prints a line per sequence.

Run:  python examples/packed.py
"""

from __future__ import annotations

import numpy as np

import gaescan


def make_packed(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.array([37, 5, 0, 64, 12, 1, 23])
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    N = int(cu_seqlens[-1])
    rewards = rng.normal(0.1, 1.0, N).astype(np.float32)
    values = rng.normal(0.0, 1.0, N).astype(np.float32)
    # V(s_{t+1}): the next step's value inside a sequence, the final observation's at its end
    next_values = np.empty(N, np.float32)
    next_values[:-1] = values[1:]
    terminated = np.zeros(N, bool)
    truncated = np.zeros(N, bool)
    ends_terminal = np.arange(len(lengths)) % 2 == 0
    for s, (lo, hi) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)):
        if hi == lo:
            continue
        next_values[hi - 1] = rng.normal()               # value of this sequence's final observation
        if ends_terminal[s]:
            terminated[hi - 1] = True
        else:
            truncated[hi - 1] = True
    return rewards, values, next_values, terminated, truncated, cu_seqlens


def gae_loop_1d(r, v, nv, term, trunc, gamma, lam):
    adv = np.zeros(len(r), np.float64)
    a = 0.0
    for t in reversed(range(len(r))):
        boot = 0.0 if term[t] else gamma * float(nv[t])
        delta = float(r[t]) + boot - float(v[t])
        a = delta if (term[t] or trunc[t]) else delta + gamma * lam * a
        adv[t] = a
    return adv


def main() -> None:
    gamma, lam = 0.99, 0.95
    r, v, nv, term, trunc, cu = make_packed()
    adv, ret = gaescan.gae(r, v, gamma=gamma, lam=lam, next_values=nv,
                           terminated=term, truncated=trunc, cu_seqlens=cu)

    print(f"{len(cu) - 1} sequences packed into N={len(r)} steps, cu_seqlens={cu.tolist()}")
    print(f"{'seq':>3} {'span':>10} {'len':>4} {'end':>10} {'A(first)':>9} {'R(first)':>9}")
    for s, (lo, hi) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        seg = slice(lo, hi)
        expected = gae_loop_1d(r[seg], v[seg], nv[seg], term[seg], trunc[seg], gamma, lam)
        np.testing.assert_allclose(adv[seg], expected, rtol=1e-4, atol=1e-5)
        if hi > lo:
            one = gaescan.gae(r[seg], v[seg], gamma=gamma, lam=lam, next_values=nv[seg],
                              terminated=term[seg], truncated=trunc[seg])
            np.testing.assert_allclose(adv[seg], one.advantages, rtol=1e-5, atol=1e-6)
            end = "terminated" if term[hi - 1] else "truncated"
            print(f"{s:>3} {f'[{lo}, {hi})':>10} {hi - lo:>4} {end:>10} {adv[lo]:>+9.3f} {ret[lo]:>+9.3f}")
        else:
            print(f"{s:>3} {f'[{lo}, {hi})':>10} {0:>4} {'(empty)':>10}")
    np.testing.assert_allclose(ret, adv + v, rtol=1e-6, atol=1e-6)

    G = gaescan.discounted_returns(r, gamma=gamma, dones=term | trunc, cu_seqlens=cu)
    firsts = cu[:-1][np.diff(cu) > 0]
    print("rewards-to-go (no bootstrap) on the same packing, first step of each sequence: "
          + ", ".join(f"{g:+.3f}" for g in G[firsts]))
    print("checked against a plain loop per sequence: OK")


if __name__ == "__main__":
    main()
