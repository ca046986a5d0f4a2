"""``gaescan.gae`` over backend x dtype x shape x layout x flags.

``setup`` builds (cached) inputs, moves them to the GPU for ``cuda``,
allocates the ``out=`` buffers and makes one call, so that JIT compilation,
kernel-cache loading and CUDA module loading never land in a timing.  GPU
timings synchronise the stream inside the timed function: the GPU's work is
measured, not just the launch.
"""

from __future__ import annotations

import gaescan

from .common import BACKENDS, DTYPES, FLAGS, LAYOUTS, SHAPES, host_inputs, on_device, require


class GAE:
    params = (BACKENDS, DTYPES, SHAPES, LAYOUTS, FLAGS)
    param_names = ["backend", "dtype", "shape", "layout", "flags"]
    timeout = 300

    def setup(self, backend, dtype, shape, layout, flags):
        require(backend)
        inputs = host_inputs(shape, dtype, layout, flags)
        self.r, self.v, self.kw, self.sync = on_device(inputs, backend)
        self.kw["backend"] = backend
        # Preallocated outputs, as in a training loop that reuses its buffers.
        self.kw["out"] = (self.r.copy(), self.r.copy())
        gaescan.gae(self.r, self.v, **self.kw)  # warm: JIT / cache load / CUDA module load
        self.sync()

    def time_gae(self, backend, dtype, shape, layout, flags):
        gaescan.gae(self.r, self.v, **self.kw)
        self.sync()


class GAEPeakMem:
    """Peak resident memory of the process around one call (host backends).

    Only the largest shape: at the small ones the interpreter and the loaded
    kernels are all there is to see.  The ``cuda`` backend is left out: host
    RSS says nothing about device memory.
    """

    params = (["numba", "numpy"], DTYPES, SHAPES[1:], LAYOUTS, FLAGS)
    param_names = ["backend", "dtype", "shape", "layout", "flags"]
    timeout = 300

    def setup(self, backend, dtype, shape, layout, flags):
        inputs = host_inputs(shape, dtype, layout, flags)
        self.r, self.v, self.kw, _ = on_device(inputs, backend)
        self.kw["backend"] = backend
        gaescan.gae(self.r, self.v, **self.kw)

    def peakmem_gae(self, backend, dtype, shape, layout, flags):
        gaescan.gae(self.r, self.v, **self.kw)
