"""Kept calls: the whole route of a repeated host call, planned once.

Training loops call :func:`gaescan.gae` with arrays of one structure, step
after step.  The first call of a structure takes the route (resolve, validate,
plan, backend: :mod:`gaescan._api`, :mod:`gaescan._dispatch`).  A backend that
can state what it did as a function of the call's arrays alone returns that
function, a *replay*, and the call is kept under a key of everything the
route's choices read: the function, the backend name, the axis, the scalar
arguments' values, and each array argument's dtype, shape and strides.  A
later call with the same key runs the replay: the same kernel build with the
same arguments, so the same bits, without the route's per-call Python work.

Only calls that need no per-call validation are kept: host NumPy arrays
(``numpy.ndarray`` itself, not a subclass), no ``out=``, no ``cu_seqlens``
(their offsets are values), no boundary values, and nonzero Python-float
coefficients (their range is checked once, by the route; a zero is left out
because ``-0.0 == 0.0`` as a key while their bits differ in the results).
A replay returns ``None`` when a backend setting it depends on has changed;
the call then takes the route, which keeps it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: A replay: the call's array arguments (in the order of :func:`gae_key`'s
#: arrays, ``term`` being ``dones`` or ``terminated``) to the call's outputs,
#: or ``None`` when it no longer applies.
Replay = Callable[..., Any]

#: The kept calls, by key.
KEPT: dict[tuple, Replay] = {}
KEPT_MAX = 128

_ND = np.ndarray


def gae_key(backend: Any, axis: Any, gamma: Any, lam: Any, rewards: Any, values: Any, next_values: Any,
            dones: Any, terminated: Any, truncated: Any, mask: Any) -> tuple | None:
    """The key of a :func:`gaescan.gae` call that may be kept, or ``None``
    (the caller has checked that ``out``, ``cu_seqlens``, ``last_value`` and
    ``last_advantage`` are absent)."""
    if (type(rewards) is not _ND or type(values) is not _ND or type(gamma) is not float
            or type(lam) is not float or not gamma or not lam or type(axis) is not int):
        return None
    key: tuple = ("gae", backend, axis, gamma, lam, rewards.dtype, rewards.shape, rewards.strides,
                  values.dtype, values.shape, values.strides)
    for x in (next_values, dones, terminated, truncated, mask):
        if x is None:
            key += (None,)
        elif type(x) is _ND:
            key += (x.dtype, x.shape, x.strides)
        else:
            return None
    return key


def keep(key: tuple, replay: Replay | None) -> None:
    """Keep ``replay`` under ``key`` (nothing when the backend offered none)."""
    if replay is None:
        return
    if len(KEPT) >= KEPT_MAX:
        KEPT.clear()
    KEPT[key] = replay


def clear() -> None:
    """Forget every kept call (tests that replace backend functions need the route)."""
    KEPT.clear()
