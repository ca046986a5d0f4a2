"""Backends: one module each, all exposing ``gae``, ``discounted_returns`` and
``linear_scan`` over the problems of :mod:`gaescan._problem`.

========= ================================ =====================================
name      module                           computes on
========= ================================ =====================================
numba     :mod:`gaescan.backends.numba_cpu`  NumPy arrays, Numba ``njit`` kernels
numpy     :mod:`gaescan.backends.numpy_chunk` NumPy or CuPy arrays, array-API chunk scan
cuda      :mod:`gaescan.backends.cuda`       GPU arrays, Numba ``cuda.jit`` kernels
========= ================================ =====================================
"""
