"""Tunables read by the backends on every call.

They exist so tests can shrink chunk sizes until short rows cross every
internal boundary, and so benchmarks can sweep them.  Results never depend on
them beyond floating-point association order (each setting is deterministic).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

DEFAULTS: dict[str, Any] = {
    # Chunk length of the NumPy-API chunk scan (the in-chunk scan is a Python
    # loop of this many vectorised steps, so it trades loop overhead against
    # the size of the carry pass).
    "numpy_chunk": 64,
    # Per-step decays (dones, masks, per-step gamma) scan chunks with C Python-level
    # steps; short chunks keep that loop cheap.  The effective length is
    # min(numpy_chunk, numpy_step_chunk).
    "numpy_step_chunk": 8,
    # Host arrays are processed in groups of rows of about this many elements,
    # so that the chunk scan's passes hit the cache rather than main memory.
    "numpy_block_elems": 1 << 20,
}

_local = threading.local()


def get(name: str) -> Any:
    """Return the current value of tunable ``name`` (thread-local overrides first)."""
    overrides = getattr(_local, "overrides", None)
    if overrides and name in overrides:
        return overrides[name]
    return DEFAULTS[name]


@contextlib.contextmanager
def override(**settings: Any) -> Iterator[None]:
    """Temporarily override tunables in the current thread.

    Examples
    --------
    >>> import gaescan._config as cfg
    >>> with cfg.override(numpy_chunk=4):
    ...     cfg.get("numpy_chunk")
    4
    """
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown tunable(s) {sorted(unknown)}; valid: {sorted(DEFAULTS)}")
    old = getattr(_local, "overrides", None)
    _local.overrides = {**(old or {}), **settings}
    try:
        yield
    finally:
        _local.overrides = old
