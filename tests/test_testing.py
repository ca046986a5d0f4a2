"""``gaescan.testing``: tiny examples worked out on paper, checking the references and every backend.

The numbers are dyadic fractions (γ = λ = 1/2), so every value is exact in
float32 and float64 and the references must reproduce them bit for bit.

Worked example, T = 3, r = [1, 2, 3], V = [1, 1, 1], last_value = 2, γ = λ = 1/2:

    δ2 = 3 + ½·2 − 1 = 3          A2 = 3
    δ1 = 2 + ½·1 − 1 = 1.5        A1 = 1.5 + ¼·3    = 2.25
    δ0 = 1 + ½·1 − 1 = 0.5        A0 = 0.5 + ¼·2.25 = 1.0625
    R  = A + V = [2.0625, 3.25, 4]
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

import gaescan
import gaescan.testing as gt

F32, F64 = np.float32, np.float64
R = [1.0, 2.0, 3.0]
V = [1.0, 1.0, 1.0]
NAN = float("nan")


def a(x, dtype=F32):
    return np.array(x, dtype=dtype)


# (id, function, kwargs, expected) -- expected is the exact result (a tuple for gae).
GAE_CASES = [
    (
        "plain",
        dict(rewards=a(R), values=a(V), gamma=0.5, lam=0.5, last_value=2.0),
        ([1.0625, 2.25, 3.0], [2.0625, 3.25, 4.0]),
    ),
    (
        # dones[1]: δ1 = 2 − 1 = 1 (no bootstrap), A1 = 1 (cut); A0 = 0.5 + ¼·1
        "dones-terminate",
        dict(rewards=a(R), values=a(V), gamma=0.5, lam=0.5, last_value=2.0, dones=a([0, 1, 0], bool)),
        ([0.75, 1.0, 3.0], [1.75, 2.0, 4.0]),
    ),
    (
        # terminated[1] with next_values: V'_1 = 4 is *not* read
        "terminated-next-values",
        dict(
            rewards=a(R),
            values=a(V),
            gamma=0.5,
            lam=0.5,
            terminated=a([0, 1, 0], np.int8),
            next_values=a([1.0, 4.0, 2.0]),
        ),
        ([0.75, 1.0, 3.0], [1.75, 2.0, 4.0]),
    ),
    (
        # truncated[1]: δ1 = 2 + ½·4 − 1 = 3 bootstraps from V'_1 = 4, A1 = 3 (cut);
        # A0 = 0.5 + ¼·3 = 1.25
        "truncated-bootstraps",
        dict(
            rewards=a(R),
            values=a(V),
            gamma=0.5,
            lam=0.5,
            truncated=a([0.0, 1.0, 0.0]),
            next_values=a([1.0, 4.0, 2.0]),
        ),
        ([1.25, 3.0, 3.0], [2.25, 4.0, 4.0]),
    ),
    (
        # mask [1,0,1]: position 1 is skipped (its NaNs and its done are never read);
        # V'_0 = V_2 = 1, δ0 = 0.5, A0 = 0.5 + ¼·A2 = 1.25; output at t = 1 is 0
        "mask-skips",
        dict(
            rewards=a([1.0, NAN, 3.0]),
            values=a([1.0, NAN, 1.0]),
            gamma=0.5,
            lam=0.5,
            last_value=2.0,
            dones=a([0, 1, 0], bool),
            mask=a([1, 0, 1], bool),
        ),
        ([1.25, 0.0, 3.0], [2.25, 0.0, 4.0]),
    ),
    (
        # two rows with per-row γ: [[½], [1]], λ = 1, r = 1, V = 0, last_value 0
        # row 0: A1 = 1, A0 = 1 + ½;  row 1: A1 = 1, A0 = 2
        "per-row-gamma",
        dict(
            rewards=a([[1.0, 1.0], [1.0, 1.0]]),
            values=a([[0.0, 0.0], [0.0, 0.0]]),
            gamma=a([[0.5], [1.0]]),
            lam=1.0,
        ),
        ([[1.5, 1.0], [2.0, 1.0]], [[1.5, 1.0], [2.0, 1.0]]),
    ),
    (
        # the "plain" example time-major (axis=0) in two columns with
        # per-column last_value [2, 0].  Column 0 is "plain"; column 1:
        # δ2 = 3 − 1 = 2, A2 = 2, A1 = 1.5 + ¼·2 = 2, A0 = 0.5 + ¼·2 = 1
        "time-major",
        dict(
            rewards=a([R, R]).T,
            values=a([V, V]).T,
            gamma=0.5,
            lam=0.5,
            last_value=a([2.0, 0.0]),
            axis=0,
        ),
        (
            [[1.0625, 1.0], [2.25, 2.0], [3.0, 2.0]],
            [[2.0625, 2.0], [3.25, 3.0], [4.0, 3.0]],
        ),
    ),
    (
        # packed: segments [0,1) and [1,3) (and an empty one in between),
        # last_value per segment [4, 9, 2].  seg 0: δ = 1 + ½·4 − 1 = 2.
        # seg 2 = r [2, 3], V [1, 1], last 2: A2 = 3, A1 = (2 + ½ − 1) + ¼·3 = 2.25
        "cu-seqlens",
        dict(
            rewards=a(R),
            values=a(V),
            gamma=0.5,
            lam=0.5,
            cu_seqlens=np.array([0, 1, 1, 3]),
            last_value=a([4.0, 9.0, 2.0]),
        ),
        ([2.0, 2.25, 3.0], [3.0, 3.25, 4.0]),
    ),
]

RETURNS_CASES = [
    # G2 = 3 + ½·4 = 5, G1 = 2 + ½·5 = 4.5, G0 = 1 + ½·4.5 = 3.25
    ("plain", dict(rewards=a(R), gamma=0.5, last_value=4.0), [3.25, 4.5, 5.0]),
    ("done-cuts", dict(rewards=a(R), gamma=0.5, last_value=4.0, dones=a([1, 0, 0])), [1.0, 4.5, 5.0]),
    (
        "mask",
        dict(rewards=a([NAN, 2.0, 3.0]), gamma=0.5, last_value=4.0, mask=a([0, 1, 1], bool)),
        [0.0, 4.5, 5.0],
    ),
    (
        # seg [0,1): 1 + ½·10 = 6; empty seg; seg [1,3) with last 4: [4.5, 5]
        "cu-seqlens",
        dict(rewards=a(R), gamma=0.5, cu_seqlens=np.array([0, 1, 1, 3]), last_value=a([10.0, 20.0, 4.0])),
        [6.0, 4.5, 5.0],
    ),
    # per-step γ [1, 0, ½] with last 4: G2 = 3 + 2 = 5, G1 = 2 + 0 = 2, G0 = 1 + 2 = 3
    ("per-step-gamma", dict(rewards=a(R), gamma=a([1.0, 0.0, 0.5]), last_value=4.0), [3.0, 2.0, 5.0]),
]

SCAN_CASES = [
    # y0 = 2·1 + 1 = 3, y1 = 7, y2 = 15
    ("forward", dict(a=2.0, b=a([1.0, 1.0, 1.0]), initial=1.0), [3.0, 7.0, 15.0]),
    ("reverse", dict(a=2.0, b=a([1.0, 1.0, 1.0]), initial=1.0, reverse=True), [15.0, 7.0, 3.0]),
    # a = [1, −1, ½], b = [1, 2, 3]: y0 = 1, y1 = −1 + 2 = 1, y2 = ½ + 3 = 3.5
    ("per-step-a", dict(a=a([1.0, -1.0, 0.5]), b=a(R)), [1.0, 1.0, 3.5]),
    # reverse, a = ½, per-row initial [0, 8]:
    # row 0: y2 = 3, y1 = 2 + 1.5 = 3.5, y0 = 1 + 1.75 = 2.75; row 1 (init 8): y2 = 7, y1 = 5.5, y0 = 3.75
    (
        "reverse-per-row-initial",
        dict(a=0.5, b=a([R, R]), initial=a([0.0, 8.0]), reverse=True),
        [[2.75, 3.5, 3.0], [3.75, 5.5, 7.0]],
    ),
]


def _ids(cases):
    return [c[0] for c in cases]


# ---------------------------------------------------------------- the references


@pytest.fixture(params=["row-loop", "vector-loop"])
def loop(request, monkeypatch):
    """Run each reference case through both of the references' loops (plain Python rows, NumPy across rows)."""
    monkeypatch.setattr(gt, "_MIN_VECTOR_ROWS", 10**9 if request.param == "row-loop" else 1)
    return request.param


@pytest.mark.parametrize("name, kw, expected", GAE_CASES, ids=_ids(GAE_CASES))
def test_reference_gae_by_hand(name, kw, expected, loop):
    adv, ret = gt.gae(**kw)
    np.testing.assert_array_equal(adv, np.array(expected[0]))
    np.testing.assert_array_equal(ret, np.array(expected[1]))
    assert isinstance(adv, np.ndarray) and adv.dtype == ret.dtype == np.float64


@pytest.mark.parametrize("name, kw, expected", RETURNS_CASES, ids=_ids(RETURNS_CASES))
def test_reference_returns_by_hand(name, kw, expected, loop):
    np.testing.assert_array_equal(gt.discounted_returns(**kw), np.array(expected))


@pytest.mark.parametrize("name, kw, expected", SCAN_CASES, ids=_ids(SCAN_CASES))
def test_reference_scan_by_hand(name, kw, expected, loop):
    np.testing.assert_array_equal(gt.linear_scan(**kw), np.array(expected))


def test_reference_scan_zero_a_is_a_select(loop):
    # a_1 = 0: y_1 = b_1 exactly, so the NaN at t = 0 (forward) or the inf at t = 2 (reverse)
    # never crosses it; a multiply would give 0·NaN = NaN.
    a_ = a([0.5, 0.0, 0.5])
    fwd = gt.linear_scan(a_, a([NAN, 2.0, 4.0]))
    np.testing.assert_array_equal(fwd, [NAN, 2.0, 5.0])
    rev = gt.linear_scan(a_, a([4.0, 2.0, np.inf]), reverse=True)
    np.testing.assert_array_equal(rev, [5.0, 2.0, np.inf])
    # the initial value does not cross it either
    np.testing.assert_array_equal(gt.linear_scan(a([0.0, 1.0]), a([1.0, 1.0]), initial=np.inf), [1.0, 2.0])


def test_reference_nan_without_dones_stays_before_it(loop):
    # reverse scans: a NaN at t reaches t and earlier only; forward: t and later only
    r = np.ones((2, 9))
    r[:, 4] = np.nan
    adv, _ = gt.gae(r, np.zeros((2, 9)), gamma=0.9, lam=0.9)
    assert np.isnan(adv[:, :5]).all() and np.isfinite(adv[:, 5:]).all()
    g = gt.discounted_returns(r, gamma=0.9)
    assert np.isnan(g[:, :5]).all() and np.isfinite(g[:, 5:]).all()
    y = gt.linear_scan(0.9, r)
    assert np.isfinite(y[:, :4]).all() and np.isnan(y[:, 4:]).all()


def test_reference_masked_positions_never_read(loop):
    # NaN and inf everywhere the mask is false, flags set there too: no output changes.
    rng = np.random.default_rng(5)
    shape = (3, 40)
    r, v, nv = (rng.standard_normal(shape) for _ in range(3))
    m = rng.random(shape) < 0.6
    d = rng.random(shape) < 0.2
    kw = dict(gamma=0.9, lam=0.8, mask=m, dones=d)
    base = gt.gae(r, v, **kw)
    poisoned = [x.copy() for x in (r, v)]
    for x in poisoned:
        x[~m] = np.nan
    d2 = d | ~m
    got = gt.gae(*poisoned, **dict(kw, dones=d2))
    np.testing.assert_array_equal(got.advantages, base.advantages)
    np.testing.assert_array_equal(got.returns, base.returns)
    assert (base.advantages[~m] == 0).all() and (base.returns[~m] == 0).all()
    g = gt.discounted_returns(r, gamma=0.9, mask=m, dones=d)
    np.testing.assert_array_equal(gt.discounted_returns(poisoned[0], gamma=0.9, mask=m, dones=d2), g)


def test_reference_packed_equals_one_call_per_segment(loop):
    rng = np.random.default_rng(6)
    cu = np.array([0, 0, 1, 7, 7, 20, 33])
    N, S = cu[-1], len(cu) - 1
    r, v = rng.standard_normal(N).astype(F32), rng.standard_normal(N).astype(F32)
    d, m = rng.random(N) < 0.2, rng.random(N) < 0.8
    lv, la = rng.standard_normal(S).astype(F32), rng.standard_normal(S).astype(F32)
    adv, ret = gt.gae(r, v, gamma=0.9, lam=0.8, dones=d, mask=m, cu_seqlens=cu, last_value=lv, last_advantage=la)
    g = gt.discounted_returns(r, gamma=0.9, dones=d, mask=m, cu_seqlens=cu, last_value=lv)
    for s in range(S):
        sl = slice(cu[s], cu[s + 1])
        a1, r1 = gt.gae(r[sl], v[sl], gamma=0.9, lam=0.8, dones=d[sl], mask=m[sl], last_value=lv[s],
                        last_advantage=la[s])
        np.testing.assert_array_equal(adv[sl], a1)
        np.testing.assert_array_equal(ret[sl], r1)
        np.testing.assert_array_equal(g[sl], gt.discounted_returns(r[sl], gamma=0.9, dones=d[sl], mask=m[sl],
                                                                   last_value=lv[s]))


def test_reference_loops_agree():
    # The plain-Python row loop and the NumPy loop across rows: the same numbers, 3-D, both axes.
    rng = np.random.default_rng(7)
    for axis in (0, 1, -1):
        shape = (17, 5, 23)
        r, v, nv, lam_ = (rng.standard_normal(shape) for _ in range(4))
        kw = dict(gamma=0.97, lam=np.abs(lam_) / 4, terminated=rng.random(shape) < 0.1,
                  truncated=rng.random(shape) < 0.1, next_values=nv, mask=rng.random(shape) < 0.8, axis=axis)
        batch = tuple(n for i, n in enumerate(shape) if i != axis % 3)
        la = rng.standard_normal(batch)
        res = {}
        for lim in (1, 10**9):
            gt._MIN_VECTOR_ROWS, saved = lim, gt._MIN_VECTOR_ROWS
            try:
                res[lim] = (gt.gae(r, v, last_advantage=la, **kw),
                            gt.discounted_returns(r, gamma=kw["gamma"], dones=kw["terminated"], mask=kw["mask"],
                                                  last_value=la, axis=axis),
                            gt.linear_scan(lam_, r, initial=la, axis=axis, reverse=True))
            finally:
                gt._MIN_VECTOR_ROWS = saved
        (g1, d1, s1), (g2, d2, s2) = res[1], res[10**9]
        np.testing.assert_allclose(g1.advantages, g2.advantages, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(g1.returns, g2.returns, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(d1, d2, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(s1, s2, rtol=1e-14, atol=1e-14)


def test_reference_rounds_gamma_to_output_dtype():
    # One step, r = V = 0, last_value = 1: A_0 = γ exactly as the output dtype sees it.
    z16, z32, z64, i64 = (np.zeros(1, dt) for dt in (np.float16, F32, F64, np.int64))
    adv = {k: gt.gae(x, y, gamma=0.1, lam=1.0, last_value=1.0).advantages[0]
           for k, (x, y) in dict(f32=(z32, z32), f64=(z32, z64), f16=(z16, i64)).items()}
    assert adv["f32"] == adv["f16"] == float(np.float32(0.1)) != 0.1
    assert adv["f64"] == 0.1
    # scalars are weak, also NumPy float64 scalars
    assert gt.gae(z32, z32, gamma=np.float64(0.1), lam=1.0, last_value=1.0).advantages[0] == adv["f32"]
    assert gt.discounted_returns(z32, gamma=0.1, last_value=1.0)[0] == adv["f32"]
    assert gt.linear_scan(0.1, z64, initial=1.0)[0] == 0.1


def test_reference_nan_does_not_cross_done(loop):
    # A NaN value in the first episode (terminated at t = 1) stays there.
    r = np.array([1.0, 1.0, 1.0, 1.0])
    v = np.array([np.nan, 0.0, 0.0, 0.0])
    adv, _ = gt.gae(r, v, gamma=0.5, lam=0.5, dones=np.array([0, 1, 0, 0]))
    assert np.isnan(adv[0]) and np.all(np.isfinite(adv[1:]))


def test_reference_signatures_match_the_library():
    for name in ("gae", "discounted_returns", "linear_scan"):
        lib, ref = inspect.signature(getattr(gaescan, name)), inspect.signature(getattr(gt, name))
        assert list(lib.parameters) == list(ref.parameters), name
        for p in lib.parameters.values():
            assert ref.parameters[p.name].default == p.default and ref.parameters[p.name].kind == p.kind


def test_reference_accepts_torch_and_leaves_inputs_alone():
    torch = pytest.importorskip("torch")
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    v = torch.ones(1, 3, dtype=torch.float64)
    before = r.clone()
    adv, _ = gt.gae(r, v, gamma=0.5, lam=0.5, last_value=torch.tensor([2.0], dtype=torch.float64))
    np.testing.assert_array_equal(adv, [[1.0625, 2.25, 3.0]])
    assert torch.equal(r, before)
    gt.assert_close(torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), dtype=np.float32)


# ------------------------------------------------------------------- assert_close


def test_tolerance():
    assert gt.tolerance(np.float64) == 1e-12
    assert gt.tolerance(np.float32) == gt.tolerance("float16") == 2e-5


def test_assert_close_passes_and_returns_the_error():
    ref = np.array([3.0, 4.0])
    assert gt.assert_close(ref, ref) == 0.0
    assert gt.assert_close(np.zeros(2), np.zeros(2)) == 0.0
    err = gt.assert_close(np.array([3.0, 4.0 + 5e-5], F32), ref)
    assert 0 < err <= 2e-5
    # matching non-finite entries are excluded from the norm
    assert gt.assert_close(np.array([np.nan, np.inf, 4.0]), np.array([np.nan, np.inf, 4.0])) == 0.0


@pytest.mark.parametrize(
    "actual, desired, kw, message",
    [
        (np.array([3.0, 4.5]), np.array([3.0, 4.0]), {}, "relative L2 error 0.1 > 1e-12"),
        (np.array([3.0, 4.001], F32), np.array([3.0, 4.0]), {}, "> 2e-05 for float32"),
        (np.array([3.0, 4.0 + 1e-9]), np.array([3.0, 4.0]), {}, "> 1e-12 for float64"),
        (np.array([np.nan, 4.0]), np.array([3.0, 4.0]), {}, "non-finite entries differ"),
        (np.array([3.0, 4.0]), np.array([np.nan, 4.0]), {}, "non-finite entries differ"),
        (np.array([np.inf, 4.0]), np.array([-np.inf, 4.0]), {}, "differ in value"),
        (np.array([np.nan, 4.0]), np.array([np.inf, 4.0]), {}, "differ in value"),
        (np.zeros(3), np.zeros(2), {}, "shape"),
        (np.zeros(2, F32), np.zeros(2), dict(dtype=np.float64), "dtype float32 != float64"),
    ],
    ids=["f64-off", "f32-off", "f64-just-off", "nan-extra", "nan-missing", "inf-sign", "nan-vs-inf",
         "shape", "dtype"],
)
def test_assert_close_fails_when_it_should(actual, desired, kw, message):
    with pytest.raises(AssertionError, match=message.replace("(", r"\(").replace("+", r"\+")):
        gt.assert_close(actual, desired, **kw)


def test_import_gaescan_testing_imports_no_optional_dependency():
    code = ("import sys, gaescan, gaescan.testing; "
            "bad = [m for m in ('torch', 'cupy', 'dask', 'numba', 'numba.cuda') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


# ----------------------------------------------------------------- the library


def _close(actual, expected):
    assert isinstance(actual, np.ndarray)
    np.testing.assert_allclose(actual, np.array(expected), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name, kw, expected", GAE_CASES, ids=_ids(GAE_CASES))
@pytest.mark.cudasim
def test_library_gae_by_hand(backend, name, kw, expected):
    res = backend.gae(**kw)
    _close(res.advantages, expected[0])
    _close(res.returns, expected[1])
    assert res.advantages.dtype == np.float32


@pytest.mark.parametrize("name, kw, expected", RETURNS_CASES, ids=_ids(RETURNS_CASES))
@pytest.mark.cudasim
def test_library_returns_by_hand(backend, name, kw, expected):
    _close(backend.returns(**kw), expected)


@pytest.mark.parametrize("name, kw, expected", SCAN_CASES, ids=_ids(SCAN_CASES))
@pytest.mark.cudasim
def test_library_scan_by_hand(backend, name, kw, expected):
    _close(backend.scan(**kw), expected)
