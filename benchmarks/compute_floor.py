"""The batch-major GAE and V-trace kernels' compute floor beside their memory floor.

Run: ``python benchmarks/compute_floor.py [--repeat N]``.

A scan is memory-bound only where the kernel's instructions per step take
less time than moving the step's bytes.  This script measures both sides on
the machine it runs on:

* the **compute floor**: :func:`gaescan.gae` (and, float32,
  :func:`gaescan.vtrace`) on ``[8, 8192]`` rows (float32:
  about 1.3 MB in all, inside L2 and L3), called many times in a row, so
  that every load hits the cache; on one thread (eight rows are one unit of
  the kernels' parallel loop), in ns per step;
* the **memory floor**: a STREAM triad over the element count of
  ``[256, 131072]``, on every Numba thread, converted to ns per step at the
  case's bytes per step;

and prints, for ``[256, 131072]`` on the machine's thread count, the time
each floor implies beside the measured time of the full case.  Where the
compute floor is the larger, the kernel is bound by its instructions per
step (the loop-carried chain and the loads and stores around it), and no
change of memory order can bring it to the triad.  One more row, ``exp
alone``, is the compute floor of the V-trace kernels' float64 exponential by
itself (:func:`gaescan.kernels.cpu_vtrace._exp` over float32 log-ratios in a
loop LLVM vectorises, one float32 result per step): the part of V-trace's
floor that no change of the chain's shape removes.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from cpu_bench import _triad, machine
from numba import njit

import gaescan
from gaescan.kernels.cpu_vtrace import _exp


@njit(fastmath={"contract"})
def _exp_alone(x, out):
    for i in range(x.size):
        out.flat[i] = np.float32(_exp(np.float64(x.flat[i])))


def _median(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    print(f"# python benchmarks/compute_floor.py --repeat {args.repeat}")
    print(f"# machine: {machine()}")
    threads = numba.get_num_threads()
    rng = np.random.default_rng(0)
    B, T = 256, 131072
    b, t = 8, 8192
    calls = 100
    N = B * T
    ta = np.empty(N, np.float32)
    tb = np.ones(N, np.float32)
    tc = np.ones(N, np.float32)
    print(f"compute floor: [{b}, {t}] in cache, {calls} calls per timing, one thread; "
          f"memory floor: a triad over [{B}, {T}] elements on {threads} threads; medians of {args.repeat}")
    print(f"{'case':24s} {'ns/step':>8s} {'compute floor':>14s} {'memory floor':>13s} {'measured':>9s}  bound")
    for dtype in (np.float32, np.float64):
        small = [rng.standard_normal((b, t)).astype(dtype) for _ in range(2)]
        big = [rng.standard_normal((B, T), dtype=np.float32).astype(dtype) for _ in range(2)]
        d_small = rng.random((b, t)) < 1e-3
        d_big = rng.random((B, T), dtype=np.float32) < 1e-3
        o_small = (np.empty_like(small[0]), np.empty_like(small[0]))
        o_big = (np.empty_like(big[0]), np.empty_like(big[0]))
        item = np.dtype(dtype).itemsize
        triad_s = _median(lambda: _triad(ta, tb, tc, np.float32(3.0)), args.repeat)
        triad_bps = 12 * N / triad_s  # bytes per second
        for name, extra, flag_bytes in (("dones", True, 1), ("plain", False, 0)):
            kw_s = {"dones": d_small} if extra else {}
            kw_b = {"dones": d_big} if extra else {}

            def run_small(kw_s=kw_s, small=small, o_small=o_small):
                for _ in range(calls):
                    gaescan.gae(small[0], small[1], gamma=0.99, lam=0.95, out=o_small, **kw_s)

            ns = _median(run_small, args.repeat) / (calls * b * t) * 1e9
            measured = _median(lambda kw_b=kw_b, big=big, o_big=o_big: gaescan.gae(big[0], big[1], gamma=0.99, lam=0.95,
                                                                                  out=o_big, **kw_b),
                               args.repeat)
            compute = ns * N / threads / 1e9
            memory = (4 * item + flag_bytes) * N / triad_bps
            bound = "compute" if compute > memory else "memory"
            print(f"gae {name} {np.dtype(dtype).name:12s} {ns:8.3f} {compute * 1e3:11.1f} ms "
                  f"{memory * 1e3:10.1f} ms {measured * 1e3:6.1f} ms  {bound}")

    # V-trace, float32: reads r, v, log-ratios (and flags), writes vs and advantages.
    small = [rng.standard_normal((b, t), dtype=np.float32) for _ in range(3)]
    big = [rng.standard_normal((B, T), dtype=np.float32) for _ in range(3)]
    small[2] *= 0.3
    big[2] *= 0.3
    d_small = rng.random((b, t)) < 1e-3
    d_big = rng.random((B, T), dtype=np.float32) < 1e-3
    o_small = (np.empty_like(small[0]), np.empty_like(small[0]))
    o_big = (np.empty_like(big[0]), np.empty_like(big[0]))
    triad_s = _median(lambda: _triad(ta, tb, tc, np.float32(3.0)), args.repeat)
    triad_bps = 12 * N / triad_s
    for name, extra, flag_bytes in (("dones", True, 1), ("plain", False, 0)):
        kw_s = {"dones": d_small} if extra else {}
        kw_b = {"dones": d_big} if extra else {}

        def run_small(kw_s=kw_s):
            for _ in range(calls):
                gaescan.vtrace(*small, gamma=0.99, out=o_small, **kw_s)

        ns = _median(run_small, args.repeat) / (calls * b * t) * 1e9
        measured = _median(lambda kw_b=kw_b: gaescan.vtrace(*big, gamma=0.99, out=o_big, **kw_b), args.repeat)
        compute = ns * N / threads / 1e9
        memory = (20 + flag_bytes) * N / triad_bps
        bound = "compute" if compute > memory else "memory"
        print(f"vtrace {name} float32    {ns:8.3f} {compute * 1e3:11.1f} ms "
              f"{memory * 1e3:10.1f} ms {measured * 1e3:6.1f} ms  {bound}")

    def run_exp():
        for _ in range(calls):
            _exp_alone(small[2], o_small[0])

    ns = _median(run_exp, args.repeat) / (calls * b * t) * 1e9
    compute = ns * N / threads / 1e9
    memory = 20 * N / triad_bps
    print(f"exp alone (vtrace)       {ns:8.3f} {compute * 1e3:11.1f} ms {memory * 1e3:10.1f} ms "
          f"{'-':>6s}     {'compute' if compute > memory else 'memory'}")


if __name__ == "__main__":
    main()
