"""``gaescan info``: what this installation can run, and why not.

Versions come from the installed distributions' metadata
(:mod:`importlib.metadata`), so that optional heavy packages (PyTorch, Dask)
are reported without being imported.  CuPy is imported only when one of its
distributions is installed, to ask the driver for devices.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

#: Distributions reported when installed: (label, distribution names tried in order).
OPTIONAL = (
    ("cupy", ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")),
    ("numba-cuda", ("numba-cuda",)),
    ("torch", ("torch",)),
    ("dask", ("dask",)),
    ("matplotlib", ("matplotlib",)),
    ("tqdm", ("tqdm",)),
    ("asv", ("asv",)),
)


def _version(*dists: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first installed one, else ``None``."""
    for d in dists:
        try:
            return d, importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """Versions of gaescan, Python, NumPy, Numba and the optional packages.

    Returns
    -------
    dict
        Label to version (``None`` when not installed); a CuPy entry names
        its wheel (``"13.3.0 (cupy-cuda12x)"``).
    """
    import gaescan

    out: dict[str, str | None] = {
        "gaescan": gaescan.__version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
    }
    for label in ("numpy", "numba"):
        v = _version(label)
        out[label] = v[1] if v else None
    for label, dists in OPTIONAL:
        v = _version(*dists)
        out[label] = None if v is None else (v[1] if v[0] == label else f"{v[1]} ({v[0]})")
    return out


def cuda_device() -> tuple[list[dict[str, Any]], str]:
    """CUDA devices seen by CuPy, or why there are none.

    Returns
    -------
    (list of dict, str)
        One dict per device (``name``, ``memory_gib``, ``free_gib``,
        ``compute_capability``), and an empty reason, or an empty list and why.
    """
    if _version("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy") is None:
        return [], "CuPy is not installed"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any driver/runtime failure means no device
        return [], f"CuPy sees no CUDA device ({type(exc).__name__}: {str(exc).strip()[:160]})"
    devices = []
    for i in range(n):
        try:
            p = cupy.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            with cupy.cuda.Device(i):
                free, total = cupy.cuda.runtime.memGetInfo()
            devices.append({"index": i, "name": name, "compute_capability": f"{p['major']}.{p['minor']}",
                            "memory_gib": round(total / 2**30, 1), "free_gib": round(free / 2**30, 1)})
        except Exception as exc:  # noqa: BLE001
            devices.append({"index": i, "error": f"{type(exc).__name__}: {exc}"})
    return devices, "" if devices else "CuPy sees no CUDA device"


def backends(devices: list[dict[str, Any]], no_device_reason: str) -> dict[str, str]:
    """Each backend: ``"available"`` or ``"unavailable: <why>"``."""
    from gaescan import _dispatch

    out = {}
    out["numba"] = ("available" if importlib.util.find_spec("numba") is not None
                    else "unavailable: numba is not installed (a required dependency: reinstall gaescan)")
    out["numpy"] = "available (NumPy arrays; CuPy arrays too when CuPy is installed)"
    missing = [d for d, dists in (("numba-cuda", ("numba-cuda",)),
                                  ("cupy", ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")))
               if _version(*dists) is None]
    if _dispatch.cuda_simulator():
        out["cuda"] = "simulator (NUMBA_ENABLE_CUDASIM=1: kernels run on the CPU, for tests only)"
    elif missing:
        out["cuda"] = (f"unavailable: {' and '.join(missing)} not installed "
                       "(pip install 'gaescan[cuda12]' or 'gaescan[cuda13]')")
    elif not devices:
        out["cuda"] = f"unavailable: {no_device_reason}"
    else:
        out["cuda"] = "available (CuPy arrays, PyTorch CUDA tensors, __cuda_array_interface__ arrays)"
    return out


def numba_threading() -> dict[str, Any]:
    """Numba's threads: the configured and the active threading layer, and
    what the active one is safe for (see :mod:`gaescan._threading`).

    The active layer is known only once Numba's thread pool has started, so
    this starts it the way gaescan's first parallel kernel does.
    """
    import numba

    from .. import _threading

    out: dict[str, Any] = {
        "configured_layer": numba.config.THREADING_LAYER,
        "threads": numba.config.NUMBA_NUM_THREADS,
    }
    try:
        out["active_layer"] = _threading.configure()
    except Exception as exc:  # noqa: BLE001
        out["active_layer"] = f"unknown ({type(exc).__name__}: {exc})"
    out["safety"] = _threading.safety(_threading.layer())
    return out


def kernel_cache() -> str:
    """Where Numba caches gaescan's compiled CPU kernels.

    Numba picks the first usable of: ``NUMBA_CACHE_DIR``, ``__pycache__`` next
    to the kernel sources (if writable), a per-user cache directory.  The
    kernel module itself is not imported (that would load every kernel).
    """
    spec = importlib.util.find_spec("gaescan.kernels.cpu")
    src = spec.origin if spec is not None else None
    if not src:
        return "unknown (gaescan.kernels.cpu not found)"
    try:
        from numba.core.caching import FunctionCache

        # Numba locates a cache from the function's source file: a stand-in
        # function "defined" in the kernel module finds the same directory.
        ns: dict[str, Any] = {}
        exec(compile("def _probe():\n    pass\n", src, "exec"), ns)  # noqa: S102 - a constant string
        return str(FunctionCache(ns["_probe"])._cache_path)
    except Exception as exc:  # noqa: BLE001 - Numba internals may move; say what we know
        where = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(src), "__pycache__")
        return f"{where} (probably; {type(exc).__name__}: {exc})"


def collect() -> dict[str, Any]:
    """Everything ``gaescan info`` prints, as a dict."""
    devices, why = cuda_device()
    return {
        "versions": versions(),
        "backends": backends(devices, why),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numba_threading": numba_threading(),
        "cuda_devices": devices,
        "numba_cache": kernel_cache(),
    }


def format_info(info: dict[str, Any]) -> str:
    """The text that ``gaescan info`` prints."""
    lines = ["versions:"]
    for k, v in info["versions"].items():
        lines.append(f"  {k:<11s} {v if v is not None else '(not installed)'}")
    lines.append("backends:")
    for k, v in info["backends"].items():
        lines.append(f"  {k:<11s} {v}")
    nt = info["numba_threading"]
    lines.append(f"platform:     {info['platform']}")
    cpus = f"{info['cpu_count']}"
    if info["cpu_affinity"] is not None and info["cpu_affinity"] != info["cpu_count"]:
        cpus += f" ({info['cpu_affinity']} usable by this process)"
    lines.append(f"CPUs:         {cpus}")
    lines.append(f"numba threads: {nt['threads']}, threading layer {nt['active_layer']} "
                 f"(configured: {nt['configured_layer']})")
    lines.append(f"  layer safety: {nt['safety']}")
    if info["cuda_devices"]:
        for d in info["cuda_devices"]:
            if "error" in d:
                lines.append(f"CUDA device {d['index']}: {d['error']}")
            else:
                lines.append(f"CUDA device {d['index']}: {d['name']} (cc {d['compute_capability']}, "
                             f"{d['memory_gib']} GiB, {d['free_gib']} GiB free)")
    else:
        lines.append("CUDA device: none")
    lines.append(f"numba kernel cache: {info['numba_cache']}")
    return "\n".join(lines)
