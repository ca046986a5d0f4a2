"""``import gaescan`` stays light: no GPU stack, no torch, no dask at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ["cupy", "numba.cuda", "numba_cuda", "torch", "dask"]

PROBE = """
import json, sys
import gaescan
print(json.dumps(sorted(m for m in sys.modules)))
"""


def _modules_after(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def loaded():
    return _modules_after(PROBE)


def test_probe_sees_gaescan(loaded):
    assert "gaescan" in loaded  # the probe itself works


@pytest.mark.parametrize("name", FORBIDDEN)
def test_no_eager_import(loaded, name):
    offenders = sorted(m for m in loaded if m == name or m.startswith(name + "."))
    assert not offenders, f"import gaescan imported {offenders}"


def test_public_api():
    import gaescan

    for name in ("gae", "discounted_returns", "linear_scan", "GAEResult"):
        assert callable(getattr(gaescan, name)), name
    assert isinstance(gaescan.__version__, str)


def test_numpy_call_does_not_import_gpu_stack():
    """A NumPy call on the default backend does not pull in cupy/torch/dask/numba.cuda."""
    code = PROBE.replace(
        "import gaescan\n",
        "import gaescan, numpy as np\n"
        "gaescan.gae(np.ones(5, np.float32), np.zeros(5, np.float32), gamma=0.9, lam=0.9)\n"
        "gaescan.discounted_returns(np.ones(5), gamma=0.9)\n"
        "gaescan.linear_scan(0.5, np.ones(5))\n",
    )
    loaded = _modules_after(code)
    offenders = sorted(m for m in loaded for f in FORBIDDEN if m == f or m.startswith(f + "."))
    assert not offenders, offenders
