"""A prepared check of the CUDA backend on a real GPU: correctness, then speed.

Run ``python -m gaescan.bench.gpu_check`` on a machine with a CUDA GPU, CuPy,
numba-cuda (and optionally PyTorch).  It

1. checks ``gaescan.gae``, ``discounted_returns``, ``linear_scan``,
   ``vtrace`` and ``turn_gae`` with ``backend="cuda"`` against :mod:`gaescan.testing`'s float64 loops (compiled
   here with Numba's ``njit``), a table of cases run by one loop
   (:func:`correctness_cases`), over the three shape regimes, dtypes,
   flags, masks, ``cu_seqlens``, layouts, CuPy and PyTorch inputs, ``out=``,
   bit-identical repeats, non-default streams and the absence of host syncs;
2. times gaescan, ``vtrace`` and ``turn_gae`` with CUDA events two ways, the
   kernel alone (back-to-back calls queued behind a spin kernel, no host time
   inside the span) and end to end (one call at a time, host included), plus
   the host's time per call, against a device-to-device copy of the same bytes
   (the roofline), the serial loop on CuPy and the published chunk-scan on CuPy.

Every check is wrapped: a failure prints ``FAIL`` with the error and the run
goes on; the exit status is non-zero if anything failed.  The whole run is
sized for a few minutes on an H200 (the first calls compile the kernels).
Options: ``--quick`` (small shapes only), ``--no-bench``, ``--no-check``,
``--budget SECONDS`` (benchmarks still pending past it are skipped),
``--check-budget SECONDS`` (the same for correctness checks).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

RESULTS: list[tuple[str, str, str]] = []  # (status, name, detail)
T0 = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - T0


CHECK_BUDGET = [170.0]  # seconds after which the remaining correctness checks are skipped
HANG_SECONDS = [60.0]  # one check or sweep setting running longer than this is taken as a hang


@contextlib.contextmanager
def watchdog(name: str) -> Any:
    """End the process (exit status 3) if the body runs past :data:`HANG_SECONDS`.

    A kernel that never finishes (a look-back waiting for a tile that never
    publishes) blocks the host in a synchronisation that Python cannot
    interrupt; ending the process frees the GPU for the next stage of a run.
    """
    def hang() -> None:
        print(f"HANG  {name}: still running after {HANG_SECONDS[0]:.0f}s; ending the process", flush=True)
        os._exit(3)

    timer = threading.Timer(HANG_SECONDS[0], hang)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def check(name: str, fn: Callable[[], str | None]) -> None:
    if _elapsed() > CHECK_BUDGET[0]:
        RESULTS.append(("SKIP", name, "time budget"))
        print(f"SKIP  {name} (past the {CHECK_BUDGET[0]:.0f}s correctness budget)", flush=True)
        return
    t = time.perf_counter()
    try:
        with watchdog(name):
            detail = fn() or ""
        status = "PASS"
    except Exception as exc:  # noqa: BLE001 - report and continue
        status = "FAIL"
        tb = traceback.format_exc(limit=6).strip().splitlines()
        detail = f"{type(exc).__name__}: {exc}"
        print("      " + "\n      ".join(tb[-8:]))
    dt = time.perf_counter() - t
    RESULTS.append((status, name, detail))
    print(f"{status}  {name:<58s} {dt:6.2f}s  {detail}", flush=True)


# --------------------------------------------------------------------------- float64 references


def _h(x: Any) -> np.ndarray:
    """Host copy of a CuPy array, a torch tensor or a NumPy array (for bit comparisons)."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get"):
        x = x.get()
    return np.asarray(x)


def _compiled_references() -> None:
    """gaescan.testing's row loops compiled by Numba: the checks' rows run to millions of steps."""
    from numba import njit

    from .. import testing

    testing._compile_row_loops(njit)


def compare(got: Any, want: np.ndarray, out_dtype: Any, mask: Any = None) -> str:
    """``got`` has ``out_dtype``, zeros where ``mask`` is false, and is within the contract's tolerance of ``want``."""
    from .. import testing

    if mask is not None and np.any(_h(got)[_h(mask) == 0] != 0):
        raise AssertionError("non-zero output at a masked position")
    return f"rel.err {testing.assert_close(got, want, dtype=out_dtype):.1e}"


def _both(res: Any, want: Any, out_dtype: Any, mask: Any = None) -> str:
    """:func:`compare` of ``(advantages, returns)``."""
    return compare(res[0], want[0], out_dtype, mask) + " / " + compare(res[1], want[1], out_dtype, mask)


# --------------------------------------------------------------------------- correctness
# Every check is a row of a table: a name, a function of an :class:`Env` and
# keyword arguments, the arguments (built when the check runs, so that its data
# is made inside its time budget) and the CUDA tunables it runs under.


@dataclasses.dataclass
class Env:
    """What the checks share: the libraries, one random stream, the size of the long rows."""

    cp: Any
    gaescan: Any
    torch: Any
    rng: np.random.Generator
    n_long: int

    @property
    def testing(self) -> Any:
        from .. import testing

        return testing

    def normal(self, shape: Any, dtype: Any = np.float32) -> Any:
        return self.cp.asarray(self.rng.standard_normal(shape).astype(dtype))

    def uniform(self, lo: float, hi: float, shape: Any) -> Any:
        return self.cp.asarray(self.rng.uniform(lo, hi, shape).astype(np.float32))

    def flags(self, p: float, shape: Any) -> Any:
        return self.cp.asarray(self.rng.random(shape) < p)

    def data(self, shape: Any, dtype: Any = np.float32, p_done: float = 0.01) -> tuple[Any, Any, Any]:
        return self.normal(shape, dtype), self.normal(shape, dtype), self.flags(p_done, shape)


@dataclasses.dataclass(frozen=True)
class CheckCase:
    """One correctness check: ``fn(env, **kwargs(env))`` under the CUDA tunables ``tun``."""

    name: str
    fn: Callable[..., str | None]
    kwargs: Callable[[Env], dict] | None = None
    tun: dict = dataclasses.field(default_factory=dict)
    needs_torch: bool = False
    needs_dask: bool = False
    #: A check of a variant the defaults do not take (``tun`` set, or an A/B of variants):
    #: run after the default path's checks and timings (see :func:`main`).
    experimental: bool = False

    def __post_init__(self) -> None:
        if self.tun:
            object.__setattr__(self, "experimental", True)

    def run(self, env: Env) -> str | None:
        from gaescan.backends import cuda as cb

        with cb.override(**self.tun):
            return self.fn(env, **(self.kwargs(env) if self.kwargs is not None else {}))


def _out_dtype(dtype: Any) -> Any:
    return np.float64 if dtype == np.float64 else np.float32


def gae_check(env: Env, shape: tuple, dtype: Any = np.float32, axis: int = -1, p_done: float = 0.01,
              repeat: bool = False, **kw: Any) -> str:
    """``gae`` on random data with ``dones`` (and ``kw``) against the reference; optionally run twice."""
    r, v, d = env.data(shape, dtype, p_done)
    args = dict(gamma=0.99, lam=0.95, dones=d, axis=axis, backend="cuda")
    args.update(kw)
    res = env.gaescan.gae(r, v, **args)
    msg = ""
    if repeat:
        res2 = env.gaescan.gae(r, v, **args)
        env.cp.cuda.get_current_stream().synchronize()
        if not (_h(res[0]).tobytes() == _h(res2[0]).tobytes() and _h(res[1]).tobytes() == _h(res2[1]).tobytes()):
            raise AssertionError("repeat run is not bit-identical")
        msg = "bit-identical repeat; "
    return msg + _both(res, env.testing.gae(r, v, **args), _out_dtype(dtype), kw.get("mask"))


def packed_kw(env: Env, dtype: Any = np.float32, repeat: bool = False, cu_dtype: Any = np.int64) -> dict:
    """:func:`gae_check` arguments of 300 packed segments (empty, one-step and a giant one), mask, lv[S], la[S]."""
    lens = env.rng.geometric(1 / 3000, size=300)
    lens[::17] = 0
    lens[5] = 1
    lens[100] = 400_000
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(cu_dtype)
    N = int(cu[-1])
    return dict(shape=(N,), dtype=dtype, cu_seqlens=env.cp.asarray(cu), repeat=repeat, mask=env.flags(0.9, N),
                last_value=env.normal(len(lens), dtype), last_advantage=env.normal(len(lens), dtype))


def tt_check(env: Env, dtype: Any, shape: tuple) -> str:
    """``gae`` with ``terminated``, uint8 ``truncated`` and ``next_values``."""
    r, v, _ = env.data(shape, dtype)
    nv = env.normal(shape, dtype)
    term = env.flags(0.005, shape)
    trunc = env.cp.asarray((env.rng.random(shape) < 0.005).astype(np.uint8))
    kw = dict(gamma=0.99, lam=0.9, next_values=nv, terminated=term, truncated=trunc)
    return _both(env.gaescan.gae(r, v, backend="cuda", **kw), env.testing.gae(r, v, **kw), _out_dtype(dtype))


def walks_check(env: Env) -> str:
    """Look-back under real concurrency: long walks (every 16th tile publishes) and the block-per-row driver."""
    from gaescan.backends import cuda as cb

    r, v, d = env.data((4, 2**20))
    base = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    with cb.test_hooks(unpublished_tiles=True):
        walk = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    with cb.override(rows_min_blocks=1):
        rows_ = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    if _h(base[0]).tobytes() != _h(walk[0]).tobytes():
        raise AssertionError("long look-back walks changed the bits")
    ea = env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d).advantages
    return ("long walks bit-identical; " + compare(walk[0], ea, np.float32) + "; block-per-row "
            + compare(rows_[0], ea, np.float32))


def nan_iso_check(env: Env) -> str:
    """A NaN after a done stays in its episode."""
    cp = env.cp
    r, v, _ = env.data((4, 100000))
    d = cp.zeros((4, 100000), dtype=cp.bool_)
    d[:, 49999] = True
    r[:, 70000] = cp.nan
    adv, _ = env.gaescan.gae(r, v, gamma=1.0, lam=1.0, dones=d, backend="cuda")
    if not np.all(np.isfinite(_h(adv)[:, :50000])):
        raise AssertionError("a NaN crossed a done")
    return "NaN stayed in its episode"


def outs_check(env: Env) -> str:
    """``out=`` arrays are written and returned."""
    cp = env.cp
    r, v, d = env.data((256, 3000))
    a0 = cp.empty((256, 3000), cp.float32)
    r0 = cp.empty((256, 3000), cp.float32)
    res = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0), backend="cuda")
    if res[0] is not a0 or res[1] is not r0:
        raise AssertionError("out= arrays not returned")
    return _both((a0, r0), env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d), np.float32)


def rets_check(env: Env, shape: tuple | None, axis: int = -1, packed: bool = False) -> str:
    """``discounted_returns`` with dones, or packed with a mask and lv[S]."""
    if not packed:
        r, _, d = env.data(shape, p_done=0.003)
        kw = dict(gamma=0.97, dones=d, axis=axis)
    else:
        lens = env.rng.geometric(1 / 2000, size=200)
        lens[::9] = 0
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        r, _, d = env.data((int(cu[-1]),), p_done=0.003)
        kw = dict(gamma=0.97, dones=d, cu_seqlens=env.cp.asarray(cu), last_value=env.normal(200),
                  mask=env.flags(0.8, int(cu[-1])))
    G = env.gaescan.discounted_returns(r, backend="cuda", **kw)
    return compare(G, env.testing.discounted_returns(r, **kw), np.float32, kw.get("mask"))


def scans_check(env: Env, shape: tuple, reverse: bool, axis: int = -1, a_arr: bool = False) -> str:
    """``linear_scan`` with a per-step or scalar ``a`` and a per-row ``initial``."""
    b = env.normal(shape)
    a = env.uniform(0.5, 1.0, shape) if a_arr else 0.999
    init = env.normal(tuple(n for i, n in enumerate(shape) if i != axis % len(shape)))
    kw = dict(reverse=reverse, initial=init, axis=axis)
    y = env.gaescan.linear_scan(a, b, backend="cuda", **kw)
    return compare(y, env.testing.linear_scan(a, b, **kw), np.float32)


def torch_case_check(env: Env) -> str:
    """CUDA tensors in, CUDA tensors out."""
    torch = env.torch
    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.randn(64, 30000, device="cuda", generator=g)
    v = torch.randn(64, 30000, device="cuda", generator=g)
    d = torch.rand(64, 30000, device="cuda", generator=g) < 0.01
    res = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    if not isinstance(res[0], torch.Tensor) or res[0].device.type != "cuda":
        raise AssertionError(f"expected a CUDA tensor back, got {type(res[0])}")
    return _both(res, env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d), np.float32)


def nccl_one_rank_check(env: Env) -> str:
    """gaescan.distributed on a one-GPU NCCL group: the exchange runs on the device."""
    import tempfile

    torch = env.torch
    import torch.distributed as dist

    import gaescan.distributed as gd

    if not dist.is_nccl_available():
        raise AssertionError("this PyTorch build has no NCCL")
    own = not dist.is_initialized()
    if own:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"file://{tempfile.mkstemp()[1]}", rank=0, world_size=1)
    try:
        g = torch.Generator(device="cuda").manual_seed(1)
        r = torch.randn(16, 50000, device="cuda", generator=g)
        v = torch.randn(16, 50000, device="cuda", generator=g)
        m = torch.rand(16, 50000, device="cuda", generator=g) < 0.9
        res = gd.gae(r, v, gamma=0.99, lam=0.95, mask=m)
        y = gd.whiten(res[0], m)
        if res[0].device.type != "cuda" or y.device.type != "cuda":
            raise AssertionError("expected CUDA tensors back")
        want = env.testing.gae(r, v, gamma=0.99, lam=0.95, mask=m)
        return (_both(res, want, np.float32) + " / whiten "
                + compare(y, env.testing.whiten(want[0], m.cpu().numpy()), np.float32))
    finally:
        if own:
            dist.destroy_process_group()


def torch_stream_check(env: Env) -> str:
    """A call on a non-default torch stream."""
    torch = env.torch
    s = torch.cuda.Stream()
    r = torch.randn(8, 2**20, device="cuda")
    v = torch.randn(8, 2**20, device="cuda")
    d = torch.rand(8, 2**20, device="cuda") < 0.001
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(s):
        adv, _ = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    s.synchronize()
    return compare(adv, env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d).advantages, np.float32)


def _torch_packed(env: Env, S: int) -> tuple:
    """``S`` packed sequences on the GPU: int32 offsets (as torch code has them), r, V, dones."""
    torch = env.torch
    lens = env.rng.geometric(1 / 3000, size=S)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    N = int(lens.sum())
    return (cu, torch.randn(N, device="cuda"), torch.randn(N, device="cuda"),
            torch.rand(N, device="cuda") < 0.001)


def _packed_err(env: Env, cu: Any, r: Any, v: Any, d: Any, adv: Any, ret: Any) -> str:
    return _both((adv, ret), env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d, cu_seqlens=cu), np.float32)


def torch_stream_prep_check(env: Env) -> str:
    """int32 offsets are copied to int64 and the outputs allocated on the caller's stream.

    Otherwise the kernel (on torch's non-blocking side stream) could read the
    offsets before the copy has run.  CuPy's default stream is kept busy
    meanwhile, so work queued there would land late.
    """
    torch, cp = env.torch, env.cp
    cu, r, v, d = _torch_packed(env, 400)
    big = cp.ones(2**28, dtype=cp.float32)  # 1 GiB
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with cp.cuda.Stream.null:
        for _ in range(60):  # ~60 x 0.5 ms queued on CuPy's default stream
            big *= 1.0000001
    with torch.cuda.stream(s):
        adv, ret = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, cu_seqlens=cu, backend="cuda")
        adv, ret = adv.clone(), ret.clone()  # on s: what the kernel wrote, before anything else
    s.synchronize()
    torch.cuda.synchronize()
    del big
    return _packed_err(env, cu, r, v, d, adv, ret)


def torch_time_major_check(env: Env) -> str:
    torch = env.torch
    r = torch.randn(3000, 256, device="cuda", dtype=torch.float64)
    v = torch.randn(3000, 256, device="cuda", dtype=torch.float64)
    d = torch.rand(3000, 256, device="cuda") < 0.01
    adv, _ = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=0, backend="cuda")
    return compare(adv, env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=0).advantages, np.float64)


def cupy_stream_check(env: Env) -> str:
    """A call on a non-blocking CuPy stream."""
    cp = env.cp
    r, v, d = env.data((8, 2**20), p_done=0.001)
    cp.cuda.get_current_stream().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        adv, _ = env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
    s.synchronize()
    return compare(adv, env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d).advantages, np.float32)


def no_host_sync_check(env: Env) -> str:
    """The call returns while its stream is still busy with earlier work."""
    r, v, d = env.data((4, 2**22))
    return _returns_while_busy(env, lambda: env.gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda"))


def _returns_while_busy(env: Env, call: Callable[[], Any]) -> str:
    """``call()`` returns while its stream still runs earlier work, in a fraction of that work's time."""
    cp = env.cp
    call()  # warm (compiled)
    big = cp.ones(2**28, dtype=cp.float32)  # 1 GiB
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with s:
        ev0 = cp.cuda.Event()
        ev0.record()
        for _ in range(60):  # ~60 x 0.5 ms of queued work
            big *= 1.0000001
        t = time.perf_counter()
        call()
        host_ms = (time.perf_counter() - t) * 1e3
        pending = not s.done
        ev1 = cp.cuda.Event()
        ev1.record()
    ev1.synchronize()
    queued_ms = cp.cuda.get_elapsed_time(ev0, ev1)
    del big
    if not pending:
        raise AssertionError(f"stream already idle when the call returned (call took {host_ms:.2f} ms "
                             f"host time, queued work {queued_ms:.1f} ms): a host sync?")
    if host_ms > 0.5 * queued_ms:
        raise AssertionError(f"call took {host_ms:.2f} ms host time behind {queued_ms:.1f} ms of queued work")
    return f"call returned after {host_ms:.2f} ms with {queued_ms:.1f} ms of work queued; stream still busy"


# group_normalize, whiten and moments: the CUDA statistics kernels (backends/stats_cuda.py).

def group_check(env: Env, B: int, size: int, leave_one_out: bool = False, scale: bool = True,
                dtype: Any = np.float32) -> str:
    """``group_normalize`` over shuffled labels (unequal groups and a single-member one) and
    over ``group_size``, against the reference."""
    labels = env.rng.permutation(np.repeat(np.arange(B // size), size))
    labels[:size // 2] = B  # half a group relabelled: one group of size // 2 ...
    labels[size // 2] = B + 7  # ... and a single-member group
    scores = env.normal(B, dtype)
    kw = dict(leave_one_out=leave_one_out, scale=scale)
    lab = env.cp.asarray(labels)
    got = env.gaescan.group_normalize(scores, groups=lab, backend="cuda", **kw)
    msg = "labels " + compare(got, env.testing.group_normalize(scores, groups=lab, **kw), dtype)
    got = env.gaescan.group_normalize(scores, group_size=size, backend="cuda", **kw)
    return msg + " / group_size " + compare(got, env.testing.group_normalize(scores, group_size=size, **kw), dtype)


def whiten_check(env: Env, shape: tuple, dtype: Any = np.float32, shift_mean: bool = True) -> str:
    """``whiten`` with a mask on ``x = 1e4 + N(0, 1)`` (E[x²] − E[x]² would cancel), and ``moments``."""
    x = env.normal(shape, dtype) + dtype(1e4)
    m = env.flags(0.8, shape)
    y = env.gaescan.whiten(x, m, shift_mean=shift_mean, backend="cuda")
    msg = compare(y, env.testing.whiten(x, m, shift_mean=shift_mean), dtype, m)
    got, want = env.gaescan.moments(x, m, backend="cuda"), env.testing.moments(x, m)
    for name in ("count", "mean", "m2"):
        g, w = float(getattr(got, name)), float(getattr(want, name))
        if abs(g - w) > 1e-9 * max(abs(w), 1.0):
            raise AssertionError(f"moments.{name} {g!r} != {w!r}")
    return msg + " / moments exact to 1e-9"


def stats_no_sync_check(env: Env) -> str:
    """``group_normalize`` (labels) and ``whiten`` return while their stream is busy."""
    B = 2**20
    labels = env.cp.asarray(env.rng.permutation(np.repeat(np.arange(B // 16), 16)))
    scores = env.normal(B)
    x, m = env.normal((256, 8192)), env.flags(0.8, (256, 8192))
    msg = "group_normalize: " + _returns_while_busy(env, lambda: env.gaescan.group_normalize(
        scores, groups=labels, backend="cuda"))
    return msg + "; whiten: " + _returns_while_busy(env, lambda: env.gaescan.whiten(x, m, backend="cuda"))


# vtrace and turn_gae: elementwise steps on CuPy around the CUDA scan and GAE kernels.


def vtrace_check(env: Env, shape: tuple | None, dtype: Any = np.float32, axis: int = -1, masked: bool = False,
                 packed: bool = False, tt: bool = False) -> str:
    """``vtrace`` with dones (or terminated + truncated + next_values), clipped ratios, lv, optionally a
    mask and packed segments, against the reference."""
    kw: dict[str, Any] = dict(gamma=0.99, lam=0.95, rho_bar=1.0, c_bar=0.9, axis=axis)
    if packed:
        lens = env.rng.geometric(1 / 2000, size=150)
        lens[::9] = 0
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        shape = (int(cu[-1]),)
        kw.update(cu_seqlens=env.cp.asarray(cu), last_value=env.normal(len(lens), dtype))
    r, v, d = env.data(shape, dtype, p_done=0.003)
    lr = env.normal(shape, dtype) * dtype(0.5)
    if tt:
        kw.update(next_values=env.normal(shape, dtype), terminated=d, truncated=env.flags(0.003, shape))
    else:
        kw["dones"] = d
        if not packed:
            kw["last_value"] = env.normal(tuple(n for i, n in enumerate(shape) if i != axis % len(shape)), dtype)
    if masked:
        kw["mask"] = env.flags(0.8, shape)
    res = env.gaescan.vtrace(r, v, lr, backend="cuda", **kw)
    return _both(res, env.testing.vtrace(r, v, lr, **kw), _out_dtype(dtype), kw.get("mask"))


def _turns(env: Env, B: int, T: int, mean_len: int) -> tuple[Any, Any]:
    """int32 turn ids (non-decreasing, with gaps) and a mask of masked spans, ``(B, T)`` on the device."""
    rng = env.rng
    ids = np.cumsum((rng.random((B, T)) < 1 / mean_len) * rng.integers(1, 4, (B, T)), axis=1).astype(np.int32)
    mask = np.repeat(rng.random((B, -(-T // 64))) > 0.2, 64, axis=1)[:, :T]  # spans of 64 tokens
    return env.cp.asarray(ids), env.cp.asarray(mask)


def turn_check(env: Env, B: int, T: int, dtype: Any = np.float32, masked: bool = True, per_row: bool = False,
               mean_len: int = 300) -> str:
    """``turn_gae`` with a mask of spans, lv[B], scalar or per-row γ and λ, against the reference."""
    r, v, _ = env.data((B, T), dtype)
    ids, mask = _turns(env, B, T, mean_len)
    kw: dict[str, Any] = dict(gamma=0.99, lam=0.95, mask=mask if masked else None,
                              last_value=env.normal(B, dtype))
    if per_row:
        kw.update(gamma=env.uniform(0.9, 1.0, (B, 1)).astype(dtype), lam=env.uniform(0.5, 1.0, (B, 1)).astype(dtype))
    res = env.gaescan.turn_gae(r, v, ids, backend="cuda", **kw)
    return _both(res, env.testing.turn_gae(r, v, ids, **kw), _out_dtype(dtype), kw["mask"])


def pipeline_no_sync_check(env: Env) -> str:
    """``vtrace`` (packed, masked) and ``turn_gae`` (masked) return while their stream is busy."""
    n = 2**22
    r, v, d = env.data((n,))
    lr, m = env.normal(n), env.flags(0.8, n)
    cu = env.cp.asarray(np.array([0, n // 3, n // 3, n], dtype=np.int64))
    ids, tm = _turns(env, 4, n // 4, 300)
    r2, v2 = r.reshape(4, -1), v.reshape(4, -1)
    msg = "vtrace: " + _returns_while_busy(env, lambda: env.gaescan.vtrace(
        r, v, lr, gamma=0.99, dones=d, mask=m, cu_seqlens=cu, backend="cuda"))
    return msg + "; turn_gae: " + _returns_while_busy(env, lambda: env.gaescan.turn_gae(
        r2, v2, ids, gamma=0.99, lam=0.95, mask=tm, backend="cuda"))


def torch_pipeline_check(env: Env) -> str:
    """``vtrace`` and ``turn_gae`` on CUDA tensors (``"auto"``): CUDA tensors back."""
    torch = env.torch
    g = torch.Generator(device="cuda").manual_seed(2)
    r = torch.randn(8, 20000, device="cuda", generator=g)
    v = torch.randn(8, 20000, device="cuda", generator=g)
    lr = 0.5 * torch.randn(8, 20000, device="cuda", generator=g)
    d = torch.rand(8, 20000, device="cuda", generator=g) < 0.003
    ids = torch.cumsum((torch.rand(8, 20000, device="cuda", generator=g) < 0.005).int(), dim=1)
    vt = env.gaescan.vtrace(r, v, lr, gamma=0.99, dones=d)
    tg = env.gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95)
    for x in (*vt, *tg):
        if not isinstance(x, torch.Tensor) or x.device.type != "cuda":
            raise AssertionError(f"expected a CUDA tensor back, got {type(x)}")
    return ("vtrace " + _both(vt, env.testing.vtrace(r, v, lr, gamma=0.99, dones=d), np.float32)
            + "; turn_gae " + _both(tg, env.testing.turn_gae(r, v, ids, gamma=0.99, lam=0.95), np.float32))


# CUDA graphs: the look-back scratch (and any conversion) of a captured call must
# outlive the call, since the graph replays with the addresses it captured.
JUNK = 0x7F7F7F7F


def _churn(env: Env, stream: Any) -> list:
    """Arrays allocated on ``stream`` after a capture: what its freed memory would go to.

    CuPy's pool hands a freed block out again only on the stream that freed it.
    """
    cp = env.cp
    with stream:
        junk = [cp.full(n, JUNK, dtype=cp.uint32) for n in (1 << 12, 1 << 16, 1 << 20) for _ in range(4)]
        stream.synchronize()
    return junk


def _intact(junk: list) -> str:
    if not all(bool((j == JUNK).all()) for j in junk):
        raise AssertionError("a replay wrote into memory the pool handed out after the capture")
    return "arrays allocated after the capture intact"


def graph_cupy_check(env: Env) -> str:
    cp = env.cp
    B, T = 4, 2**20
    r, v, d = env.data((B, T))
    adv = cp.empty((B, T), cp.float32)
    ret = cp.empty((B, T), cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    args = dict(gamma=0.99, lam=0.95, dones=d, out=(adv, ret), backend="cuda")
    cp.cuda.Device().synchronize()
    with s:
        env.gaescan.gae(r, v, **args)  # compiled, and the pool holds this stream's blocks
        s.synchronize()
        s.begin_capture()
        env.gaescan.gae(r, v, **args)
        graph = s.end_capture()
    junk = _churn(env, s)
    msgs = []
    for _ in range(2):  # new inputs in the same arrays, every replay
        with s:
            r[...] = env.normal((B, T))
            adv.fill(np.nan)
            graph.launch(s)
        s.synchronize()
        msgs.append(_both((adv, ret), env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d), np.float32))
    return "look-back captured, replayed twice: " + "; ".join(msgs) + "; " + _intact(junk)


def graph_torch_check(env: Env) -> str:
    """PyTorch's recipe as documented: warm up on a side stream, then capture with torch.cuda.graph's defaults."""
    torch, cp = env.torch, env.cp
    cu, r, v, d = _torch_packed(env, 300)
    N = r.shape[0]
    adv = torch.empty(N, device="cuda")
    ret = torch.empty(N, device="cuda")
    args = dict(gamma=0.99, lam=0.95, dones=d, cu_seqlens=cu, out=(adv, ret), backend="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        env.gaescan.gae(r, v, **args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        capture_stream = torch.cuda.current_stream().cuda_stream
        env.gaescan.gae(r, v, **args)  # int32 offsets: a conversion copy inside the graph
    junk = _churn(env, cp.cuda.ExternalStream(capture_stream))
    r.copy_(torch.randn(N, device="cuda"))
    adv.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return _packed_err(env, cu, r, v, d, adv, ret) + "; " + _intact(junk)


GL = dict(fast_lookback=False)
PF = dict(prefetch=True)


def fast_vs_general_check(env: Env) -> str:
    """The fast look-back (the default where it applies) gives the general look-back's bits,
    also with long walks; rows and packed."""
    from gaescan.backends import cuda as cb

    lens = env.rng.geometric(1 / 5000, size=200)
    cu = env.cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    rp, vp, dp = env.data((int(lens.sum()),))
    r4, v4, d4 = env.data((8, 2**20))
    out = []
    for tun, hooks in ((GL, {}), (dict(), {}), (dict(), dict(unpublished_tiles=True)),
                       (GL, dict(unpublished_tiles=True))):
        with cb.override(**tun), cb.test_hooks(**hooks):
            a, _ = env.gaescan.gae(r4, v4, gamma=0.99, lam=0.95, dones=d4, backend="cuda")
            ap, _ = env.gaescan.gae(rp, vp, gamma=0.99, lam=0.95, dones=dp, cu_seqlens=cu, backend="cuda")
        out.append(_h(a).tobytes() + _h(ap).tobytes())
    if any(o != out[0] for o in out):
        raise AssertionError("the fast look-back (or long walks) changed the bits")
    return "fast and general look-back bit-identical, also with long walks; rows and packed"


def vector_vs_element_check(env: Env) -> str:
    """The 16-byte accesses (``vector_access``, on where the layout allows) give the
    element accesses' bits: both drivers, float32 and float64, ``next_values``,
    forward and reverse scans, discounted returns; and a view one step off 16-byte
    alignment takes the element accesses with the same results."""
    from gaescan.backends import cuda as cb

    g = env.gaescan
    r4, v4, d4 = env.data((4, 2**20))
    r5, v5, d5 = env.data((512, 4096))
    r8, v8, d8 = env.data((8, 100000), np.float64)
    nv = env.normal((4, 2**20))
    wide = env.normal((8, 4097))
    calls = [
        lambda: g.gae(r4, v4, gamma=0.99, lam=0.95, dones=d4, backend="cuda"),
        lambda: g.gae(r5, v5, gamma=0.99, lam=0.95, dones=d5, backend="cuda"),
        lambda: g.gae(r8, v8, gamma=0.99, lam=0.95, dones=d8, backend="cuda"),
        lambda: g.gae(r4, v4, gamma=0.99, lam=0.95, next_values=nv, terminated=d4, backend="cuda"),
        lambda: g.discounted_returns(r4, gamma=0.99, dones=d4, backend="cuda"),
        lambda: (g.linear_scan(0.9, r5, backend="cuda"), g.linear_scan(0.9, r5, reverse=True, backend="cuda")),
        lambda: g.gae(wide[:, 1:], wide[:, :-1], gamma=0.99, lam=0.95, backend="cuda"),  # not aligned
    ]

    def bits(res: Any) -> bytes:
        return b"".join(_h(x).tobytes() for x in res)

    on = [bits(f()) for f in calls]
    with cb.override(vector_access=False):
        off = [bits(f()) for f in calls]
    bad = [i for i, (a, b) in enumerate(zip(on, off, strict=True)) if a != b]
    if bad:
        raise AssertionError(f"16-byte accesses changed the bits of calls {bad} (0-based, in the order above)")
    want = env.testing.gae(_h(wide[:, 1:]), _h(wide[:, :-1]), gamma=0.99, lam=0.95)
    msg = _both(calls[-1](), want, np.float32)
    return f"bit-identical with and without 16-byte accesses (7 calls); the unaligned view: {msg}"


def dask_cupy_check(env: Env) -> str:
    """``gae`` on a Dask array of CuPy chunks (chunked along time and batch): lazy, CuPy chunks back,
    each block on the CUDA backend, against the reference."""
    import dask
    import dask.array as da

    cp = env.cp
    B, T = 64, 200_000
    r, v, d = env.data((B, T), p_done=0.002)
    lv = env.normal(B)
    chunks = (32, 30_000)
    dr, dv, dd = (da.from_array(x, chunks=chunks, asarray=False) for x in (r, v, d))
    dlv = da.from_array(lv, chunks=(32,), asarray=False)
    res = env.gaescan.gae(dr, dv, gamma=0.99, lam=0.95, dones=dd, last_value=dlv)
    if not isinstance(res[0], da.Array):
        raise AssertionError(f"expected a lazy Dask array back, got {type(res[0])}")
    with dask.config.set(scheduler="synchronous"):
        adv, ret = dask.compute(*res)
    if not isinstance(adv, cp.ndarray):
        raise AssertionError(f"expected CuPy chunks back, got {type(adv)}")
    want = env.testing.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=lv)
    return f"{res[0].numblocks} blocks: " + _both((adv, ret), want, np.float32)


def _gae(shape: tuple, dtype: Any = np.float32, **fixed: Any) -> Callable[[Env], dict]:
    """:func:`gae_check` arguments: fixed ones, and arrays drawn when the check runs.

    An entry of ``fixed`` named ``"<arg>"`` whose value is a ``(kind, shape)`` pair in
    ``{"normal", "flags", "uniform"}`` is drawn from the check's random stream.
    """
    def build(env: Env) -> dict:
        kw: dict[str, Any] = dict(shape=shape, dtype=dtype)
        for k, x in fixed.items():
            if isinstance(x, tuple) and x and x[0] == "normal":
                x = env.normal(x[1], dtype)
            elif isinstance(x, tuple) and x and x[0] == "flags":
                x = env.flags(x[2], x[1])
            elif isinstance(x, tuple) and x and x[0] == "uniform":
                x = env.uniform(x[2], x[3], x[1])
            kw[k] = x
        return kw
    return build


def _args(**kw: Any) -> Callable[[Env], dict]:
    return lambda env: dict(kw)


def _packed(**kw: Any) -> Callable[[Env], dict]:
    return lambda env: packed_kw(env, **kw)


def correctness_cases(n_long: int) -> list[CheckCase]:
    """The table of correctness checks; ``n_long`` is the length of the "few long rows" cases."""
    C = CheckCase
    N = n_long
    long_mixed = _gae((3, 300001), mask=("flags", (3, 300001), 0.7), gamma=("uniform", (3, 1), 0.9, 1.0),
                      lam=("uniform", (3, 300001), 0.8, 1.0), last_value=("normal", 3))
    tm_lv = _gae((4096, 512), axis=0, last_value=("normal", 512))
    rows_lv = _gae((2048, 2000), last_value=("normal", 2048))
    cases = [
        # Regime: many rows.
        C("gae many rows B=512 T=300 f32 dones", gae_check, _gae((512, 300))),
        C("gae many rows B=2048 T=2000 f32 dones lv[B]", gae_check, rows_lv),
        # Regime: few long rows (look-back), bit-identical repeat.
        C(f"gae few long rows B=4 T={N} f32 dones (repeat)", gae_check, _gae((4, N), repeat=True)),
        C("gae long rows B=3 T=300001 f32 mask+gamma[B,1]+lam[B,T]+lv[B]", gae_check, long_mixed),
        C("gae single row T=1000003 f64 gamma=lam=1", gae_check, _gae((1000003,), np.float64, gamma=1.0, lam=1.0)),
        # A float32 decay near 1 runs the float64 kernels on float64 copies.
        C("gae B=2 T=65536 f32 gamma=lam=0.9999 (float64 kernels)", gae_check, _gae((2, 65536), gamma=0.9999, lam=0.9999)),
        # last_advantage (the carry-in of sequence-parallel slices): both drivers and packed.
        C("gae last_advantage[B] + lv[B], B=2048 T=2000 f32 (rows driver)", gae_check,
          _gae((2048, 2000), last_value=("normal", 2048), last_advantage=("normal", 2048))),
        C("gae last_advantage[B] B=3 T=300001 f32 mask, gamma=lam=1 (look-back driver)", gae_check,
          _gae((3, 300001), gamma=1.0, lam=1.0, mask=("flags", (3, 300001), 0.7), last_advantage=("normal", 3))),
        # Packed cu_seqlens (empty, one-step and a giant segment), mask, per-segment last_value.
        C("gae packed cu_seqlens S=300 N~1.3M f32 mask lv[S] last_advantage[S] (repeat)", gae_check,
          _packed(repeat=True)),
        C("gae packed cu_seqlens int32 offsets, f64", gae_check, _packed(dtype=np.float64, cu_dtype=np.int32)),
        # Regime: many short rows.
        C("gae short rows B=65536 T=16 f32 dones", gae_check, _gae((65536, 16), p_done=0.1)),
        C("gae short rows B=4000 T=1 f32", gae_check, _gae((4000, 1))),
        C("gae 3-D batch (8,64,700) axis=-1 f32", gae_check, _gae((8, 64, 700))),
        # Time-major layouts.
        C("gae time-major axis=0 T=4096 B=512 f32 dones lv[B]", gae_check, tm_lv),
        C("gae time-major axis=0 T=50000 B=8 f32", gae_check, _gae((50000, 8), axis=0)),
        C("gae time-major axis=0 T=64 B=20000 f64", gae_check, _gae((64, 20000), np.float64, axis=0)),
        # Dtypes.
        C("gae f16 inputs -> f32 B=64 T=5000", gae_check, _gae((64, 5000), np.float16)),
        C("gae f64 B=64 T=50000", gae_check, _gae((64, 50000), np.float64)),
        # terminated + truncated + next_values.
        C("gae terminated+truncated(uint8)+next_values B=16 T=20000 f32", tt_check,
          _args(dtype=np.float32, shape=(16, 20000))),
        C("gae terminated+truncated+next_values B=2 T=2^20 f64", tt_check, _args(dtype=np.float64, shape=(2, 2**20))),
        C("gae look-back long walks + block-per-row driver B=4 T=2^20", walks_check),
        C("gae NaN does not cross a done (look-back regime)", nan_iso_check),
        C("gae out= preallocated B=256 T=3000", outs_check),
        C("discounted_returns B=1024 T=1000 dones", rets_check, _args(shape=(1024, 1000))),
        C("discounted_returns B=2 T=2^21 dones", rets_check, _args(shape=(2, 2**21))),
        C("discounted_returns time-major T=3000 B=700", rets_check, _args(shape=(3000, 700), axis=0)),
        C("discounted_returns packed mask lv[S]", rets_check, _args(shape=None, packed=True)),
        C("linear_scan forward a[B,T] B=512 T=4000", scans_check, _args(shape=(512, 4000), reverse=False, a_arr=True)),
        C("linear_scan reverse a scalar B=3 T=2^21", scans_check, _args(shape=(3, 2**21), reverse=True)),
        C("linear_scan forward a scalar B=3 T=2^21", scans_check, _args(shape=(3, 2**21), reverse=False)),
        C("linear_scan forward time-major T=5000 B=300", scans_check,
          _args(shape=(5000, 300), reverse=False, axis=0)),
        # PyTorch inputs and streams.
        C("torch CUDA tensors B=64 T=30000 f32", torch_case_check, needs_torch=True),
        C("torch non-default stream B=8 T=2^20", torch_stream_check, needs_torch=True),
        C("gaescan.distributed on a one-GPU NCCL group (gae mask, whiten)", nccl_one_rank_check,
          needs_torch=True),
        C("torch side stream, int32 cu_seqlens, CuPy's default stream busy", torch_stream_prep_check,
          needs_torch=True),
        C("torch time-major axis=0 f64 T=3000 B=256", torch_time_major_check, needs_torch=True),
        C("cupy non-default stream B=8 T=2^20", cupy_stream_check),
        C("no host synchronisation (queued work, streamQuery)", no_host_sync_check),
        C("CUDA graph (CuPy capture) gae look-back B=4 T=2^20 out=", graph_cupy_check),
        C("CUDA graph (torch.cuda.graph) packed int32 cu_seqlens out=", graph_torch_check, needs_torch=True),
        # vtrace and turn_gae (elementwise CuPy steps around the scan and GAE kernels).
        C("vtrace B=64 T=5000 f32 dones lv[B]", vtrace_check, _args(shape=(64, 5000))),
        C("vtrace B=3 T=100001 f32 mask dones lv[B] (look-back)", vtrace_check,
          _args(shape=(3, 100001), masked=True)),
        C("vtrace time-major axis=0 T=2000 B=128 f64 terminated+truncated+next_values mask", vtrace_check,
          _args(shape=(2000, 128), dtype=np.float64, axis=0, tt=True, masked=True)),
        C("vtrace packed cu_seqlens S=150 mask lv[S] f32", vtrace_check, _args(shape=None, packed=True, masked=True)),
        C("turn_gae B=16 T=20000 f32 mask spans lv[B]", turn_check, _args(B=16, T=20000)),
        C("turn_gae B=2 T=150001 f64 no mask, per-row gamma/lam (look-back)", turn_check,
          _args(B=2, T=150001, dtype=np.float64, masked=False, per_row=True)),
        C("turn_gae B=4096 T=64 f32 mask, one-token turns", turn_check, _args(B=4096, T=64, mean_len=1)),
        C("vtrace and turn_gae: no host synchronisation", pipeline_no_sync_check),
        C("group_normalize B=4096 groups of 16 (GRPO), labels and group_size", group_check, _args(B=4096, size=16)),
        C("group_normalize B=2^20 groups of 8, leave-one-out, no scale (RLOO)", group_check,
          _args(B=2**20, size=8, leave_one_out=True, scale=False)),
        C("whiten [4096, 8192] f32 mask, x = 1e4 + N(0, 1); moments", whiten_check, _args(shape=(4096, 8192))),
        C("whiten [3, 100001] f64 mask, no shift", whiten_check, _args(shape=(3, 100001), dtype=np.float64,
                                                                       shift_mean=False)),
        C("group_normalize and whiten: no host synchronisation", stats_no_sync_check),
        C("vtrace and turn_gae on torch CUDA tensors (auto)", torch_pipeline_check, needs_torch=True),
        C("Dask array of CuPy chunks: gae B=64 T=200000, chunks (32, 30000), lv[B]", dask_cupy_check,
          needs_dask=True),
    ]
    # The experimental raw launch (tunable "raw_launch"): parameters packed in Python,
    # cuLaunchKernel through CuPy.  Every dtype and option changes the parameter list.
    RL = dict(raw_launch=True)
    cases += [
        C("raw launch: gae many rows B=512 T=300 f32 dones", gae_check, _gae((512, 300)), RL),
        C("raw launch: gae few long rows B=4 T=2^20 f32 dones (repeat)", gae_check,
          _gae((4, 2**20), repeat=True), RL),
        C("raw launch: gae f64 time-major axis=0 T=3000 B=256", gae_check, _gae((3000, 256), np.float64, axis=0), RL),
        C("raw launch: gae f16 inputs B=64 T=5000", gae_check, _gae((64, 5000), np.float16), RL),
        C("raw launch: packed f32 mask lv[S]", gae_check, _packed(), RL),
        C("raw launch: terminated+truncated+next_values B=16 T=20000", tt_check,
          _args(dtype=np.float32, shape=(16, 20000)), RL),
        C("raw launch: discounted_returns B=1024 T=1000", rets_check, _args(shape=(1024, 1000)), RL),
        C("raw launch: linear_scan forward a[B,T] B=512 T=4000", scans_check,
          _args(shape=(512, 4000), reverse=False, a_arr=True), RL),
        C("raw launch: cupy non-default stream B=8 T=2^20", cupy_stream_check, None, RL),
        C("raw launch: no host synchronisation", no_host_sync_check, None, RL),
        C("raw launch: torch non-default stream B=8 T=2^20", torch_stream_check, None, RL, needs_torch=True),
    ]
    # The row-resident driver's one candidate (tunable "prefetch"), and the general look-back
    # where the fast one is the default (tunable "fast_lookback" off).
    cases += [
        C("prefetch: gae rows B=512 T=3000 f32 dones (3 tiles per row, repeat)", gae_check,
          _gae((512, 3000), repeat=True), dict(PF, rows_min_blocks=1)),
        C("prefetch: gae rows B=256 T=131072 f32 dones", gae_check, _gae((256, 131072)), PF),
        C("prefetch: gae rows f16 inputs B=64 T=5000", gae_check, _gae((64, 5000), np.float16),
          dict(PF, rows_min_blocks=1)),
        C("prefetch: gae rows f64 B=64 T=50000", gae_check, _gae((64, 50000), np.float64),
          dict(PF, rows_min_blocks=1)),
        C("prefetch: packed f32 mask lv[S] (one row)", gae_check, _packed(), dict(PF, rows_min_blocks=1)),
        C("prefetch: terminated+truncated+next_values B=16 T=20000", tt_check,
          _args(dtype=np.float32, shape=(16, 20000)), dict(PF, rows_min_blocks=1)),
        C("prefetch: discounted_returns B=1024 T=1000", rets_check, _args(shape=(1024, 1000)), PF),
        C("prefetch: linear_scan forward a[B,T] B=512 T=4000", scans_check,
          _args(shape=(512, 4000), reverse=False, a_arr=True), PF),
        C(f"general look-back: gae B=4 T={N} f32 dones (repeat)", gae_check, _gae((4, N), repeat=True), GL),
        C("general look-back: gae f16 inputs B=4 T=2^20", gae_check, _gae((4, 2**20), np.float16), GL),
        C("general look-back: terminated+truncated+next_values B=2 T=2^20", tt_check,
          _args(dtype=np.float32, shape=(2, 2**20)), GL),
        C("general look-back: discounted_returns B=2 T=2^21", rets_check, _args(shape=(2, 2**21)), GL),
        C("general look-back: discounted_returns packed mask lv[S]", rets_check, _args(shape=None, packed=True),
          GL),
        C("general look-back: linear_scan forward B=3 T=2^21", scans_check, _args(shape=(3, 2**21), reverse=False),
          GL),
        C("general look-back: linear_scan reverse B=3 T=2^21", scans_check, _args(shape=(3, 2**21), reverse=True),
          GL),
        C("fast look-back == general look-back, B=8 T=2^20, packed S=200", fast_vs_general_check,
          experimental=True),
        C("16-byte accesses == element accesses: both drivers, f32/f64, next_values, scans, returns, unaligned",
          vector_vs_element_check),
    ]
    return cases


def _have_dask() -> bool:
    try:
        import dask.array  # noqa: F401
    except ImportError:
        return False
    return True


def correctness(cp: Any, gaescan: Any, torch: Any, quick: bool, select: str | None = None,
                experimental: bool | None = None) -> None:
    """Run the table of correctness checks (those whose name contains ``select``, if given;
    only the experimental ones, or only the others, if ``experimental`` is given)."""
    env = Env(cp=cp, gaescan=gaescan, torch=torch, rng=np.random.default_rng(1234),
              n_long=2**22 if not quick else 2**18)
    have_torch = torch is not None and torch.cuda.is_available()
    have_dask = _have_dask()
    if not have_torch and experimental is not True:
        print("SKIP  torch checks (torch with CUDA not available)")
    if not have_dask and experimental is not True:
        print("SKIP  Dask checks (dask[array] not installed)")
    for case in correctness_cases(env.n_long):
        if ((case.needs_torch and not have_torch) or (case.needs_dask and not have_dask)
                or (select is not None and select not in case.name)
                or (experimental is not None and case.experimental != experimental)):
            continue
        check(case.name, functools.partial(case.run, env))



# --------------------------------------------------------------------------- timing
# Each benchmark call gets three figures, all on the current stream:
#
# * kernel alone (:func:`_kernel_alone`): the GPU time of back-to-back calls with
#   no host time inside the timed span;
# * end to end (:func:`_events_ms`): events around one call at a time, so the
#   host's work before each launch is inside the span;
# * host (:func:`_host_us`): the host's time per call of back-to-back calls.
#
# The device-to-device copy of the same bytes (:func:`_copy_timing`) is timed
# like the kernel alone, so that ``kernel x copy`` compares two GPU times.

# One thread busy-waits for ``cycles`` SM clock cycles.  Queued ahead of the timed
# calls, it keeps the stream busy while the host enqueues them: the GPU reaches the
# first timed call only once all of them are queued, so it runs them back to back
# and the events around them hold GPU time only.
SPIN_KERNEL_SRC = r"""
extern "C" __global__ void gaescan_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""
SPIN_CALIBRATION_CYCLES = 1_000_000  # length of the spin that measures the SM clock rate
SPIN_MIN_MS = 2.0  # shortest spin queued ahead of the timed calls
SPIN_MAX_MS = 200.0  # longest spin of a second try
KERNEL_CALLS = 20  # back-to-back calls per kernel-alone timing
HOST_BOUND = "host-bound"  # the figure of a kernel-alone timing the host did not keep up with


def _host_clock() -> float:
    """Host time in seconds.

    The kernel-alone and host timings read the host clock through this function
    only, so that a test can replace it with the clock of a simulated GPU.
    """
    return time.perf_counter()


@functools.cache
def _spin_kernel(cp: Any) -> Any:
    """The :data:`SPIN_KERNEL_SRC` kernel, one per CuPy module, compiled and launched once.

    CuPy compiles a raw kernel at its first launch: that launch, of zero cycles,
    happens here, so that no timed span holds the compilation.
    """
    kernel = cp.RawKernel(SPIN_KERNEL_SRC, "gaescan_spin")
    kernel((1,), (1,), (np.int64(0),))
    return kernel


def _spin_alone_ms(cp: Any, cycles: int) -> float:
    """GPU time, in ms, of one spin of ``cycles`` cycles on the idle current stream (CUDA events)."""
    s = cp.cuda.get_current_stream()
    s.synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(s)
    _spin_kernel(cp)((1,), (1,), (np.int64(cycles),))
    e1.record(s)
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1)


@dataclasses.dataclass(frozen=True)
class QueuedTiming:
    """One kernel-alone timing: ``calls`` back-to-back calls queued behind a spin kernel.

    Attributes
    ----------
    total_ms : float
        Event time from the end of the spin to the end of the last call.
    calls : int
        Number of timed calls.
    host_ms : float
        Host time from the spin's launch to the return of the last call.
    spin_ms : float
        GPU time of the spin, measured alone just before the timed calls.
    tries : int
        Number of timed runs made (the second one with a spin long enough for twice the
        host time the first measured, at most :data:`SPIN_MAX_MS`).
    """

    total_ms: float
    calls: int
    host_ms: float
    spin_ms: float
    tries: int

    @property
    def valid(self) -> bool:
        """Whether the host had queued every call before the spin ended.

        Otherwise the GPU waited for the host inside the timed span, and
        ``total_ms`` holds host time.
        """
        return self.host_ms < self.spin_ms

    @property
    def ms(self) -> float | None:
        """GPU time per call, in ms; ``None`` if the timing is not valid."""
        return self.total_ms / self.calls if self.valid else None

    @property
    def figure(self) -> float | str:
        """:attr:`ms`, or :data:`HOST_BOUND` if the timing is not valid (the form a table prints)."""
        return self.total_ms / self.calls if self.valid else HOST_BOUND

    def note(self) -> str:
        """Why a timing is not valid: how long the host took to queue the calls against the spin."""
        return (f"{HOST_BOUND}: the host took {self.host_ms:.2f} ms to queue {self.calls} calls, "
                f"the spin ahead of them lasted {self.spin_ms:.2f} ms ({self.tries} tries)")


def _kernel_alone(cp: Any, fn: Callable[[], Any], calls: int = KERNEL_CALLS, warm: int = 2,
                  spin_ms: float | None = None) -> QueuedTiming:
    """Time ``fn``'s GPU work alone: ``calls`` back-to-back calls queued behind a spin kernel.

    The spin is enqueued first, then event ``e0``, the calls (no sync) and event
    ``e1``; the time per call is ``elapsed(e0, e1) / calls``.  The host time from
    the spin's launch to the last call's return is compared with the spin's own
    GPU time, measured alone: if the host took longer, the GPU waited for it
    inside the span, and the run is repeated once with a spin that lasts twice the
    host time it measured (at least twice the first spin, at most :data:`SPIN_MAX_MS`).

    Parameters
    ----------
    cp : module
        CuPy (or an object with the same ``cuda`` and ``RawKernel`` API).
    fn : callable
        One call; it enqueues its work on the current stream and does not synchronise.
    calls : int
        Number of timed calls.
    warm : int
        Untimed calls first (at least one); the fastest one's host time sizes the spin.
    spin_ms : float, optional
        Length of the first spin, in ms.  By default twice the host time of
        ``calls`` warm-up calls, and at least :data:`SPIN_MIN_MS`.

    Returns
    -------
    QueuedTiming
        The last run made: the first valid one, or the second if neither is.
    """
    s = cp.cuda.get_current_stream()
    host_per_call = []
    for _ in range(max(warm, 1)):
        t = _host_clock()
        fn()
        host_per_call.append((_host_clock() - t) * 1e3)
    s.synchronize()
    if spin_ms is None:
        # The fastest warm-up call: the first one may include compilation.
        spin_ms = max(SPIN_MIN_MS, 2 * calls * min(host_per_call))
    cycles_per_ms = SPIN_CALIBRATION_CYCLES / _spin_alone_ms(cp, SPIN_CALIBRATION_CYCLES)
    cycles = max(int(spin_ms * cycles_per_ms), 1)
    spin = _spin_kernel(cp)
    for tries in (1, 2):
        spin_alone = _spin_alone_ms(cp, cycles)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        t = _host_clock()
        spin((1,), (1,), (np.int64(cycles),))
        e0.record(s)
        for _ in range(calls):
            fn()
        host_ms = (_host_clock() - t) * 1e3
        e1.record(s)
        e1.synchronize()
        timing = QueuedTiming(cp.cuda.get_elapsed_time(e0, e1), calls, host_ms, spin_alone, tries)
        if timing.valid:
            break
        # The second spin covers twice the host time the first try measured: the
        # calibration's cycles per ms drift with the SM clock (an idle GPU clocks down).
        scale = max(2.0, 2.0 * host_ms / max(spin_alone, 1e-3))
        cycles = max(int(cycles * min(scale, SPIN_MAX_MS / max(spin_alone, 1e-3))), 1)
    return timing


def _events_ms(cp: Any, fn: Callable[[], Any], reps: int = 10, warm: int = 2) -> float:
    """End-to-end time of one call, in ms: median of CUDA events around each of ``reps`` calls.

    The stream is idle when ``e0`` is recorded, so the span holds the host's work
    before the launch as well as the GPU's.
    """
    for _ in range(warm):
        fn()
    s = cp.cuda.get_current_stream()
    s.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        fn()
        e1.record(s)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return statistics.median(times)


def _host_us(cp: Any, fn: Callable[[], Any], calls: int = 200) -> float:
    """Host time per call, in µs, of back-to-back calls (no sync in between)."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    t = _host_clock()
    for _ in range(calls):
        fn()
    us = (_host_clock() - t) / calls * 1e6
    cp.cuda.get_current_stream().synchronize()
    return us


def _copy_timing(cp: Any, n: int, per_step: int = 17) -> QueuedTiming:
    """Kernel-alone timing of a device-to-device copy moving ``per_step`` bytes per step for ``n`` steps.

    This is the roofline (GAE's 17 bytes per step by default).  A copy of X bytes
    moves 2X (read and write): X = per_step·n/2.
    """
    nbytes = (per_step * n) // 2
    src = cp.empty(nbytes, cp.uint8)
    dst = cp.empty(nbytes, cp.uint8)
    sp = cp.cuda.get_current_stream().ptr
    return _kernel_alone(cp, lambda: cp.cuda.runtime.memcpyAsync(
        dst.data.ptr, src.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, sp))


def _timing_columns(cp: Any, fn: Callable[[], Any], n: int, per_step: int, e2e_reps: int = 10) -> dict:
    """Kernel-alone, end-to-end and copy columns of one call that moves ``per_step`` bytes for each of ``n`` steps.

    Returns
    -------
    dict
        ``"gaescan ms"`` (end to end) and ``"GB/s"`` (its bandwidth),
        ``"kernel ms"`` (kernel alone, or :data:`HOST_BOUND`), ``"copy ms"``,
        and where the figures they need are valid ``"kernel GB/s"``,
        ``"copy GB/s"``, ``"kernel x copy"`` and ``"e2e x copy"`` (copy time over the call's: fractions of the copy's speed);
        ``"kernel note"`` / ``"copy note"`` say why a kernel-alone figure is not valid.
    """
    def gbs(ms: float) -> float:
        return per_step * n / ms / 1e6

    e2e = _events_ms(cp, fn, reps=e2e_reps)  # first: its warm-up calls compile
    kern = _kernel_alone(cp, fn)
    copy = _copy_timing(cp, n, per_step)
    row: dict[str, Any] = {"gaescan ms": e2e, "GB/s": gbs(e2e), "kernel ms": kern.figure, "copy ms": copy.figure}
    if kern.valid:
        row["kernel GB/s"] = gbs(kern.ms)
    else:
        row["kernel note"] = kern.note()
    if copy.valid:
        row["copy GB/s"] = gbs(copy.ms)
        row["e2e x copy"] = copy.ms / e2e
        if kern.valid:
            row["kernel x copy"] = copy.ms / kern.ms
    else:
        row["copy note"] = copy.note()
    return row


def _cell(x: Any, width: int = 11) -> str:
    """One table cell: a float with three decimals (none past 10^4), anything else as text, ``-`` if absent."""
    if isinstance(x, float):
        return f"{x:{width}.3f}" if x < 1e4 else f"{x:{width}.0f}"
    return f"{x!s:>{width}}" if x is not None else f"{'-':>{width}}"


TIMING_HELP = (
    "kernel ms   = GPU time per call with no host time in it: {calls} calls queued back to back behind a\n"
    "              spin kernel (long enough to cover the host's enqueueing), CUDA events around the {calls},\n"
    "              divided by {calls}.  '" + HOST_BOUND + "' = the host needed longer to queue the calls than the\n"
    "              spin lasted, even with the spin doubled: no valid figure.\n"
    "e2e ms      = end to end: CUDA events around one call at a time from an idle stream (median), the\n"
    "              host's work before the launch included.\n"
    "copy ms     = device-to-device copy of the same bytes (the roofline), timed like kernel ms.\n"
    "kernel frac = copy ms / kernel ms; e2e frac = copy ms / e2e ms (fractions of the copy's speed: 1 = at the roofline)."
).format(calls=KERNEL_CALLS)


def _gae_arrays(cp: Any, rng: Any, shape: tuple, p_done: float) -> tuple:
    """Float32 rewards, values, boolean dones (probability ``p_done``) and two float32 outputs."""
    r = cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    v = cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    d = cp.asarray(rng.random(shape) < p_done)
    return r, v, d, cp.empty(shape, cp.float32), cp.empty(shape, cp.float32)


def _local_chunk_scan(cp: Any, r: Any, v: Any, gamma: float, lam: float, C: int = 256) -> Any:
    """C x C kernel-matmul chunk scan, constant gamma*lam, no dones; carries by the same trick, recursively."""
    dt = r.dtype
    B, T = r.shape
    vn = cp.concatenate([v[:, 1:], cp.zeros((B, 1), dt)], axis=1)
    delta = r + dt.type(gamma) * vn - v
    return _rev_discount(cp, delta, dt.type(gamma) * dt.type(lam), C)


def _rev_discount(cp: Any, x: Any, c: Any, C: int) -> Any:
    dt = x.dtype
    B, T = x.shape
    if T <= 1:
        return x.copy()
    n = -(-T // C)
    if n * C != T:
        x = cp.concatenate([x, cp.zeros((B, n * C - T), dt)], axis=1)
    i = cp.arange(C)
    e = i[None, :] - i[:, None]
    K = cp.where(e >= 0, c ** cp.maximum(e, 0).astype(dt), dt.type(0)).astype(dt)
    local = x.reshape(B, n, C) @ K.T
    if n > 1:
        heads = local[:, :, 0]
        z = _rev_discount(cp, heads, dt.type(c) ** C, C)  # z_k = sum from chunk k to the end
        nxt = cp.concatenate([z[:, 1:], cp.zeros((B, 1), dt)], axis=1)
        decay = (dt.type(c) ** cp.arange(C, 0, -1).astype(dt)).astype(dt)
        local = local + nxt[:, :, None] * decay[None, None, :]
    return local.reshape(B, n * C)[:, :T]


def benchmarks(cp: Any, gaescan: Any, quick: bool, budget: float) -> None:
    """Time GAE on the CUDA backend (kernel alone, end to end, host) against a copy and the baselines."""
    try:
        from gaescan.bench import baselines
    except Exception:  # noqa: BLE001
        baselines = None
    rng = np.random.default_rng(7)
    shapes = [("B=256 T=131072", 256, 131072, -1), ("B=4 T=2^22", 4, 2**22, -1),
              ("B=8 T=1024", 8, 1024, -1), ("B=4096 T=256", 4096, 256, -1),
              ("time-major T=8192 B=4096", 4096, 8192, 0)]
    if quick:
        shapes = [("B=64 T=16384", 64, 16384, -1), ("B=8 T=1024", 8, 1024, -1)]
    def one(row: dict, B: int, T: int, axis: int) -> None:
        shp = (B, T) if axis == -1 else (T, B)
        r, v, d, a0, r0 = _gae_arrays(cp, rng, shp, 0.001)
        n = B * T

        def f():
            return gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, out=(a0, r0), backend="cuda")

        row.update(_timing_columns(cp, f, n, 17))
        if B * T <= 2**20:  # small problems are host-bound
            from gaescan.backends import cuda as cb

            row["host us/call"] = _host_us(cp, f)
            try:  # experimental: a failure here must not cost the row its other figures
                with cb.override(raw_launch=True):
                    row["host us raw"] = _host_us(cp, f)
            except Exception as exc:  # noqa: BLE001
                row["host us raw"] = f"n/a ({type(exc).__name__})"
                RESULTS.append(("FAIL", "raw launch host timing", f"{type(exc).__name__}: {exc}"))
        rr, vv, dd = (x if axis == -1 else x.T for x in (r, v, d))
        if baselines is not None:  # serial loop on CuPy, capped and extrapolated
            Tc = min(T, 4096 if not quick else 1024)
            t_s = _events_ms(cp, lambda: baselines.serial_gae(cp, rr[:, :Tc], vv[:, :Tc], 0.99, 0.95,
                                                              dd[:, :Tc]), reps=2, warm=1)
            row["serial ms"] = t_s * T / Tc
            row["serial note"] = "" if Tc == T else f"T capped at {Tc}, time per step extrapolated to T={T}"
        if _elapsed() < budget:
            try:
                row["numpy-backend ms"] = _events_ms(cp, lambda: gaescan.gae(
                    r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, backend="numpy"), reps=2, warm=1)
            except Exception as exc:  # noqa: BLE001
                row["numpy-backend ms"] = f"n/a ({type(exc).__name__})"
            try:
                row["CxC chunk ms"] = _events_ms(cp, lambda: _local_chunk_scan(cp, rr, vv, 0.99, 0.95),
                                                 reps=2, warm=1)
            except Exception as exc:  # noqa: BLE001
                row["CxC chunk ms"] = f"n/a ({type(exc).__name__}: {exc})"
            if baselines is not None and T <= 2**17:
                try:
                    row["published chunk ms"] = _events_ms(
                        cp, lambda: baselines.chunk_scan_gae(cp, rr, vv, 0.99, 0.95), reps=2, warm=1)
                except Exception as exc:  # noqa: BLE001
                    row["published chunk ms"] = f"n/a ({type(exc).__name__})"

    rows = []
    for label, B, T, axis in shapes:
        if _elapsed() > budget:
            print(f"SKIP  bench {label}: past the {budget:.0f}s budget")
            continue
        row = {"shape": label}
        try:
            one(row, B, T, axis)
            RESULTS.append(("PASS", f"bench {label}", ""))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc(limit=4)
            RESULTS.append(("FAIL", f"bench {label}", f"{type(exc).__name__}: {exc}"))
            print(f"FAIL  bench {label}: {type(exc).__name__}: {exc}")
        rows.append(row)
        cp.get_default_memory_pool().free_all_blocks()

    cols = ["kernel ms", "kernel GB/s", "gaescan ms", "host us/call", "host us raw",
            "copy ms", "copy GB/s", "kernel x copy", "e2e x copy", "serial ms", "numpy-backend ms", "CxC chunk ms",
            "published chunk ms"]
    heads = ["kernel ms", "kernel GB/s", "e2e ms", "host us", "host raw", "copy ms", "copy GB/s",
             "kernel frac", "e2e frac", "serial ms", "numpy-bk ms", "CxC ms", "publ. ms"]
    print()
    print("GAE float32 with dones on the cuda backend, N = B*T steps (17 bytes/step: 4 r + 4 V + 1 done read,")
    print("4 adv + 4 ret written).")
    print(TIMING_HELP)
    print("kernel GB/s / copy GB/s = 17N bytes / kernel ms / copy ms (the copy moves 17N/2 bytes: 17N of traffic).")
    print("host us     = host time per call of 200 back-to-back calls (shapes up to 2^20 steps); host raw = the")
    print("              same with the experimental raw_launch tunable (parameters packed in Python,")
    print("              cuLaunchKernel through CuPy).")
    print("serial      = CuPy loop over time (vectorised over batch), CUDA events, end to end.")
    print("numpy-bk    = gaescan.gae(..., backend='numpy') on the same CuPy arrays (with dones), end to end.")
    print("CxC         = local C=256 kernel-matmul chunk scan (constant gamma*lam, NO dones: not the same")
    print("              problem, a speed reference), end to end.")
    print("publ.       = gaescan.bench.baselines.chunk_scan_gae (no dones), end to end.")
    print(f"{'shape':<26s}" + "".join(f"{h:>12s}" for h in heads))
    for row in rows:
        print(f"{row['shape']:<26s}" + "".join(" " + _cell(row.get(c)) for c in cols))
        for key in ("kernel note", "copy note", "serial note"):
            if row.get(key):
                print(f"{'':<26s} {key.split()[0]}: {row[key]}")
    try:
        from gaescan.backends import cuda as cb

        print("launch plans:")
        for label, B, T, axis in shapes:
            pl = cb.plan(B, T, np.float32, time_major=axis == 0, vector=True)
            print(f"  {label:<26s} {({k: v for k, v in pl.items() if k != 'opts'})}")
    except Exception as exc:  # noqa: BLE001
        print(f"(no launch plans: {exc})")
    try:
        access_probe(cp, quick)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc(limit=4)
        RESULTS.append(("FAIL", "access-pattern probe", f"{type(exc).__name__}: {exc}"))


# Bytes per step that each function of :func:`pipeline_bench` must move at least: GAE 17
# (see :func:`benchmarks`); vtrace 21 (r, V, log ρ, a done flag read; vs, advantages
# written, float32); turn_gae 21 (r, V, int32 ids, a mask flag read; advantages, returns written).
PIPELINE_BYTES = {"gae": 17, "vtrace": 21, "turn_gae": 21}
PIPELINE_COLS = ["kernel ms", "kernel GB/s", "gaescan ms", "copy ms", "kernel x copy", "e2e x copy"]
PIPELINE_HEADS = ["kernel ms", "kernel GB/s", "e2e ms", "copy ms", "kernel frac", "e2e frac"]


def _pipeline_row(cp: Any, gaescan: Any, rng: Any, label: str, B: int, T: int) -> None:
    """Time and print one shape of :func:`pipeline_bench`: one line per function."""
    r, v, d, a0, r0 = _gae_arrays(cp, rng, (B, T), 0.001)
    lr = cp.asarray(0.5 * rng.standard_normal((B, T), dtype=np.float32))
    ids = cp.asarray(np.cumsum(rng.random((B, T)) < 1 / 300, axis=1).astype(np.int32))
    mask = cp.asarray(rng.random((B, T)) > 0.2)
    calls = {
        "gae": lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0), backend="cuda"),
        "vtrace": lambda: gaescan.vtrace(r, v, lr, gamma=0.99, dones=d, out=(a0, r0), backend="cuda"),
        "turn_gae": lambda: gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95, mask=mask, out=(a0, r0),
                                             backend="cuda"),
    }
    for fn, call in calls.items():
        row = _timing_columns(cp, call, B * T, PIPELINE_BYTES[fn], e2e_reps=5)
        print(f"{label:<18s}{fn:>10s}" + "".join(" " + _cell(row.get(c)) for c in PIPELINE_COLS), flush=True)
        for key in ("kernel note", "copy note"):
            if row.get(key):
                print(f"{'':<28s} {key.split()[0]}: {row[key]}")


def pipeline_bench(cp: Any, gaescan: Any, quick: bool, budget: float) -> None:
    """gae, vtrace and turn_gae on CuPy, kernel alone and end to end, against a copy of their bytes."""
    rng = np.random.default_rng(11)
    shapes = [("B=256 T=16384", 256, 16384), ("B=4 T=2^21", 4, 2**21), ("B=4096 T=256", 4096, 256)]
    if quick:
        shapes = [("B=64 T=16384", 64, 16384)]
    print()
    print("gae (dones), vtrace (dones) and turn_gae (mask, int32 ids), float32, on CuPy arrays.")
    print(TIMING_HELP)
    print(f"kernel GB/s = bytes each must move per step ({PIPELINE_BYTES}) x B*T / kernel ms.")
    print(f"{'shape':<18s}{'function':>10s}" + "".join(f"{h:>12s}" for h in PIPELINE_HEADS))
    for label, B, T in shapes:
        if _elapsed() > budget:
            print(f"SKIP  pipeline bench {label}: past the {budget:.0f}s budget")
            continue
        try:
            _pipeline_row(cp, gaescan, rng, label, B, T)
            RESULTS.append(("PASS", f"pipeline bench {label}", ""))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc(limit=4)
            RESULTS.append(("FAIL", f"pipeline bench {label}", f"{type(exc).__name__}: {exc}"))
            print(f"FAIL  pipeline bench {label}: {type(exc).__name__}: {exc}")
        cp.get_default_memory_pool().free_all_blocks()


def access_probe(cp: Any, quick: bool) -> None:
    """GAE's 17 bytes per step moved by elementwise kernels (no scan): the access pattern's own cost.

    The probes and the copy are timed kernel alone (:func:`_kernel_alone`).
    """
    from gaescan.backends import cuda as cb
    from gaescan.bench import _probe

    n = 2**25 if not quick else 2**20
    rng = np.random.default_rng(5)
    r, v, d, o1, o2 = _gae_arrays(cp, rng, (n,), 0.001)
    args = [cb._device_view(x) for x in (r, v, d, o1, o2)]
    stream = cb._stream(cb.current_stream_ptr())
    t_copy = _copy_timing(cp, n).ms
    print()
    print(f"access-pattern probe: r, v, done in, two float32 out (17 bytes/step), N=2^{n.bit_length() - 1}, "
          "elementwise (no scan), kernel alone; frac = copy time / probe time")
    if t_copy is None:
        print(f"  {'D2D copy of the same bytes':<40s} {HOST_BOUND}")
    else:
        print(f"  {'D2D copy of the same bytes':<40s} {t_copy:8.3f} ms {17 * n / t_copy / 1e6:7.0f} GB/s")
    probes = [("coalesced, one thread per step", "coalesced", 8, 0), ("coalesced, grid-stride 16 blocks/SM",
              "coalesced", 8, 16), ("owned K=4 consecutive steps per thread", "owned", 4, 0),
              ("owned K=8 (the scan kernels' default)", "owned", 8, 0), ("owned K=16", "owned", 16, 0)]
    want1 = _h(r[:4096]) - _h(v[:4096])
    want2 = np.where(_h(d[:4096]), _h(r[:4096]), want1 + _h(v[:4096]))
    for label, which, K, bps in probes:
        o1.fill(np.nan)
        t = _kernel_alone(cp, lambda which=which, K=K, bps=bps: _probe.launch(
            which, *args, K=K, stream=stream, blocks_per_sm=bps)).ms
        ok = np.array_equal(_h(o1[:4096]), want1) and np.array_equal(_h(o2[:4096]), want2) \
            and bool(cp.all(cp.isfinite(o1)))
        if t is None:
            txt = f"{HOST_BOUND:>11s}"
        else:
            txt = f"{t:8.3f} ms {17 * n / t / 1e6:7.0f} GB/s" + (f"  frac {t_copy / t:.2f}" if t_copy else "")
        print(f"  {label:<40s} {txt}{'' if ok else '  WRONG OUTPUT'}")
        if not ok:
            RESULTS.append(("FAIL", f"access-pattern probe {label}", "wrong output"))


def sweep_shapes(quick: bool = False) -> list[tuple[str, int, int, list[dict]]]:
    """The sweep's shapes and, per shape, the CUDA tunable settings it times, most telling first.

    Each item is ``(label, B, T, settings)``; a setting is a dict for
    :func:`gaescan.backends.cuda.override` (the empty one: the defaults, timed
    first).  A sweep past its budget is cut short, so the order matters.
    Prefetching needs more registers than two blocks of 256 threads can have:
    ``min_blocks_per_sm=2`` caps them (at the cost of a few spills).  Each sweep
    line prints the registers, spills and blocks per SM that ptxas gives the
    setting.
    """
    lookback = dict(rows_min_blocks=1 << 30)  # rows split into tiles with the look-back
    rows = dict(rows_min_blocks=1)  # a block per row walking its tiles, no look-back
    general = dict(fast_lookback=False)
    pf = dict(prefetch=True)
    b256 = [{}, dict(pf), dict(pf, min_blocks_per_sm=2), dict(threads=128), dict(threads=512), dict(k=16),
            dict(lookback), dict(lookback, threads=128), dict(lookback, **general), dict(threads=128, **pf),
            dict(min_blocks_per_sm=2)]
    b4 = [{}, dict(threads=128), dict(general), dict(threads=128, k=16), dict(threads=512), dict(k=16),
          dict(threads=128, min_blocks_per_sm=6), dict(rows)]
    b1024 = [{}, dict(pf), dict(threads=128), dict(threads=128, **pf), dict(pf, min_blocks_per_sm=2),
             dict(threads=512)]
    if quick:
        return [("B=64 T=16384", 64, 16384, b4[:2])]
    return [("B=256 T=131072", 256, 131072, b256), ("B=4 T=2^22", 4, 2**22, b4),
            ("B=1024 T=32768", 1024, 32768, b1024)]


def time_major_settings() -> list[dict]:
    """The settings the sweep times on time-major rows (``axis=0``, T=8192, B=4096), most telling first.

    Time-major rows take ``rows_time_major`` rows per block and ``k_time_major``
    steps per thread; the row-resident driver needs ``rows_min_blocks`` at most
    ``B / rows_time_major`` (a block per row group).
    """
    return [{}, dict(threads=128), dict(k_time_major=16), dict(k_time_major=4), dict(rows_time_major=16),
            dict(rows_min_blocks=1), dict(threads=512), dict(rows_time_major=64)]


def blocks_per_sm(regs: int, smem: int, threads: int, props: dict | None = None) -> int:
    """Blocks of ``threads`` that can be resident on one SM at once, from the kernel's resources.

    The CUDA occupancy rules: registers are allocated per warp in units of 256,
    every block also takes the per-block reserved shared memory, and threads and
    blocks per SM are capped.  ``props`` holds the device's limits (CuPy's
    ``getDeviceProperties`` keys); missing ones default to an H100/H200's.
    """
    p = props or {}
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = int(p.get("regsPerMultiprocessor", 65536)) // per_warp // warps if per_warp else 1 << 30
    reserved = int(p.get("reservedSharedMemPerBlock", 1024))
    by_smem = int(p.get("sharedMemPerMultiprocessor", 233472)) // (smem + reserved)
    by_threads = int(p.get("maxThreadsPerMultiProcessor", 2048)) // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, int(p.get("maxBlocksPerMultiProcessor", 32))))


def _kernel_resources(dispatcher: Any) -> tuple[int, int, int] | None:
    """A compiled kernel's registers per thread, shared bytes per block and local bytes per thread."""
    try:
        (ov,) = dispatcher.overloads.values()
        return int(ov.regs_per_thread), int(ov.shared_mem_per_block), int(ov.local_mem_per_thread)
    except Exception:  # noqa: BLE001 - a report, never a failure
        return None


def _launched_kernel(cb: Any, call: Callable[[], Any]) -> Any:
    """The compiled kernel ``call`` launches (one more call, with the backend's lookup watched)."""
    got = []
    typed = cb._typed

    def watched(*a, **k):
        got.append(typed(*a, **k))
        return got[-1]

    cb._typed = watched
    try:
        call()
    finally:
        cb._typed = typed
    return got[-1] if len(got) == 1 else None


def _progress_started(path: str | None) -> set[str]:
    """The sweep lines a progress file says were started (timed, failed or hung) by an earlier process."""
    if not path or not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line[6:].rstrip("\n") for line in f if line.startswith("start ")}


def _progress_note(path: str | None, what: str, key: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {key}\n")


def sweep(cp: Any, gaescan: Any, quick: bool, budget: float, progress: str | None = None) -> None:
    """Time CUDA tunable settings (each compiles a kernel once) on a few shapes.

    Each line names the kernel variant the setting actually got (a tunable that does
    not apply to the shape is dropped by the backend) and its registers, shared and
    local memory (spills) and the blocks per SM they allow; it is printed as soon
    as it is measured.  With ``progress`` (a file), each setting is noted there
    before it runs and after, and settings an earlier process started are
    skipped: a run that ended on a hung kernel (:func:`watchdog`) goes on past it.
    """
    from gaescan.backends import cuda as cb

    from .. import testing

    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    except Exception:  # noqa: BLE001
        props = {}
    seen: dict[tuple, tuple[int, int, int] | None] = {}  # kernel spec -> resources
    started = _progress_started(progress)
    rng = np.random.default_rng(3)
    print()
    print("tunable sweep (GAE f32 with dones, end to end: CUDA events around one call, median of 10;")
    print("GB/s at 17 bytes/step); [mode K options | registers, shared memory, local memory per thread")
    print("(spills) -> blocks per SM]:", flush=True)
    shapes = [(label, B, T, -1, st) for label, B, T, st in sweep_shapes(quick)]
    if not quick:  # after the two target shapes of batch-major rows, before the rest
        shapes.insert(2, ("time-major T=8192 B=4096", 4096, 8192, 0, time_major_settings()))
    for label, B, T, axis, settings in shapes:
        if _elapsed() > budget:
            print(f"  {label}: (budget)", flush=True)
            continue
        todo = [st for st in settings if f"{label} | {_setting_name(st)}" not in started]
        if not todo:
            continue
        shp = (B, T) if axis == -1 else (T, B)
        r, v, d, a0, r0 = _gae_arrays(cp, rng, shp, 0.001)
        ea = testing.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=axis).advantages
        times = []  # (ms, name) of the settings that ran and were right
        print(f"  {label}", flush=True)
        for st in todo:
            if _elapsed() > budget:
                print("    (budget)", flush=True)
                break
            name = _setting_name(st)
            key = f"{label} | {name}"
            _progress_note(progress, "start", key)
            try:
                a0.fill(np.nan)
                with watchdog(f"sweep {key}"), cb.override(**st):
                    pl = cb.plan(B, T, np.float32, time_major=axis == 0, vector=axis == -1)
                    spec = tuple(pl[k] for k in ("mode", "k", "opts", "threads", "min_blocks_per_sm",
                                                 "rows_per_block"))
                    call = functools.partial(gaescan.gae, r, v, gamma=0.99, lam=0.95, dones=d, axis=axis,
                                             out=(a0, r0), backend="cuda")
                    t = _events_ms(cp, call)
                    if spec not in seen:
                        seen[spec] = _kernel_resources(_launched_kernel(cb, call))
                    # A fast wrong answer is not a result: every timed setting is checked.
                    err = compare(a0, ea, np.float32)
                res = seen[spec]
                kern_txt = f"{pl['mode']} K={pl['k']} RW={pl['rows_per_block']} {pl['options']}"
                if res is not None:
                    kern_txt += (f" | {res[0]} regs, {res[1]} B smem, {res[2]} B local -> "
                                 f"{blocks_per_sm(res[0], res[1], pl['threads'], props)} blocks/SM")
                print(f"    {name}: {t:.3f} ms {17 * B * T / t / 1e6:.0f} GB/s  ({err})  [{kern_txt}]", flush=True)
                times.append((t, name))
            except Exception as exc:  # noqa: BLE001
                print(f"    {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
                RESULTS.append(("FAIL", f"sweep {key}", f"{type(exc).__name__}: {exc}"))
            _progress_note(progress, "done", key)
        if times:
            first = times[0] if times[0][1] == _setting_name(settings[0]) else None
            best = min(times)
            rel = f": {first[0] / best[0]:.2f}x the first setting" if first else ""
            print(f"    fastest: {best[1]} {best[0]:.3f} ms{rel}", flush=True)
        r = v = d = a0 = r0 = None
        cp.get_default_memory_pool().free_all_blocks()


def _setting_name(st: dict) -> str:
    return ",".join(f"{k}={val}" for k, val in st.items())


def host_profile(cp: Any, gaescan: Any, calls: int = 300, top: int = 18) -> None:
    """Where the host time of a small call goes: cProfile of back-to-back calls (no sync)."""
    import cProfile
    import io
    import pstats

    r, v, d, a0, r0 = _gae_arrays(cp, np.random.default_rng(5), (8, 1024), 0.01)

    def f():
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0), backend="cuda")

    from gaescan.backends import cuda as cb

    for tun in (dict(), dict(raw_launch=True)):
        with cb.override(**tun):
            for _ in range(20):
                f()
            cp.cuda.get_current_stream().synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                f()
            prof.disable()
            cp.cuda.get_current_stream().synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        print()
        print(f"host profile ({tun or 'default launch'}): {calls} calls of gae(B=8, T=1024, dones, out=...) "
              "on the cuda backend (cProfile adds its own overhead; compare the rows, not the total)")
        print(buf.getvalue().rstrip())


# --------------------------------------------------------------------------- main


def _header(cp: Any, torch: Any) -> None:
    import numba

    try:
        import numba_cuda

        nc = getattr(numba_cuda, "__version__", "?")
    except Exception:  # noqa: BLE001
        nc = "absent"
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    drv = cp.cuda.runtime.driverGetVersion()
    rt = cp.cuda.runtime.runtimeGetVersion()
    print(f"gaescan GPU check  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"GPU: {name} (cc {props['major']}.{props['minor']}, {props['multiProcessorCount']} SMs, "
          f"{props['totalGlobalMem'] / 2**30:.0f} GiB)")
    print(f"driver CUDA {drv // 1000}.{drv % 1000 // 10}, runtime {rt // 1000}.{rt % 1000 // 10}; "
          f"cupy {cp.__version__}, numba {numba.__version__}, numba-cuda {nc}, "
          f"torch {getattr(torch, '__version__', 'absent')}; python {sys.version.split()[0]}")


def _stage(name: str, fn: Callable[[], Any]) -> None:
    """Run one stage of :func:`main`; an exception is reported as a failure and the run goes on."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        RESULTS.append(("FAIL", name, f"{type(exc).__name__}: {exc}"))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gaescan.bench.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--no-bench", action="store_true", help="no timings (and no sweep)")
    ap.add_argument("--no-check", action="store_true", help="no correctness checks")
    ap.add_argument("--no-sweep", action="store_true", help="no tunable sweep")
    ap.add_argument("--sweep-only", action="store_true", help="the tunable sweep alone")
    ap.add_argument("--budget", type=float, default=280.0,
                    help="seconds after which pending benchmarks and sweep settings are skipped (default 280)")
    ap.add_argument("--check-budget", type=float, default=170.0,
                    help="seconds after which pending correctness checks are skipped (default 170)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="a Unix time past which nothing new starts (caps both budgets): for a run of "
                         "several processes with one end")
    ap.add_argument("--hang-seconds", type=float, default=HANG_SECONDS[0],
                    help="a check or sweep setting running longer ends the process with exit status 3 "
                         f"(default {HANG_SECONDS[0]:.0f})")
    ap.add_argument("--progress", default=None,
                    help="a file where the sweep notes each setting before and after it runs; settings "
                         "it names as started are skipped (a rerun goes on past a hung one)")
    a = ap.parse_args(argv)
    if a.deadline is not None:
        left = a.deadline - time.time() + _elapsed()
        a.budget, a.check_budget = min(a.budget, left), min(a.check_budget, left)
    CHECK_BUDGET[0] = a.check_budget
    HANG_SECONDS[0] = a.hang_seconds
    try:
        import cupy as cp

        if not cp.cuda.is_available():
            print("FAIL  no CUDA GPU visible to CuPy")
            return 2
    except Exception as exc:  # noqa: BLE001
        print(f"FAIL  cannot import CuPy: {exc}")
        return 2
    try:
        import torch
    except Exception:  # noqa: BLE001
        torch = None
    import gaescan

    try:
        _header(cp, torch)
    except Exception as exc:  # noqa: BLE001
        print(f"(header failed: {exc})")

    def warm():
        t = time.perf_counter()
        _compiled_references()
        x = cp.ones((2, 64), cp.float32)
        gaescan.gae(x, x, gamma=0.9, lam=0.9, dones=x > 0, backend="cuda")
        cp.cuda.get_current_stream().synchronize()
        return f"first call (compiles one kernel) {time.perf_counter() - t:.1f}s"
    check("import + first call", warm)
    try:
        from gaescan.backends import cuda as cb

        print(f"cuda backend tunables: {cb.TUNABLES}")
    except Exception as exc:  # noqa: BLE001
        print(f"(cannot import gaescan.backends.cuda: {exc})")
    # The default path first (its checks, then its timings), then the experimental
    # variants' checks and the sweep, so that a variant that hangs or fails costs
    # none of the defaults' figures.
    bench = not a.no_bench and not a.sweep_only
    check_ = not a.no_check and not a.sweep_only
    if check_:
        _stage("correctness driver", lambda: correctness(cp, gaescan, torch, a.quick, experimental=False))
        print(f"-- correctness of the default path done at {_elapsed():.0f}s", flush=True)
    if bench:
        _stage("benchmark driver", lambda: benchmarks(cp, gaescan, a.quick, a.budget))
        _stage("pipeline benchmark driver", lambda: pipeline_bench(cp, gaescan, a.quick, a.budget))
        try:
            host_profile(cp, gaescan)
        except Exception as exc:  # noqa: BLE001
            print(f"(host profile failed: {type(exc).__name__}: {exc})")
        print(f"-- timings of the default path done at {_elapsed():.0f}s", flush=True)
    if check_:
        _stage("correctness driver", lambda: correctness(cp, gaescan, torch, a.quick, experimental=True))
        print(f"-- correctness of the experimental variants done at {_elapsed():.0f}s", flush=True)
    if (bench and not a.no_sweep) or a.sweep_only:
        _stage("sweep", lambda: sweep(cp, gaescan, a.quick, a.budget, a.progress))
    fails = [r for r in RESULTS if r[0] == "FAIL"]
    skips = [r for r in RESULTS if r[0] == "SKIP"]
    print()
    print(f"{len(RESULTS) - len(fails) - len(skips)} passed, {len(fails)} failed, {len(skips)} skipped, "
          f"{_elapsed():.0f}s total")
    for _, name, detail in fails:
        print(f"  FAILED {name}: {detail}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
