"""gpu-check's timing helpers on a simulated GPU: kernel alone, end to end, host, copy.

:class:`FakeGPU` is a one-stream timeline with a host clock.  Work enqueued at
host time ``h`` starts at ``max(h, end of the work queued before it)``; an event
records when the stream reaches it; a synchronisation moves the host clock to
that time.  So the figures the helpers compute are known exactly, and the
host-bound case (the host queues the calls slower than the spin lasts) can be
made on purpose.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gaescan.bench import gpu_check as gc

CYCLES_PER_MS = 1.5e6  # the simulated SM clock
COPY_BYTES_PER_MS = 2e9  # the simulated copy: read and write, 2 bytes of traffic per byte copied


class FakeCupy(SimpleNamespace):
    """The fake ``cp``: hashable, like the CuPy module (gpu-check caches its spin kernel per module)."""

    __hash__ = object.__hash__


class FakeGPU:
    """A simulated CUDA stream and host clock, with the parts of CuPy's API that gpu-check's timing uses."""

    def __init__(self) -> None:
        self.host_ms = 0.0
        self.busy_until_ms = 0.0  # when the queued work ends
        self.spins: list[int] = []  # cycles of every spin launched
        self.kernels_built: list[tuple[str, str]] = []
        gpu = self

        class Event:
            def __init__(self) -> None:
                self.at_ms: float | None = None

            def record(self, stream: object = None) -> None:
                self.at_ms = max(gpu.host_ms, gpu.busy_until_ms)

            def synchronize(self) -> None:
                gpu.host_ms = max(gpu.host_ms, self.at_ms)

        class Stream:
            ptr = 7

            def synchronize(self) -> None:
                gpu.host_ms = max(gpu.host_ms, gpu.busy_until_ms)

        class RawKernel:
            def __init__(self, src: str, name: str) -> None:
                gpu.kernels_built.append((src, name))

            def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
                assert grid == (1,) and block == (1,)
                cycles = int(args[0])
                gpu.spins.append(cycles)
                gpu.enqueue(cycles / CYCLES_PER_MS)

        def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream_ptr: int) -> None:
            assert kind == "d2d" and stream_ptr == Stream.ptr
            gpu.host_ms += 0.002
            gpu.enqueue(2 * nbytes / COPY_BYTES_PER_MS)

        stream = Stream()
        self.cp = FakeCupy(
            uint8=np.uint8,
            float32=np.float32,
            RawKernel=RawKernel,
            asarray=np.asarray,
            empty=lambda shape, dtype: SimpleNamespace(data=SimpleNamespace(ptr=0)),
            get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
            cuda=SimpleNamespace(
                Event=Event,
                get_current_stream=lambda: stream,
                get_elapsed_time=lambda e0, e1: e1.at_ms - e0.at_ms,
                runtime=SimpleNamespace(memcpyAsync=memcpy_async, memcpyDeviceToDevice="d2d"),
            ),
        )

    def enqueue(self, ms: float) -> None:
        self.busy_until_ms = max(self.host_ms, self.busy_until_ms) + ms

    def clock(self) -> float:
        return self.host_ms / 1e3

    def call(self, host_ms: float, kernel_ms: float):
        """A library call: ``host_ms`` of Python, then one launch of ``kernel_ms`` of GPU work."""
        def f(*args, **kwargs) -> None:
            self.host_ms += host_ms
            self.enqueue(kernel_ms)
        return f

    def syncing_call(self, host_ms: float, kernel_ms: float):
        """A call that waits for the stream after its launch (a host synchronisation)."""
        launch = self.call(host_ms, kernel_ms)

        def f(*args, **kwargs) -> None:
            launch()
            self.host_ms = max(self.host_ms, self.busy_until_ms)
        return f


@pytest.fixture
def gpu(monkeypatch) -> FakeGPU:
    g = FakeGPU()
    monkeypatch.setattr(gc, "_host_clock", g.clock)
    monkeypatch.setattr(gc, "RESULTS", [])
    return g


def test_kernel_alone_holds_gpu_time_only(gpu):
    t = gc._kernel_alone(gpu.cp, gpu.call(host_ms=0.05, kernel_ms=0.3), calls=20)
    assert t.valid and t.tries == 1 and t.calls == 20
    assert t.ms == pytest.approx(0.3) and t.figure == pytest.approx(0.3)
    assert t.total_ms == pytest.approx(20 * 0.3)  # divided by the number of calls
    # The spin was sized from the warm-up calls' host time and covered the enqueueing.
    assert t.spin_ms == pytest.approx(max(gc.SPIN_MIN_MS, 2 * 20 * 0.05))
    assert t.host_ms == pytest.approx(20 * 0.05) and t.host_ms < t.spin_ms
    assert gpu.spins[0] == 0  # the compiling launch, before any timed span
    src, name = gpu.kernels_built[0]
    assert name == "gaescan_spin" and "clock64()" in src and src == gc.SPIN_KERNEL_SRC


def test_end_to_end_and_host_include_the_host(gpu):
    f = gpu.call(host_ms=0.05, kernel_ms=0.3)
    assert gc._events_ms(gpu.cp, f) == pytest.approx(0.35)
    assert gc._host_us(gpu.cp, f) == pytest.approx(50.0)


def test_spin_sized_from_the_host_time_of_slow_calls(gpu):
    # Host time per call far above SPIN_MIN_MS / calls: the spin grows with it.
    t = gc._kernel_alone(gpu.cp, gpu.call(host_ms=0.5, kernel_ms=0.1), calls=20)
    assert t.valid and t.tries == 1 and t.ms == pytest.approx(0.1)
    assert t.spin_ms == pytest.approx(2 * 20 * 0.5)
    assert gpu.spins[-1] == pytest.approx(20 * CYCLES_PER_MS, rel=1e-6)


def test_too_short_a_spin_is_doubled_once(gpu):
    # 20 calls take 1.6 ms of host time: a 1.5 ms spin is too short, a second one
    # lasting twice that host time is not.
    t = gc._kernel_alone(gpu.cp, gpu.call(host_ms=0.08, kernel_ms=0.2), calls=20, spin_ms=1.5)
    assert t.valid and t.tries == 2
    assert t.spin_ms == pytest.approx(2 * 20 * 0.08, rel=1e-3)
    assert t.ms == pytest.approx(0.2)


def test_a_far_too_short_spin_grows_to_twice_the_host_time(gpu):
    # The spin's calibration can be off several times over (an idle GPU clocks down):
    # 20 calls take 4 ms of host time behind a 0.5 ms spin; the second spin lasts 8 ms.
    t = gc._kernel_alone(gpu.cp, gpu.call(host_ms=0.2, kernel_ms=0.05), calls=20, spin_ms=0.5)
    assert t.valid and t.tries == 2
    assert t.spin_ms == pytest.approx(2 * 20 * 0.2, rel=1e-3)
    assert t.ms == pytest.approx(0.05)


def test_host_bound_is_reported_not_valid(gpu):
    # 20 calls take 400 ms of host time: neither a 1 ms spin nor the longest second
    # spin (SPIN_MAX_MS) covers it.  The events then span host gaps, so total / calls
    # would overstate the kernel.
    assert 20 * 20.0 > gc.SPIN_MAX_MS
    t = gc._kernel_alone(gpu.cp, gpu.call(host_ms=20.0, kernel_ms=0.05), calls=20, spin_ms=1.0)
    assert not t.valid and t.tries == 2
    assert t.ms is None and t.figure == gc.HOST_BOUND == "host-bound"
    assert t.total_ms / t.calls > 0.05 * 1.5
    assert "host-bound" in t.note() and "20 calls" in t.note()


def test_copy_is_timed_kernel_alone(gpu):
    n = 1 << 20
    t = gc._copy_timing(gpu.cp, n)
    assert t.valid
    assert t.ms == pytest.approx(2 * (17 * n // 2) / COPY_BYTES_PER_MS)


def test_timing_columns(gpu):
    n = 1 << 20
    copy_ms = 17 * n / COPY_BYTES_PER_MS
    row = gc._timing_columns(gpu.cp, gpu.call(host_ms=0.05, kernel_ms=4 * copy_ms), n, 17)
    assert row["kernel ms"] == pytest.approx(4 * copy_ms)
    assert row["gaescan ms"] == pytest.approx(4 * copy_ms + 0.05)  # end to end
    assert row["copy ms"] == pytest.approx(copy_ms)
    assert row["kernel x copy"] == pytest.approx(0.25)
    assert row["e2e x copy"] == pytest.approx(copy_ms / (4 * copy_ms + 0.05))
    assert row["kernel GB/s"] == pytest.approx(17 * n / (4 * copy_ms) / 1e6)
    assert row["copy GB/s"] == pytest.approx(17 * n / copy_ms / 1e6)
    assert row["GB/s"] == pytest.approx(17 * n / row["gaescan ms"] / 1e6)
    assert "kernel note" not in row and "copy note" not in row


def test_timing_columns_of_a_host_bound_call(gpu, monkeypatch):
    # Warm-up calls are cheap, the timed ones are not: the spin sized from the
    # warm-up falls short, and so does the longest second spin (20 calls of 20 ms of
    # host time each), and the row says so instead of giving a figure.
    n = 1 << 16
    calls = {"n": 0}
    cheap, dear = gpu.call(0.001, 0.01), gpu.call(20.0, 0.01)

    def f():
        calls["n"] += 1
        (cheap if calls["n"] <= 12 + 2 else dear)()  # _events_ms: 2 warm + 10; then 2 warm

    row = gc._timing_columns(gpu.cp, f, n, 17)
    assert row["kernel ms"] == "host-bound"
    assert "kernel GB/s" not in row and "kernel x copy" not in row
    assert row["kernel note"].startswith("host-bound")
    assert isinstance(row["copy ms"], float) and "e2e x copy" in row  # the copy and end to end stand
    assert gc._cell(row["kernel ms"]).strip() == "host-bound" and gc._cell(None).strip() == "-"


def test_pipeline_rows_give_both_figures_per_function(gpu, capsys):
    copy_ms = {fn: b * 64 * 16384 / COPY_BYTES_PER_MS for fn, b in gc.PIPELINE_BYTES.items()}
    fake = SimpleNamespace(gae=gpu.call(0.05, 3 * copy_ms["gae"]), vtrace=gpu.call(0.05, 2 * copy_ms["vtrace"]),
                           turn_gae=gpu.syncing_call(0.05, 0.01))
    gc.pipeline_bench(gpu.cp, fake, quick=True, budget=1e9)
    out = capsys.readouterr().out
    lines = {ln.split()[2]: ln.split() for ln in out.splitlines() if ln.startswith("B=64 T=16384")}
    assert set(lines) == {"gae", "vtrace", "turn_gae"}
    cols = {c: 3 + i for i, c in enumerate(gc.PIPELINE_COLS)}  # after the shape (two words) and function
    assert float(lines["gae"][cols["kernel x copy"]]) == pytest.approx(1 / 3, abs=1e-3)
    assert float(lines["vtrace"][cols["kernel x copy"]]) == pytest.approx(0.5, abs=1e-3)
    assert float(lines["vtrace"][cols["e2e x copy"]]) < 0.5
    assert lines["turn_gae"][cols["kernel ms"]] == "host-bound"  # its first call waits for the spin
    assert "kernel ms" in out and "e2e frac" in out  # the header explains the columns
    assert [r[0] for r in gc.RESULTS] == ["PASS"]
