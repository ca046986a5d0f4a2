"""gaescan.vtrace against torchrl's ``vtrace_advantage_estimate`` on off-policy CartPole rollouts.

The rollouts are real: several seeded CartPole-v1 environments with a short time
limit (so that episodes both terminate and are truncated), actions sampled from a
behaviour policy μ, importance ratios of a different target policy π, and values
from a fixed linear value function.  Both policies and the value function are
fixed random linear maps of the observation (no training).

The calls are mapped as in ``docs/recipes/vtrace.md``: torchrl's ``[B, T, 1]``
tensors with ``time_dim=-2``; its ``done`` (terminated or truncated) and
``terminated`` become gaescan's ``terminated`` and ``truncated = done and not
terminated``; ``next_state_value`` is ``next_values``; ``rho_thresh``/``c_thresh``
are ``rho_bar``/``c_bar``.  Where the two libraries differ (torchrl has no λ and no
separate policy-gradient clipping, it bootstraps the advantage from ``vs_{t+1}``
rather than from ``next_values[t]``, and it multiplies by ``1 − terminated`` rather
than selecting), the tests check the documented relation between the results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gaescan
import gaescan.testing as gt

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
gym = pytest.importorskip("gymnasium")
from torchrl.objectives.value.functional import vtrace_advantage_estimate  # noqa: E402

N_ENVS = 4
STEPS = 96
TIME_LIMIT = 25
GAMMA = 0.99
DTYPES = [np.float32, np.float64]
# (rho_bar, c_bar): IMPALA's defaults, rho_bar above and c_bar below 1, the reverse,
# and no clipping at all.
THRESHOLDS = [(1.0, 1.0), (2.0, 0.5), (0.8, 1.5), (math.inf, math.inf)]


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _linear(obs: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``obs @ w + b`` as an elementwise product and a sum over the 4 observation
    entries, so that the same observation gives the same bits wherever it sits."""
    return (obs[..., :, None] * w).sum(axis=-2) + b


@pytest.fixture(scope="module")
def rollout() -> dict[str, np.ndarray]:
    """``N_ENVS`` CartPole streams of ``STEPS`` steps each, batch-major ``[B, T]``, float64."""
    rng = np.random.default_rng(19)
    w_pi, b_pi = rng.standard_normal((4, 2)) * 2.0, rng.standard_normal(2) * 0.3
    w_mu, b_mu = rng.standard_normal((4, 2)) * 2.0, rng.standard_normal(2) * 0.3
    w_v, b_v = rng.standard_normal((4, 1)) * 3.0, np.array([5.0])
    envs = [gym.make("CartPole-v1", max_episode_steps=TIME_LIMIT) for _ in range(N_ENVS)]
    shape = (N_ENVS, STEPS)
    buf = {k: np.zeros(shape) for k in ("rewards", "values", "next_values", "log_pi", "log_mu")}
    buf["terminated"] = np.zeros(shape, bool)
    buf["truncated"] = np.zeros(shape, bool)
    for i, env in enumerate(envs):
        obs, _ = env.reset(seed=100 + i)
        for t in range(STEPS):
            o = obs.astype(np.float64)
            lp_mu = _log_softmax(_linear(o, w_mu, b_mu))
            lp_pi = _log_softmax(_linear(o, w_pi, b_pi))
            a = int(rng.choice(2, p=np.exp(lp_mu)))
            nxt, r, term, trunc, _ = env.step(a)
            buf["rewards"][i, t] = r
            buf["values"][i, t] = _linear(o, w_v, b_v)[0]
            # The value of the observation that followed step t; at an episode end it is
            # the final observation, taken before the reset replaces it.
            buf["next_values"][i, t] = _linear(nxt.astype(np.float64), w_v, b_v)[0]
            buf["log_pi"][i, t], buf["log_mu"][i, t] = lp_pi[a], lp_mu[a]
            buf["terminated"][i, t], buf["truncated"][i, t] = term, trunc
            obs = env.reset()[0] if term or trunc else nxt
        env.close()
    # The time limit has the last word: a step both terminated and truncated is terminated.
    buf["truncated"] &= ~buf["terminated"]
    return buf


def test_rollout_has_every_kind_of_step(rollout):
    """The comparison covers terminations, truncations, rows ending mid-episode and
    importance ratios on both sides of 1."""
    term, trunc = rollout["terminated"], rollout["truncated"]
    assert term.sum() >= 5 and trunc.sum() >= 3, (term.sum(), trunc.sum())
    assert not (term | trunc)[:, -1].all()
    ratios = np.exp(rollout["log_pi"] - rollout["log_mu"])
    assert (ratios > 1.6).any() and (ratios < 0.6).any()
    assert np.abs(rollout["values"]).min() > 0


def _cast(rollout: dict, dtype) -> dict:
    out = {k: (v.astype(dtype) if v.dtype.kind == "f" else v.copy()) for k, v in rollout.items()}
    # The ratios in the result dtype, the same subtraction torchrl does.
    out["log_rhos"] = out["log_pi"] - out["log_mu"]
    return out


def _torch(x: np.ndarray):
    """``[B, T]`` -> torchrl's ``[B, T, 1]``."""
    return torch.from_numpy(np.ascontiguousarray(x))[..., None]


def torchrl_vtrace(d: dict, *, gamma=GAMMA, rho_bar=1.0, c_bar=1.0, next_values=None, with_terminated=True,
                   python_scalars=False):
    """torchrl's V-trace on a ``_cast`` rollout; ``(vs, advantages)`` as ``[B, T]`` NumPy arrays.

    γ and the thresholds go in as 0-d tensors of the inputs' dtype: torchrl turns Python
    floats into float32 (``gamma * (~done).int()`` and ``torch.tensor(rho_thresh)``), which
    would round them for float64 inputs (``python_scalars=True`` does that)."""
    done = d["terminated"] | d["truncated"]
    if not python_scalars:
        tdt = torch.from_numpy(d["values"][:1, :1]).dtype
        gamma, rho_bar, c_bar = (torch.tensor(x, dtype=tdt) for x in (gamma, rho_bar, c_bar))
    adv, vs = vtrace_advantage_estimate(
        gamma, _torch(d["log_pi"]), _torch(d["log_mu"]), _torch(d["values"]),
        _torch(d["next_values"] if next_values is None else next_values), _torch(d["rewards"]),
        _torch(done), _torch(d["terminated"]) if with_terminated else None,
        rho_thresh=rho_bar, c_thresh=c_bar, time_dim=-2,
    )
    return vs[..., 0].numpy(), adv[..., 0].numpy()


def gaescan_vtrace(d: dict, **kw):
    return gaescan.vtrace(d["rewards"], d["values"], d["log_rhos"], gamma=kw.pop("gamma", GAMMA),
                          next_values=kw.pop("next_values", d["next_values"]),
                          terminated=d["terminated"], truncated=d["truncated"], **kw)


@pytest.mark.parametrize("rho_bar, c_bar", THRESHOLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_torchrl(rollout, dtype, rho_bar, c_bar):
    d = _cast(rollout, dtype)
    res = gaescan_vtrace(d, rho_bar=rho_bar, c_bar=c_bar)
    vs_trl, adv_trl = torchrl_vtrace(d, rho_bar=rho_bar, c_bar=c_bar)
    assert vs_trl.dtype == dtype
    ref = _ref(d, gamma=GAMMA, rho_bar=rho_bar, c_bar=c_bar)
    for got, trl, want in ((res.vs, vs_trl, ref.vs), (res.advantages, adv_trl, ref.advantages)):
        gt.assert_close(got, want, dtype=dtype)
        gt.assert_close(trl, want, dtype=dtype)
        gt.assert_close(got, trl, dtype=dtype)


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (0.8, 1.5)])
def test_torchrl_python_floats_are_float32(rollout, rho_bar, c_bar):
    """With float64 inputs and Python floats for γ and the thresholds, torchrl's results are
    those of ``float32(γ)``, ``float32(rho_bar)`` and ``float32(c_bar)``; gaescan's float64
    results use the values themselves, and so does torchrl given float64 0-d tensors."""
    d = _cast(rollout, np.float64)
    f32 = [float(np.float32(x)) for x in (GAMMA, rho_bar, c_bar)]
    vs_py, adv_py = torchrl_vtrace(d, rho_bar=rho_bar, c_bar=c_bar, python_scalars=True)
    vs_t, adv_t = torchrl_vtrace(d, rho_bar=rho_bar, c_bar=c_bar)
    assert vs_py.dtype == np.float64
    res = gaescan_vtrace(d, rho_bar=rho_bar, c_bar=c_bar)
    res32 = gaescan_vtrace(d, gamma=f32[0], rho_bar=f32[1], c_bar=f32[2])
    ref = _ref(d, gamma=GAMMA, rho_bar=rho_bar, c_bar=c_bar)
    ref32 = _ref(d, gamma=f32[0], rho_bar=f32[1], c_bar=f32[2])
    for i in range(2):
        gt.assert_close(res[i], ref[i], dtype=np.float64)
        gt.assert_close((vs_t, adv_t)[i], ref[i], dtype=np.float64)
        gt.assert_close(res32[i], ref32[i], dtype=np.float64)
        gt.assert_close((vs_py, adv_py)[i], ref32[i], dtype=np.float64)
        # The rounded γ differs by more than float64 rounding.
        with pytest.raises(AssertionError):
            gt.assert_close(ref32[i], ref[i], dtype=np.float64)


def _ref(d: dict, **kw):
    """The float64 reference on a ``_cast`` rollout."""
    return gt.vtrace(d["rewards"], d["values"], d["log_rhos"], next_values=kw.pop("next_values", d["next_values"]),
                     terminated=d["terminated"], truncated=d["truncated"], **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_tensors_time_dim(rollout, dtype):
    """torchrl's own tensors, ``[B, T, 1]`` with ``axis=-2``: torch in, torch out, the same numbers."""
    d = _cast(rollout, dtype)
    done = d["terminated"] | d["truncated"]
    gamma = torch.tensor(GAMMA, dtype=_torch(d["values"]).dtype)
    adv_trl, vs_trl = vtrace_advantage_estimate(
        gamma, _torch(d["log_pi"]), _torch(d["log_mu"]), _torch(d["values"]), _torch(d["next_values"]),
        _torch(d["rewards"]), _torch(done), _torch(d["terminated"]), time_dim=-2)
    log_rhos = _torch(d["log_pi"]) - _torch(d["log_mu"])
    res = gaescan.vtrace(_torch(d["rewards"]), _torch(d["values"]), log_rhos, gamma=GAMMA,
                         next_values=_torch(d["next_values"]), terminated=_torch(d["terminated"]),
                         truncated=_torch(done), axis=-2)
    assert isinstance(res.vs, torch.Tensor) and res.vs.shape == (N_ENVS, STEPS, 1)
    assert res.vs.dtype == vs_trl.dtype and res.advantages.dtype == adv_trl.dtype
    gt.assert_close(res.vs, vs_trl, dtype=dtype)
    gt.assert_close(res.advantages, adv_trl, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_terminated_every_done_terminates(rollout, dtype):
    """torchrl's ``terminated=None`` treats every done as terminated: gaescan's ``dones=``."""
    d = _cast(rollout, dtype)
    done = d["terminated"] | d["truncated"]
    vs_trl, adv_trl = torchrl_vtrace(d, with_terminated=False)
    res = gaescan.vtrace(d["rewards"], d["values"], d["log_rhos"], gamma=GAMMA,
                         next_values=d["next_values"], dones=done)
    gt.assert_close(res.vs, vs_trl, dtype=dtype)
    gt.assert_close(res.advantages, adv_trl, dtype=dtype)
    # ... which is not the same as bootstrapping the truncated steps.
    assert not np.allclose(res.vs, gaescan_vtrace(d).vs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_and_masked_episodes(rollout, dtype):
    """Variable-length rollouts: torchrl runs each one as its own ``[1, T_i, 1]`` batch;
    gaescan takes them packed (``cu_seqlens``) or padded with a ``mask``."""
    d = _cast(rollout, dtype)
    lengths = [STEPS, 61, 17, 80]
    pieces = [{k: v[i:i + 1, :n] for k, v in d.items()} for i, n in enumerate(lengths)]
    want = [torchrl_vtrace(p) for p in pieces]

    cat = {k: np.concatenate([p[k][0] for p in pieces]) for k in d}
    cu = np.concatenate([[0], np.cumsum(lengths)])
    res = gaescan.vtrace(cat["rewards"], cat["values"], cat["log_rhos"], gamma=GAMMA,
                         next_values=cat["next_values"], terminated=cat["terminated"],
                         truncated=cat["truncated"], cu_seqlens=cu)
    for s, (vs_trl, adv_trl) in enumerate(want):
        gt.assert_close(res.vs[cu[s]:cu[s + 1]], vs_trl[0], dtype=dtype)
        gt.assert_close(res.advantages[cu[s]:cu[s + 1]], adv_trl[0], dtype=dtype)

    # Padded to STEPS, on the left in odd rows and on the right in even ones; the padding holds
    # NaN and flags, none of which may be read.
    pad = {k: (np.full(d[k].shape, np.nan, dtype) if d[k].dtype.kind == "f" else np.ones(d[k].shape, bool))
           for k in d}
    mask = np.zeros((N_ENVS, STEPS), bool)
    spans = []
    for i, n in enumerate(lengths):
        lo = STEPS - n if i % 2 else 0
        spans.append((lo, lo + n))
        mask[i, lo:lo + n] = True
        for k in d:
            pad[k][i, lo:lo + n] = pieces[i][k][0]
    res = gaescan.vtrace(pad["rewards"], pad["values"], pad["log_rhos"], gamma=GAMMA,
                         next_values=pad["next_values"], terminated=pad["terminated"],
                         truncated=pad["truncated"] & ~pad["terminated"], mask=mask)
    for i, ((lo, hi), (vs_trl, adv_trl)) in enumerate(zip(spans, want, strict=True)):
        gt.assert_close(res.vs[i, lo:hi], vs_trl[0], dtype=dtype)
        gt.assert_close(res.advantages[i, lo:hi], adv_trl[0], dtype=dtype)
    assert not res.vs[~mask].any() and not res.advantages[~mask].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_next_values_off_the_next_value(rollout, dtype):
    """Where ``next_values[t]`` is not ``values[t+1]`` inside an episode (say, from a
    separate forward pass), the two libraries bootstrap the advantage differently:
    gaescan from ``next_values[t] + D_{t+1}``, torchrl from ``vs_{t+1} = values[t+1] +
    D_{t+1}``.  ``vs`` agrees; the advantages differ by exactly
    ``ρ_t γ (values[t+1] − next_values[t])`` at steps that do not end an episode."""
    d = _cast(rollout, dtype)
    rng = np.random.default_rng(5)
    nv = (d["next_values"] + rng.standard_normal(d["next_values"].shape)).astype(dtype)
    res = gaescan_vtrace(d, next_values=nv)
    vs_trl, adv_trl = torchrl_vtrace(d, next_values=nv)
    gt.assert_close(res.vs, vs_trl, dtype=dtype)

    lr = d["log_rhos"].astype(np.float64)
    rho = np.minimum(1.0, np.exp(lr))
    done = d["terminated"] | d["truncated"]
    within = ~done
    within[:, -1] = False  # the row's last step bootstraps from next_values in both libraries
    shift = np.zeros_like(rho)
    values_next = d["values"][:, 1:].astype(np.float64)
    shift[:, :-1] = values_next - nv[:, :-1].astype(np.float64)
    correction = np.where(within, rho * np.float64(dtype(GAMMA)) * shift, 0.0)
    gt.assert_close(adv_trl, res.advantages.astype(np.float64) + correction, dtype=dtype)
    assert np.abs(correction).max() > 0.1  # the difference is real, not rounding


@pytest.mark.parametrize("pg_rho_bar", [0.5, 3.0])
@pytest.mark.parametrize("dtype", DTYPES)
def test_separate_policy_gradient_clipping(rollout, dtype, pg_rho_bar):
    """torchrl clips the policy-gradient weights with ``rho_thresh``; gaescan's
    ``pg_rho_bar`` (default ``rho_bar``) can differ: the advantages scale by
    ``min(pg_rho_bar, e^ℓ) / min(rho_bar, e^ℓ)`` and ``vs`` does not change."""
    d = _cast(rollout, dtype)
    res = gaescan_vtrace(d, pg_rho_bar=pg_rho_bar)
    vs_trl, adv_trl = torchrl_vtrace(d)
    gt.assert_close(res.vs, vs_trl, dtype=dtype)
    e = np.exp(d["log_rhos"].astype(np.float64))
    scale = np.minimum(np.float64(dtype(pg_rho_bar)), e) / np.minimum(1.0, e)
    gt.assert_close(res.advantages, adv_trl.astype(np.float64) * scale, dtype=dtype)
    assert not np.allclose(res.advantages, adv_trl)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lambda_below_one_has_no_torchrl_counterpart(rollout, dtype):
    """torchrl's V-trace is gaescan's with ``lam=1`` (the default); ``lam < 1`` scales the
    traces ``c_t`` and changes ``vs``, and agrees with the float64 reference."""
    d = _cast(rollout, dtype)
    vs_trl, _ = torchrl_vtrace(d)
    gt.assert_close(gaescan_vtrace(d, lam=1.0).vs, vs_trl, dtype=dtype)
    res = gaescan_vtrace(d, lam=0.9)
    ref = _ref(d, gamma=GAMMA, lam=0.9)
    gt.assert_close(res.vs, ref.vs, dtype=dtype)
    gt.assert_close(res.advantages, ref.advantages, dtype=dtype)
    assert not np.allclose(res.vs, vs_trl)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_value_after_termination(rollout, dtype):
    """A NaN ``next_values`` at a terminated step (the value of a terminal observation,
    which is never used) does not reach gaescan's results: they equal torchrl's with 0
    there.  torchrl multiplies it by ``1 − terminated`` instead of selecting it out."""
    d = _cast(rollout, dtype)
    term = d["terminated"]
    nan_nv = np.where(term, np.nan, d["next_values"]).astype(dtype)
    zero_nv = np.where(term, 0.0, d["next_values"]).astype(dtype)
    res = gaescan_vtrace(d, next_values=nan_nv)
    assert np.isfinite(res.vs).all() and np.isfinite(res.advantages).all()
    vs_trl, adv_trl = torchrl_vtrace(d, next_values=zero_nv)
    gt.assert_close(res.vs, vs_trl, dtype=dtype)
    gt.assert_close(res.advantages, adv_trl, dtype=dtype)
