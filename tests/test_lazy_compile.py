"""Lazy compilation of the Numba CPU kernels.

A kernel compiles (or loads from Numba's disk cache) the one signature a call
needs, on that call; importing the kernel module compiles nothing; ``gaescan
warmup`` (``kernels.cpu.compile_all``) builds everything; the kernels run from
a read-only package directory.  Cold-cache cases run in a subprocess with
their own empty cache directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gaescan
from gaescan.kernels import cpu, cpu_vtrace

PKG = Path(gaescan.__file__).parent

_ONE_CALL = textwrap.dedent("""
    import json, sys
    import numpy as np
    import gaescan
    from gaescan.kernels import cpu
    before = [(k.__name__, str(dt), s, n) for k, dt, s, n in cpu.builds() if k.compiled(dt, s, n)]
    rng = np.random.default_rng(0)
    r = rng.standard_normal((4, 1000)).astype(np.float32)
    v = rng.standard_normal((4, 1000)).astype(np.float32)
    d = rng.random((4, 1000)) < 0.05
    adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    after = [(k.__name__, str(dt), s, n) for k, dt, s, n in cpu.builds() if k.compiled(dt, s, n)]
    np.save(sys.argv[1], np.stack([adv, ret]))
    print(json.dumps({"file": gaescan.__file__, "before": before, "after": after}))
""")


def _call_in_subprocess(tmp_path, env_extra, pythonpath=None):
    import json

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(env_extra)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = tmp_path / "out.npy"
    p = subprocess.run([sys.executable, "-c", _ONE_CALL, str(out)], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), np.load(out)


def _expected():
    import gaescan.testing as gt

    rng = np.random.default_rng(0)
    r = rng.standard_normal((4, 1000)).astype(np.float32)
    v = rng.standard_normal((4, 1000)).astype(np.float32)
    d = rng.random((4, 1000)) < 0.05
    return gt.gae(r, v, gamma=0.99, lam=0.95, dones=d)


def _close(got, want):
    import gaescan.testing as gt

    for g, w in zip(got, want, strict=True):
        gt.assert_close(g, w, dtype=np.float32)


def test_first_call_compiles_only_what_it_needs(tmp_path):
    info, res = _call_in_subprocess(tmp_path, {"NUMBA_CACHE_DIR": str(tmp_path / "cache")})
    assert info["before"] == []
    # one build: float32, float32 state (γλ = 0.99·0.95 is far from 1)
    assert len(info["after"]) == 1, info["after"]
    assert info["after"][0][1:] == ["float32", False, True], info["after"]
    assert any((tmp_path / "cache").rglob("*.nbi")), "nothing written to the disk cache"
    _close(res, _expected())


def test_read_only_package_directory(tmp_path):
    """Numba cannot cache next to read-only sources; it falls back to the
    user-wide cache directory and the kernels still run."""
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "gaescan", ignore=shutil.ignore_patterns("__pycache__"))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root writes through file modes: a plain file named __pycache__ in
        # every package directory makes the cache directories uncreatable
        for d in [site / "gaescan", *(site / "gaescan").rglob("*")]:
            if d.is_dir():
                (d / "__pycache__").write_text("")
    for p in [site, *site.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    xdg = tmp_path / "xdg"
    try:
        info, res = _call_in_subprocess(tmp_path, {"XDG_CACHE_HOME": str(xdg)}, pythonpath=site)
        assert info["file"].startswith(str(site)), info["file"]
        assert not any((site / "gaescan").rglob("*.nbi"))
        assert any(xdg.rglob("*.nbi")), "the user-wide cache directory was not used"
        _close(res, _expected())
    finally:
        for p in [site, *site.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_kernels_are_lazy_and_closed():
    assert cpu.all_kernels(), "no kernels registered"
    for k in cpu.all_kernels():
        assert isinstance(k, cpu.Kernel)
        # the kernels of eight float32 rows (or columns) in SIMD lanes are float32 only
        lanes = ("gae_lanes", "gae_packed_lanes", "gae_timemajor_lanes", "returns_lanes", "returns_timemajor_lanes",
                 "scan_lanes", "scan_timemajor_lanes", "vtrace_lanes", "vtrace_lanes_next", "vtrace_timemajor_lanes")
        # and the packed-pairs kernel float64 only (float32 packed calls take the lanes or the general kernel)
        want = ["float32"] if k.__name__ in lanes else ["float64"] if k.__name__ == "gae_packed_pairs" else [
            "float32", "float64"]
        assert sorted(str(d) for d in k.signatures) == want
    with pytest.raises(TypeError, match="float32 or float64"):
        cpu.scan_rows.compile(np.float16)
    with pytest.raises(TypeError, match="takes float32$"):
        cpu.gae_lanes.compile(np.float64)
    with pytest.raises(TypeError, match="takes float32$"):
        cpu.gae_timemajor_lanes.compile(np.float64)
    with pytest.raises(TypeError, match="takes float32$"):
        cpu_vtrace.vtrace_lanes.compile(np.float64)
    with pytest.raises(TypeError, match="takes float32$"):
        cpu_vtrace.vtrace_timemajor_lanes.compile(np.float64)


@pytest.mark.slow
def test_warmup_compiles_every_build():
    seen = []
    n = cpu.compile_all(lambda done, total, name: seen.append((done, total, name)))
    builds = list(cpu.builds())
    assert n == len(builds) == len(seen)
    assert [s[0] for s in seen] == list(range(1, n + 1))
    for k in cpu.all_kernels():
        for dt in k.signatures:
            assert k.compiled(dt)
            # each build is closed to one signature
            assert len(k._builds[np.dtype(dt), False].signatures) == 1
            if k.parallel:
                assert k.compiled(dt, serial=True)
        # a recurrence kernel's float32 also has float32-state builds, each its own dispatcher
        if not k.narrow:
            assert not k._narrow_builds, k.__name__
            continue
        assert k.compiled(np.float32, narrow=True) and not k.compiled(np.float64, narrow=True)
        assert len(k._narrow_builds[False].signatures) == 1
        assert k._narrow_builds[False] is not k._builds[np.dtype(np.float32), False]
        if k.parallel:
            assert k.compiled(np.float32, serial=True, narrow=True)
    # the statistics, V-trace and turn-level GAE kernels are among them, every variant of each
    names = {k.__name__ for k in cpu.all_kernels()}
    assert {"_moments", "_gn_sorted", "_normalize"} <= names, names
    assert any(n.startswith("vtrace") for n in names), names
    assert sum(n.startswith("_turn_gae_rows") for n in names) == 8, names
    names = [s[2] for s in seen]
    assert len(set(names)) == n, "two builds share a progress name"
    assert sum("f32-state" in name for name in names) == sum(
        2 if k.parallel else 1 for k in cpu.all_kernels() if k.narrow)
