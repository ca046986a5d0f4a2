"""gaescan.group_normalize against the float64 reference, its edge rules and errors, and
the framework mappings of docs/recipes/outcome-advantages.md against loops written to
those frameworks' published semantics."""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pytest
from conftest import selected_backend_names
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gaescan
import gaescan.testing as gt

# The CPU backends; the CUDA backend has its own small cases (the simulator is slow).
BACKENDS = [b for b in selected_backend_names() if b in ("numba", "numpy")]
OPTIONS = [
    {},
    {"leave_one_out": True},
    {"scale": False},
    {"leave_one_out": True, "scale": False},
    {"ddof": 0},
    {"ddof": 0, "leave_one_out": True},
    {"eps": 0.0},
    {"eps": 0.5, "ddof": 2},
]


def _labels(rng, B, sizes=(1, 2, 3, 5, 8, 16)):
    """Shuffled, non-contiguous, large and negative labels of unequal group sizes."""
    out, g = [], 0
    while len(out) < B:
        n = int(rng.choice(sizes))
        out += [int(rng.integers(-(10**12), 10**12)) if g % 3 else g * 7919 - 50] * n
        g += 1
    labels = np.array(out[:B], dtype=np.int64)
    return labels[rng.permutation(B)]


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "grpo")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_against_reference(be, opts, dtype):
    rng = np.random.default_rng(len(str(opts)) * 7 + np.dtype(dtype).itemsize)
    B = 257
    s = rng.standard_normal(B).astype(dtype)
    labels = _labels(rng, B)
    kw = dict(groups=labels, **opts)
    got = gaescan.group_normalize(s, backend=be, **kw)
    assert got.dtype == dtype and got.shape == (B,)
    gt.assert_close(got, gt.group_normalize(s, **kw), dtype=dtype)


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("opts", OPTIONS[:6], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "grpo")
@pytest.mark.parametrize("n", [1, 2, 3, 16])
def test_group_size_against_reference(be, opts, n):
    rng = np.random.default_rng(n)
    s = rng.standard_normal(48).astype(np.float32)
    got = gaescan.group_normalize(s, group_size=n, backend=be, **opts)
    gt.assert_close(got, gt.group_normalize(s, group_size=n, **opts), dtype=np.float32)
    # group_size=n is labels i // n
    same = gaescan.group_normalize(s, groups=np.arange(48) // n, backend=be, **opts)
    np.testing.assert_allclose(got, same, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("opts", [{}, {"leave_one_out": True, "scale": False}])
def test_large_mean_float32(be, opts):
    """Centred statistics: float32 scores 1e4 + N(0, 1) keep the contract's tolerance."""
    rng = np.random.default_rng(3)
    B = 4096
    s = (1e4 + rng.standard_normal(B)).astype(np.float32)
    labels = rng.permutation(np.repeat(np.arange(256), 16))
    got = gaescan.group_normalize(s, groups=labels, backend=be, **opts)
    gt.assert_close(got, gt.group_normalize(s, groups=labels, **opts), dtype=np.float32)


@pytest.mark.parametrize("be", BACKENDS)
def test_input_dtypes(be):
    s16 = np.array([1, 2, 3, 4, 6, 6], dtype=np.float16)
    for s in (s16, s16.astype(np.int32), s16 > 2):
        got = gaescan.group_normalize(s, group_size=3, backend=be)
        assert got.dtype == np.float32
        gt.assert_close(got, gt.group_normalize(s, group_size=3), dtype=np.float32)
    for lab in (np.array([1, 1, 1, 2, 2, 2], np.uint8), np.array([1, 1, 1, 2, 2, 2], np.int16)):
        got = gaescan.group_normalize(s16, groups=lab, backend=be)
        gt.assert_close(got, gt.group_normalize(s16, group_size=3), dtype=np.float32)


@pytest.mark.parametrize("be", BACKENDS)
def test_single_member_and_small_groups(be):
    s = np.array([5.0, 1.0, 3.0, -2.0, 7.0])
    labels = np.array([0, 1, 1, 2, 3])
    # n == 1: the score itself, for every option
    for opts in OPTIONS:
        got = gaescan.group_normalize(s, groups=labels, backend=be, **opts)
        assert got[0] == 5.0 and got[3] == -2.0 and got[4] == 7.0
    # n <= ddof with scale: the score itself; without scale ddof plays no part
    got = gaescan.group_normalize(s, groups=labels, ddof=2, backend=be)
    np.testing.assert_array_equal(got, s)
    got = gaescan.group_normalize(s, groups=labels, ddof=2, scale=False, backend=be)
    np.testing.assert_array_equal(got, [5.0, -1.0, 1.0, -2.0, 7.0])
    # a group of equal scores: zero advantages (0 / eps), never NaN
    got = gaescan.group_normalize(np.full(4, 0.7), group_size=4, backend=be)
    np.testing.assert_array_equal(got, np.zeros(4))


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equal_scores_with_eps_zero(be, dtype):
    # σ + eps = 0: the contract's 0/0 is NaN in that group only, as in the reference,
    # with no exception and no warning; the other groups are untouched.
    s = np.array([0.75, 0.75, 0.75, 1.0, 2.0, 4.0], dtype)
    labels = np.array([3, 3, 3, 8, 8, 8])
    for opts in ({"ddof": 0}, {"ddof": 1}, {"ddof": 2}, {"leave_one_out": True}):
        want = gt.group_normalize(s, groups=labels, eps=0.0, **opts)
        assert np.isnan(want[:3]).all() and np.isfinite(want[3:]).all()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = gaescan.group_normalize(s, groups=labels, eps=0.0, backend=be, **opts)
            fixed = gaescan.group_normalize(s, group_size=3, eps=0.0, backend=be, **opts)
        for g in (got, fixed):
            assert np.isnan(g[:3]).all()
            gt.assert_close(g[3:], want[3:], dtype=dtype)


@pytest.mark.parametrize("be", BACKENDS)
def test_nan_stays_in_group(be):
    rng = np.random.default_rng(5)
    s = rng.standard_normal(40)
    labels = _labels(rng, 40, sizes=(3, 4, 5))
    bad = int(np.flatnonzero(np.bincount(np.unique(labels, return_inverse=True)[1]) > 1)[0])
    group = np.unique(labels, return_inverse=True)[1] == bad
    for poison in (np.nan, np.inf):
        s2 = s.copy()
        s2[np.flatnonzero(group)[0]] = poison
        for opts in ({}, {"leave_one_out": True, "scale": False}):
            got = gaescan.group_normalize(s2, groups=labels, backend=be, **opts)
            clean = gaescan.group_normalize(s, groups=labels, backend=be, **opts)
            np.testing.assert_array_equal(got[~group], clean[~group])
            assert not np.isfinite(got[group]).all()


@pytest.mark.parametrize("be", BACKENDS)
def test_inputs_unchanged_out_and_views(be):
    rng = np.random.default_rng(6)
    base = rng.standard_normal(64)
    s = base[::2]  # non-contiguous
    labels = np.repeat(np.arange(8), 4)[rng.permutation(32)]
    s_before, l_before = s.copy(), labels.copy()
    want = gt.group_normalize(s, groups=labels)
    out = np.full(32, np.nan)
    res = gaescan.group_normalize(s, groups=labels, out=out, backend=be)
    assert res is out
    gt.assert_close(out, want)
    np.testing.assert_array_equal(s, s_before)
    np.testing.assert_array_equal(labels, l_before)
    # a non-contiguous out
    big = np.zeros(64)
    gaescan.group_normalize(s, groups=labels, out=big[1::2], backend=be)
    gt.assert_close(big[1::2], want)
    assert np.all(big[::2] == 0)


@pytest.mark.parametrize("be", BACKENDS)
def test_empty(be):
    got = gaescan.group_normalize(np.zeros(0, np.float32), groups=np.zeros(0, np.int64), backend=be)
    assert got.shape == (0,) and got.dtype == np.float32
    assert gaescan.group_normalize(np.zeros(0), group_size=4, backend=be).shape == (0,)


def test_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for be in BACKENDS:
            gaescan.group_normalize(np.array([1.0, 1.0, 2.0]), groups=np.array([0, 0, 1]), eps=0.0, ddof=3,
                                    backend=be)
            gaescan.group_normalize(np.array([1.0, 1.0, 2.0]), groups=np.array([0, 0, 1]), leave_one_out=True,
                                    backend=be)


def test_backends_agree_and_deterministic():
    rng = np.random.default_rng(7)
    s = rng.standard_normal(1000).astype(np.float32)
    labels = _labels(rng, 1000)
    a = gaescan.group_normalize(s, groups=labels, backend="numba")
    np.testing.assert_array_equal(a, gaescan.group_normalize(s, groups=labels, backend="numba"))
    b = gaescan.group_normalize(s, groups=labels, backend="numpy")
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


def test_serial_build_same_bits():
    """The serial build (used off the main thread under workqueue) gives the parallel build's bits."""
    from gaescan.kernels import cpu_stats as k

    rng = np.random.default_rng(8)
    s = rng.standard_normal(300)
    order = np.argsort(rng.integers(0, 40, 300), kind="stable")
    offsets = np.linspace(0, 300, 41).astype(np.int64)
    outs = []
    for serial in (False, True):
        out = np.empty(300)
        k.group_norm_sorted.compile(np.float64, serial)(s, order, offsets, True, True, 1, 1e-6, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 60), ngroups=st.integers(1, 12),
       loo=st.booleans(), scale=st.booleans(), ddof=st.integers(0, 2))
def test_permutation_property(seed, B, ngroups, loo, scale, ddof):
    """Permuting the sequences (scores with their labels) permutes the advantages."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(B)
    labels = rng.integers(0, ngroups, B) * 1000 - 37
    perm = rng.permutation(B)
    kw = dict(leave_one_out=loo, scale=scale, ddof=ddof)
    for be in BACKENDS:
        a = gaescan.group_normalize(s, groups=labels, backend=be, **kw)
        b = gaescan.group_normalize(s[perm], groups=labels[perm], backend=be, **kw)
        np.testing.assert_allclose(b, a[perm], rtol=1e-12, atol=1e-12)
        gt.assert_close(a, gt.group_normalize(s, groups=labels, **kw))


# --------------------------------------------------------------------------- PyTorch


def test_torch_in_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    s = rng.standard_normal(24).astype(np.float32)
    labels = np.repeat(np.arange(6), 4)[rng.permutation(24)]
    got = gaescan.group_normalize(torch.from_numpy(s), groups=torch.from_numpy(labels))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    gt.assert_close(got, gt.group_normalize(s, groups=labels), dtype=np.float32)
    with pytest.raises(TypeError, match="same array library"):
        gaescan.group_normalize(torch.from_numpy(s), groups=labels)
    with pytest.raises(ValueError, match="requires grad"):
        gaescan.group_normalize(torch.from_numpy(s).requires_grad_(), group_size=4)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        (dict(), ValueError, "exactly one of groups"),
        (dict(groups=np.zeros(6, int), group_size=3), ValueError, "exactly one of groups"),
        (dict(groups=np.zeros(6)), TypeError, "integer labels"),
        (dict(groups=np.zeros(6, bool)), TypeError, "integer labels"),
        (dict(groups=np.zeros(5, int)), ValueError, "one label per score"),
        (dict(groups=np.zeros((6, 1), int)), ValueError, "one label per score"),
        (dict(group_size=4), ValueError, "does not divide"),
        (dict(group_size=0), ValueError, "positive integer"),
        (dict(group_size=2.0), TypeError, "positive integer"),
        (dict(group_size=True), TypeError, "positive integer"),
        (dict(group_size=3, ddof=-1), ValueError, "ddof"),
        (dict(group_size=3, ddof=1.0), TypeError, "ddof"),
        (dict(group_size=3, eps=-1e-3), ValueError, "eps"),
        (dict(group_size=3, eps=float("nan")), ValueError, "eps"),
        (dict(group_size=3, scale=1), TypeError, "scale must be a bool"),
        (dict(group_size=3, leave_one_out="yes"), TypeError, "leave_one_out must be a bool"),
        (dict(group_size=3, out=np.zeros(6, np.float32)), ValueError, "dtype float64"),
        (dict(group_size=3, out=np.zeros(5)), ValueError, r"shape \(6,\)"),
        (dict(group_size=3, backend="gpu"), ValueError, "unknown backend"),
    ],
)
def test_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        gaescan.group_normalize(np.arange(6.0), **kw)


def test_errors_scores():
    with pytest.raises(ValueError, match="1-D"):
        gaescan.group_normalize(np.zeros((2, 3)), group_size=3)
    with pytest.raises(TypeError, match="scalar"):
        gaescan.group_normalize(1.0, group_size=1)
    with pytest.raises(TypeError, match="real numbers"):
        gaescan.group_normalize(np.array(["a", "b"]), group_size=1)
    s = np.arange(6.0)
    with pytest.raises(ValueError, match="overlaps"):
        gaescan.group_normalize(s, group_size=3, out=s)


# --------------------------------------------------------------------------- framework mappings
#
# Each loop below follows the framework's published code (a Python loop over a
# dict of groups, or a reshape into equal groups), in PyTorch, and is compared
# with the gaescan call that docs/recipes/outcome-advantages.md gives for it.


def _torch():
    return pytest.importorskip("torch")


def _rollout(seed=0, B=24, L=10):
    """Scores placed at the last token of right-padded responses, and the prompt index."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, L + 1, B)
    mask = torch.from_numpy(np.arange(L)[None, :] < lengths[:, None]).float()
    scores = torch.from_numpy(rng.standard_normal(B).astype(np.float32))
    tlr = torch.zeros(B, L)
    tlr[torch.arange(B), torch.from_numpy(lengths - 1)] = scores
    index = np.array([f"uid-{i}" for i in np.repeat(np.arange(B // 4), 4)[rng.permutation(B)]], dtype=object)
    index[0] = "only-one"  # a group of one
    return tlr, mask, index, scores


def _verl_grpo(tlr, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    torch = _torch()
    scores = tlr.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            t = torch.stack(id2score[idx])
            id2mean[idx], id2std[idx] = torch.mean(t), torch.std(t)
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores.unsqueeze(-1) * mask


def _verl_group_mean(scores, index):
    torch = _torch()
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.tensor(0.0) if len(id2score[idx]) == 1 else torch.mean(torch.stack(id2score[idx]))
    return id2score, id2mean


def _verl_rloo(tlr, mask, index):
    scores = tlr.sum(dim=-1)
    id2score, id2mean = _verl_group_mean(scores, index)
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores.unsqueeze(-1) * mask


def _verl_masked_whiten(values, mask, shift_mean=True):
    torch = _torch()
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8)
    var = var * (mask.sum() / (mask.sum() - 1))
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def _verl_reinforce_pp(tlr, mask, gamma):
    torch = _torch()
    returns = torch.zeros_like(tlr)
    running = torch.zeros(tlr.shape[0])
    for t in reversed(range(tlr.shape[1])):
        running = tlr[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return _verl_masked_whiten(returns, mask) * mask


def _verl_reinforce_pp_baseline(tlr, mask, index):
    scores = tlr.sum(dim=-1)
    id2score, id2mean = _verl_group_mean(scores, index)
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, tlr.shape[1]]) * mask
    return _verl_masked_whiten(scores, mask) * mask


def _verl_gae(tlr, values, mask, gamma, lam):
    torch = _torch()
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(tlr.shape[1])):
        delta = tlr[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        rev.append(lastgaelam)
    adv = torch.stack(rev[::-1], dim=1)
    return _verl_masked_whiten(adv, mask) * mask


def _dense(index):
    """String uids as integer labels (gaescan takes integers)."""
    return np.unique(index, return_inverse=True)[1]


def test_verl_grpo_and_dr_grpo():
    torch = _torch()
    tlr, mask, index, scores = _rollout(1)
    want = _verl_grpo(tlr.clone(), mask, index)
    adv = gaescan.group_normalize(tlr.sum(-1), groups=torch.from_numpy(_dense(index)))
    # verl treats a group of one as mean 0, std 1: s / (1 + eps)
    single = torch.from_numpy(index == "only-one")
    adv = torch.where(single, adv / (1 + 1e-6), adv)
    gt.assert_close(adv[:, None] * mask, want.numpy().astype(np.float64), dtype=np.float32)
    want = _verl_grpo(tlr.clone(), mask, index, norm_adv_by_std_in_grpo=False)
    adv = gaescan.group_normalize(tlr.sum(-1), groups=torch.from_numpy(_dense(index)), scale=False)
    gt.assert_close(adv[:, None] * mask, want.numpy().astype(np.float64), dtype=np.float32)


def test_verl_rloo():
    torch = _torch()
    tlr, mask, index, _ = _rollout(2)
    want = _verl_rloo(tlr.clone(), mask, index)
    adv = gaescan.group_normalize(tlr.sum(-1), groups=torch.from_numpy(_dense(index)), leave_one_out=True,
                                  scale=False)
    gt.assert_close(adv[:, None] * mask, want.numpy().astype(np.float64), dtype=np.float32)


def test_verl_reinforce_plus_plus():
    tlr, mask, _, _ = _rollout(3)
    want = _verl_reinforce_pp(tlr.clone(), mask, gamma=0.99)
    ret = gaescan.discounted_returns(tlr, gamma=0.99, mask=mask)
    got = gaescan.whiten(ret, mask)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)


def test_verl_reinforce_plus_plus_baseline():
    torch = _torch()
    tlr, mask, index, _ = _rollout(4)
    want = _verl_reinforce_pp_baseline(tlr.clone(), mask, index)
    adv = gaescan.group_normalize(tlr.sum(-1), groups=torch.from_numpy(_dense(index)), scale=False)
    got = gaescan.whiten(adv[:, None] * mask, mask)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)


def test_verl_gae_masked_whiten():
    torch = _torch()
    tlr, mask, _, _ = _rollout(5)
    values = torch.from_numpy(np.random.default_rng(5).standard_normal(tuple(tlr.shape)).astype(np.float32))
    want = _verl_gae(tlr, values, mask, gamma=1.0, lam=0.95)
    adv, _ = gaescan.gae(tlr, values, gamma=1.0, lam=0.95, mask=mask)
    got = gaescan.whiten(adv, mask)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)


def _openrlhf(rewards, n, estimator):
    rewards = rewards.reshape(-1, n)
    if estimator == "group_norm":
        rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
    elif estimator == "rloo":
        baseline = (rewards.sum(-1, keepdim=True) - rewards) / (n - 1)
        rewards = rewards - baseline
    elif estimator in ("dr_grpo", "reinforce_baseline"):
        rewards = rewards - rewards.mean(-1, keepdim=True)
    return rewards.reshape(-1)


def _openrlhf_batch_norm(adv, mask):
    """The batch normalisation OpenRLHF applies to REINFORCE-baseline advantages."""
    num = mask.sum()
    mean = (adv * mask).sum() / num
    var = ((adv - mean).pow(2) * mask).sum() / num
    return (adv - mean) * var.clamp(min=1e-8).rsqrt()


@pytest.mark.parametrize(
    ("estimator", "kw"),
    [("group_norm", dict(eps=1e-9)), ("dr_grpo", dict(scale=False)),
     ("rloo", dict(leave_one_out=True, scale=False)), ("reinforce_baseline", dict(scale=False))],
)
def test_openrlhf(estimator, kw):
    torch = _torch()
    r = torch.from_numpy(np.random.default_rng(6).standard_normal(32).astype(np.float32))
    want = _openrlhf(r.clone(), 8, estimator)
    got = gaescan.group_normalize(r, group_size=8, **kw)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)
    if estimator == "reinforce_baseline":
        mask = torch.from_numpy(np.random.default_rng(7).random((32, 6)) < 0.7).float()
        mask[:, 0] = 1
        tok = want[:, None] * mask
        want_tok = _openrlhf_batch_norm(tok, mask)
        got_tok = gaescan.whiten(got[:, None] * mask, mask, ddof=0, eps=1e-8)
        # OpenRLHF leaves (0 - mean)·rstd at masked positions; gaescan writes 0 there
        gt.assert_close(got_tok * mask, (want_tok * mask).numpy().astype(np.float64), dtype=np.float32)


def _trl_grpo(rewards, num_generations, scale_rewards):
    torch = _torch()
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations, dim=0)
    adv = rewards - mean
    if scale_rewards in ("group", True):
        std = grouped.std(dim=1).repeat_interleave(num_generations, dim=0)
    elif scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = torch.ones_like(rewards)
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return adv


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_trl_grpo(scale_rewards):
    torch = _torch()
    r = torch.from_numpy(np.random.default_rng(8).standard_normal(24).astype(np.float32))
    want = _trl_grpo(r.clone(), 6, scale_rewards)
    if scale_rewards == "group":
        got = gaescan.group_normalize(r, group_size=6, eps=1e-4)
    elif scale_rewards == "batch":
        m = gaescan.moments(r)
        std = torch.sqrt(m.m2 / (m.count - 1)).float()
        got = gaescan.group_normalize(r, group_size=6, scale=False) / (std + 1e-4)
    else:
        got = gaescan.group_normalize(r, group_size=6, scale=False)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)


def test_trl_rloo_k_major():
    """TRL's RLOOTrainer lays out completions k-major: ``reshape(rloo_k, -1)``."""
    torch = _torch()
    k, P = 4, 6
    r = torch.from_numpy(np.random.default_rng(9).standard_normal(k * P).astype(np.float32))
    grouped = r.reshape(k, -1)
    baseline = (grouped.sum(0) - grouped) / (k - 1)
    want = (grouped - baseline).flatten()
    got = gaescan.group_normalize(r, groups=torch.arange(k * P) % P, leave_one_out=True, scale=False)
    gt.assert_close(got, want.numpy().astype(np.float64), dtype=np.float32)


def test_nemo_rl_leave_one_out_baseline():
    """NeMo-RL's leave-one-out baseline: a (1 − I) matrix over each prompt's samples."""
    torch = _torch()
    rng = np.random.default_rng(10)
    prompts = torch.from_numpy(rng.integers(0, 5, (30, 1)))  # prompt ids (token rows in NeMo-RL)
    prompts[0] = 99  # a prompt with one sample
    rewards = torch.from_numpy(rng.standard_normal(30).astype(np.float32))
    baseline = torch.zeros_like(rewards)
    for p in torch.unique(prompts, dim=0):
        idx = torch.arange(30)[(prompts == p).all(1)]
        if len(idx) <= 1:
            baseline[idx] = rewards[idx]  # NeMo-RL: no baseline, so the advantage is 0
            continue
        w = 1 - torch.eye(len(idx))
        baseline[idx] = (w @ rewards[idx]) / w.sum(1)
    want = rewards - baseline
    got = gaescan.group_normalize(rewards, groups=prompts[:, 0], leave_one_out=True, scale=False)
    assert want[0] == 0 and got[0] == rewards[0]  # gaescan keeps a lone sample's score
    gt.assert_close(got[1:], want[1:].numpy().astype(np.float64), dtype=np.float32)


def test_large_batch_parallel_build():
    """Above the serial threshold the parallel build runs: same numbers."""
    from gaescan.backends import stats_numba

    rng = np.random.default_rng(11)
    B = 7 * (stats_numba.SERIAL_MAX // 7 + 3)
    s = rng.standard_normal(B).astype(np.float32)
    labels = _labels(rng, B)
    got = gaescan.group_normalize(s, groups=labels, backend="numba")
    gt.assert_close(got, gt.group_normalize(s, groups=labels), dtype=np.float32)
    got = gaescan.group_normalize(s, group_size=7, leave_one_out=True, backend="numba")
    gt.assert_close(got, gt.group_normalize(s, group_size=7, leave_one_out=True), dtype=np.float32)
