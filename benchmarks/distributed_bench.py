"""gaescan.distributed.gae on spawned gloo ranks against one process and an all-gather.

Run: ``python benchmarks/distributed_bench.py [--ranks 4] [--B 64] [--T 1048576] [--repeat 5]``.

Three ways to get every rank its slice of GAE over ``[B, T]`` rows split along
time, float32 with dones, timed in the same run (medians; per call, the slowest
rank):

* ``gaescan.distributed.gae``: two all-gathers of ``(2, B)`` summaries, one
  ``gae`` pass over the local slice and the carry added to the steps it
  reaches;
* all-gather the rows (rewards, values, dones) to every rank, compute the
  whole rows there with ``gaescan.gae`` and keep the local slice (what
  frameworks do today);
* the one-process ``gaescan.gae`` on the whole rows (no ranks), for scale.

Each rank runs its Numba kernels on ``os.cpu_count() // ranks`` threads (at
least 1), so that the ranks do not oversubscribe the cores.  The first line
names the machine.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import tempfile
import time


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _worker(rank, world, port, B, T, repeat, out_dir):
    import numba
    import numpy as np
    import torch
    import torch.distributed as dist

    import gaescan
    import gaescan.distributed as gd
    import gaescan.testing

    numba.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rng = np.random.default_rng(rank)
    lo, hi = rank * T // world, (rank + 1) * T // world
    r = torch.from_numpy(rng.standard_normal((B, hi - lo), dtype=np.float32))
    v = torch.from_numpy(rng.standard_normal((B, hi - lo), dtype=np.float32))
    d = torch.from_numpy(rng.random((B, hi - lo)) < 1e-3)

    def split():
        return gd.gae(r, v, gamma=0.99, lam=0.95, dones=d)

    def gather_rows():
        parts = []
        for x in (r, v, d.to(torch.uint8)):
            buf = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(buf, x)
            parts.append(torch.cat(buf, dim=1))
        adv, ret = gaescan.gae(parts[0], parts[1], gamma=0.99, lam=0.95, dones=parts[2])
        return adv[:, lo:hi], ret[:, lo:hi]

    # both ways give this rank the same slice (checked before timing)
    for x, y in zip(split(), gather_rows(), strict=True):
        gaescan.testing.assert_close(x.numpy(), y.numpy(), dtype=np.float32)
    times = {}
    for name, f in (("split", split), ("gather", gather_rows)):
        f()
        ts = []
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            f()
            dist.barrier()
            ts.append(time.perf_counter() - t0)
        times[name] = ts
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump(times, fh)
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--T", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    import numpy as np
    import torch.multiprocessing as mp

    sys.path.insert(0, os.path.dirname(__file__))
    from cpu_bench import machine

    import gaescan

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(args.ranks, port, args.B, args.T, args.repeat, tmp), nprocs=args.ranks)
        ranks = []
        for k in range(args.ranks):
            with open(os.path.join(tmp, f"rank{k}.pkl"), "rb") as fh:
                ranks.append(pickle.load(fh))
    rng = np.random.default_rng(0)
    r = rng.standard_normal((args.B, args.T), dtype=np.float32)
    v = rng.standard_normal((args.B, args.T), dtype=np.float32)
    d = rng.random((args.B, args.T)) < 1e-3
    one = [0.0] * args.repeat
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    for i in range(args.repeat):
        t0 = time.perf_counter()
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
        one[i] = time.perf_counter() - t0
    # per repeat, the slowest rank (the barrier makes the ranks' times nearly equal)
    split = _median([max(rk["split"][i] for rk in ranks) for i in range(args.repeat)])
    gather = _median([max(rk["gather"][i] for rk in ranks) for i in range(args.repeat)])
    t1 = _median(one)
    print(f"# python benchmarks/distributed_bench.py --ranks {args.ranks} --B {args.B} --T {args.T} "
          f"--repeat {args.repeat}")
    print(f"# machine: {machine()}; {args.ranks} gloo ranks on this machine, "
          f"{max(1, (os.cpu_count() or 1) // args.ranks)} Numba thread(s) each; medians")
    print(f"{'method':52s} {'median':>10s}  ratio")
    print(f"{'one process, gaescan.gae on the whole rows':52s} {t1 * 1e3:8.1f}ms  1.00x")
    print(f"{'gaescan.distributed.gae (O(B) exchanged)':52s} {split * 1e3:8.1f}ms  {split / t1:.2f}x one process")
    print(f"{'all-gather the rows, gaescan.gae on every rank':52s} {gather * 1e3:8.1f}ms  "
          f"{gather / t1:.2f}x one process; distributed is {gather / split:.1f}x faster")


if __name__ == "__main__":
    main()
