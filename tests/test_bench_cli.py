"""``gaescan bench`` / ``info`` / ``gpu-check``: the command line, its outputs
and its correctness checks, on tiny shapes.  No test looks at a timing."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gaescan.testing as gt
from gaescan.bench import cli, runner
from gaescan.bench.runner import check

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--shapes", "3x70,2x5", "--repeat", "1", "--no-progress"]
STATUSES = {"ok", "n/a"}


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch):
    """No pause between methods (in this process and in CLI subprocesses)."""
    monkeypatch.setattr(runner, "_SETTLE_S", 0.0)
    monkeypatch.setenv("GAESCAN_BENCH_SETTLE_S", "0")


def _bench(capsys, *args: str) -> tuple[int, str]:
    rc = cli.main(["bench", *TINY, *args])
    return rc, capsys.readouterr().out


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- the table and files


def test_table_json_csv(capsys, tmp_path):
    j, c = tmp_path / "b.json", tmp_path / "b.csv"
    rc, out = _bench(capsys, "--backends", "serial,chunk64,numpy,numba", "--json", str(j), "--csv", str(c))
    assert rc == 0, out
    for text in ("shape flags", "serial", "chunk64", "numpy", "numba", "3x70 none", "2x5 dones",
                 "vs serial", "GB/s", "x roofline", "methods:", "CPU triad"):
        assert text in out, text
    assert "WRONG" not in out and "error" not in out

    data = _load(j)
    recs = data["results"]
    # 2 shapes x 2 default flags (none, dones) x 4 methods.
    assert len(recs) == 16
    assert {r["method"] for r in recs} == {"serial", "chunk64", "numpy", "numba"}
    assert {r["flags"] for r in recs} == {"none", "dones"}
    assert {r["status"] for r in recs} <= STATUSES
    by = {(r["shape"], r["flags"], r["method"]): r for r in recs}
    # The published chunk-scan has no dones: its cell says so instead of a time.
    assert by["3x70", "dones", "chunk64"]["status"] == "n/a"
    for key in (("3x70", "none", "chunk64"), ("3x70", "dones", "numba"), ("2x5", "dones", "serial")):
        r = by[key]
        assert r["status"] == "ok", r
        assert len(r["times_s"]) == 1 and r["median_s"] is not None
        assert r["speedup"] is not None and r["gbps"] is not None and r["roofline_gbps"] is not None
        assert r["detail"].startswith("rel.err")
    # Bytes per step: 16 for float32 GAE without flags, 17 with dones.
    assert by["3x70", "none", "numba"]["bytes"] == 16 * 210
    assert by["3x70", "dones", "numba"]["bytes"] == 17 * 210
    assert data["meta"]["repeat"] == 1 and data["rooflines"]

    rows = list(csv.DictReader(c.open()))
    assert len(rows) == len(recs)
    assert [(r["shape"], r["flags"], r["method"], r["status"]) for r in rows] == \
        [(r["shape"], r["flags"], r["method"], r["status"]) for r in recs]
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(float(r["median_s"]) > 0 and float(r["gbps"]) > 0 for r in ok)


def test_flags_layouts_dtypes_all_checked(capsys, tmp_path):
    """Masks, packing, time-major and float64 reach every method and pass the check."""
    j = tmp_path / "b.json"
    rc, out = _bench(capsys, "--flags", "none,dones,masks,packed", "--layout", "batch-major,time-major",
                     "--dtype", "float32,float64", "--backends", "baselines,numpy,numba", "--json", str(j))
    assert rc == 0, out
    recs = _load(j)["results"]
    assert {r["status"] for r in recs} <= STATUSES
    by = {(r["shape"], r["dtype"], r["layout"], r["flags"], r["method"]): r for r in recs}
    for dt in ("float32", "float64"):
        for flags in ("none", "dones", "masks"):
            for layout in ("batch-major", "time-major"):
                for m in ("serial", "numpy", "numba"):
                    assert by["3x70", dt, layout, flags, m]["status"] == "ok"
        for m in ("numpy", "numba"):
            assert by["3x70", dt, "packed", "packed", m]["status"] == "ok"
        assert by["3x70", dt, "packed", "packed", "serial"]["status"] == "n/a"
    assert by["3x70", "float64", "batch-major", "masks", "numba"]["bytes_per_step"] == 33
    assert by["3x70", "float64", "batch-major", "none", "numba"]["bytes_per_step"] == 32
    assert "float64, time-major ([T, B], axis=0)" in out


# --------------------------------------------------------------------------- wrong methods


def _broken(case):
    """gaescan's numba backend, then one advantage nudged: a subtle bug."""
    fn = runner._gaescan("numba")(case)

    def run():
        adv, ret = fn()
        adv = adv.copy()
        adv.flat[adv.size // 2] += 0.5
        return adv, ret

    return run


def _raises(case):
    def run():
        raise RuntimeError("kaput")

    return run


def test_wrong_method_is_reported(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "EXTRA_METHODS", [
        runner.Method("broken", "numba with one wrong advantage", _broken),
        runner.Method("raises", "a method that raises", _raises),
    ])
    j = tmp_path / "b.json"
    rc, out = _bench(capsys, "--backends", "numba,broken,raises", "--json", str(j))
    assert rc == 1  # a wrong cell fails the run
    assert "WRONG[1]" in out
    assert "relative L2 error" in out
    assert "RuntimeError: kaput" in out
    recs = _load(j)["results"]
    for r in recs:
        want = {"numba": "ok", "broken": "wrong", "raises": "error"}[r["method"]]
        assert r["status"] == want, r
        if want != "ok":
            assert r["median_s"] is None and r["times_s"] == []  # a wrong cell is never timed


def test_check_catches_errors():
    want = np.linspace(1, 2, 1000).reshape(10, 100)
    assert check(want.astype(np.float32), want, np.float32)[0]
    bad = want.astype(np.float32)
    bad[3, 7] += 1e-2
    ok, why = check(bad, want, np.float32)
    assert not ok and "relative L2 error" in why
    bad[0, 0] = np.nan
    assert "non-finite" in check(bad, want, np.float32)[1]
    assert "shape" in check(want.T, want, np.float64)[1]
    # float64 outputs get the float64 tolerance.
    assert not check(want.astype(np.float32).astype(np.float64), want, np.float64)[0]


@pytest.mark.parametrize("flags", ["none", "dones", "masks", "packed"])
@pytest.mark.parametrize("layout", ["batch-major", "time-major"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reference_is_gaescan_testing(flags, layout, dtype):
    """The benchmark checks each cell against ``gaescan.testing.gae`` on the case's own arguments."""
    case = runner.Case(3, 41, dtype, layout, flags, seed=5).build()
    case.dones = None if case.dones is None else (np.random.default_rng(1).random(case.r.shape) < 0.1)
    adv, ret = case.reference()
    kw = dict(gamma=runner.GAMMA, lam=runner.LAM, dones=case.dones, mask=case.mask, cu_seqlens=case.cu,
              axis=case.axis)
    ea, er = gt.gae(case.r, case.v, **kw)
    np.testing.assert_array_equal(adv, ea)
    np.testing.assert_array_equal(ret, er)


def test_reference_layout_roundtrip():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((5, 9)).astype(np.float32)
    v = rng.standard_normal((5, 9)).astype(np.float32)
    a1, r1 = gt.gae(r, v, gamma=0.9, lam=0.8)
    a0, r0 = gt.gae(r.T, v.T, gamma=0.9, lam=0.8, axis=0)
    np.testing.assert_array_equal(a1, a0.T)
    np.testing.assert_array_equal(r1, r0.T)


# --------------------------------------------------------------------------- plot, options


def test_plot_writes_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "b.png"
    rc, out = _bench(capsys, "--backends", "serial,numba", "--plot", str(p))
    assert rc == 0, out
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args", [["--shapes", "12"], ["--shapes", "0x5"], ["--dtype", "float16"],
                                  ["--flags", "maybe"], ["--layout", "diagonal"]])
def test_bad_options_exit_2(args, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *args])
    assert e.value.code == 2


def test_unknown_backend(capsys):
    assert cli.main(["bench", *TINY, "--backends", "numba,nosuch"]) == 2
    assert "unknown method 'nosuch'" in capsys.readouterr().err


def test_cuda_requested_without_gpu_is_na(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "gpu_status", lambda: (False, "no GPU in this test"))
    j = tmp_path / "b.json"
    rc, out = _bench(capsys, "--backends", "numba,cuda", "--json", str(j))
    assert rc == 0
    cells = [r for r in _load(j)["results"] if r["method"] == "cuda"]
    assert cells and all(r["status"] == "n/a" and r["detail"] == "no GPU in this test" for r in cells)


def test_default_drops_cuda_without_gpu(monkeypatch):
    monkeypatch.setattr(runner, "gpu_status", lambda: (False, "no GPU in this test"))
    notes: list[str] = []
    names = [m.name for m in runner.select_methods(None, notes)]
    assert names == ["serial", "chunk64", "chunk128", "chunk256", "numpy", "numba"]
    assert notes == ["cuda: not run (no GPU in this test)"]


def test_shape_presets(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run", lambda cfg: seen.append(cfg) or {"results": []})
    monkeypatch.setattr("gaescan.bench.table.format_table", lambda result: "")
    cli.main(["bench"])
    cli.main(["bench", "--full"])
    cli.main(["bench", "--quick", "--shapes", "4x4"])
    assert list(seen[0].shapes) == list(runner.QUICK_SHAPES)
    assert list(seen[1].shapes) == list(runner.QUICK_SHAPES) + list(runner.PUBLISHED_SHAPES)
    assert (256, 131072) in seen[1].shapes and (128, 65536) in seen[1].shapes
    assert list(seen[2].shapes) == [(4, 4)]
    assert list(seen[0].flags) == ["none", "dones"] and seen[0].repeat >= 3


# --------------------------------------------------------------------------- info, gpu-check, entry points


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for text in ("versions:", "gaescan", "python", "numpy", "numba", "backends:", "cuda",
                 "CPUs:", "threading layer", "numba kernel cache:"):
        assert text in out, text
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["versions"]["gaescan"]
    assert data["backends"]["numba"] == "available"
    assert data["backends"]["cuda"].startswith(("available", "unavailable", "simulator"))
    assert data["cpu_count"] >= 1


def test_info_states_the_threading_layer_and_its_safety(capsys):
    from gaescan import _threading

    assert cli.main(["info", "--json"]) == 0
    nt = json.loads(capsys.readouterr().out)["numba_threading"]
    assert nt["active_layer"] in ("tbb", "omp", "workqueue")
    assert nt["active_layer"] == _threading.layer()
    assert nt["safety"] == _threading.safety(nt["active_layer"])
    assert cli.main(["info"]) == 0
    assert f"layer safety: {nt['safety']}" in capsys.readouterr().out


def _square(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * x[i]


def _tiny_kernels(monkeypatch):
    """Replace the kernel registry by one small kernel (fast to compile)."""
    from numba import types

    from gaescan.kernels import cpu

    monkeypatch.setattr(cpu, "_REGISTRY", [])
    monkeypatch.setattr(cpu, "_SIBLINGS", ())
    sigs = [types.void(types.Array(ft, 1, "A", readonly=True), types.Array(ft, 1, "A"))
            for ft in (types.float32, types.float64)]
    return cpu.Kernel(_square, sigs)


@pytest.mark.parametrize("tqdm", [True, False], ids=["tqdm", "plain"])
def test_warmup_compiles_every_build_with_progress(capsys, monkeypatch, tqdm):
    k = _tiny_kernels(monkeypatch)
    if not tqdm:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    assert cli.main(["warmup"]) == 0
    captured = capsys.readouterr()
    assert "compiled or loaded 2 kernel builds" in captured.out
    assert ("2/2" in captured.err) and ("_square" in captured.err or tqdm)
    assert k.compiled(np.float32) and k.compiled(np.float64)
    x = np.arange(3, dtype=np.float32)
    out = np.empty_like(x)
    k(x, out)
    assert np.array_equal(out, x * x)


def test_warmup_quiet(capsys, monkeypatch):
    _tiny_kernels(monkeypatch)
    assert cli.main(["warmup", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "2 kernel builds" in captured.out


def test_gpu_check_subcommand_forwards(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["gpu-check", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--no-bench" in out and "--check-budget" in out


@pytest.mark.parametrize("regs,smem,threads,blocks", [
    (111, 14112, 128, 4),  # the GAE look-back kernel on sm_90: registers decide
    (78, 14112, 128, 6),  # the same with shared steps
    (64, 14112, 128, 8),  # 64 registers: 8 blocks, as launch bounds (128, 8) ask
    (64, 40000, 128, 5),  # shared memory decides (each block also reserves 1 KiB)
    (16, 0, 128, 16),  # threads decide (2048 per SM)
    (16, 0, 32, 32),  # blocks per SM are capped
    (166, 0, 256, 1),  # prefetching's registers: one block of 256
    (255, 0, 1024, 0),  # does not fit at all
])
def test_blocks_per_sm(regs, smem, threads, blocks):
    from gaescan.bench.gpu_check import blocks_per_sm

    assert blocks_per_sm(regs, smem, threads) == blocks
    # The device's own limits replace the defaults (an sm_80: 164 KiB of shared memory per SM).
    a100 = {"sharedMemPerMultiprocessor": 167936, "maxThreadsPerMultiProcessor": 2048}
    assert blocks_per_sm(32, 40000, 128, a100) == 4


def test_sweep_reports_the_kernel_a_call_launched():
    from types import SimpleNamespace

    from gaescan.bench import gpu_check as gc

    ov = SimpleNamespace(regs_per_thread=78, shared_mem_per_block=14112, local_mem_per_thread=0)
    kernel = SimpleNamespace(overloads={"sig": ov})
    cb = SimpleNamespace()
    cb._typed = lambda *a, **k: kernel
    real = cb._typed
    assert gc._launched_kernel(cb, lambda: cb._typed("key", "args")) is kernel
    assert cb._typed is real  # the lookup is watched for that one call only
    assert gc._kernel_resources(kernel) == (78, 14112, 0)
    assert gc._launched_kernel(cb, lambda: None) is None  # no launch (e.g. the simulator)
    assert gc._kernel_resources(None) is None


def test_gpu_check_correctness_table():
    """The correctness checks are rows of one table: unique names, and arguments that build on the host."""
    import inspect

    import gaescan
    from gaescan.bench import gpu_check as gc

    cases = gc.correctness_cases(2**10)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) >= 80
    env = gc.Env(cp=np, gaescan=gaescan, torch=None, rng=np.random.default_rng(0), n_long=2**10)
    for c in cases:
        kw = c.kwargs(env) if c.kwargs is not None else {}
        inspect.signature(c.fn).bind(env, **kw)  # the arguments fit the function
        assert all(isinstance(k, str) for k in c.tun)
    # one row run end to end on the CPU: the check function compares with gaescan.testing
    row = gc.CheckCase("tiny", gc.gae_check, gc._gae((3, 40), mask=("flags", (3, 40), 0.7)))
    msg = gc.gae_check(env, **dict(row.kwargs(env), backend="numba"))
    assert msg.startswith("rel.err")
    with pytest.raises(AssertionError, match="masked position"):
        gc.compare(np.ones(3, np.float32), np.ones(3), np.float32, mask=np.array([1, 0, 1]))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


def test_module_entry_points():
    p = _run("-m", "gaescan", "--help")
    assert p.returncode == 0 and "bench" in p.stdout and "gpu-check" in p.stdout, p.stderr
    p = _run("-m", "gaescan.bench", "--help")
    assert p.returncode == 0 and "--flags" in p.stdout, p.stderr
    p = _run("-m", "gaescan.bench.gpu_check", "--help")
    assert p.returncode == 0 and "--no-bench" in p.stdout, p.stderr


def test_cpu_run_stays_off_the_gpu_stack():
    """``import gaescan`` does not load the bench; a CPU-only bench run never imports CuPy."""
    code = (
        "import sys, json\n"
        "import gaescan\n"
        "light = sorted(m for m in sys.modules if m.startswith('gaescan.bench'))\n"
        "from gaescan.bench import cli\n"
        "rc = cli.main(['bench', '--shapes', '2x8', '--repeat', '1', '--backends', 'serial,numba', '--no-progress'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'dask', 'numba_cuda')"
        " or m.startswith('numba.cuda'))\n"
        "print(json.dumps([rc, light, heavy]))\n"
    )
    p = _run("-c", code)
    assert p.returncode == 0, p.stderr
    rc, light, heavy = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0
    assert light == []
    assert heavy == []


_SIM_PROBE = '''
import json, time
from types import SimpleNamespace
import numpy as np
from gaescan.bench import runner

# A stand-in for the few CuPy calls the runner makes: host arrays (the CUDA
# simulator runs the kernels on them), perf_counter "events", a no-op memcpy.
class Ev:
    def record(self, stream=None):
        self.t = time.perf_counter()
    def synchronize(self):
        pass
class Stream:
    ptr = 0
    def synchronize(self):
        pass
class Buf:
    def __init__(self, n, dtype):
        self.data = SimpleNamespace(ptr=0)
fake = SimpleNamespace(
    asarray=np.array, empty_like=np.empty_like, uint8=np.uint8, empty=Buf,
    cuda=SimpleNamespace(Event=Ev, get_current_stream=Stream, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
                         runtime=SimpleNamespace(memcpyDeviceToDevice=3, memcpyAsync=lambda *a: None)))
runner._CUPY[:] = [fake]
runner.gpu_status = lambda: (True, "")
res = runner.run(runner.Config(shapes=[(2, 40)], flags=runner.FLAGS, layouts=runner.LAYOUTS,
                               methods=["cuda"], repeat=1))
print(json.dumps([(r["layout"], r["flags"], r["status"], r["detail"], r.get("roofline")) for r in res["results"]]))
'''


def test_cuda_column_in_the_simulator():
    """The cuda column's path (device copies, event timer, copy roofline, check)
    on Numba's CUDA simulator with a CuPy stand-in: no GPU needed."""
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed")
    p = subprocess.run([sys.executable, "-c", _SIM_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       check=False, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})
    assert p.returncode == 0, p.stderr
    cells = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(cells) == 7  # 3 flags x 2 layouts + packed once
    for layout, flags, status, detail, roof in cells:
        assert status == "ok", (layout, flags, detail)
        assert roof.startswith("GPU device-to-device copy")


def test_info_does_not_import_torch_or_dask():
    code = (
        "import sys, json, contextlib, io\n"
        "from gaescan.bench import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = cli.main(['info'])\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'dask'))]))\n"
    )
    p = _run("-c", code)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [0, []]
