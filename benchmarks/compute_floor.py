"""The batch-major GAE and V-trace kernels' compute floor beside their memory floor.

Run: ``python benchmarks/compute_floor.py [--repeat N]``.

A scan is memory-bound only where the kernel's instructions per step take
less time than moving the step's bytes.  This script measures both sides on
the machine it runs on:

* the **compute floor**: :func:`gaescan.gae` (and, float32, with
  ``next_values`` and both flags, :func:`gaescan.linear_scan` both ways and
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
    print(f"{'case':30s} {'ns/step':>8s} {'compute floor':>14s} {'memory floor':>13s} {'measured':>9s}  bound")
    def floor(label, call, nbytes, rows_of):
        """One row of the table: ``call(arrays)`` on the small and the big inputs;
        ``rows_of(shape)`` makes the arrays of one size."""
        small, big = rows_of((b, t)), rows_of((B, T))
        triad_s = _median(lambda: _triad(ta, tb, tc, np.float32(3.0)), args.repeat)
        triad_bps = 12 * N / triad_s  # bytes per second

        def run_small():
            for _ in range(calls):
                call(small)

        ns = _median(run_small, args.repeat) / (calls * b * t) * 1e9
        measured = _median(lambda: call(big), args.repeat)
        compute = ns * N / threads / 1e9
        memory = nbytes * N / triad_bps
        bound = "compute" if compute > memory else "memory"
        print(f"{label:30s} {ns:8.3f} {compute * 1e3:11.1f} ms {memory * 1e3:10.1f} ms {measured * 1e3:6.1f} ms  {bound}",
              flush=True)
        return small

    def gae_arrays(dtype, flags):
        def make(shape):
            a = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype)}
            if "dones" in flags:
                a["dones"] = rng.random(shape) < 1e-3
            if "next" in flags:
                a["next_values"] = rng.standard_normal(shape).astype(dtype)
                a["terminated"] = rng.random(shape) < 1e-3
                a["truncated"] = rng.random(shape) < 1e-3
            a["out"] = (np.empty(shape, dtype), np.empty(shape, dtype))
            return a
        return make

    def gae_call(a):
        gaescan.gae(gamma=0.99, lam=0.95, **a)

    for dtype in (np.float32, np.float64):
        item = np.dtype(dtype).itemsize
        name = np.dtype(dtype).name
        floor(f"gae dones {name}", gae_call, 4 * item + 1, gae_arrays(dtype, ("dones",)))
        floor(f"gae plain {name}", gae_call, 4 * item, gae_arrays(dtype, ()))
    floor("gae next+term+trunc float32", gae_call, 22, gae_arrays(np.float32, ("next",)))

    # linear_scan, float32: reads a and b, writes y.
    def scan_arrays(shape):
        return {"a": rng.uniform(0.9, 1.0, shape).astype(np.float32),
                "b": rng.standard_normal(shape).astype(np.float32), "out": np.empty(shape, np.float32)}

    for reverse in (True, False):
        floor(f"linear_scan {'reverse' if reverse else 'forward'} float32",
              lambda a, reverse=reverse: gaescan.linear_scan(**a, reverse=reverse), 12, scan_arrays)

    # V-trace, float32: reads r, v, log-ratios (and flags), writes vs and advantages.
    def vtrace_arrays(flags):
        def make(shape):
            a = [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]
            a[2] *= 0.3
            kw = {"dones": rng.random(shape) < 1e-3} if flags else {}
            return a, kw, (np.empty(shape, np.float32), np.empty(shape, np.float32))
        return make

    def vtrace_call(a):
        arrays, kw, out = a
        gaescan.vtrace(*arrays, gamma=0.99, out=out, **kw)

    floor("vtrace dones float32", vtrace_call, 21, vtrace_arrays(True))
    small = floor("vtrace plain float32", vtrace_call, 20, vtrace_arrays(False))
    small, o_small = small[0], small[2]
    triad_s = _median(lambda: _triad(ta, tb, tc, np.float32(3.0)), args.repeat)
    triad_bps = 12 * N / triad_s

    def run_exp():
        for _ in range(calls):
            _exp_alone(small[2], o_small[0])

    ns = _median(run_exp, args.repeat) / (calls * b * t) * 1e9
    compute = ns * N / threads / 1e9
    memory = 20 * N / triad_bps
    print(f"{'exp alone (vtrace)':30s} {ns:8.3f} {compute * 1e3:11.1f} ms {memory * 1e3:10.1f} ms "
          f"{'-':>6s}     {'compute' if compute > memory else 'memory'}")


if __name__ == "__main__":
    main()
