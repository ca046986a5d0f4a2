"""Compile every CUDA kernel specialisation the backend launches to PTX and assemble it.

No GPU is needed: ``cuda.compile_ptx`` (NVVM) targets sm_80 and sm_90, and
``ptxas -v`` reports registers, shared memory and local-memory spills per
kernel.  A spill fails the test.  Skipped when ``ptxas`` or the NVVM/NVRTC
libraries are missing, and under the simulator (which compiles nothing).

The argument types mirror :meth:`gaescan.backends.cuda._Launch.run`: every
array is typed with layout ``"A"`` (the backend compiles one specialisation
per dtype combination, whatever the strides).

Each distinct kernel (build parameters, argument types, launch bounds) is lowered
by Numba once per session, and NVVM and ``ptxas`` run on it once per CC: the
lowering does not depend on the CC (``test_shared_lowering_matches_a_separate_compile``
checks that), and it is most of a compile.  Tests that reach the same kernel share
its PTX and its ``ptxas`` report.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

pytestmark = pytest.mark.ptx

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip("the CUDA simulator is enabled: nothing is compiled", allow_module_level=True)

numba = pytest.importorskip("numba")
from numba import cuda, types  # noqa: E402


def _ptxas() -> str | None:
    found = shutil.which("ptxas")
    if found:
        return found
    for cand in sorted(glob.glob("/usr/local/cuda*/bin/ptxas"), reverse=True):
        if os.access(cand, os.X_OK):
            return cand
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", "ptxas"), os.X_OK):
        return os.path.join(home, "bin", "ptxas")
    return None


PTXAS = _ptxas()
CCS = [(8, 0), (9, 0)]


class _FakeDevice:
    """Numba compiles device functions for the *current device's* CC, even under
    ``compile_ptx``; there may be no device here, so each compile sees the target CC."""

    cc = CCS[-1]

    @property
    def compute_capability(self):
        return _FakeDevice.cc

    id = 0


@pytest.fixture(scope="module")
def toolchain():
    if PTXAS is None:
        pytest.skip("ptxas not found (install the CUDA toolkit or put ptxas on PATH)")
    import numba.cuda.dispatcher as disp

    saved = disp.get_current_device
    disp.get_current_device = lambda: _FakeDevice()
    try:
        @cuda.jit
        def probe(x):
            x[0] = 1.0

        try:
            cuda.compile_ptx(probe, (types.float32[::1],), cc=CCS[0])
        except Exception as exc:  # NVVM / NVRTC wheels absent, or no CUDA support at all
            pytest.skip(f"cannot compile PTX here ({type(exc).__name__}: {exc}); "
                        "install numba-cuda[cu12] or [cu13]")
        yield
    finally:
        disp.get_current_device = saved


def _arr(dt, nd):
    return types.Array(numba.from_dtype(np.dtype(dt)), nd, "A")


def _sig(kind, out, inp, flag, coeff=None):
    """The argument types of one launch (see the backend's ``_Launch.run``).

    Arrays are typed ``"A"``, as the backend types every launch.
    """
    from gaescan.kernels import cuda as kern

    o = numba.from_dtype(np.dtype(out))
    coeff = out if coeff is None else coeff
    d2, d1, b2 = _arr(out, 2), _arr(out, 1), _arr(np.bool_, 2)
    i64 = types.int64
    if kind in (kern.GAE_V, kern.GAE_NEXT):
        r, v = _arr(inp, 2), _arr(inp, 2)
        nv = _arr(inp, 2) if kind == kern.GAE_NEXT else d2
        term = trunc = mask = _arr(flag, 2)
        g = lm = _arr(coeff, 2)
        out2 = d2
    elif kind == kern.RET:
        r, v, nv = _arr(inp, 2), d2, d2
        term, trunc, mask = _arr(flag, 2), b2, _arr(flag, 2)
        g, lm, out2 = _arr(coeff, 2), d2, d2
    else:
        r, v, nv = _arr(inp, 2), d2, d2
        term = trunc = mask = b2
        g, lm, out2 = _arr(coeff, 2), d2, d2
    return (r, v, nv, term, trunc, mask, g, lm, d1, _arr(np.int64, 1), d2, out2,
            o, o, o, i64, i64, i64, i64, i64, i64, d1, _arr(np.int32, 1), _arr(np.uint64, 1))


def _cases():
    from gaescan.kernels import cuda as kern

    kinds = [("gae", kern.GAE_V, False), ("gae_next", kern.GAE_NEXT, False),
             ("returns", kern.RET, False), ("scan_rev", kern.SCAN, False), ("scan_fwd", kern.SCAN, True)]
    modes = [("rows", kern.MODE_ROWS), ("lookback", kern.MODE_LOOKBACK)]
    M, P = kern.OPT_MASK, kern.OPT_PACKED
    out = []
    # (name, kind, mode, fwd, out dtype, input dtype, flag dtype, coeff dtype, compile-time options)
    for kname, kind, fwd in kinds:
        for mname, mode in modes:
            for o, i in ((np.float32, np.float32), (np.float32, np.float16), (np.float64, np.float64)):
                out.append((f"{kname}-{mname}-{np.dtype(o).name}<-{np.dtype(i).name}",
                            kind, mode, fwd, o, i, np.bool_, None, 0))
            if kind != kern.SCAN:
                for cname, ct in (("mask", M), ("mask+packed", M | P)):
                    out.append((f"{kname}-{mname}-float32<-float32-{cname}",
                                kind, mode, fwd, np.float32, np.float32, np.bool_, None, ct))
    # Other flag dtypes (compared with 0 in their own dtype) and coefficient dtypes.
    for flag in (np.uint8, np.int64, np.float32):
        for mname, mode in modes:
            out.append((f"gae-{mname}-float32<-float32-mask-flags_{np.dtype(flag).name}",
                        kern.GAE_V, mode, False, np.float32, np.float32, flag, None, M))
    out.append(("gae-lookback-float64<-float32-coeff_f32", kern.GAE_V, kern.MODE_LOOKBACK, False,
                np.float64, np.float32, np.bool_, np.float32, 0))
    # turn_gae on the device: a masked float64 GAE over the turns' first tokens, and
    # float32 forward fills of float64 per-turn results.
    for mname, mode in modes:
        out.append((f"gae-{mname}-float64<-float64-mask", kern.GAE_V, mode, False,
                    np.float64, np.float64, np.bool_, None, M))
        out.append((f"scan_fwd-{mname}-float32<-float64", kern.SCAN, mode, True,
                    np.float32, np.float64, np.bool_, None, 0))
    # The compile-time variants: rows with the next tile prefetched, the fence-free look-back.
    PF, FL = kern.OPT_PREFETCH, kern.OPT_FASTLB
    for kname, kind, fwd in kinds:
        for i in (np.float32, np.float16):
            out.append((f"{kname}-rows-prefetch-float32<-{np.dtype(i).name}",
                        kind, kern.MODE_ROWS, fwd, np.float32, i, np.bool_, None, PF))
            out.append((f"{kname}-lookback-fast-float32<-{np.dtype(i).name}",
                        kind, kern.MODE_LOOKBACK, fwd, np.float32, i, np.bool_, None, FL))
    out.append(("gae-rows-prefetch-float64<-float64", kern.GAE_V, kern.MODE_ROWS, False,
                np.float64, np.float64, np.bool_, None, PF))
    out.append(("gae-rows-prefetch-float32<-float32-mask+packed", kern.GAE_V, kern.MODE_ROWS, False,
                np.float32, np.float32, np.bool_, None, PF | M | P))
    out.append(("gae-lookback-fast-float32<-float32-packed", kern.GAE_V, kern.MODE_LOOKBACK, False,
                np.float32, np.float32, np.bool_, None, FL | P))
    out.append(("returns-lookback-fast-float32<-float32-mask+packed", kern.RET, kern.MODE_LOOKBACK, False,
                np.float32, np.float32, np.bool_, None, FL | M | P))
    # 16-byte loads and stores (float32: v4, float64: v2) with the features that change
    # their code: forward time, next values, masks and packed rows, the prefetch, the
    # fast look-back.  (The backend's default kernels for GAE with dones are checked by
    # test_chosen_kernel_uses_16_byte_accesses and the sweep.)
    V = kern.OPT_VECTOR
    out += [("gae-rows-vector-float64<-float64", kern.GAE_V, kern.MODE_ROWS, False,
             np.float64, np.float64, np.bool_, None, V),
            ("scan_fwd-rows-vector-float32<-float32", kern.SCAN, kern.MODE_ROWS, True,
             np.float32, np.float32, np.bool_, None, V),
            ("gae-rows-vector-float32<-float32-mask+packed", kern.GAE_V, kern.MODE_ROWS, False,
             np.float32, np.float32, np.bool_, None, V | M | P),
            ("gae-rows-prefetch+vector-float32<-float32", kern.GAE_V, kern.MODE_ROWS, False,
             np.float32, np.float32, np.bool_, None, V | PF),
            ("gae_next-lookback-vector-float32<-float32", kern.GAE_NEXT, kern.MODE_LOOKBACK, False,
             np.float32, np.float32, np.bool_, None, V),
            ("returns-lookback-vector-float32<-float32-mask", kern.RET, kern.MODE_LOOKBACK, False,
             np.float32, np.float32, np.bool_, None, V | M),
            ("gae-lookback-fast+vector-float32<-float32", kern.GAE_V, kern.MODE_LOOKBACK, False,
             np.float32, np.float32, np.bool_, None, V | FL)]
    return out


CASES = _cases()
REPORT: list[str] = []
_BUILT: dict = {}  # private kernel builds per build key
_LOWERED: dict = {}  # Numba's code library per (build key, argument types, launch bounds)
_PTX: dict = {}  # PTX per (kernel key, CC)
_INFO: dict = {}  # ptxas -v report per (kernel key, CC)


def _kernel(kind, mode, fwd, out, nsh, k, ct):
    """The build key and a private build of one kernel (not the backend's kernel cache).

    Its device functions never reach a kernel launched on a real GPU.
    """
    from gaescan.kernels import cuda as kern

    key = (kind, mode, bool(fwd), np.dtype(out).str, int(nsh), int(k), int(ct) & kern.CT_BITS)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = kern._build(kind, mode, bool(fwd), np.dtype(out), int(nsh), int(k),
                                          int(ct) & kern.CT_BITS)
    return key, built


def _lower(py_func, sig, launch_bounds):
    """Numba's code library of one kernel, or None where this numba.cuda has no
    separate lowering step (each CC is then compiled by ``compile_ptx``)."""
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.cuda.compiler import _compile_pyfunc_with_fixup
    except ImportError:
        return None
    _FakeDevice.cc = CCS[-1]
    kw = {} if launch_bounds is None else {"launch_bounds": launch_bounds}
    with global_compiler_lock:
        lib, _ = _compile_pyfunc_with_fixup(py_func, sig, device=False, abi="numba", cc=CCS[-1], **kw)
    return lib


def _ptx(build, sig, cc, launch_bounds=None) -> tuple[tuple, str]:
    """The kernel key and the PTX of one kernel for ``cc``, lowered once for every CC."""
    bkey, k = build
    key = (bkey, sig, launch_bounds)
    if (key, cc) not in _PTX:
        if key not in _LOWERED:
            _LOWERED[key] = _lower(k.py_func, sig, launch_bounds)
        lib = _LOWERED[key]
        if lib is None:
            _FakeDevice.cc = cc
            kw = {} if launch_bounds is None else {"launch_bounds": launch_bounds}
            _PTX[key, cc] = cuda.compile_ptx(k.py_func, sig, cc=cc, **kw)[0]
        else:
            (_PTX[key, cc],) = lib.get_asm_strs(cc=cc)
        # The LLVM modules are large: keep the few most recent libraries (a test asks
        # for each CC of its kernel in turn); one dropped too early is lowered again.
        if all((key, c) in _PTX for c in CCS) or len(_LOWERED) > 4:
            _LOWERED.pop(key if all((key, c) in _PTX for c in CCS) else next(iter(_LOWERED)), None)
    return key, _PTX[key, cc]


def _report(build, sig, cc, launch_bounds=None) -> tuple[str, str]:
    """The PTX of one kernel for ``cc`` and ``ptxas -v``'s report on it (one run per kernel and CC)."""
    key, ptx = _ptx(build, sig, cc, launch_bounds)
    if (key, cc) not in _INFO:
        _INFO[key, cc] = _ptxas_info(ptx, cc)
    return ptx, _INFO[key, cc]


def _ptxas_info(ptx: str, cc) -> str:
    arch = f"sm_{cc[0]}{cc[1]}"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([PTXAS, "-v", f"-arch={arch}", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"ptxas failed for {arch}:\n{res.stderr[-3000:]}")
    return res.stderr


@pytest.mark.parametrize("cc", CCS, ids=lambda c: f"sm_{c[0]}{c[1]}")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_compiles_without_spills(toolchain, case, cc):
    _compile_and_check(case, cc)


def _compile_and_check(case, cc):
    from gaescan.backends import cuda as cb
    from gaescan.kernels import cuda as kern

    name, kind, mode, fwd, out, inp, flag, coeff, ct = case
    nsh = int(cb.TUNABLES["threads"])
    kk = int(cb.TUNABLES["k_f64" if np.dtype(out) == np.float64 else "k"])
    ptx, info = _report(_kernel(kind, mode, fwd, out, nsh, kk, ct), _sig(kind, out, inp, flag, coeff), cc)
    if mode == kern.MODE_ROWS:
        need, absent = ("bar.sync",), ("atom.global",)
    elif ct & kern.OPT_FASTLB:
        # Flags and values travel together in 64-bit atomics: no fence at all; a
        # fruitless polling round backs off.
        need, absent = ("bar.sync", "exch.b64", "vote.sync.ballot", "shfl.sync.idx", "nanosleep.u32"), \
            ("membar", "fence.")
    else:
        need, absent = ("bar.sync", "atom.global", "membar.gl"), ()
    if ct & kern.OPT_VECTOR:
        vec = "v4.f32" if np.dtype(out) == np.float32 else "v2.f64"
        need += (f"ld.global.nc.{vec}", f"st.global.{vec}")
    for op in need:
        assert op in ptx, f"{op} missing from the PTX of {name}"
    for op in absent:
        assert op not in ptx, f"{op} in the PTX of {name}"
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", info)]
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", info)]
    stores = [int(x) for x in re.findall(r"(\d+) bytes spill stores", info)]
    loads = [int(x) for x in re.findall(r"(\d+) bytes spill loads", info)]
    stack = [int(x) for x in re.findall(r"(\d+) bytes stack frame", info)]
    line = (f"sm_{cc[0]}{cc[1]}  {name:<52s} regs {max(regs, default=-1):3d}  smem {max(smem, default=0):6d} B"
            f"  stack {max(stack, default=0):4d} B  spill st/ld {sum(stores)}/{sum(loads)}")
    REPORT.append(line)
    print(line)
    assert regs, f"no register report from ptxas:\n{info}"
    assert sum(stores) == 0 and sum(loads) == 0, f"local-memory spills in {name}:\n{info}"
    return max(regs)


# The kernels the backend chooses for float32 GAE with dones on contiguous, 16-byte
# aligned arrays (fresh allocations): (label, B, T, tunables).  Many long rows take the
# row-resident driver, few the fast look-back; the general look-back serves the rest
# (float64, masked GAE).  The register budget is stated for 256-thread blocks.
CHOSEN = [("B=256 T=131072", 256, 131072, {}), ("B=4 T=2^22", 4, 2**22, {}),
          ("B=4 T=2^22 general look-back", 4, 2**22, {"fast_lookback": False})]


@pytest.mark.parametrize("label,B,T,settings", CHOSEN, ids=[c[0] for c in CHOSEN])
def test_chosen_kernel_uses_16_byte_accesses(toolchain, label, B, T, settings):
    # Each thread's K steps of rewards and values are read with 16-byte loads (two
    # per array at K=8), the staged outputs written with 16-byte stores, within the
    # register budget (at most 128 per thread: two blocks of 256 threads per SM) and
    # without spills.
    from gaescan.backends import cuda as cb
    from gaescan.kernels import cuda as kern

    with cb.override(**settings):
        p = cb.plan(B, T, np.float32, vector=True)
    assert p["opts"] & kern.OPT_VECTOR, p
    mode = kern.MODE_ROWS if p["mode"] == "rows" else kern.MODE_LOOKBACK
    K, threads = p["k"], p["threads"]
    bounds = cb.launch_bounds(threads, p["min_blocks_per_sm"])
    build = _kernel(kern.GAE_V, mode, False, np.float32, threads, K, p["opts"])
    sig = _sig(kern.GAE_V, np.float32, np.float32, np.bool_)
    cc = CCS[-1]
    ptx, info = _report(build, sig, cc, bounds)
    assert ptx.count("ld.global.nc.v4.f32") == 2 * (K // 4)
    assert ptx.count("st.global.v4.f32") == 2 * (K // 4)
    regs, smem, spills = _resources(info)
    loads = sum(int(x) for x in re.findall(r"(\d+) bytes spill loads", info))
    print(f"sm_90  {label}: {p['mode']} K={K} threads={threads} opts={p['opts']}: regs {regs}, "
          f"smem {smem} B, spill st/ld {spills}/{loads}")
    assert spills == 0 and loads == 0
    assert regs <= 128


def test_shared_lowering_matches_a_separate_compile(toolchain):
    # The other tests lower each kernel once and let NVVM translate it for every CC.
    # A build compiled from scratch for sm_80 (device functions included) gives the
    # same PTX, apart from the names Numba numbers per compile.
    from gaescan.kernels import cuda as kern

    def code(ptx):
        ptx = re.sub(r"_Z[\w$]+", "SYMBOL", ptx)
        ptx = re.sub(r"_cudapy_smem_\d+", "SMEM", ptx)
        return [line for line in ptx.splitlines() if not line.lstrip().startswith("//")]

    cc = CCS[0]
    args = (kern.GAE_V, kern.MODE_ROWS, False, np.float32, 128, 8, kern.OPT_MASK)
    sig = _sig(kern.GAE_V, np.float32, np.float32, np.bool_)
    _, shared = _ptx(_kernel(*args), sig, cc)
    _FakeDevice.cc = cc
    fresh = kern._build(*args[:3], np.dtype(np.float32), *args[4:])
    separate, _ = cuda.compile_ptx(fresh.py_func, sig, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in shared
    assert code(shared) == code(separate)


def _resources(info: str) -> tuple[int, int, int]:
    """Registers, shared memory and spill stores (bytes) that ``ptxas -v`` reports for a kernel."""
    regs = max(int(x) for x in re.findall(r"Used (\d+) registers", info))
    smem = max((int(x) for x in re.findall(r"(\d+) bytes smem", info)), default=0)
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", info))
    return regs, smem, spills


@pytest.mark.parametrize("min_blocks", [6, 8])
def test_launch_bounds_cap_registers(toolchain, min_blocks):
    # The "min_blocks_per_sm" tunable compiles with launch bounds (threads, min_blocks):
    # ptxas must then fit 65536 registers among min_blocks blocks of 128 threads.
    import inspect

    from gaescan.kernels import cuda as kern

    if "launch_bounds" not in inspect.signature(cuda.compile_ptx).parameters:
        pytest.skip("this numba.cuda has no launch bounds (numba-cuda, the cuda12/cuda13 extra, has)")
    cc = CCS[-1]
    build = _kernel(kern.GAE_V, kern.MODE_LOOKBACK, False, np.float32, 128, 8, 0)
    ptx, info = _report(build, _sig(kern.GAE_V, np.float32, np.float32, np.bool_), cc,
                        launch_bounds=(128, min_blocks))
    assert ".minnctapersm" in ptx
    regs, _, spills = _resources(info)
    print(f"sm_90  gae-lookback-float32 launch_bounds(128, {min_blocks}): regs {regs}, spill stores {spills} B")
    assert regs * 128 * min_blocks <= 65536


def test_gpu_check_access_probes_compile(toolchain):
    # gpu-check's elementwise probes: typed as the check launches them (CuPy views).
    from gaescan.bench import _probe

    cc = CCS[-1]
    _FakeDevice.cc = cc
    f32, b1 = types.Array(types.float32, 1, "C"), types.Array(types.boolean, 1, "C")
    for k in _probe._build(8):
        ptx, _ = cuda.compile_ptx(k.py_func, (f32, f32, b1, f32, f32, types.int64), cc=cc)
        info = _ptxas_info(ptx, cc)
        assert "Used" in info and "spill" in info


_PTX_SIZES = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4, "s32": 4, "b32": 4,
              "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}


def _ptx_param_layout(ptx: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of the PTX entry, laid out as a C struct."""
    head = ptx[ptx.index(".entry"):]
    head = head[: head.index(")")]
    out, off = [], 0
    for m in re.finditer(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+\S+?(?:\[(\d+)\])?\s*[,\n]", head + "\n"):
        align, kind, count = m.group(1), m.group(2), m.group(3)
        size = _PTX_SIZES[kind] * (int(count) if count else 1)
        a = int(align) if align else _PTX_SIZES[kind]
        off = -(-off // a) * a
        out.append((off, size))
        off += size
    return out


def _struct_layout(fmt: str) -> list[tuple[int, int]]:
    import struct

    out = []
    for i in range(1, len(fmt)):
        code = fmt[i]
        end = struct.calcsize(fmt[: i + 1])
        out.append((end - struct.calcsize("=" + code), struct.calcsize("=" + code)))
    return out


@pytest.mark.parametrize("out,mode", [(np.float32, "rows"), (np.float64, "lookback")])
def test_raw_launch_parameter_buffer_matches_the_kernel(toolchain, out, mode):
    # The "raw_launch" tunable packs the parameters itself: every one must sit at the
    # offset, and have the size, that the compiled kernel's entry declares.
    from gaescan.backends import cuda as cb
    from gaescan.kernels import cuda as kern

    cc = CCS[-1]
    _FakeDevice.cc = cc
    m = kern.MODE_ROWS if mode == "rows" else kern.MODE_LOOKBACK
    k = kern._build(kern.GAE_V, m, False, np.dtype(out), 128, 4, 0)
    sig = _sig(kern.GAE_V, out, np.float16, np.uint8)
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=cc)
    want = _ptx_param_layout(ptx)
    assert len(want) == 134
    assert _struct_layout(cb.param_format(sig)) == want


def _sweep_specs():
    # Each distinct kernel gpu-check's tunable sweep compiles (GAE float32 with dones,
    # contiguous, 16-byte aligned arrays, as fresh CuPy allocations are), with the
    # settings that ask for it.
    from gaescan.backends import cuda as cb
    from gaescan.bench.gpu_check import sweep_shapes

    specs: dict[tuple, list[str]] = {}
    for label, B, T, settings in sweep_shapes():
        for st in settings:
            with cb.override(**st):
                p = cb.plan(B, T, np.float32, vector=True)
            spec = (p["mode"], p["k"], p["opts"], p["threads"], p["min_blocks_per_sm"])
            specs.setdefault(spec, []).append(f"{label}: " + ",".join(f"{k}={v}" for k, v in st.items()))
    return specs


SWEEP_SPECS = _sweep_specs()


@pytest.mark.parametrize("spec", list(SWEEP_SPECS), ids=lambda s: "-".join(map(str, s)))
def test_every_swept_kernel_compiles_and_fits_its_launch(toolchain, spec):
    # The GPU session's sweep must not spend its minutes on a kernel that fails to
    # compile or to launch: every kernel it times is assembled here, for sm_90.
    import inspect

    from gaescan.backends import cuda as cb
    from gaescan.bench.gpu_check import blocks_per_sm
    from gaescan.kernels import cuda as kern

    mode_name, K, opts, threads, min_blocks = spec
    bounds = cb.launch_bounds(threads, min_blocks)
    kw = {}
    if bounds is not None:
        if "launch_bounds" not in inspect.signature(cuda.compile_ptx).parameters:
            pytest.skip("this numba.cuda has no launch bounds (numba-cuda, the cuda12/cuda13 extra, has)")
        kw["launch_bounds"] = bounds
    cc = CCS[-1]
    mode = kern.MODE_ROWS if mode_name == "rows" else kern.MODE_LOOKBACK
    build = _kernel(kern.GAE_V, mode, False, np.float32, threads, K, opts)
    sig = _sig(kern.GAE_V, np.float32, np.float32, np.bool_)
    _, info = _report(build, sig, cc, kw.get("launch_bounds"))
    regs, smem, spills = _resources(info)
    blocks = blocks_per_sm(regs, smem, threads)
    print(f"sm_90  sweep {spec}: regs {regs}, smem {smem} B, spill stores {spills} B, {blocks} blocks/SM"
          f"  <- {SWEEP_SPECS[spec][0]}")
    assert blocks >= max(min_blocks, 1), f"{spec}: {regs} registers, {smem} B shared: does not fit its launch"
    if bounds is None:
        # Only launch bounds (a setting's min_blocks_per_sm, or blocks of more than 256
        # threads) may trade spills for blocks: the sweep then times that trade.
        assert spills == 0, f"{spec} spills {spills} B ({SWEEP_SPECS[spec]})"


def test_too_much_shared_memory_is_reported_in_the_words_the_backend_looks_for(toolchain):
    # The backend turns a launch that fails for its static shared memory into a
    # ValueError naming the tunables; it recognises ptxas's message.
    from gaescan.backends import cuda as cb
    from gaescan.kernels import cuda as kern

    cc = CCS[-1]
    _FakeDevice.cc = cc
    k = kern._build(kern.GAE_V, kern.MODE_LOOKBACK, False, np.dtype(np.float32), 512, 8, 0)
    ptx, _ = cuda.compile_ptx(k.py_func, _sig(kern.GAE_V, np.float32, np.float32, np.bool_), cc=cc)
    with pytest.raises(AssertionError, match="ptxas failed") as e:
        _ptxas_info(ptx, cc)
    assert cb._SMEM_LIMIT in str(e.value)
