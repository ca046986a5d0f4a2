"""Shared helpers of the asv suite: parameters, cached inputs, backend checks.

Inputs are seeded and cached per process (as bottleneck's asv suite does), so
that ``setup`` builds each input once however many times asv calls it.  A
backend that cannot run here makes ``setup`` raise ``NotImplementedError``,
which asv reports as skipped (``n/a``), not failed.

The default shapes are small, so that ``asv run --quick`` takes a few minutes
on 2 cores.  ``GAESCAN_ASV_FULL=1`` adds the published shapes (B=256,
T=131072 and B=128, T=65536).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os

import numpy as np

GAMMA, LAM = 0.99, 0.95
FULL = os.environ.get("GAESCAN_ASV_FULL", "0") not in ("", "0")

BACKENDS = ["numba", "numpy", "cuda"]
DTYPES = ["float32", "float64"]
# Shapes are "BxT" strings: asv shows them as they are and keys results by them.
SHAPES = ["8x1024", "64x4096"] + (["128x65536", "256x131072"] if FULL else [])
LAYOUTS = ["batch-major", "time-major"]
FLAGS = ["none", "dones", "masks", "packed"]


def parse_shape(shape: str) -> tuple[int, int]:
    b, t = shape.split("x")
    return int(b), int(t)


@functools.cache
def gpu_reason() -> str:
    """Empty if a CUDA GPU is usable through CuPy, else why not (cached)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "the CUDA simulator is not benchmarked"
    for dist in ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"):
        try:
            importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        return "CuPy is not installed"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA GPU"
    except Exception as exc:  # noqa: BLE001 - no driver, no device: all mean "skip"
        return f"no CUDA GPU ({type(exc).__name__})"
    return ""


def require(backend: str) -> None:
    """Raise ``NotImplementedError`` (asv: skip) if ``backend`` cannot run here."""
    if backend == "cuda":
        why = gpu_reason()
        if why:
            raise NotImplementedError(why)


@functools.cache
def host_inputs(shape: str, dtype: str, layout: str, flags: str, seed: int = 0) -> dict:
    """Seeded GAE inputs and keyword arguments for one parameter set (cached).

    ``packed`` is 1-D (``B*T`` steps, about ``B`` segments, ``cu_seqlens``),
    so it has no time-major variant: that combination raises
    ``NotImplementedError``.
    """
    if flags == "packed" and layout == "time-major":
        raise NotImplementedError("packed inputs are 1-D: no time-major layout")
    B, T = parse_shape(shape)
    rng = np.random.default_rng([seed, B, T])
    if flags == "packed":
        dims: tuple[int, ...] = (B * T,)
    else:
        dims = (T, B) if layout == "time-major" else (B, T)
    out = {
        "rewards": rng.standard_normal(dims).astype(dtype),
        "values": rng.standard_normal(dims).astype(dtype),
        "kw": {"gamma": GAMMA, "lam": LAM, "axis": 0 if layout == "time-major" else -1},
    }
    if flags == "dones":
        out["kw"]["dones"] = rng.random(dims) < 1e-3
    elif flags == "masks":
        out["kw"]["mask"] = rng.random(dims) < 0.9
    elif flags == "packed":
        cuts = np.sort(rng.integers(0, B * T + 1, size=B - 1))
        out["kw"]["cu_seqlens"] = np.concatenate([[0], cuts, [B * T]]).astype(np.int64)
    return out


def on_device(inputs: dict, backend: str) -> tuple:
    """``(rewards, values, kwargs, sync)`` for ``backend``: CuPy copies and a
    stream synchronisation for ``cuda``, the host arrays and a no-op otherwise."""
    r, v, kw = inputs["rewards"], inputs["values"], dict(inputs["kw"])
    if backend != "cuda":
        return r, v, kw, _nothing
    import cupy as cp

    kw = {k: (cp.asarray(x) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    return cp.asarray(r), cp.asarray(v), kw, cp.cuda.get_current_stream().synchronize


def _nothing() -> None:
    return None
