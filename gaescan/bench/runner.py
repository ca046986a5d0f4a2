"""The engine behind ``gaescan bench``: cases, methods, timing, checking.

A *case* is one GAE problem (shape, dtype, layout, flags) with seeded inputs;
a *method* is one way of solving it (a baseline or a gaescan backend).  Each
cell of the table is one (case, method) pair: the method runs once (warm-up:
JIT loading, page faults, CUDA module loading), its output is checked against
the float64 reference, and only a correct method is then timed, ``repeat``
times; the cell reports the median.

Nothing here is imported by ``gaescan`` itself.  CuPy is imported only when the
``cuda`` method is requested (explicitly, or by default when a CuPy
distribution is installed).
"""

from __future__ import annotations

import importlib.metadata
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GAMMA = 0.99
LAM = 0.95
P_DONE = 1e-3  # episode ends: one in a thousand steps
P_VALID = 0.9  # masks: one step in ten is padding / prompt

#: The shapes of the published table (README, "Performance").
PUBLISHED_SHAPES = ((256, 131072), (128, 65536))
#: The quick default set: small calls, one long-ish row regime, many short rows.
QUICK_SHAPES = ((8, 1024), (1024, 1024), (64, 16384), (16, 131072))

FLAGS = ("none", "dones", "masks", "packed")
LAYOUTS = ("batch-major", "time-major")
DTYPES = ("float32", "float64")
BASELINES = ("serial", "chunk64", "chunk128", "chunk256")
BACKENDS = ("numpy", "numba", "cuda")

_GPU_DISTS = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One GAE problem with seeded host inputs.

    Attributes
    ----------
    B, T : int
        Rows and steps (``packed``: about ``B`` segments of ``B*T`` steps in all).
    dtype : str
        ``"float32"`` or ``"float64"`` (inputs and outputs).
    layout : str
        ``"batch-major"`` (``[B, T]``, ``axis=-1``) or ``"time-major"``
        (``[T, B]``, ``axis=0``); ignored for ``packed`` (1-D).
    flags : str
        ``"none"``, ``"dones"``, ``"masks"`` or ``"packed"`` (``cu_seqlens``).
    """

    B: int
    T: int
    dtype: str
    layout: str
    flags: str
    seed: int = 0
    r: Any = None
    v: Any = None
    dones: Any = None
    mask: Any = None
    cu: Any = None
    _ref: Any = None

    @property
    def shape_label(self) -> str:
        return f"{self.B}x{self.T}"

    @property
    def n(self) -> int:
        return self.B * self.T

    @property
    def axis(self) -> int:
        return 0 if self.layout == "time-major" and self.flags != "packed" else -1

    @property
    def bytes_per_step(self) -> int:
        """Compulsory memory traffic per step: r, V (and a 1-byte flag) read,
        advantages and returns written, each once."""
        item = np.dtype(self.dtype).itemsize
        return 4 * item + (1 if self.flags in ("dones", "masks") else 0)

    @property
    def nbytes(self) -> int:
        return self.bytes_per_step * self.n

    def build(self) -> Case:
        """Make the seeded inputs (host NumPy arrays)."""
        rng = np.random.default_rng([self.seed, self.B, self.T])
        dt = np.dtype(self.dtype)
        if self.flags == "packed":
            shape: tuple[int, ...] = (self.n,)
        elif self.axis == 0:
            shape = (self.T, self.B)
        else:
            shape = (self.B, self.T)
        self.r = rng.standard_normal(shape, dtype=np.float64 if dt == np.float64 else np.float32).astype(dt)
        self.v = rng.standard_normal(shape, dtype=np.float64 if dt == np.float64 else np.float32).astype(dt)
        if self.flags == "dones":
            self.dones = rng.random(shape) < P_DONE
        elif self.flags == "masks":
            self.mask = rng.random(shape) < P_VALID
        elif self.flags == "packed":
            # About B segments of random lengths (some may be empty) covering all steps.
            cuts = np.sort(rng.integers(0, self.n + 1, size=max(self.B - 1, 0)))
            self.cu = np.concatenate([[0], cuts, [self.n]]).astype(np.int64)
        return self

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """The float64 reference ``(advantages, returns)``, computed once."""
        if self._ref is None:
            from .. import testing

            self._ref = tuple(testing.gae(self.r, self.v, gamma=GAMMA, lam=LAM, dones=self.dones,
                                          mask=self.mask, cu_seqlens=self.cu, axis=self.axis))
        return self._ref

    def batch_major(self, x: Any) -> Any:
        """A ``[B, T]`` view of an input (the baselines' layout)."""
        return None if x is None else (x.T if self.axis == 0 else x)

    def batch_major_out(self, adv: Any) -> Any:
        """A baseline's ``[B, T]`` result in the input's layout (the reference's)."""
        return adv.T if self.axis == 0 else adv

    def release(self) -> None:
        self.r = self.v = self.dones = self.mask = self.cu = self._ref = None


# --------------------------------------------------------------------------- methods


@dataclass
class Method:
    """One column of the table.

    Attributes
    ----------
    name : str
        Column name (also the ``--backends`` key).
    description : str
        One line for the table's legend.
    prepare : callable
        ``prepare(case) -> fn``: does the untimed work (moving inputs to the
        GPU, allocating ``out=`` buffers) and returns a zero-argument callable
        that computes the result: ``(advantages, returns_or_None)``.
    supports : callable, optional
        ``supports(case) -> None`` if the method solves the case, else a short
        reason (the cell then says ``n/a``).
    device : str
        ``"cpu"`` or ``"gpu"`` (chooses the timer and the roofline).
    """

    name: str
    description: str
    prepare: Callable[[Case], Callable[[], tuple[Any, Any]]]
    supports: Callable[[Case], str | None] = lambda case: None
    device: str = "cpu"
    kind: str = "baseline"


def _serial(case: Case) -> Callable[[], tuple[Any, Any]]:
    from .baselines import serial_gae

    r, v, d, m = (case.batch_major(x) for x in (case.r, case.v, case.dones, case.mask))
    return lambda: (case.batch_major_out(serial_gae(np, r, v, GAMMA, LAM, d, m)), None)


def _chunk(C: int) -> Callable[[Case], Callable[[], tuple[Any, Any]]]:
    def prepare(case: Case) -> Callable[[], tuple[Any, Any]]:
        from .baselines import chunk_scan_gae

        r, v = case.batch_major(case.r), case.batch_major(case.v)
        return lambda: (case.batch_major_out(chunk_scan_gae(np, r, v, GAMMA, LAM, C)), None)

    return prepare


def _gaescan(backend: str) -> Callable[[Case], Callable[[], tuple[Any, Any]]]:
    def prepare(case: Case) -> Callable[[], tuple[Any, Any]]:
        import gaescan

        if backend == "cuda":
            cp = _cupy()
            r, v = cp.asarray(case.r), cp.asarray(case.v)
            d = None if case.dones is None else cp.asarray(case.dones)
            m = None if case.mask is None else cp.asarray(case.mask)
            cu = None if case.cu is None else cp.asarray(case.cu)
            out = (cp.empty_like(r), cp.empty_like(r))
        else:
            r, v, d, m, cu = case.r, case.v, case.dones, case.mask, case.cu
            out = (np.empty_like(r), np.empty_like(r))
        kw = dict(gamma=GAMMA, lam=LAM, dones=d, mask=m, cu_seqlens=cu, axis=case.axis, out=out,
                  backend=backend)
        # Outputs go to preallocated buffers, as in a training loop that reuses them.
        return lambda: tuple(gaescan.gae(r, v, **kw))

    return prepare


def _baseline_support(case: Case) -> str | None:
    return "no packed sequences" if case.flags == "packed" else None


def _chunk_support(case: Case) -> str | None:
    return None if case.flags == "none" else f"no {case.flags} (constant decay only)"


def builtin_methods() -> list[Method]:
    """The baselines and gaescan's backends, in column order."""
    ms = [Method("serial", "serial loop: NumPy, vectorised over the batch, Python loop over time",
                 _serial, _baseline_support)]
    for C in (64, 128, 256):
        ms.append(Method(f"chunk{C}", f"published chunk-scan, C={C}: CxC kernel matmul per chunk, "
                         "serial carry between chunks", _chunk(C), _chunk_support))
    ms.append(Method("numpy", "gaescan backend='numpy' (NumPy-API chunk scan)", _gaescan("numpy"), kind="gaescan"))
    ms.append(Method("numba", "gaescan backend='numba' (Numba CPU kernels)", _gaescan("numba"), kind="gaescan"))
    ms.append(Method("cuda", "gaescan backend='cuda' on CuPy arrays (CUDA-event timings)", _gaescan("cuda"),
                     device="gpu", kind="gaescan"))
    return ms


#: Extra methods appended to the built-in ones (an internal hook: the tests add
#: a deliberately wrong method here to see it reported as wrong).
EXTRA_METHODS: list[Method] = []


def all_methods() -> list[Method]:
    return builtin_methods() + list(EXTRA_METHODS)


# --------------------------------------------------------------------------- GPU


_CUPY: list[Any] = []


def gpu_status() -> tuple[bool, str]:
    """Whether a CUDA GPU is usable through CuPy, and why not.

    CuPy is imported only if one of its distributions is installed.
    """
    names = []
    for dist in _GPU_DISTS:
        try:
            importlib.metadata.version(dist)
            names.append(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if not names:
        return False, "CuPy is not installed (pip install 'gaescan[cuda12]')"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any CUDA runtime/driver failure means "no GPU"
        return False, f"no CUDA GPU visible to CuPy ({type(exc).__name__}: {str(exc).strip()[:120]})"
    if count < 1:
        return False, "no CUDA GPU visible to CuPy"
    _CUPY[:] = [cupy]
    return True, ""


def _cupy() -> Any:
    if not _CUPY:
        ok, why = gpu_status()
        if not ok:
            raise RuntimeError(why)
    return _CUPY[0]


# --------------------------------------------------------------------------- rooflines

_TRIAD: list[Any] = []


def _triad_kernels() -> list[Any]:
    """A ``prange`` triad and a single-threaded one (compiled once, cached on disk)."""
    if not _TRIAD:
        from numba import njit, prange

        @njit(parallel=True, cache=True)
        def triad(a, b, c, s):  # pragma: no cover - jitted
            for i in prange(a.size):
                a[i] = b[i] + s * c[i]

        @njit(cache=True)
        def triad_serial(a, b, c, s):  # pragma: no cover - jitted
            for i in range(a.size):
                a[i] = b[i] + s * c[i]

        _TRIAD[:] = [triad, triad_serial]
    return _TRIAD


def _triad_kernel() -> Any:
    """The ``prange`` triad."""
    return _triad_kernels()[0]


def cpu_roofline(n: int, dtype: str, repeat: int) -> dict[str, Any]:
    """STREAM triad ``a = b + s*c`` over ``n`` elements: Numba ``prange``, and
    a single-threaded loop, whichever is faster.

    A roofline bounds what is achievable, so this is the best of at least 10
    runs (the median would let a noisy neighbour lower the roof), and of both
    kernels (waking a thread pool costs more than a small array's traffic).

    Returns
    -------
    dict
        ``name``, ``best_s`` and ``gbps`` (3 arrays of ``dtype`` moved once).
    """
    dt = np.dtype(dtype)
    n = max(n, 1)
    a, b, c = np.empty(n, dt), np.ones(n, dt), np.ones(n, dt)
    s = dt.type(3.0)
    t = min(min(_times_cpu(lambda k=k: k(a, b, c, s), max(repeat, 10), warmup=1)) for k in _triad_kernels())
    return {"name": "CPU triad (Numba, best of prange and serial)", "best_s": t,
            "gbps": 3 * dt.itemsize * n / t / 1e9}


def gpu_roofline(nbytes: int, repeat: int) -> dict[str, Any]:
    """Device-to-device copy moving ``nbytes`` of traffic (``nbytes/2`` copied),
    best of at least 10 runs."""
    cp = _cupy()
    half = max(nbytes // 2, 1)
    src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
    stream = cp.cuda.get_current_stream()

    def copy() -> None:
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, half, cp.cuda.runtime.memcpyDeviceToDevice,
                                    stream.ptr)

    t = min(_times_gpu(copy, max(repeat, 10), warmup=1))
    return {"name": "GPU device-to-device copy (best run)", "best_s": t, "gbps": 2 * half / t / 1e9}


# --------------------------------------------------------------------------- timing


# OpenBLAS worker threads keep spinning for a while after a matmul (the
# chunk-scan baselines); on a machine with few cores they then steal the CPU
# from the next method's threads.  A short pause lets them go to sleep first
# (the tests set GAESCAN_BENCH_SETTLE_S=0: they check tables, not times).
_SETTLE_S = float(os.environ.get("GAESCAN_BENCH_SETTLE_S", "0.2"))


def _times_cpu(fn: Callable[[], Any], repeat: int, warmup: int = 0) -> list[float]:
    time.sleep(_SETTLE_S)
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def _times_gpu(fn: Callable[[], Any], repeat: int, warmup: int = 0) -> list[float]:
    # CUDA events on the current stream: the time the GPU spent, launch overhead
    # included; the event synchronisation makes each run complete before the next.
    cp = _cupy()
    for _ in range(warmup):
        fn()
    stream = cp.cuda.get_current_stream()
    stream.synchronize()
    ts = []
    for _ in range(repeat):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    return ts


# --------------------------------------------------------------------------- the run


@dataclass
class Config:
    """What to run (the CLI's options, parsed)."""

    shapes: Sequence[tuple[int, int]] = QUICK_SHAPES
    dtypes: Sequence[str] = ("float32",)
    layouts: Sequence[str] = ("batch-major",)
    flags: Sequence[str] = ("none", "dones")
    methods: Sequence[str] | None = None  # None: every available method
    repeat: int = 5  # at least 1
    warmup: int = 1  # at least 1 (the checked call)
    seed: int = 0
    progress: bool = False
    notes: list[str] = field(default_factory=list)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"256x131072,8x1024"`` -> ``[(256, 131072), (8, 1024)]`` (``B x T``)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            b, t = part.replace("*", "x").split("x")
            B, T = int(b), int(t)
        except ValueError:
            raise ValueError(f"bad shape {part!r}: expected BxT, e.g. 256x131072") from None
        if B < 1 or T < 1:
            raise ValueError(f"bad shape {part!r}: B and T must be positive")
        out.append((B, T))
    if not out:
        raise ValueError("no shapes given")
    return out


def select_methods(names: Iterable[str] | None, notes: list[str]) -> list[Method]:
    """The methods to run, in column order; unknown names raise ``ValueError``.

    With ``names=None`` every method runs except ``cuda`` when no GPU is usable
    (then a note says why).  An explicitly requested ``cuda`` without a GPU
    stays as a column of ``n/a`` cells carrying the reason.
    """
    methods = all_methods()
    by_name = {m.name: m for m in methods}
    if names is None:
        chosen = methods
        if "cuda" in by_name:
            ok, why = gpu_status()
            if not ok:
                chosen = [m for m in methods if m.name != "cuda"]
                notes.append(f"cuda: not run ({why})")
        return chosen
    wanted = []
    for name in names:
        if name == "baselines":
            wanted.extend(BASELINES)
        elif name == "gaescan":
            wanted.extend(BACKENDS)
        elif name not in by_name:
            raise ValueError(f"unknown method {name!r}; valid: {', '.join(by_name)}, baselines, gaescan")
        else:
            wanted.append(name)
    return [m for m in methods if m.name in wanted]


def _progress(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr if tqdm is installed, else a plain line per cell."""
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, file=sys.stderr, unit="cell", leave=False)
        except ImportError:
            pass

    class Plain:
        def __init__(self) -> None:
            self.k = 0

        def set_description(self, text: str) -> None:
            if enabled:
                print(f"[{self.k + 1}/{total}] {text}", file=sys.stderr, flush=True)

        def update(self, k: int = 1) -> None:
            self.k += k

        def close(self) -> None:
            pass

    return Plain()


def check(got: Any, want: np.ndarray, out_dtype: Any) -> tuple[bool, str]:
    """Compare a method's result with the float64 reference.

    Parameters
    ----------
    got : array
        The method's output (NumPy or CuPy), in ``want``'s layout.
    want : numpy.ndarray
        The float64 reference of :mod:`gaescan.testing`.
    out_dtype : dtype
        The dtype the method was asked to produce: it sets the tolerance
        (:func:`gaescan.testing.tolerance`); a result of another float dtype
        is compared after a cast to it.

    Returns
    -------
    (bool, str)
        Whether it is correct, and the relative L2 error or what is wrong.
    """
    from .. import testing

    dtype = np.dtype(out_dtype)
    if hasattr(got, "get") and not isinstance(got, np.ndarray):
        got = got.get()
    got = np.asarray(got).astype(dtype, copy=False)
    try:
        err = testing.assert_close(got, want, dtype=dtype)
    except AssertionError as exc:
        return False, str(exc)
    return True, f"rel.err {err:.1e}"


def run(config: Config) -> dict[str, Any]:
    """Run every (case, method) cell.

    Returns
    -------
    dict
        ``{"meta": {...}, "results": [record, ...], "rooflines": [...]}``; one
        record per cell with ``status`` ``"ok"`` (timed), ``"wrong"`` (output
        failed the check; no time), ``"n/a"`` (method does not solve the case)
        or ``"error"`` (the method raised).
    """
    notes = config.notes
    methods = select_methods(config.methods, notes)
    gpu_ok = None
    # Packed inputs are 1-D: one case whatever the layouts asked for.
    cases = [Case(B, T, dt, lay, fl, config.seed)
             for dt in config.dtypes for lay in config.layouts for (B, T) in config.shapes for fl in config.flags
             if fl != "packed" or lay == config.layouts[0]]
    bar = _progress(len(cases) * len(methods), config.progress)
    records: list[dict[str, Any]] = []
    rooflines: list[dict[str, Any]] = []
    cpu_roof: dict[tuple[int, str], dict[str, Any]] = {}
    gpu_roof: dict[int, dict[str, Any]] = {}
    t_start = time.perf_counter()
    try:
        for case in cases:
            case.build()
            serial_s = None
            for m in methods:
                bar.set_description(f"{case.shape_label} {case.dtype} {case.layout} {case.flags}: {m.name}")
                rec: dict[str, Any] = {
                    "shape": case.shape_label, "B": case.B, "T": case.T, "dtype": case.dtype,
                    "layout": "packed" if case.flags == "packed" else case.layout, "flags": case.flags,
                    "method": m.name, "kind": m.kind, "device": m.device, "bytes": case.nbytes,
                    "bytes_per_step": case.bytes_per_step, "status": "n/a", "detail": "", "median_s": None,
                    "times_s": [], "speedup": None, "gbps": None, "roofline_gbps": None, "roofline_frac": None,
                }
                why = m.supports(case)
                if why is None and m.device == "gpu":
                    if gpu_ok is None:
                        gpu_ok = gpu_status()
                    if not gpu_ok[0]:
                        why = gpu_ok[1]
                if why is not None:
                    rec["detail"] = why
                    records.append(rec)
                    bar.update(1)
                    continue
                try:
                    fn = m.prepare(case)
                    times = _times_gpu if m.device == "gpu" else _times_cpu
                    # Warm-up: the first call (JIT loading, page faults, CUDA module
                    # loading) is the one checked; timing follows only if it is correct.
                    for _ in range(config.warmup - 1):
                        fn()
                    adv, ret = fn()
                    want_adv, want_ret = case.reference()
                    ok, detail = check(adv, want_adv, case.dtype)
                    if ok and ret is not None:
                        ok, detail2 = check(ret, want_ret, case.dtype)
                        detail = detail if ok else "returns: " + detail2
                    elif not ok:
                        detail = "advantages: " + detail
                    adv = ret = None
                    rec["detail"] = detail
                    if not ok:
                        rec["status"] = "wrong"
                    else:
                        ts = times(fn, config.repeat)
                        rec.update(status="ok", times_s=ts, median_s=statistics.median(ts))
                except Exception as exc:  # noqa: BLE001 - a failing method is a cell, not a crash
                    rec.update(status="error", detail=f"{type(exc).__name__}: {str(exc).strip()[:200]}")
                fn = None  # drop the method's buffers before the next one allocates its own
                if rec["status"] == "ok":
                    med = rec["median_s"]
                    rec["gbps"] = case.nbytes / med / 1e9
                    if m.name == "serial":
                        serial_s = med
                    if m.device == "gpu":
                        if case.nbytes not in gpu_roof:
                            gpu_roof[case.nbytes] = gpu_roofline(case.nbytes, config.repeat)
                        roof = gpu_roof[case.nbytes]
                    else:
                        key = (case.n, case.dtype)
                        if key not in cpu_roof:
                            cpu_roof[key] = cpu_roofline(case.n, case.dtype, config.repeat)
                        roof = cpu_roof[key]
                    rec["roofline"] = roof["name"]
                    rec["roofline_gbps"] = roof["gbps"]
                    rec["roofline_frac"] = rec["gbps"] / roof["gbps"]
                records.append(rec)
                bar.update(1)
            if serial_s is not None:
                for rec in records[-len(methods):]:
                    if rec["status"] == "ok":
                        rec["speedup"] = serial_s / rec["median_s"]
            case.release()
    finally:
        bar.close()
    for (n, dt), roof in cpu_roof.items():
        rooflines.append({"device": "cpu", "elements": n, "dtype": dt, **roof})
    for nbytes, roof in gpu_roof.items():
        rooflines.append({"device": "gpu", "bytes": nbytes, **roof})
    return {"meta": _meta(config, methods, time.perf_counter() - t_start), "results": records,
            "rooflines": rooflines}


def _meta(config: Config, methods: list[Method], seconds: float) -> dict[str, Any]:
    import datetime
    import os
    import platform

    import numba

    import gaescan

    return {
        "tool": "gaescan bench", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gaescan": gaescan.__version__, "python": platform.python_version(), "numpy": np.__version__,
        "numba": numba.__version__, "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "gamma": GAMMA, "lam": LAM, "p_done": P_DONE, "p_valid": P_VALID,
        "repeat": config.repeat, "warmup": config.warmup, "seed": config.seed,
        "methods": {m.name: m.description for m in methods}, "notes": list(config.notes),
        "seconds": seconds,
    }
