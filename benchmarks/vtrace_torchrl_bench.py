"""CPU time of :func:`gaescan.vtrace` beside torchrl's ``vtrace_advantage_estimate``.

Run: ``python benchmarks/vtrace_torchrl_bench.py [--repeat N] [--B B] [--T T]``.
Needs torch and torchrl.

Both run in one process on the same float32 inputs: torchrl on ``[B, T, 1]``
tensors (``time_dim=-2``), gaescan on the NumPy ``[B, T]`` views of the same
memory and on the tensors themselves (``axis=-2``).  Every call allocates its
outputs.  torchrl's backward loop is a Python loop over time of small tensor
operations, so its time grows with ``T`` far more than with ``B``.  The printed
medians include one warm-up call each (the Numba compile for gaescan).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from cpu_bench import _median, machine  # noqa: E402

import gaescan  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--T", type=int, default=8192)
    args = ap.parse_args(argv)
    import torch
    import torchrl
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    B, T, rep = args.B, args.T, args.repeat
    rng = np.random.default_rng(0)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    nv = np.concatenate([v[:, 1:], rng.standard_normal((B, 1), dtype=np.float32)], axis=1)
    log_mu = np.log(rng.uniform(0.05, 1.0, (B, T))).astype(np.float32)
    log_pi = np.log(rng.uniform(0.05, 1.0, (B, T))).astype(np.float32)
    lr = log_pi - log_mu
    term = rng.random((B, T)) < 1e-3
    trunc = (rng.random((B, T)) < 1e-3) & ~term
    done = term | trunc

    def t3(x):
        return torch.from_numpy(x)[..., None]

    tr, tv, tnv, tlp, tlm, tlr, tterm, tdone = map(t3, (r, v, nv, log_pi, log_mu, lr, term, done))

    def run_trl():
        return vtrace_advantage_estimate(0.99, tlp, tlm, tv, tnv, tr, tdone, tterm, time_dim=-2)

    def run_np():
        return gaescan.vtrace(r, v, lr, gamma=0.99, next_values=nv, terminated=term, truncated=trunc)

    def run_torch():
        return gaescan.vtrace(tr, tv, tlr, gamma=0.99, next_values=tnv, terminated=tterm, truncated=tdone,
                              axis=-2)

    adv_trl, vs_trl = run_trl()
    res = run_np()
    err = max(float(np.linalg.norm(res.vs - vs_trl[..., 0].numpy()) / np.linalg.norm(res.vs)),
              float(np.linalg.norm(res.advantages - adv_trl[..., 0].numpy()) / np.linalg.norm(res.advantages)))

    t_trl = _median(run_trl, rep)
    t_np = _median(run_np, rep)
    t_torch = _median(run_torch, rep)
    print(f"# {machine()}")
    print(f"# torch {torch.__version__} ({torch.get_num_threads()} threads), torchrl {torchrl.__version__}")
    print(f"# float32 [{B}, {T}], terminations and truncations at rate 1e-3 each; medians of {rep}")
    print(f"# relative L2 difference gaescan vs torchrl (max of vs, advantages): {err:.2g}")
    print(f"torchrl vtrace_advantage_estimate [B, T, 1]   {t_trl * 1e3:10.2f} ms")
    print(f"gaescan.vtrace, NumPy [B, T]                  {t_np * 1e3:10.2f} ms   {t_trl / t_np:8.1f}x faster")
    print(f"gaescan.vtrace, torch [B, T, 1], axis=-2      {t_torch * 1e3:10.2f} ms   {t_trl / t_torch:8.1f}x faster")


if __name__ == "__main__":
    main()
