"""Numba's threading layer: which one runs the parallel kernels, and where
they must not be entered.

Numba runs ``prange`` loops on one of three layers, chosen when the first
parallel kernel launches its thread pool:

* ``tbb`` (the optional ``tbb`` package): safe to enter from several threads
  at once and to use in a forked child;
* ``omp`` (OpenMP): safe from several threads at once; the GNU runtime
  (libgomp) cannot run in a child forked after the pool started, and Numba
  terminates such a child with "fork() called from a process already using
  GNU OpenMP";
* ``workqueue`` (Numba's own): one caller at a time; two threads entering it
  together terminate the process ("Concurrent access has been detected").

gaescan leaves the choice to Numba (its default order is tbb, omp,
workqueue; an explicit ``NUMBA_THREADING_LAYER`` is respected) and, where the
chosen layer is unsafe for a call, runs that call's kernel serially on the
calling thread instead (same results bit for bit):

* under ``workqueue``, calls from any thread other than the main thread;
* under GNU ``omp``, every call in a process forked after the pool started.

So every call is thread-safe and fork-safe under every layer.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_layer: str | None = None
_main_ident = threading.main_thread().ident
# Set by configure(): serial off the main thread (workqueue); serial
# everywhere (a child forked under GNU OpenMP).
_serial_off_main = False
_serial_all = False


def serial_here() -> bool:
    """Whether a parallel kernel must run serially on the calling thread."""
    if _serial_all:
        return True
    return _serial_off_main and threading.get_ident() != _main_ident


def _gnu_omp() -> bool:
    try:
        from numba.np.ufunc import omppool

        return str(getattr(omppool, "openmp_vendor", "")).upper() == "GNU"
    except ImportError:
        return False


def _after_fork_in_child() -> None:
    global _serial_all, _main_ident
    _main_ident = threading.get_ident()
    if _layer == "omp" and _gnu_omp():
        _serial_all = True


def configure() -> str:
    """Start Numba's thread pool (if not started) and record its layer.

    Called before gaescan's first parallel kernel runs.  The layer is Numba's
    choice (``NUMBA_THREADING_LAYER`` if the user set it, else Numba's default
    order); this function only records which one it is and, from it, which
    calls run serially (see the module docstring).

    Returns
    -------
    str
        ``"tbb"``, ``"omp"`` or ``"workqueue"``.
    """
    global _layer, _serial_off_main
    with _lock:
        if _layer is not None:
            return _layer
        import numba
        from numba.np.ufunc import parallel

        parallel._launch_threads()
        _layer = numba.threading_layer()
        _serial_off_main = _layer == "workqueue"
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        return _layer


def layer() -> str | None:
    """The layer gaescan's parallel kernels run on; ``None`` before the first
    parallel kernel (or :func:`configure`) has run."""
    return _layer


def safety(name: str | None) -> str:
    """A sentence saying what layer ``name`` is safe for and what gaescan does
    where it is not."""
    if name == "tbb":
        return "thread-safe and fork-safe"
    if name == "omp":
        if _gnu_omp():
            return ("thread-safe; GNU OpenMP is not fork-safe: in a process forked after the pool started "
                    "gaescan runs its kernels serially (other Numba parallel code there is terminated)")
        return "thread-safe and fork-safe"
    if name == "workqueue":
        return ("fork-safe; not thread-safe: gaescan runs calls from threads other than the main thread "
                "serially (install the 'tbb' extra for a thread-safe pool)")
    return "not started yet (the first parallel kernel chooses: tbb, omp or workqueue)"
