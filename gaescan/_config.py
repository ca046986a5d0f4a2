"""Tunables read by the backends on every call.

They exist so tests can shrink chunk sizes until short rows cross every
internal boundary, and so benchmarks can sweep them.  Results never depend on
them beyond floating-point association order (each setting is deterministic).
Each backend with tunables owns one :class:`Tunables` table; this module holds
the table of the host backends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class Tunables:
    """A table of named settings with thread-local temporary overrides.

    Parameters
    ----------
    defaults : dict
        The settings and their default values (the dict itself is kept, so a
        module can expose it and benchmarks can change it globally).
    label : str
        How error messages name a setting.
    """

    def __init__(self, defaults: dict[str, Any], label: str = "tunable"):
        self.defaults = defaults
        self.label = label
        self._local = threading.local()

    def get(self, name: str) -> Any:
        """Return the current value of ``name`` (thread-local overrides first)."""
        overrides = getattr(self._local, "overrides", None)
        if overrides and name in overrides:
            return overrides[name]
        return self.defaults[name]

    @contextlib.contextmanager
    def override(self, **settings: Any) -> Iterator[None]:
        """Temporarily override settings in the current thread."""
        unknown = set(settings) - set(self.defaults)
        if unknown:
            raise ValueError(f"unknown {self.label}(s) {sorted(unknown)}; valid: {sorted(self.defaults)}")
        old = getattr(self._local, "overrides", None)
        self._local.overrides = {**(old or {}), **settings}
        try:
            yield
        finally:
            self._local.overrides = old


DEFAULTS: dict[str, Any] = {
    # Chunk length of the NumPy-API chunk scan's kernel matmul (constant decay).
    "numpy_chunk": 64,
    # Per-step decays (dones, masks, per-step gamma) scan chunks with C Python-level
    # steps; short chunks keep that loop cheap.  The effective length is
    # min(numpy_chunk, numpy_step_chunk).
    "numpy_step_chunk": 8,
    # Host arrays are processed in groups of rows of about this many elements,
    # so that the chunk scan's passes hit the cache rather than main memory.
    "numpy_block_elems": 1 << 20,
}

_host = Tunables(DEFAULTS)

#: Current value of a host tunable.
get = _host.get

#: Temporarily override host tunables in the current thread, e.g.
#: ``with gaescan._config.override(numpy_chunk=4): ...``.
override = _host.override
