"""Out-of-core GAE with Dask (issue 6): throughput and peak worker memory.

Run: ``python benchmarks/dask_bench.py [--log2-t 23] [--batch 64]``.

The input (default B=64, T=2^23 float32: rewards and values 2 GiB each, dones
0.5 GiB; the two outputs another 4 GiB) is generated lazily, block by block,
with ``da.random.RandomState(seed)`` and never exists in one place: it is
larger than the whole cluster's memory limit (2 workers × ``--memory-limit``).
Outputs are written to a sink that discards them (``da.store``), so what is
measured is generate → GAE → drop.  The same pipeline without GAE (generate →
drop) is timed too, for reference (on a shared machine the two are noisy).

Compared with the in-memory ``"numba"`` backend on a size that fits
(``--mem-log2-t``, same B), run in this process on the same two cores, and
with the same NumPy input through the Dask path on the threaded scheduler.
The cluster is also timed on inputs of the in-memory size already persisted
in the workers (GAE alone).  Throughput counts 17 bytes per step (rewards,
values: 4 B; dones: 1 B; advantages, returns: 4 B each).  Peak worker memory is the maximum resident
set size of each worker process, sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time

import dask
import dask.array as da
import numpy as np
import psutil
from distributed import Client, LocalCluster, get_task_stream

import gaescan

BYTES_PER_STEP = 17
GiB = 2.0**30


class Discard:
    """A ``da.store`` target that drops every block (nothing is gathered)."""

    def __setitem__(self, key, value):
        pass


def _rss():
    return psutil.Process().memory_info().rss


class PeakMemory:
    """Samples the RSS of every worker process while the block runs."""

    def __init__(self, client, period=0.2):
        self.client, self.period = client, period
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()

    def _poll(self):
        while not self._stop.is_set():
            try:
                for w, rss in self.client.run(_rss).items():
                    self.peak[w] = max(self.peak.get(w, 0), rss)
            except Exception:  # noqa: BLE001 - a worker restarting mid-sample
                pass
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def inputs(B, T, chunks, seed):
    """Rewards, values and dones of one block come from one random block.

    So the three inputs of a block are born on the same worker (as when one
    record array is read from storage): what is measured is GAE, not the
    scheduler moving independently placed input blocks between workers.
    """
    rs = da.random.RandomState(seed)
    x = rs.random_sample((3, B, T), chunks=(3, *chunks))
    return x[0].astype(np.float32), x[1].astype(np.float32), x[2] < 1e-3


def timed_store(client, arrays):
    """Wall seconds, peak RSS per worker, and worker-seconds spent per activity.

    Activities: computing gaescan's tasks (summaries, carries, final blocks),
    computing anything else (generating the inputs), moving data between
    workers, spilling.
    """
    busy = {"gaescan compute": 0.0, "other compute": 0.0, "transfer": 0.0, "spill": 0.0}
    with PeakMemory(client) as mem, get_task_stream(client) as ts:
        t0 = time.perf_counter()
        da.store(arrays, [Discard() for _ in arrays], lock=False)
        dt = time.perf_counter() - t0
    for task in ts.data:
        key = task["key"]
        name = key[0] if isinstance(key, tuple) else str(key)
        ours = name.startswith(("gae-", "discounted-returns-", "linear-scan-"))
        for ss in task["startstops"]:
            span = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                busy["gaescan compute" if ours else "other compute"] += span
            elif ss["action"] == "transfer":
                busy["transfer"] += span
            else:
                busy["spill"] += span
    return dt, mem.peak, busy


def _median(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def in_memory(B, T, chunks, repeat):
    """Median seconds of the numba backend, and of the Dask path (threads) on the same NumPy input."""
    rng = np.random.default_rng(0)
    r = rng.random((B, T), dtype=np.float32)
    v = rng.random((B, T), dtype=np.float32)
    d = rng.random((B, T)) < 1e-3
    t_numba = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d), repeat)
    R, V, D = (da.from_array(x, chunks=chunks) for x in (r, v, d))

    def run():
        adv, ret = gaescan.gae(R, V, gamma=0.99, lam=0.95, dones=D)
        with dask.config.set(scheduler="threads"):
            da.store([adv, ret], [Discard(), Discard()], lock=False)

    return t_numba, _median(run, max(1, repeat // 2))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--log2-t", type=int, default=23)
    p.add_argument("--chunk-b", type=int, default=32)
    p.add_argument("--log2-chunk-t", type=int, default=19)
    p.add_argument("--mem-log2-t", type=int, default=20, help="in-memory comparison size")
    p.add_argument("--memory-limit", default="2.5GiB", help="per worker")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=2026)
    a = p.parse_args()
    B, T = a.batch, 1 << a.log2_t
    chunks = (a.chunk_b, 1 << a.log2_chunk_t)
    steps = B * T

    print(f"gaescan {gaescan.__version__}, dask {dask.__version__}, {platform.processor() or platform.machine()}, "
          f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / GiB:.0f} GiB RAM")
    print(f"input B={B} T=2^{a.log2_t} float32 (+ bool dones), chunks {chunks}: "
          f"rewards+values+dones {9 * steps / GiB:.1f} GiB, advantages+returns {8 * steps / GiB:.1f} GiB")

    print(f"load average at start: {', '.join(f'{x:.1f}' for x in psutil.getloadavg())} (shared machine)")
    mem_chunks = chunks
    t_mem, t_mem_dask = in_memory(B, 1 << a.mem_log2_t, mem_chunks, a.repeat)
    mem_steps = B * (1 << a.mem_log2_t)
    print(f"in-memory numba, B={B} T=2^{a.mem_log2_t} ({17 * mem_steps / GiB:.2f} GiB moved): "
          f"{t_mem * 1e3:.1f} ms, {BYTES_PER_STEP * mem_steps / t_mem / 1e9:.2f} GB/s, "
          f"{mem_steps / t_mem / 1e6:.0f} Msteps/s")
    print(f"same NumPy input through the Dask path (threaded scheduler, chunks {mem_chunks}): "
          f"{t_mem_dask * 1e3:.1f} ms, {BYTES_PER_STEP * mem_steps / t_mem_dask / 1e9:.2f} GB/s "
          f"({t_mem / t_mem_dask:.2f}x numba)")

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      memory_limit=a.memory_limit, dashboard_address=None) as cluster, Client(cluster) as client:
        print(f"LocalCluster: 2 workers x 1 thread, memory limit {a.memory_limit} each")
        base = client.run(_rss)
        print("worker RSS at start: " + ", ".join(f"{x / GiB:.2f} GiB" for x in base.values()))
        # Warm-up: load the kernels in the workers.
        r, v, d = inputs(B, 1 << 16, (B, 1 << 14), a.seed)
        da.store(list(gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)), [Discard(), Discard()], lock=False)

        # GAE alone on the cluster: inputs of the in-memory size, persisted in the workers first.
        from distributed import wait

        small = client.persist(list(inputs(B, 1 << a.mem_log2_t, chunks, a.seed)))
        wait(small)

        def run_small():
            da.store(list(gaescan.gae(small[0], small[1], gamma=0.99, lam=0.95, dones=small[2])),
                     [Discard(), Discard()], lock=False)

        t_small = _median(run_small, 3)
        small.clear()  # release the persisted inputs

        r, v, d = inputs(B, T, chunks, a.seed)
        t_gen, peak_gen, _ = timed_store(client, [r, v, d])
        adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
        ntasks = len(dict(adv.__dask_graph__()) | dict(ret.__dask_graph__()))
        t_gae, peak_gae, busy = timed_store(client, [adv, ret])

    def peaks(pk):
        return ", ".join(f"{x / GiB:.2f}" for x in pk.values()) + " GiB"

    print(f"cluster, inputs persisted in the workers, B={B} T=2^{a.mem_log2_t}: {t_small * 1e3:.0f} ms, "
          f"{BYTES_PER_STEP * mem_steps / t_small / 1e9:.2f} GB/s ({t_mem / t_small:.2f}x in-memory numba)")
    print(f"out of core, B={B} T=2^{a.log2_t}:")
    print(f"generate only (random inputs -> discard): {t_gen:.1f} s, peak worker RSS {peaks(peak_gen)}")
    print(f"generate + gae (-> discard), {ntasks} tasks: {t_gae:.1f} s, peak worker RSS {peaks(peak_gae)}")
    gbs_all = BYTES_PER_STEP * steps / t_gae / 1e9
    mem_gbs = BYTES_PER_STEP * mem_steps / t_mem / 1e9
    print(f"out-of-core dask gae throughput (end to end, incl. generating the inputs): {gbs_all:.2f} GB/s "
          f"({steps / t_gae / 1e6:.0f} Msteps/s), {gbs_all / mem_gbs:.2f}x in-memory numba; generating "
          f"alone takes {t_gen / t_gae:.0%} of that time")
    print("worker-seconds in the gae run: " + ", ".join(f"{k} {x:.1f} s" for k, x in busy.items()))
    print(f"gaescan's own tasks: {BYTES_PER_STEP * steps / busy['gaescan compute'] / 1e9:.2f} GB/s per busy worker "
          f"(in-memory numba, 2 threads: {mem_gbs:.2f} GB/s)")
    print(f"load average at end: {', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")


if __name__ == "__main__":
    main()
