"""Array-library detection and zero-copy conversion.

Detection never imports a library: an object's library is read from the
module of its type, so ``import gaescan`` stays free of cupy, torch, dask and
numba.cuda.  Every call works in one *compute namespace* — ``numpy`` for host
arrays (NumPy, PyTorch CPU tensors, array-likes) or ``cupy`` for device arrays
(CuPy, PyTorch CUDA tensors, any ``__cuda_array_interface__`` object) — and
results are handed back in the caller's library.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

# Python and NumPy scalars: they take part in a call but pick no library.
SCALAR = "scalar"
# Concrete types first: isinstance against the numbers ABCs is slow on the hot path.
_SCALAR_TYPES = (float, int, bool, complex, np.generic, numbers.Number)


def _root_module(x: Any) -> str:
    return type(x).__module__.partition(".")[0]


def library_of(x: Any) -> str:
    """Name the array library of ``x`` without importing anything.

    Returns one of ``"numpy"``, ``"cupy"``, ``"torch"``, ``"dask"``,
    ``"cuda"`` (another ``__cuda_array_interface__`` producer) or
    ``"scalar"``.
    """
    if type(x) is np.ndarray:
        return "numpy"
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(
                "masked arrays (numpy.ma) are not supported: their mask would be ignored; pass "
                "x.filled(fill_value), or for gae and discounted_returns the data x.data with "
                "mask=~numpy.ma.getmaskarray(x)"
            )
        return "numpy"
    if isinstance(x, _SCALAR_TYPES):
        return SCALAR
    root = _root_module(x)
    if root in ("cupy", "torch", "dask"):
        return root
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    if isinstance(x, (list, tuple)) or hasattr(x, "__array__"):
        return "numpy"
    raise TypeError(
        f"unsupported argument of type {type(x).__module__}.{type(x).__qualname__}; "
        "pass a NumPy, CuPy or PyTorch array (or a Python scalar where a scalar is allowed)"
    )


def any_dask(*xs: Any) -> bool:
    """True if any argument is a Dask array (or a sequence of them, for ``out=``).

    Costs one dictionary lookup when Dask has not been imported: nobody can
    hold a Dask array then.
    """
    if "dask" not in sys.modules:
        return False
    for x in xs:
        if x is None:
            continue
        if type(x).__module__[:5] == "dask.":
            return True
        if isinstance(x, (list, tuple)) and any(type(y).__module__[:5] == "dask." for y in x):
            return True
    return False


def _device_of(x: Any, lib: str) -> str:
    if lib == "torch":
        return str(x.device)
    if lib == "cupy":
        return f"cuda:{x.device.id}"
    if lib == "cuda":
        return "cuda"
    return "cpu"


def _describe(lib: str, device: str) -> str:
    return f"{lib} ({device})" if lib in ("torch", "cupy") else lib


@dataclass(frozen=True)
class Context:
    """How one call maps the caller's arrays to the compute namespace and back.

    Attributes
    ----------
    library : str
        The caller's array library (``"numpy"``, ``"cupy"``, ``"torch"``,
        ``"cuda"``).
    on_device : bool
        True when the arrays live in GPU memory (compute namespace ``cupy``).
    """

    library: str
    on_device: bool
    exact: bool = False
    """Every argument is a NumPy ndarray (exactly), a Python scalar or ``None``:
    the compute views are the arguments themselves."""

    @property
    def xp(self) -> Any:
        if not self.on_device:
            return np
        return _import_cupy()

    def to_compute(self, x: Any) -> Any:
        """Return a zero-copy view of ``x`` in the compute namespace (scalars pass through)."""
        if x is None or (type(x) is np.ndarray and self.library == "numpy"):
            return x
        if library_of(x) == SCALAR:
            return x
        if self.library == "torch":
            if not self.on_device:
                x = x.detach()
                if str(x.dtype) == "torch.bfloat16":
                    # NumPy has no bfloat16: compute in float32, as for float16.
                    x = x.float()
                return x.resolve_conj().numpy()
            return self.xp.from_dlpack(x.detach())
        if self.on_device:
            return self.xp.asarray(x)
        return np.asarray(x)

    def from_compute(self, y: Any) -> Any:
        """Hand a result back in the caller's library (zero-copy)."""
        if self.library == "torch":
            import torch  # already imported by the caller, who passed tensors

            return torch.from_numpy(y) if not self.on_device else torch.from_dlpack(y)
        return y

    def stream(self) -> contextlib.AbstractContextManager[None]:
        """Make the caller's current stream CuPy's current stream for the call.

        PyTorch users launch on ``torch.cuda.current_stream()``; CuPy users
        already have CuPy's current stream.  Host calls need nothing (a shared
        null context).  While that stream captures a CUDA graph, the call's
        allocations are kept (see
        :func:`gaescan.backends._cuda_graphs.keeping_if_captured`).
        """
        if not self.on_device:
            return _HOST_STREAM
        return self._device_stream()

    @contextlib.contextmanager
    def _device_stream(self) -> Iterator[None]:
        cp = _import_cupy()
        from .backends._cuda_graphs import keeping_if_captured

        with contextlib.ExitStack() as stack:
            if self.library == "torch":
                import torch

                stack.enter_context(cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))
            stack.enter_context(keeping_if_captured(cp.cuda.get_current_stream().ptr))
            yield

    def call(self, named: Mapping[str, Any]) -> _Views:
        """The compute namespace and views of a call's arguments, on the caller's stream.

        A context manager: everything the call does inside, conversions and
        allocations included, runs on the caller's stream (see :meth:`stream`):
        work queued on another stream would not be ordered before the kernel
        (PyTorch's side streams are non-blocking).
        """
        return _Views(self, named)


_HOST_STREAM = contextlib.nullcontext()


class _Views:
    """:meth:`Context.call`'s context manager: enters the stream, then converts."""

    __slots__ = ("ctx", "named", "stream")

    def __init__(self, ctx: Context, named: Mapping[str, Any]):
        self.ctx, self.named = ctx, named

    def __enter__(self) -> tuple[Any, Mapping[str, Any]]:
        ctx = self.ctx
        self.stream = ctx.stream()
        self.stream.__enter__()
        try:
            if ctx.exact:
                return np, self.named
            return ctx.xp, {k: ctx.to_compute(x) for k, x in self.named.items()}
        except BaseException:
            self.stream.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> Any:
        return self.stream.__exit__(*exc)


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "device arrays need CuPy; install gaescan with the extra matching your CUDA "
            "toolkit: pip install 'gaescan[cuda12]' or 'gaescan[cuda13]'"
        ) from exc
    return cupy


_EXACT_NUMPY = Context("numpy", False, exact=True)
# The argument types of an exact call (see Context.exact).
_EXACT_TYPES = frozenset({np.ndarray, type(None), float, int, bool})


def _no_array() -> Context:
    raise TypeError("no array argument given: pass the data as an array, not only scalars")


F = TypeVar("F", bound=Callable[..., Any])

#: The public functions that take Dask arrays (lazily), as :func:`takes_dask` registers them.
DASK_FUNCTIONS: list[str] = []


def takes_dask(func: F) -> F:
    """Register a public function that routes Dask arrays to its Dask path
    (named in the error of every function that does not)."""
    DASK_FUNCTIONS.append(func.__name__)
    return func


def resolve(named: Mapping[str, Any], types: tuple | None = None) -> Context:
    """Find the single array library (and device) of a call's arguments.

    Parameters
    ----------
    named : mapping of str to object
        Every argument that may be an array, by parameter name (``None`` for
        absent ones).
    types : tuple of type, optional
        The types of ``named``'s values (in any order), when the caller has them.

    Raises
    ------
    TypeError
        When arrays of different libraries or devices are mixed, naming them.
    """
    if types is None:
        types = tuple(map(type, named.values()))
    if _EXACT_TYPES.issuperset(types):
        return _EXACT_NUMPY if np.ndarray in types else _no_array()
    seen: dict[str, str] = {}  # description -> first parameter name
    libs: set[str] = set()
    for name, x in named.items():
        if x is None:
            continue
        try:
            lib = library_of(x)
        except TypeError as exc:
            raise TypeError(f"{name!r}: {exc}") from None
        if lib == SCALAR:
            continue
        if lib == "torch":
            _check_tensor(x, name)
        desc = _describe(lib, _device_of(x, lib))
        seen.setdefault(desc, name)
        libs.add(lib)
    if len(seen) > 1:
        parts = ", ".join(f"{name!r} is {desc}" for desc, name in seen.items())
        raise TypeError(
            f"all arrays of one call must come from the same array library and device, but {parts}; "
            "convert them first (e.g. numpy.asarray, cupy.asarray or torch.as_tensor(..., device=...))"
        )
    if not libs:
        _no_array()
    (lib,) = libs
    if lib == "dask":
        # The functions with a Dask path route Dask arrays to it before they get
        # here; everything else needs in-memory arrays.
        names = ", ".join(f"gaescan.{n}" for n in DASK_FUNCTIONS)
        raise TypeError(
            f"this function needs in-memory arrays, not Dask arrays; {names} accept Dask arrays "
            "directly (lazily); for this one, compute them first (x.compute())"
        )
    if lib == "torch":
        (desc,) = seen
        return Context("torch", on_device="cpu" not in desc)
    return Context(lib, on_device=lib in ("cupy", "cuda"))


def _check_tensor(x: Any, name: str) -> None:
    """A PyTorch tensor a call can read: on the CPU or a CUDA device, outside autograd.

    The scans are not differentiable, so a result computed from a tensor that
    requires grad would silently leave the autograd graph: such a tensor is
    refused, and the caller detaches it explicitly.
    """
    device = getattr(x, "device", None)
    kind = getattr(device, "type", None)
    if kind not in ("cpu", "cuda"):
        raise TypeError(
            f"{name!r} is a PyTorch tensor on device {str(device)!r}; gaescan reads CPU and CUDA "
            "tensors (a 'meta' tensor holds no data): move it with .to('cpu') or .to('cuda')"
        )
    if getattr(x, "requires_grad", False):
        raise ValueError(
            f"{name!r} requires grad, but gaescan's scans are not differentiable: the result would "
            f"be cut from the autograd graph; pass {name}.detach() (advantages and returns are "
            "targets, computed without gradients)"
        )


def may_overlap(xp: Any, a: Any, b: Any) -> bool:
    """Whether two arrays may share memory (exact for NumPy when cheap, else conservative)."""
    if not xp.may_share_memory(a, b):
        return False
    if xp is np:
        try:
            return bool(np.shares_memory(a, b, max_work=10_000))
        except np.exceptions.TooHardError:  # pragma: no cover - pathological strides
            return True
    return True

