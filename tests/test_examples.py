"""The scripts in ``examples/`` run and pass their own checks against a plain loop.

Each runs in a subprocess (as a user would run it); an example whose optional
dependency is missing is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# The documentation does not depend on the backend selection: run it once, in the
# CPU pass, not again in CI's pass under Numba's CUDA simulator.
pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"),
    reason="documentation checks run in the CPU pass (not under the CUDA simulator)",
)


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=EXAMPLES.parent,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "OK" in proc.stdout, proc.stdout
    return proc.stdout


def test_cartpole_gae() -> None:
    pytest.importorskip("gymnasium")
    out = run_example("cartpole_gae.py", "--steps", "128", "--envs", "3")
    assert "truncated by the time limit" in out


def test_rlhf_masked() -> None:
    out = run_example("rlhf_masked.py")
    assert "generated tokens" in out


def test_packed() -> None:
    out = run_example("packed.py")
    assert "cu_seqlens=[0, 37, 42, 42, 106, 118, 119, 142]" in out


def test_every_example_is_tested() -> None:
    tested = {"cartpole_gae.py", "rlhf_masked.py", "packed.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
