"""Batch-major float32 kernels at [256, 131072], side by side across source trees.

Each tree (a checkout of gaescan, e.g. a ``git worktree`` of another commit)
runs in its own process, and the trees alternate round after round, so that a
busy spell of a shared machine falls on all of them.  Each process times, on
the same seeded inputs into preallocated outputs, ``gae`` (with dones, plain,
and with ``next_values`` and both flags), ``discounted_returns`` with dones,
``linear_scan`` reversed and ``vtrace`` with dones, each the median of
``--repeat`` calls after a warm-up, and a STREAM triad over the same element
count (``benchmarks/cpu_bench.py``), on the backend ``--backend`` names
(default ``"auto"``: the Numba kernels).  ``--cases carry`` times the carry
API's slice summaries on the same inputs instead: ``vtrace_summary`` with
dones, ``gae_summary`` with dones and a per-step γ, and with scalars.
``--cases zero-decay`` times the calls whose kernels select at a zero decay:
``gae`` and ``discounted_returns`` with a per-step γ (the general kernels),
``gae`` with λ = 0, ``vtrace`` with dones in float32 (also with one log-ratio
of −200 per 4096 steps, which the lanes kernel takes in float64) and in
float64, and ``turn_gae`` with turns of 512 tokens.

    python benchmarks/trees_ab.py /path/to/other/tree . --rounds 4
    python benchmarks/trees_ab.py /path/to/other/tree . --backend numpy --repeat 3
    python benchmarks/trees_ab.py /path/to/other/tree . --cases carry --rounds 3
    python benchmarks/trees_ab.py /path/to/other/tree . --cases zero-decay --rounds 3

Prints the machine, one line per tree and round (milliseconds), then per case
the median over rounds of each tree and its ratio to the first tree's (above 1:
faster than the first).  Figures are per machine: commit the output under
``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import numpy as np
import gaescan
from cpu_bench import _median, _triad_bw
B, T, rep, BK, SUITE = 256, 131072, int(sys.argv[3]), sys.argv[4], sys.argv[5]
rng = np.random.default_rng(0)
r = rng.standard_normal((B, T), dtype=np.float32)
v = rng.standard_normal((B, T), dtype=np.float32)
nv = rng.standard_normal((B, T), dtype=np.float32)
lr = rng.standard_normal((B, T), dtype=np.float32) * np.float32(0.5)
d = rng.random((B, T), dtype=np.float32) < 1e-3
tr = rng.random((B, T), dtype=np.float32) < 1e-3
a, b = np.empty_like(r), np.empty_like(r)
cases = {
    "gae dones": lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a, b), backend=BK),
    "gae plain": lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, out=(a, b), backend=BK),
    "gae next_values": lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=d,
                                           truncated=tr, out=(a, b), backend=BK),
    "returns dones": lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, out=a, backend=BK),
    "scan reverse": lambda: gaescan.linear_scan(v, r, reverse=True, out=a, backend=BK),
    "vtrace dones": lambda: gaescan.vtrace(r, v, lr, gamma=0.99, lam=1.0, dones=d, out=(a, b), backend=BK),
}
if SUITE == "carry":
    g = rng.uniform(0.9, 1.0, (B, T)).astype(np.float32)
    cases = {
        "vtrace_summary": lambda: gaescan.vtrace_summary(r, v, lr, gamma=0.99, dones=d, backend=BK),
        "gae_summary step g": lambda: gaescan.gae_summary(r, v, gamma=g, lam=0.95, dones=d, backend=BK),
        "gae_summary": lambda: gaescan.gae_summary(r, v, gamma=0.99, lam=0.95, dones=d, backend=BK),
    }
if SUITE == "zero-decay":
    g = rng.uniform(0.9, 1.0, (B, T)).astype(np.float32)
    r8, v8, lr8 = (x.astype(np.float64) for x in (r, v, lr))
    a8, b8 = np.empty_like(r8), np.empty_like(r8)
    lw = lr.copy()
    lw[:, ::4096] = -200.0  # one log-ratio outside the float32 exponential's range per 4096 steps
    ids = np.repeat(np.arange(T // 512, dtype=np.int32), 512)[None].repeat(B, 0)
    cases = {
        "gae step g": lambda: gaescan.gae(r, v, gamma=g, lam=0.95, dones=d, out=(a, b), backend=BK),
        "returns step g": lambda: gaescan.discounted_returns(r, gamma=g, dones=d, out=a, backend=BK),
        "gae lam=0": lambda: gaescan.gae(r, v, gamma=0.99, lam=0.0, dones=d, out=(a, b), backend=BK),
        "vtrace dones": lambda: gaescan.vtrace(r, v, lr, gamma=0.99, lam=1.0, dones=d, out=(a, b), backend=BK),
        "vtrace wide": lambda: gaescan.vtrace(r, v, lw, gamma=0.99, lam=1.0, dones=d, out=(a, b), backend=BK),
        "vtrace f64": lambda: gaescan.vtrace(r8, v8, lr8, gamma=0.99, lam=1.0, dones=d, out=(a8, b8), backend=BK),
        "turn_gae": lambda: gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95, out=(a, b), backend=BK),
    }
out = {"triad GB/s": _triad_bw(B * T, rep)}
for name, f in cases.items():
    out[name] = _median(f, rep) * 1e3
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="source trees (directories holding gaescan/)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backend", default="auto", help="the backend= of every call")
    ap.add_argument("--cases", choices=("kernels", "carry", "zero-decay"), default="kernels",
                    help="the scans themselves, the carry API's slice summaries, or the calls whose "
                         "kernels drop the carry at a zero decay")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees]
    sys.path.insert(0, str(_HERE))
    from cpu_bench import machine

    print(machine())
    results: dict[str, list[dict]] = {t: [] for t in trees}
    for rnd in range(args.rounds):
        for t in trees:
            # Each tree's own Numba cache: the trees' kernels differ under the same names.
            cache = os.path.join(tempfile.gettempdir(), "gaescan-trees-ab", t.strip("/").replace("/", "_"))
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            proc = subprocess.run([sys.executable, "-c", _CHILD, t, str(_HERE), str(args.repeat), args.backend,
                                   args.cases],
                                  capture_output=True, text=True, env=env, cwd="/", check=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[t].append(res)
            print(f"round {rnd + 1} {t}: " + "  ".join(f"{k} {x:.2f}" for k, x in res.items()), flush=True)
    names = list(results[trees[0]][0])
    print("\nmedians over rounds (ms; triad GB/s); ratio: first tree's time over this tree's")
    print(f"{'case':<18}" + "".join(f"{Path(t).name[-16:]:>18}{'ratio':>7}" for t in trees))
    for name in names:
        meds = [float(np.median([r[name] for r in results[t]])) for t in trees]
        cells = []
        for m in meds:
            ratio = (m / meds[0]) if name == "triad GB/s" else (meds[0] / m)
            cells.append(f"{m:>18.2f}{ratio:>7.2f}")
        print(f"{name:<18}" + "".join(cells))


if __name__ == "__main__":
    main()
