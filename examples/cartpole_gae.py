"""GAE on a CartPole rollout with time-limit truncation, bootstrapped correctly.

Several CartPole environments with a short time limit are stepped with random
actions for a fixed number of steps, collecting a time-major rollout
``[T, n_envs]``.  At every step we record the value of the observation that
*followed* it; when an episode ended, that is the value of the episode's final
observation (not of the reset one).  gaescan then computes GAE with
``terminated``/``truncated`` + ``next_values``, so time-limit truncations are
bootstrapped and real terminations are not.

The value function is a fixed linear function of the observation (no network),
enough to show the bookkeeping.  The script checks gaescan against a plain
Python loop, and shows how much the value targets of truncated steps change
when truncations are (wrongly) treated as terminations.

Run:  python examples/cartpole_gae.py [--steps 256] [--envs 4] [--time-limit 20]
Needs gymnasium (pip install gymnasium).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import gaescan


def value_fn(obs: np.ndarray) -> np.ndarray:
    """A fixed linear value function of the CartPole observation
    (cart position, cart velocity, pole angle, pole angular velocity)."""
    w = np.array([0.5, -0.3, 8.0, 1.0], dtype=np.float32)
    return (10.0 + obs @ w).astype(np.float32)


def rollout(n_envs: int, steps: int, time_limit: int, seed: int) -> dict[str, np.ndarray]:
    envs = [gym.make("CartPole-v1", max_episode_steps=time_limit) for _ in range(n_envs)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    rng = np.random.default_rng(seed)
    buf = {k: np.zeros((steps, n_envs), np.float32) for k in ("rewards", "values", "next_values")}
    buf["terminated"] = np.zeros((steps, n_envs), bool)
    buf["truncated"] = np.zeros((steps, n_envs), bool)
    for t in range(steps):
        buf["values"][t] = value_fn(obs)
        for i, env in enumerate(envs):
            nxt, r, term, trunc, _ = env.step(int(rng.integers(2)))
            buf["rewards"][t, i] = r
            buf["terminated"][t, i] = term
            buf["truncated"][t, i] = trunc
            # The value of the observation that followed step t: at an episode end,
            # the final observation, computed *before* the reset replaces it.
            buf["next_values"][t, i] = value_fn(nxt[None])[0]
            if term or trunc:
                nxt, _ = env.reset()
            obs[i] = nxt
    for env in envs:
        env.close()
    return buf


def gae_loop(r, v, nv, term, trunc, gamma, lam):
    """The plain reverse loop, one environment (column) at a time."""
    adv = np.zeros(r.shape, np.float64)
    for i in range(r.shape[1]):
        a = 0.0
        for t in reversed(range(r.shape[0])):
            boot = 0.0 if term[t, i] else gamma * float(nv[t, i])
            delta = float(r[t, i]) + boot - float(v[t, i])
            a = delta if (term[t, i] or trunc[t, i]) else delta + gamma * lam * a
            adv[t, i] = a
    return adv


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--time-limit", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lam", type=float, default=0.95)
    args = p.parse_args(argv)

    b = rollout(args.envs, args.steps, args.time_limit, args.seed)
    adv, ret = gaescan.gae(
        b["rewards"], b["values"], gamma=args.gamma, lam=args.lam,
        terminated=b["terminated"], truncated=b["truncated"], next_values=b["next_values"],
        axis=0,  # time-major buffer [T, n_envs]
    )

    expected = gae_loop(b["rewards"], b["values"], b["next_values"], b["terminated"], b["truncated"],
                        args.gamma, args.lam)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, adv + b["values"], rtol=1e-6, atol=1e-6)

    # The common mistake: truncation treated as termination (no bootstrap).
    wrong_adv, wrong_ret = gaescan.gae(
        b["rewards"], b["values"], gamma=args.gamma, lam=args.lam,
        dones=b["terminated"] | b["truncated"], next_values=b["next_values"], axis=0,
    )
    # A step can be both terminated and truncated (the pole falls on the last allowed
    # step): termination wins, no bootstrap.  Look at the truncations proper.
    trunc = b["truncated"] & ~b["terminated"]

    print(f"rollout: {args.steps} steps x {args.envs} envs, time limit {args.time_limit}")
    print(f"episode ends: {int(b['terminated'].sum())} terminated, {int(trunc.sum())} truncated by the time limit")
    print(f"advantages: mean {adv.mean():+.3f}, std {adv.std():.3f}; "
          f"value targets: mean {ret.mean():.3f}")
    if trunc.any():
        gap = (ret - wrong_ret)[trunc]
        print(f"at truncated steps the value target keeps gamma*V(final obs): "
              f"mean {ret[trunc].mean():.3f}, vs {wrong_ret[trunc].mean():.3f} "
              f"if truncation were treated as termination (gap {gap.mean():.3f})")
        np.testing.assert_allclose(gap, args.gamma * b["next_values"][trunc], rtol=1e-5)
    print("checked against a plain Python loop: OK")


if __name__ == "__main__":
    main()
