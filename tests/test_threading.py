"""Thread- and fork-safety of the Numba CPU kernels under every threading layer.

Each case runs in a subprocess with ``NUMBA_THREADING_LAYER`` set, so that a
layer that terminates the process or a fork that hangs fails the test (exit
status, timeout) instead of killing or hanging the suite.  A layer that does
not load on this machine is skipped (the child reports it).  Shapes are above
``SERIAL_MAX_STEPS`` so that the parallel kernels run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LAYERS = ["omp", "workqueue", "tbb"]

_PRELUDE = textwrap.dedent("""
    import sys
    import numpy as np
    import numba
    from numba.np.ufunc import parallel
    try:
        parallel._launch_threads()
    except (ValueError, ImportError) as exc:
        print("UNAVAILABLE", exc)
        sys.exit(0)
    import gaescan
    from gaescan.backends import numba_cpu

    rng = np.random.default_rng(0)
    R, T = 16, 4096
    assert R * T > numba_cpu.SERIAL_MAX_STEPS
    r = rng.standard_normal((R, T)).astype(np.float32)
    v = rng.standard_normal((R, T)).astype(np.float32)
    d = rng.random((R, T)) < 0.01
    g = (0.9 + 0.1 * rng.random((R, T))).astype(np.float32)
    rT, vT, dT = (np.ascontiguousarray(x.T) for x in (r, v, d))

    def calls():
        # one call per parallel kernel family: fused batch-major, fused
        # time-major, general rows, returns, scan
        return [
            gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")[0],
            gaescan.gae(rT, vT, gamma=0.99, lam=0.95, dones=dT, axis=0, backend="numba")[0],
            gaescan.gae(r, v, gamma=g, lam=0.95, dones=d, backend="numba")[0],
            gaescan.discounted_returns(r, gamma=0.99, dones=d, backend="numba"),
            gaescan.linear_scan(g, r, backend="numba"),
        ]
""")

_THREADS = _PRELUDE + textwrap.dedent("""
    import threading
    ref = calls()
    assert numba.threading_layer() == sys.argv[1], numba.threading_layer()
    errors = []
    barrier = threading.Barrier(8)

    def work(k):
        try:
            barrier.wait()
            for _ in range(3):
                for a, b in zip(calls(), ref):
                    if not np.array_equal(a, b):
                        errors.append(k)
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("ERRORS", errors)
    print("OK" if not errors else "FAIL")
""")

# The very first gaescan calls come from 8 threads at once (no call on the
# main thread before): the layer must be known before any parallel build runs.
_THREADS_FIRST = _PRELUDE + textwrap.dedent("""
    import threading
    results = {}
    barrier = threading.Barrier(8)

    def work(k):
        barrier.wait()
        results[k] = calls()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert numba.threading_layer() == sys.argv[1], numba.threading_layer()
    ref = calls()
    ok = len(results) == 8 and all(np.array_equal(a, b) for res in results.values() for a, b in zip(res, ref))
    print("OK" if ok else "FAIL")
""")

_FORK = _PRELUDE + textwrap.dedent("""
    import multiprocessing as mp

    def child(_):
        return [a.tobytes() for a in calls()]

    ref = [a.tobytes() for a in calls()]
    assert numba.threading_layer() == sys.argv[1], numba.threading_layer()
    with mp.get_context("fork").Pool(2) as pool:
        res = pool.map_async(child, range(2)).get(timeout=120)
    print("OK" if all(x == ref for x in res) else "FAIL")
""")


def _run(script: str, layer: str) -> str:
    env = {**os.environ, "NUMBA_THREADING_LAYER": layer}
    try:
        p = subprocess.run([sys.executable, "-c", script, layer], env=env, capture_output=True, text=True,
                           timeout=600)
    except subprocess.TimeoutExpired as exc:  # a hang is a failure, not a stuck suite
        pytest.fail(f"layer {layer}: timed out\n{exc.stdout}\n{exc.stderr}")
    if "UNAVAILABLE" in p.stdout:
        pytest.skip(f"threading layer {layer} does not load here: {p.stdout.strip()}")
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), (
        f"layer {layer}: exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}")
    return p.stdout


@pytest.mark.parametrize("layer", LAYERS)
def test_threads_call_parallel_kernels_concurrently(layer):
    """8 threads call every parallel kernel family at once; every result
    equals the single-thread result bit for bit."""
    _run(_THREADS, layer)


@pytest.mark.parametrize("layer", LAYERS)
def test_first_calls_from_threads(layer):
    """The first calls of the process come from 8 threads at once."""
    _run(_THREADS_FIRST, layer)


@pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")
@pytest.mark.parametrize("layer", LAYERS)
def test_fork_pool_after_a_parallel_call(layer):
    """A fork pool started after parallel kernels ran returns, and its
    workers' kernels give the parent's results."""
    _run(_FORK, layer)


def test_serial_here_follows_the_layer(monkeypatch):
    from gaescan import _threading

    monkeypatch.setattr(_threading, "_serial_all", False)
    monkeypatch.setattr(_threading, "_serial_off_main", True)
    assert not _threading.serial_here()  # the main thread keeps the pool
    seen = []
    import threading

    t = threading.Thread(target=lambda: seen.append(_threading.serial_here()))
    t.start()
    t.join()
    assert seen == [True]
    monkeypatch.setattr(_threading, "_serial_all", True)
    assert _threading.serial_here()


def test_safety_sentences():
    from gaescan import _threading

    assert _threading.safety("tbb") == "thread-safe and fork-safe"
    assert "not thread-safe" in _threading.safety("workqueue")
    assert _threading.safety("omp").startswith("thread-safe")
    assert "not started" in _threading.safety(None)


# Every batch-major path on lengths around powers of two and primes, in
# shapes above and below SERIAL_MAX_STEPS: a digest of every output's bits.
_BITS = textwrap.dedent("""
    import hashlib
    import sys
    import numpy as np
    import numba
    import gaescan

    assert numba.get_num_threads() == int(sys.argv[1]), numba.get_num_threads()
    L = 128
    digest = hashlib.sha256()
    rng = np.random.default_rng(0)
    for R, T in ((16, 4096 + 3 * L + 1), (64, 1031), (5, 2 * L + 1)):
        for dtype in (np.float32, np.float64):
            r = rng.standard_normal((R, T)).astype(dtype)
            v = rng.standard_normal((R, T)).astype(dtype)
            nv = rng.standard_normal((R, T)).astype(dtype)
            d = rng.random((R, T)) < 0.01
            tr = rng.random((R, T)) < 0.01
            m = rng.random((R, T)) < 0.8
            g = rng.uniform(0.9, 1.0, (R, T)).astype(dtype)
            N = R * T
            cu = np.unique(np.concatenate([[0, N], rng.integers(0, N, 2 * R)]))
            outs = [
                *gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d),
                *gaescan.gae(r, v, gamma=0.999, lam=0.95),
                *gaescan.gae(r, v, gamma=0.99, lam=0.95, mask=m, dones=d),
                *gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=d, truncated=tr),
                *gaescan.gae(r, v, gamma=g, lam=0.95, dones=d, mask=m),
                *gaescan.gae(r.reshape(-1), v.reshape(-1), gamma=0.99, lam=0.95, cu_seqlens=cu),
                gaescan.discounted_returns(r, gamma=0.99, dones=d),
                gaescan.discounted_returns(r.reshape(-1), gamma=0.99, cu_seqlens=cu),
                gaescan.linear_scan(g, r),
                gaescan.linear_scan(g, r, reverse=True),
            ]
            for x in outs:
                digest.update(np.ascontiguousarray(x).tobytes())
    print(digest.hexdigest())
""")


def test_bits_do_not_depend_on_the_thread_count():
    """``NUMBA_NUM_THREADS=1`` and ``=2`` give the same bits on every
    batch-major path (rows are independent; no split depends on threads)."""
    digests = []
    for n in (1, 2):
        env = {**os.environ, "NUMBA_NUM_THREADS": str(n)}
        p = subprocess.run([sys.executable, "-c", _BITS, str(n)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        digests.append(p.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]
