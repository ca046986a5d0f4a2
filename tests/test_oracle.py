"""Tiny examples worked out on paper, checking the oracle itself and every backend.

The numbers are dyadic fractions (γ = λ = 1/2), so every value is exact in
float32 and float64 and the oracle must reproduce them bit for bit.

Worked example, T = 3, r = [1, 2, 3], V = [1, 1, 1], last_value = 2, γ = λ = 1/2:

    δ2 = 3 + ½·2 − 1 = 3          A2 = 3
    δ1 = 2 + ½·1 − 1 = 1.5        A1 = 1.5 + ¼·3    = 2.25
    δ0 = 1 + ½·1 − 1 = 0.5        A0 = 0.5 + ¼·2.25 = 1.0625
    R  = A + V = [2.0625, 3.25, 4]
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest

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


# ------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("name, kw, expected", GAE_CASES, ids=_ids(GAE_CASES))
def test_oracle_gae_by_hand(name, kw, expected):
    adv, ret = oracle.gae_ref(**kw)
    np.testing.assert_array_equal(adv, np.array(expected[0]))
    np.testing.assert_array_equal(ret, np.array(expected[1]))


@pytest.mark.parametrize("name, kw, expected", RETURNS_CASES, ids=_ids(RETURNS_CASES))
def test_oracle_returns_by_hand(name, kw, expected):
    np.testing.assert_array_equal(oracle.returns_ref(**kw), np.array(expected))


@pytest.mark.parametrize("name, kw, expected", SCAN_CASES, ids=_ids(SCAN_CASES))
def test_oracle_scan_by_hand(name, kw, expected):
    np.testing.assert_array_equal(oracle.scan_ref(**kw), np.array(expected))


def test_oracle_rounds_gamma_to_output_dtype():
    # One step, r = V = 0, last_value = 1: A_0 = γ exactly as the output dtype sees it.
    z32, z64 = np.zeros(1, np.float32), np.zeros(1, np.float64)
    adv32, _ = oracle.gae_ref(z32, z32, gamma=0.1, lam=1.0, last_value=1.0)
    adv64, _ = oracle.gae_ref(z64, z64, gamma=0.1, lam=1.0, last_value=1.0)
    assert adv32[0] == float(np.float32(0.1)) != 0.1
    assert adv64[0] == 0.1


def test_oracle_dtype_rule():
    f16, f32, f64, i64 = (np.zeros(2, d) for d in (np.float16, np.float32, np.float64, np.int64))
    assert oracle.result_dtype(f32, f32) == np.float32
    assert oracle.result_dtype(f16, i64, np.float64(0.5), 0.5) == np.float32  # scalars are weak
    assert oracle.result_dtype(f32, f64) == np.float64
    assert oracle.result_dtype(f32, None, f64) == np.float64


def test_oracle_nan_does_not_cross_done():
    # A NaN value in the first episode (terminated at t = 1) stays there.
    r = np.array([1.0, 1.0, 1.0, 1.0])
    v = np.array([np.nan, 0.0, 0.0, 0.0])
    adv, _ = oracle.gae_ref(r, v, gamma=0.5, lam=0.5, dones=np.array([0, 1, 0, 0]))
    assert np.isnan(adv[0]) and np.all(np.isfinite(adv[1:]))


def test_rel_l2_metric():
    ref = np.array([3.0, 4.0])
    assert oracle.rel_l2(ref, ref) == 0.0
    assert oracle.rel_l2(np.array([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert oracle.rel_l2(np.array([np.nan, 4.0]), ref) == np.inf
    assert oracle.rel_l2(np.array([np.nan, 4.0]), np.array([np.nan, 4.0])) == 0.0
    assert oracle.rel_l2(np.zeros(2), np.zeros(2)) == 0.0


# ----------------------------------------------------------------- the library


def _close(actual, expected):
    assert isinstance(actual, np.ndarray)
    np.testing.assert_allclose(actual, np.array(expected), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name, kw, expected", GAE_CASES, ids=_ids(GAE_CASES))
def test_library_gae_by_hand(backend, name, kw, expected):
    res = backend.gae(**kw)
    _close(res.advantages, expected[0])
    _close(res.returns, expected[1])
    assert res.advantages.dtype == np.float32


@pytest.mark.parametrize("name, kw, expected", RETURNS_CASES, ids=_ids(RETURNS_CASES))
def test_library_returns_by_hand(backend, name, kw, expected):
    _close(backend.returns(**kw), expected)


@pytest.mark.parametrize("name, kw, expected", SCAN_CASES, ids=_ids(SCAN_CASES))
def test_library_scan_by_hand(backend, name, kw, expected):
    _close(backend.scan(**kw), expected)
