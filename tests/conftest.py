"""Shared fixtures and helpers for the gaescan test suite.

Backends under test come from ``GAESCAN_TEST_BACKENDS`` (comma list), by
default ``numba,numpy`` -- plus ``cuda`` when ``NUMBA_ENABLE_CUDASIM=1``.  The
``numpy`` backend is run at several chunk sizes (small ones so that short rows
cross many internal chunk boundaries, and the library default).  The CUDA
simulator is very slow, so the ``cuda`` backend is marked ``small``: tests
then pick shapes below ~2000 elements, and it is given only to tests marked
``cudasim`` (those that reach CUDA kernel or host code the CPU backends do not
reach); CI's simulator pass runs ``-m cudasim`` with ``GAESCAN_TEST_BACKENDS=cuda``.

``GAESCAN_TEST_SHARD=i/n`` runs the ``i``-th of ``n`` shares of the selected
tests (CI runs the PTX check as two processes, one per core).

Every test that takes the ``backend`` fixture gets a :class:`Backend` whose
``gae``/``returns``/``scan`` methods call the library with ``backend=<name>``
inside the variant's tunable overrides.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import gaescan.testing as gt  # noqa: E402

# Large enough that every float32 case passes on a correct library, small
# enough that an off-by-one step (a wrong γ, a missed bootstrap) fails.
TOL = {np.dtype(dt): gt.tolerance(dt) for dt in (np.float32, np.float64)}

# Lengths that straddle every chunk size used below (4, 8, default 32) and the
# usual power-of-two block sizes of GPU kernels, plus some primes.
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 32, 33, 61, 63, 64, 65, 127, 128, 129, 257]
SMALL_LENGTHS = [1, 3, 4, 5, 8, 9, 13, 33, 61]
LONG_T = 1 << 17
CUDA_MAX_ELEMS = 2000


@dataclass(frozen=True)
class Backend:
    """One backend configuration under test."""

    name: str
    overrides: dict = field(default_factory=dict)
    small: bool = False  # keep shapes tiny (the CUDA simulator is slow)
    label: str = ""

    @property
    def id(self) -> str:
        return self.label or self.name

    def gae(self, *args, **kw):
        import gaescan

        return gaescan.gae(*args, backend=self.name, **kw)

    def returns(self, *args, **kw):
        import gaescan

        return gaescan.discounted_returns(*args, backend=self.name, **kw)

    def scan(self, *args, **kw):
        import gaescan

        return gaescan.linear_scan(*args, backend=self.name, **kw)

    def lengths(self, full=LENGTHS):
        return [T for T in full if not self.small or T <= 129]

    def batch(self, T, want=5):
        """A batch size that keeps a case within the simulator budget."""
        if not self.small:
            return want
        return max(1, min(want, CUDA_MAX_ELEMS // max(T, 1)))


def _cudasim() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def selected_backend_names() -> list[str]:
    env = os.environ.get("GAESCAN_TEST_BACKENDS", "").strip()
    if env:
        return [b.strip() for b in env.split(",") if b.strip()]
    return ["numba", "numpy", "cuda"] if _cudasim() else ["numba", "numpy"]


def _variants(name: str) -> list[Backend]:
    if name == "numpy":
        return [
            Backend("numpy", {"numpy_chunk": 4, "numpy_block_elems": 64}, label="numpy-c4"),
            Backend("numpy", {"numpy_chunk": 8}, label="numpy-c8"),
            Backend("numpy", {}, label="numpy"),
        ]
    if name == "cuda":
        return [Backend("cuda", {}, small=True)]
    return [Backend(name)]


def all_backends() -> list[Backend]:
    return [v for n in selected_backend_names() for v in _variants(n)]


def pytest_configure(config):
    # The CUDA simulator runs each block's threads as Python threads that hand the
    # GIL to one another at every barrier; on more than one CPU each hand-off
    # crosses cores, which makes the simulator several times slower.  One CPU
    # keeps the hand-offs on one core.
    if _cudasim() and hasattr(os, "sched_setaffinity"):
        cpus = os.sched_getaffinity(0)
        if len(cpus) > 1:
            os.sched_setaffinity(0, {min(cpus)})


def _shard() -> tuple[int, int] | None:
    spec = os.environ.get("GAESCAN_TEST_SHARD", "").strip()
    if not spec:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    if m is None or not int(m[1]) < int(m[2]):
        raise pytest.UsageError(f"GAESCAN_TEST_SHARD={spec!r}: expected 'i/n' with 0 <= i < n, "
                                "e.g. GAESCAN_TEST_SHARD=0/2 and GAESCAN_TEST_SHARD=1/2 for two processes")
    return int(m[1]), int(m[2])


def pytest_collection_modifyitems(config, items):
    # GAESCAN_TEST_SHARD=i/n keeps every n-th group of tests, from the i-th.  A group
    # is a test id without its CUDA compute capability (``sm_80``, ``sm_90``): the
    # PTX tests of one kernel for both CCs share its lowering, so they stay together.
    shard = _shard()
    if shard is None:
        return
    i, n = shard
    groups: dict[str, int] = {}
    keep, drop = [], []
    for item in items:
        g = groups.setdefault(re.sub(r"-?sm_\d+", "", item.nodeid), len(groups))
        (keep if g % n == i else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# From a cold Numba cache, compiling the kernels takes most of a full run, on
# one core.  A run of many tests therefore starts a second process that compiles
# every CPU kernel build into the same disk cache meanwhile, last build first
# (the tests reach the V-trace, turn-level and statistics kernels late), at a
# lower priority than the tests; a test whose kernels it has compiled loads them
# from the cache.  The results do not depend on it (the same builds either way);
# GAESCAN_TEST_WARMUP=0 turns it off.  Not under the CUDA simulator, whose pass
# follows a run that filled the cache.
_WARM_MIN_TESTS = 2000
_WARM = """
import os
os.nice(10)
from gaescan.kernels import cpu
for k, dt, serial, narrow in reversed(list(cpu.builds())):
    k.compile(dt, serial, narrow)
"""
_warm_process: list = []


def pytest_collection_finish(session):
    if (len(session.items) < _WARM_MIN_TESTS or _cudasim()
            or os.environ.get("GAESCAN_TEST_WARMUP", "1") == "0" or not hasattr(os, "nice")):
        return
    _warm_process.append(subprocess.Popen([sys.executable, "-c", _WARM], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))


def pytest_sessionfinish(session):
    for proc in _warm_process:
        proc.kill()
        proc.wait()
    _warm_process.clear()


def pytest_generate_tests(metafunc):
    # ``backend``: every selected configuration, the simulator's only for tests
    # marked ``cudasim``; ``cpu_backend``: only those that can afford 2^17-step
    # rows and hypothesis runs (not the simulator).
    if "backend" in metafunc.fixturenames and not _parametrized_directly(metafunc, "backend"):
        sim = metafunc.definition.get_closest_marker("cudasim") is not None
        bs = [b for b in all_backends() if sim or not b.small]
        metafunc.parametrize("backend", bs, ids=[b.id for b in bs], indirect=True)
    if "cpu_backend" in metafunc.fixturenames:
        bs = [b for b in all_backends() if not b.small]
        metafunc.parametrize("cpu_backend", bs, ids=[b.id for b in bs], indirect=True)


def _parametrized_directly(metafunc, name: str) -> bool:
    """Whether the test's own ``parametrize`` marks give ``name`` its values."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def _enter(request):
    import gaescan._config as cfg

    b: Backend = request.param
    with cfg.override(**b.overrides):
        yield b


@pytest.fixture
def backend(request):
    yield from _enter(request)


@pytest.fixture
def cpu_backend(request):
    yield from _enter(request)


@pytest.fixture
def rng(request):
    """A generator seeded from the test id: reproducible, different per case."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# ----------------------------------------------------------------- assertions


@contextlib.contextmanager
def cuda_settings(settings: dict):
    """CUDA tunables and test hooks given in one dict: a key of the CUDA
    backend's ``TEST_HOOKS`` sets a hook, any other key a tunable."""
    from gaescan.backends import cuda as cb

    hooks = {k: x for k, x in settings.items() if k in cb.TEST_HOOKS}
    with cb.override(**{k: x for k, x in settings.items() if k not in hooks}), cb.test_hooks(**hooks):
        yield


def one_thread_and_all(f):
    """``(f() on Numba's threads, f() on one thread)``: results that must not
    depend on the thread count."""
    import numba

    many = f()
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = f()
    finally:
        numba.set_num_threads(n)
    return many, one


def run_in_threads(work, n: int = 8) -> list:
    """Run ``work(k)`` for ``k`` in ``range(n)`` on ``n`` threads that start
    together (a barrier); the exceptions they raised, in no order."""
    errors: list = []
    barrier = threading.Barrier(n)

    def run(k):
        try:
            barrier.wait()
            work(k)
        except BaseException as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def assert_close(actual, expected, dtype, *, shape=None):
    """``actual`` is a NumPy array of ``dtype`` close to the float64 ``expected``."""
    dtype = np.dtype(dtype)
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    assert actual.shape == (expected.shape if shape is None else shape), (actual.shape, expected.shape)
    gt.assert_close(actual, expected, dtype=dtype)


def assert_zero_where(arr, keep):
    """Outputs at masked positions (``keep`` false) are exactly +0.0 or -0.0."""
    keep = np.asarray(keep) != 0
    masked = np.asarray(arr)[~keep]
    assert np.all(masked == 0.0), masked[masked != 0.0][:10]


# ------------------------------------------------------------------ generators


def random_data(rng, shape, dtype=np.float32, scale=1.0):
    x = rng.standard_normal(shape) * scale
    if np.dtype(dtype).kind in "iu":
        return np.round(x * 3).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return x > 0
    return x.astype(dtype)


def random_flags(rng, shape, p=0.1, dtype=bool):
    f = rng.random(shape) < p
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        # nonzero means true: use odd nonzero values, not only 1.0
        return np.where(f, rng.choice([1.0, 0.5, -2.0], size=shape), 0.0).astype(dtype)
    return f.astype(dtype)


def random_cu_seqlens(rng, n, n_segments, empty_p=0.2):
    """Sorted offsets [0, ..., n] with ``n_segments`` segments, some empty."""
    if n_segments == 0:
        assert n == 0, "zero segments can only cover zero elements"
        return np.array([0], dtype=np.int64)
    cuts = np.sort(rng.integers(0, n + 1, size=n_segments - 1))
    if n_segments > 1:
        empty = rng.random(n_segments - 1) < empty_p
        cuts[empty] = cuts[np.maximum(np.arange(n_segments - 1) - 1, 0)][empty]
        cuts = np.sort(cuts)
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


FLAG_MODES = ["none", "dones", "terminated", "term+trunc", "trunc-only"]


def flag_kwargs(mode, rng, shape, values, p=0.15, dtype=bool):
    """Keyword arguments for ``gae`` for one flag mode (incl. next_values when needed)."""
    if mode == "none":
        return {}
    if mode == "dones":
        return {"dones": random_flags(rng, shape, p, dtype)}
    if mode == "terminated":
        return {"terminated": random_flags(rng, shape, p, dtype)}
    nv = random_data(rng, shape, values.dtype if values.dtype.kind == "f" else np.float32)
    if mode == "term+trunc":
        return {
            "terminated": random_flags(rng, shape, p / 2, dtype),
            "truncated": random_flags(rng, shape, p / 2, dtype),
            "next_values": nv,
        }
    if mode == "trunc-only":
        return {"truncated": random_flags(rng, shape, p, dtype), "next_values": nv}
    raise AssertionError(mode)


def snapshot(kw: dict) -> dict:
    """Copies of every array argument, to check that inputs are never modified."""
    return {k: np.array(v, copy=True) for k, v in kw.items() if isinstance(v, np.ndarray)}


def assert_unchanged(kw: dict, snap: dict):
    for k, before in snap.items():
        now = kw[k]
        assert now.dtype == before.dtype, k
        np.testing.assert_array_equal(now, before, err_msg=f"input {k!r} was modified", strict=True)


def aligned_rows_out(R, T, row_items, offset):
    """Two float32 ``(R, T)`` views, NaN-filled, whose rows are ``row_items``
    apart, each row's step 0 ``offset`` items past a 64-byte boundary."""
    outs = []
    for _ in range(2):
        buf = np.full(R * row_items + 64, np.nan, np.float32)
        skip = (-buf.__array_interface__["data"][0] % 64) // 4 + offset
        outs.append(buf[skip:skip + R * row_items].reshape(R, row_items)[:, :T])
    return outs
