"""Float32 V-trace lanes kernels with the trace in float32 (the default) against the trace in float64.

Run: ``python benchmarks/vtrace_trace_width.py [--repeat N] [--rounds N]``.

``gaescan.vtrace`` on float32 ``[256, 131072]`` rows runs the lanes kernels
(:mod:`gaescan.kernels.cpu_vtrace`).  Where ``ρ̄ <= 1`` and ``|γλ|·c̄`` is at
most ``gaescan.backends.numba_cpu.F32_STATE_MAX_DECAY`` they carry the trace in
float32 (:func:`gaescan.backends.vtrace_numba._state32`); setting that bound
to -1 makes the same call carry it in float64.  The script times both on the
same inputs into the same outputs, the two calls in turn (medians of each),
for four cases: dones, plain, ``next_values`` with terminations and
truncations, and time-major ``[131072, 256]`` (``axis=0``) with dones; and a
STREAM triad over the same element count, round after round.  Before timing
it checks, per case, that both widths are within 1e-6 relative L2 of each
other and prints the difference.  Figures are per machine: commit the output
under ``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gaescan
from gaescan.backends import numba_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402
from lanes_bench import ab_args, ab_rounds  # noqa: E402
from vtrace_lanes_bench import inputs  # noqa: E402

GAMMA = 0.99


def main(argv=None) -> None:
    args = ab_args(__doc__, argv)
    R, T = 256, 131072
    rng, r, v, lr, d = inputs(R, T)
    term = rng.random((R, T)) < 1e-3
    trunc = rng.random((R, T)) < 1e-3
    nv = rng.standard_normal((R, T), dtype=np.float32)
    rt, vt, lrt, dt = (np.ascontiguousarray(x.reshape(T, R)) for x in (r, v, lr, d))
    outs = (np.empty_like(r), np.empty_like(r))
    cases = {
        # name: (call, bytes per step)
        "dones": (lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, dones=d, out=outs), 21),
        "plain": (lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, out=outs), 20),
        "next+term+trunc": (lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, next_values=nv, terminated=term,
                                                    truncated=trunc, out=outs), 26),
        "time-major dones": (lambda: gaescan.vtrace(rt, vt, lrt, gamma=GAMMA, dones=dt, axis=0,
                                                     out=tuple(o.reshape(T, R) for o in outs)), 21),
    }
    bound = numba_cpu.F32_STATE_MAX_DECAY

    def wide(call):
        def run():
            numba_cpu.F32_STATE_MAX_DECAY = -1.0
            try:
                call()
            finally:
                numba_cpu.F32_STATE_MAX_DECAY = bound
        return run

    print(f"# python benchmarks/vtrace_trace_width.py --repeat {args.repeat} --rounds {args.rounds}")
    print(f"# {machine()}")
    print(f"# [{R}, {T}] float32, gamma={GAMMA}, lam=1, rho_bar=c_bar=1; f64 = trace in float64, "
          f"f32 = trace in float32 (the default); medians of {args.repeat}, the two timed in turn;")
    print("# x triad = bytes one pass moves (reads and writes per step, column 'B') / time / triad GB/s "
          "of the same round")
    for name, (call, _) in cases.items():
        wide(call)()
        ref = tuple(o.astype(np.float64) for o in outs)
        call()
        diff = max(float(np.linalg.norm(o - x) / np.linalg.norm(x)) for o, x in zip(outs, ref, strict=True))
        print(f"# {name}: f32 trace vs f64 trace, relative L2 {diff:.1e} (vs and advantages)")
        if diff > 1e-6:
            raise SystemExit(f"{name}: the two trace widths differ by {diff:.2e} relative L2")
    ab_rounds(args, R * T, cases, wide, ("f64", "f32"))


if __name__ == "__main__":
    main()
