"""PyTorch CPU tensors: torch in, torch out, same numbers and dtype rule as NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, random_data, random_flags

import gaescan
import gaescan.testing as gt

torch = pytest.importorskip("torch")

CPU_BACKENDS = ["auto", "numba", "numpy"]


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def check_tensor(y, ref, dtype, device="cpu"):
    assert isinstance(y, torch.Tensor), type(y)
    assert y.device.type == device
    assert_close(y.numpy(), ref, dtype)


@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize(
    "dtype, expected",
    [
        (torch.float32, np.float32),
        (torch.float64, np.float64),
        (torch.float16, np.float32),
        (torch.bfloat16, np.float32),
    ],
    ids=["f32", "f64", "f16", "bf16"],
)
def test_gae_tensors(rng, name, dtype, expected):
    B, T = 4, 70
    r, v = torch.randn(B, T, dtype=torch.float64), torch.randn(B, T, dtype=torch.float64)
    r, v = r.to(dtype), v.to(dtype)
    d = t(random_flags(rng, (B, T), 0.1))
    m = t(rng.random((B, T)) < 0.8)
    res = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m, backend=name)
    assert isinstance(res, gaescan.GAEResult)
    ref_r, ref_v = r.to(torch.float64).numpy(), v.to(torch.float64).numpy()
    ref_adv, ref_ret = gt.gae(
        ref_r, ref_v, gamma=0.99, lam=0.95, dones=d.numpy(), mask=m.numpy()
    )
    check_tensor(res.advantages, ref_adv, expected)
    check_tensor(res.returns, ref_ret, expected)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_gae_tensor_flags_and_packing(rng, name):
    n = 200
    cu = t(np.array([0, 10, 10, 150, n], np.int64))
    r, v, nv = (t(random_data(rng, (n,))) for _ in range(3))
    term = t(random_flags(rng, (n,), 0.1, np.float32))
    trunc = t(random_flags(rng, (n,), 0.1, np.int32))
    res = gaescan.gae(
        r,
        v,
        gamma=0.9,
        lam=0.8,
        terminated=term,
        truncated=trunc,
        next_values=nv,
        cu_seqlens=cu,
        backend=name,
    )
    ref = gt.gae(
        r.numpy(),
        v.numpy(),
        gamma=0.9,
        lam=0.8,
        terminated=term.numpy(),
        truncated=trunc.numpy(),
        next_values=nv.numpy(),
        cu_seqlens=cu.numpy(),
    )
    check_tensor(res.advantages, ref[0], np.float32)
    check_tensor(res.returns, ref[1], np.float32)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_returns_and_scan_tensors(rng, name):
    r = t(random_data(rng, (3, 40)))
    d = t(rng.random((3, 40)) < 0.1)
    g = gaescan.discounted_returns(r, gamma=0.97, dones=d, last_value=t(random_data(rng, (3,))), backend=name)
    assert isinstance(g, torch.Tensor) and g.dtype == torch.float32
    a = t(rng.uniform(0.5, 1.0, (3, 40)).astype(np.float64))
    y = gaescan.linear_scan(a, r, reverse=True, backend=name)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    check_tensor(y, gt.linear_scan(a.numpy(), r.numpy(), reverse=True), np.float64)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_noncontiguous_and_time_major_tensors(rng, name):
    base = t(random_data(rng, (6, 80)))
    r = base[:, ::2]  # non-contiguous
    v = t(random_data(rng, (40, 6))).T  # transposed view
    res = gaescan.gae(r, v, gamma=0.9, lam=0.9, backend=name)
    ref = gt.gae(r.numpy(), v.numpy(), gamma=0.9, lam=0.9)
    check_tensor(res.advantages, ref[0], np.float32)
    res0 = gaescan.gae(r.T, v.T, gamma=0.9, lam=0.9, axis=0, backend=name)
    check_tensor(res0.advantages, ref[0].T, np.float32)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_out_tensors(rng, name):
    r, v = t(random_data(rng, (3, 30))), t(random_data(rng, (3, 30)))
    adv, ret = torch.full((3, 30), float("nan")), torch.full((3, 60), float("nan"))[:, ::2]
    res = gaescan.gae(r, v, gamma=0.9, lam=0.9, out=(adv, ret), backend=name)
    assert res.advantages is adv and res.returns is ret
    ref = gt.gae(r.numpy(), v.numpy(), gamma=0.9, lam=0.9)
    check_tensor(adv, ref[0], np.float32)
    check_tensor(ret, ref[1], np.float32)
    out = torch.empty(3, 30)
    assert gaescan.discounted_returns(r, gamma=0.9, out=out, backend=name) is out


def test_inputs_unchanged(rng):
    r, v = t(random_data(rng, (2, 20))), t(random_data(rng, (2, 20)))
    r0, v0 = r.clone(), v.clone()
    gaescan.gae(r, v, gamma=0.9, lam=0.9, mask=t(rng.random((2, 20)) < 0.5))
    assert torch.equal(r, r0) and torch.equal(v, v0)


def test_mixing_torch_and_numpy_is_type_error(rng):
    r = t(random_data(rng, (2, 5)))
    v = random_data(rng, (2, 5))
    with pytest.raises(TypeError, match="(?i)torch") as info:
        gaescan.gae(r, v, gamma=0.9, lam=0.9)
    assert "numpy" in str(info.value).lower()
    with pytest.raises(TypeError, match="(?i)torch"):
        gaescan.gae(v, r, gamma=0.9, lam=0.9)
    with pytest.raises(TypeError):
        gaescan.gae(r, r, gamma=0.9, lam=0.9, dones=np.zeros((2, 5), bool))
    with pytest.raises(TypeError):
        gaescan.linear_scan(np.full((2, 5), 0.5, np.float32), r)


def test_out_of_other_library_is_type_error(rng):
    r = t(random_data(rng, (2, 5)))
    with pytest.raises(TypeError):
        gaescan.discounted_returns(r, gamma=0.9, out=np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError):
        gaescan.discounted_returns(r.numpy(), gamma=0.9, out=torch.zeros(2, 5))
    with pytest.raises(TypeError):
        gaescan.gae(r, r, gamma=0.9, lam=0.9, out=(torch.zeros(2, 5), np.zeros((2, 5), np.float32)))


def test_out_overlapping_tensor_input(rng):
    r, v = t(random_data(rng, (2, 5))), t(random_data(rng, (2, 5)))
    with pytest.raises(ValueError):
        gaescan.gae(r, v, gamma=0.9, lam=0.9, out=(r, torch.zeros(2, 5)))


def test_zero_size_tensor():
    z = torch.zeros(3, 0, dtype=torch.float64)
    res = gaescan.gae(z, z, gamma=0.9, lam=0.9)
    assert isinstance(res.advantages, torch.Tensor) and res.advantages.shape == (3, 0)
    assert res.advantages.dtype == torch.float64
