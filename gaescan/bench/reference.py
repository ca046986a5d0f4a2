"""A float64 reference for the benchmark's cells, and the accuracy check.

The benchmark checks every timed result before it reports a time.  The
reference is a serial float64 loop written here (Numba ``njit``, cached on disk
so that only the first run on a machine pays for compiling it), independent of
gaescan's kernels: it is the SPEC's recurrence read literally, with ``gamma``
and ``lam`` first rounded to the output dtype as the SPEC's accuracy clause says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_KERNEL: list[Any] = []


def _kernel() -> Any:
    # Compiled on first use, not at import: ``gaescan bench --help`` and
    # ``gaescan info`` must not pay for Numba.
    if _KERNEL:
        return _KERNEL[0]
    from numba import njit

    @njit(cache=True, nogil=True)
    def gae_ref(r, v, g, gl, term, mask, lo, hi, adv, ret):  # pragma: no cover - jitted
        # One segment [lo[s], hi[s]) of the flattened rows per iteration;
        # masked steps are skipped (outputs 0, their inputs never read).
        for s in range(lo.shape[0]):
            a_next = 0.0
            v_next = 0.0
            for t in range(hi[s] - 1, lo[s] - 1, -1):
                if not mask[t]:
                    adv[t] = 0.0
                    ret[t] = 0.0
                    continue
                if term[t]:
                    a = r[t] - v[t]
                else:
                    a = r[t] + g * v_next - v[t] + gl * a_next
                adv[t] = a
                ret[t] = a + v[t]
                a_next = a
                v_next = v[t]

    _KERNEL.append(gae_ref)
    return gae_ref


def reference_gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float, *,
                  out_dtype: Any, dones: np.ndarray | None = None, mask: np.ndarray | None = None,
                  cu_seqlens: np.ndarray | None = None, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Float64 GAE on host arrays: ``(advantages, returns)`` in the input's layout.

    Parameters
    ----------
    rewards, values : numpy.ndarray
        2-D ``[B, T]`` (``axis=-1``) or ``[T, B]`` (``axis=0``), or 1-D packed
        with ``cu_seqlens``.
    gamma, lam : float
        Scalars; rounded to ``out_dtype`` first (SPEC, Accuracy).
    out_dtype : dtype
        The dtype of the result being checked.
    dones, mask : numpy.ndarray, optional
        Flags of the same shape (nonzero = true).
    cu_seqlens : numpy.ndarray, optional
        Packed segment offsets (1-D inputs only).
    axis : int
        The time axis of 2-D inputs.

    Returns
    -------
    tuple of numpy.ndarray
        float64 advantages and returns, the same shape as ``rewards``.
    """
    dt = np.dtype(out_dtype).type
    g = float(dt(gamma))
    gl = g * float(dt(lam))  # the float64 product of the rounded coefficients

    def rows(x: np.ndarray, kind: Any) -> np.ndarray:
        # Flatten to time-contiguous rows: [B, T] row-major, or the transpose of [T, B].
        x = np.asarray(x)
        if x.ndim == 2 and axis % 2 == 0:
            x = x.T
        return np.ascontiguousarray(x, dtype=kind).reshape(-1)

    shape = np.shape(rewards)
    r = rows(rewards, np.float64)
    v = rows(values, np.float64)
    n = r.size
    term = rows(dones, np.bool_) if dones is not None else np.zeros(n, np.bool_)
    m = rows(mask, np.bool_) if mask is not None else np.ones(n, np.bool_)
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens, np.int64)
        lo, hi = cu[:-1].copy(), cu[1:].copy()
    else:
        T = shape[-1] if len(shape) == 1 or axis % 2 == 1 else shape[0]
        R = n // max(T, 1)
        lo = np.arange(R, dtype=np.int64) * T
        hi = lo + T
    adv = np.zeros(n)
    ret = np.zeros(n)
    _kernel()(r, v, g, gl, term, m, lo, hi, adv, ret)

    def back(x: np.ndarray) -> np.ndarray:
        if len(shape) == 2 and axis % 2 == 0:
            return x.reshape(shape[1], shape[0]).T
        return x.reshape(shape)

    return back(adv), back(ret)


def tolerance(out_dtype: Any) -> float:
    """The SPEC's relative L2 error bound for an output dtype."""
    return 1e-12 if np.dtype(out_dtype) == np.float64 else 2e-5


def check(got: Any, want: np.ndarray, out_dtype: Any) -> tuple[bool, str]:
    """Compare a result with the reference.

    Parameters
    ----------
    got : array
        The method's output (NumPy, or CuPy with ``.get()``), in ``want``'s layout.
    want : numpy.ndarray
        The float64 reference.
    out_dtype : dtype
        The dtype the method was asked to produce (sets the tolerance).

    Returns
    -------
    (bool, str)
        Whether it is correct, and the relative L2 error or what is wrong.
    """
    if hasattr(got, "get") and not isinstance(got, np.ndarray):
        got = got.get()
    got = np.asarray(got)
    if got.shape != want.shape:
        return False, f"shape {got.shape} != {want.shape}"
    g = got.astype(np.float64)
    if not np.all(np.isfinite(g)):
        return False, f"{int(np.sum(~np.isfinite(g)))} non-finite outputs"
    err = float(np.linalg.norm(g - want)) / max(float(np.linalg.norm(want)), 1e-300)
    tol = tolerance(out_dtype)
    if not err <= tol:
        return False, f"relative L2 error {err:.2g} > {tol:g}"
    return True, f"rel.err {err:.1e}"
