"""group_normalize and whiten against their baselines, in one run.

Run: ``python benchmarks/stats_bench.py [--repeat N]``.

* GRPO outcome advantages at B = 4096 (256 groups of 16, labels shuffled):
  ``gaescan.group_normalize`` against a per-sequence Python loop over a dict
  of groups, as verl's ``compute_grpo_outcome_advantage`` is written (on
  torch tensors when PyTorch is installed, as there; else on NumPy scalars,
  which is faster), on the same inputs.
* ``gaescan.whiten`` on ``[4096, 8192]`` float32 with a mask, against a
  STREAM triad over the same element count, counting 9 bytes per element
  (x and the one-byte mask read once, y written once).

Medians; the first line names the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import numpy as np

import gaescan

sys.path.insert(0, os.path.dirname(__file__))
from cpu_bench import _triad_bw, machine  # noqa: E402


def _median(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def dict_loop_grpo(scores, index, eps=1e-6):
    """Per-sequence loops over a dict of groups (unbiased std, eps added to it),
    on torch tensors when ``scores`` is one."""
    try:
        import torch
    except ImportError:
        torch = None
    tensor = torch is not None and isinstance(scores, torch.Tensor)
    id2score = defaultdict(list)
    id2mean, id2std = {}, {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        elif tensor:
            g = torch.stack(group)
            id2mean[idx], id2std[idx] = torch.mean(g), torch.std(g)
        else:
            g = np.array(group)
            id2mean[idx], id2std[idx] = g.mean(), g.std(ddof=1)
    out = scores.clone() if tensor else np.empty_like(scores)
    for i in range(len(scores)):
        out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    rep = args.repeat
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(256), 16))
    scores = rng.standard_normal(4096).astype(np.float32)
    try:
        import torch

        loop_in, loop_kind = torch.from_numpy(scores), "torch"
    except ImportError:
        loop_in, loop_kind = scores, "NumPy"
    t_loop = _median(lambda: dict_loop_grpo(loop_in, labels), max(1, rep // 2))
    t_gn = _median(lambda: gaescan.group_normalize(scores, groups=labels), max(rep, 51))
    t_gs = _median(lambda: gaescan.group_normalize(scores, group_size=16), max(rep, 51))
    np.testing.assert_allclose(gaescan.group_normalize(scores, groups=labels),
                               np.asarray(dict_loop_grpo(loop_in, labels)), rtol=1e-4, atol=1e-5)
    x = (1e4 + rng.standard_normal((4096, 8192))).astype(np.float32)
    m = rng.random((4096, 8192)) < 0.8
    y = np.empty_like(x)
    N = x.size
    bw = _triad_bw(N, rep)
    t_w = _median(lambda: gaescan.whiten(x, m, out=y), rep)
    t_m = _median(lambda: gaescan.moments(x, m), rep)
    print("# python benchmarks/stats_bench.py --repeat", rep)
    print(f"# machine: {machine()}; medians")
    print(f"{'case':60s} {'median':>11s}  note")
    print(f"{f'GRPO B=4096, 256 shuffled groups of 16: dict loop ({loop_kind})':60s} {t_loop * 1e3:9.3f}ms")
    print(f"{'  gaescan.group_normalize(groups=labels)':60s} {t_gn * 1e6:9.1f}us  "
          f"{t_loop / t_gn:.0f}x the dict loop (target >= 100x)")
    print(f"{'  gaescan.group_normalize(group_size=16), labels not needed':60s} {t_gs * 1e6:9.1f}us  "
          f"{t_loop / t_gs:.0f}x the dict loop")
    print(f"{'STREAM triad, same element count as whiten':60s} {12 * N / bw / 1e9 * 1e3:9.3f}ms  {bw:.1f} GB/s")
    print(f"{'whiten [4096, 8192] f32, mask (x = 1e4 + N(0, 1))':60s} {t_w * 1e3:9.3f}ms  "
          f"{9 * N / t_w / 1e9 / bw:.2f}x triad at 9 B/element (target >= 0.5x)")
    print(f"{'  of which moments (x and mask read)':60s} {t_m * 1e3:9.3f}ms  "
          f"{5 * N / t_m / 1e9 / bw:.2f}x triad at 5 B/element")


if __name__ == "__main__":
    main()
