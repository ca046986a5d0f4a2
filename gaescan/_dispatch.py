"""Backend selection: which module computes a call.

Each backend is one module in :mod:`gaescan.backends` exposing the same three
functions (``gae``, ``discounted_returns``, ``linear_scan``) over the problems
of :mod:`gaescan._problem`.  Modules are imported on first use only, and a
backend never falls back to another one silently.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from ._arrays import Context

BACKENDS = ("auto", "numba", "numpy", "cuda")

_MODULES = {
    "numba": "gaescan.backends.numba_cpu",
    "numpy": "gaescan.backends.numpy_chunk",
    "cuda": "gaescan.backends.cuda",
}

_EXTRAS = {
    "numba": "pip install numba (a required dependency of gaescan: reinstall gaescan)",
    "numpy": "pip install numpy",
    "cuda": "pip install 'gaescan[cuda12]' or 'gaescan[cuda13]' (numba-cuda and the matching CuPy)",
}


def cuda_simulator() -> bool:
    """True when Numba's CUDA simulator is enabled (kernels then run on host arrays)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def choose(backend: str, ctx: Context) -> str:
    """Resolve ``backend`` (``"auto"`` or a name) for the call's arrays."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends are {', '.join(map(repr, BACKENDS))}")
    if backend == "auto":
        return "cuda" if ctx.on_device else "numba"
    if backend == "numba" and ctx.on_device:
        raise TypeError(
            "backend='numba' runs on the CPU and cannot read GPU arrays; "
            "use backend='cuda' (or 'auto'), or move the arrays to the host first"
        )
    if backend == "cuda" and not ctx.on_device and not cuda_simulator():
        raise TypeError(
            "backend='cuda' needs GPU arrays (CuPy, PyTorch CUDA tensors or any "
            "__cuda_array_interface__ array); move the data with cupy.asarray(...) "
            "or use backend='numba' for host arrays"
        )
    return backend


def load(name: str) -> ModuleType:
    """Import a backend module, naming the missing extra if it cannot be."""
    try:
        return importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise ImportError(f"the {name!r} backend is unavailable ({exc}); {_EXTRAS[name]}") from exc
