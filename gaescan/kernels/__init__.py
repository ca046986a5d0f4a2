"""Compiled kernels: ``cpu`` (Numba ``njit``) and ``cuda`` (Numba ``cuda.jit``).

Kernels are pure loops over raw ``(R, T)`` row arrays writing into outputs the
caller allocated; validation, casting and allocation live in the backend
modules of :mod:`gaescan.backends`.
"""
