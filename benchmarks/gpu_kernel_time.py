"""Kernel-only timings of the CUDA backend, for a profiler (``ncu``) to read.

The event timings of ``gpu_check`` include the host's launch overhead for small
problems; run this under Nsight Compute to see the kernels alone::

    ncu --metrics gpu__time_duration.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python benchmarks/gpu_kernel_time.py
"""

import cupy as cp

import gaescan

rng = cp.random.default_rng(0)
for B, T in [(256, 131072), (4, 1 << 22), (4096, 256)]:
    r = rng.standard_normal((B, T), dtype=cp.float32)
    v = rng.standard_normal((B, T), dtype=cp.float32)
    d = rng.random((B, T)) < 1e-3
    out = (cp.empty_like(r), cp.empty_like(r))
    for _ in range(2):
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=out, backend="cuda")
    cp.cuda.Device().synchronize()
    print(f"B={B} T={T} done", flush=True)
# time-major
T, B = 8192, 4096
r = rng.standard_normal((T, B), dtype=cp.float32)
v = rng.standard_normal((T, B), dtype=cp.float32)
d = rng.random((T, B)) < 1e-3
for _ in range(2):
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=0, backend="cuda")
cp.cuda.Device().synchronize()
print("time-major done", flush=True)
