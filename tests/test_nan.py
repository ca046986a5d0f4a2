"""NaN and infinities reach exactly the steps that depend on them, on every backend.

A NaN or an infinity at step t reaches t and the steps before it in a reverse
scan (t and later ones in a forward scan) up to the nearest cut (a done, a
sequence end, a zero decay), and nothing else; every finite output still
matches the float64 reference.  The expected set of non-finite outputs is the
reference's own, ``~np.isfinite(ref)``, computed by the float64 references of
:mod:`gaescan.testing` on the same inputs.  The cases run without dones and masks, where a
backend may use its constant-decay shortcuts, and with them.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    assert_close,
    assert_unchanged,
    random_cu_seqlens,
    random_data,
    random_flags,
    snapshot,
)

import gaescan.testing as gt

# Lengths around the chunk sizes the backends use (4, 8, 32, 64) and longer
# rows whose carry pass has several levels.
NAN_LENGTHS = [1, 3, 4, 5, 31, 32, 33, 65, 257, 1000]
SMALL_NAN_LENGTHS = [1, 5, 33]
DTYPES = [np.float32, np.float64]
DT_IDS = ["f32", "f64"]
COEFS = ["scalar", "row", "step"]
POISON = [np.nan, np.inf, -np.inf]
ROWS = 6

# The float64 references meet NaN and inf on purpose.
# cudasim: the CUDA backend runs these in CI's simulator pass too.
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"), pytest.mark.cudasim]


def lengths(backend):
    return SMALL_NAN_LENGTHS if backend.small else NAN_LENGTHS


def coef(form, rng, shape, dtype, lo=0.9, hi=1.0, value=0.97):
    """A decay coefficient in ``[lo, hi]``: high enough that no product of a
    length-1000 row underflows, so that every dependency stays visible."""
    if form == "scalar":
        return value
    if form == "row":
        return rng.uniform(lo, hi, shape[:-1] + (1,)).astype(dtype)
    return rng.uniform(lo, hi, shape).astype(dtype)


def poison_rows(rng, x, positions=None):
    """Non-finite values in ``x`` (in place), one pattern per row.

    Row 0 stays finite; rows 1-3 hold one NaN, +inf or -inf; row 4 holds
    +inf and -inf at two steps (NaN where both reach); row 5 holds NaN at two
    steps.  Returns the poisoned steps per row.
    """
    T = x.shape[-1]
    cands = sorted({p for p in (0, 1, 3, 4, 7, 8, 31, 32, 63, 64, T // 2, T - 2, T - 1) if 0 <= p < T})
    out = []
    for row in range(x.shape[0]):
        pat = [(), (np.nan,), (np.inf,), (-np.inf,), (np.inf, -np.inf), (np.nan, np.nan)][row % 6]
        steps = sorted(rng.choice(cands, size=min(len(pat), len(cands)), replace=False).tolist())
        for p, val in zip(steps, pat, strict=False):
            x[row, p] = val
        out.append(steps)
    return out


def poison_flat(rng, x, n=3):
    """``n`` non-finite values at random steps of a 1-D ``x`` (in place)."""
    steps = rng.choice(x.shape[0], size=min(n, x.shape[0]), replace=False)
    for i, p in enumerate(steps):
        x[p] = POISON[i % 3]
    return sorted(steps.tolist())


def check(actual, ref, dtype, what):
    """``actual`` is non-finite exactly where ``ref`` is, equal there, and close elsewhere."""
    actual = np.asarray(actual)
    got = ~np.isfinite(actual)
    want = ~np.isfinite(ref)
    if not np.array_equal(got, want):
        leak = np.argwhere(got & ~want)
        lost = np.argwhere(want & ~got)
        raise AssertionError(
            f"{what}: {len(leak)} non-finite outputs at steps that do not depend on a NaN/inf "
            f"(first {leak[:6].tolist()}), {len(lost)} finite where one reaches (first {lost[:6].tolist()})"
        )
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(ref), err_msg=f"{what}: NaN versus inf")
    assert_close(actual, ref, dtype)


def assert_prefix(ref, steps, forward=False):
    """Without cuts, row k of ``ref`` is non-finite exactly on the steps up to
    (reverse) or from (forward) its last (first) poisoned step.  This checks
    the cases themselves: a poison the scan never reads would test nothing."""
    T = ref.shape[-1]
    for row, st in zip(ref, steps, strict=True):
        bad = ~np.isfinite(row)
        want = np.zeros(T, dtype=bool)
        if st:
            if forward:
                want[min(st):] = True
            else:
                want[: max(st) + 1] = True
        np.testing.assert_array_equal(bad, want)


def nan_rows(R, T):
    return np.full((R, T), np.nan)


# ---------------------------------------------------------------------------- gae

GAE_MODES = ["plain", "dones", "term+trunc", "mask"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("form", COEFS)
@pytest.mark.parametrize("mode", GAE_MODES)
def test_gae(backend, rng, mode, form, dtype):
    for T in lengths(backend):
        gae_case(backend, rng, mode, form, dtype, T)


def gae_case(backend, rng, mode, form, dtype, T):
    shape = (backend.batch(T, ROWS), T)
    r = random_data(rng, shape, dtype)
    v = random_data(rng, shape, dtype)
    kw = dict(rewards=r, values=v, gamma=coef(form, rng, shape, dtype),
              lam=coef(form, rng, shape, dtype, value=0.95))
    steps = poison_rows(rng, r if T % 2 else v)
    if mode == "dones":
        kw["dones"] = random_flags(rng, shape, 0.1)
    elif mode == "term+trunc":
        nv = random_data(rng, shape, dtype)
        poison_rows(rng, nv[::-1])
        kw.update(terminated=random_flags(rng, shape, 0.05), truncated=random_flags(rng, shape, 0.05),
                  next_values=nv)
    elif mode == "mask":
        m = rng.random(shape) < 0.8
        m[min(1, shape[0] - 1), :] = True  # one row without masked steps
        kw["mask"] = m
        r[~m] = np.nan  # masked steps are never read
        v[~m] = -np.inf
    else:
        kw["last_value"] = random_data(rng, shape[:1], dtype)
    snap = snapshot(kw)
    adv, ret = backend.gae(**kw)
    ref_adv, ref_ret = gt.gae(**kw)
    if mode == "plain":
        assert_prefix(ref_adv, steps)
    assert (~np.isfinite(ref_adv)).any() or shape[0] == 1
    check(adv, ref_adv, dtype, f"advantages T={T}")
    check(ret, ref_ret, dtype, f"returns T={T}")
    assert_unchanged(kw, snap)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("form", ["scalar", "step"])
@pytest.mark.parametrize("dones", [False, True], ids=["no-dones", "dones"])
def test_gae_cu_seqlens(backend, rng, dones, form, dtype):
    for n in lengths(backend):
        cu = random_cu_seqlens(rng, n, max(1, n // 40))
        r = random_data(rng, (n,), dtype)
        v = random_data(rng, (n,), dtype)
        poison_flat(rng, r)
        poison_flat(rng, v, 1)
        kw = dict(rewards=r, values=v, gamma=coef(form, rng, (n,), dtype), lam=coef(form, rng, (n,), dtype),
                  cu_seqlens=cu, last_value=random_data(rng, (len(cu) - 1,), dtype))
        if dones:
            kw["dones"] = random_flags(rng, (n,), 0.05)
        adv, ret = backend.gae(**kw)
        ref_adv, ref_ret = gt.gae(**kw)
        check(adv, ref_adv, dtype, f"advantages N={n}")
        check(ret, ref_ret, dtype, f"returns N={n}")


# ---------------------------------------------------------------------- returns


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("form", COEFS)
@pytest.mark.parametrize("mode", ["plain", "dones", "mask", "cu_seqlens"])
def test_returns(backend, rng, mode, form, dtype):
    for T in lengths(backend):
        returns_case(backend, rng, mode, form, dtype, T)


def returns_case(backend, rng, mode, form, dtype, T):
    shape = (backend.batch(T, ROWS), T)
    if mode == "cu_seqlens":
        shape = (T,)
    r = random_data(rng, shape, dtype)
    kw = dict(rewards=r, gamma=coef(form, rng, shape, dtype))
    if mode == "cu_seqlens":
        steps = None
        poison_flat(rng, r)
        kw["cu_seqlens"] = cu = random_cu_seqlens(rng, T, max(1, T // 40))
        kw["last_value"] = random_data(rng, (len(cu) - 1,), dtype)
    else:
        steps = poison_rows(rng, r)
    if mode == "dones":
        kw["dones"] = random_flags(rng, shape, 0.1)
    elif mode == "mask":
        m = rng.random(shape) < 0.8
        kw["mask"] = m
        r[~m] = np.nan
    snap = snapshot(kw)
    y = backend.returns(**kw)
    ref = gt.discounted_returns(**kw)
    if mode == "plain":
        assert_prefix(ref, steps)
    check(y, ref, dtype, f"returns T={T}")
    assert_unchanged(kw, snap)


# -------------------------------------------------------------------- linear_scan


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("form", ["scalar", "scalar-negative", "row", "step", "step-zeros"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_scan(backend, rng, reverse, form, dtype):
    for T in lengths(backend):
        scan_case(backend, rng, reverse, form, dtype, T)


def scan_case(backend, rng, reverse, form, dtype, T):
    shape = (backend.batch(T, ROWS), T)
    b = random_data(rng, shape, dtype)
    init = random_data(rng, shape[:1], dtype)
    if form == "scalar-negative":
        a = -0.97
    elif form == "step-zeros":
        a = np.where(rng.random(shape) < 0.05, 0.0, rng.uniform(0.9, 1.0, shape)).astype(dtype)
    else:
        a = coef(form, rng, shape, dtype)
    # Forward rows run from the left: mirror the poison so that it sits
    # at the same distance from the start as a reverse row's from the end.
    steps = poison_rows(rng, b if reverse else b[:, ::-1])
    if not reverse:
        steps = [[T - 1 - p for p in st] for st in steps]
    if form == "step" and T > 2:
        a[-1, T // 3] = np.nan  # a NaN decay poisons its step like a NaN b
    kw = dict(a=a, b=b, reverse=reverse, initial=init)
    snap = snapshot(kw)
    y = backend.scan(**kw)
    ref = gt.linear_scan(**kw)  # a zero a_t is a select there, as in every backend
    if form not in ("step", "step-zeros") or T <= 2:
        assert_prefix(ref, steps, forward=not reverse)
    check(y, ref, dtype, f"linear_scan T={T}")
    assert_unchanged(kw, snap)


@pytest.mark.parametrize("poison", POISON, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_scan_nonfinite_decay_beyond_a_cut(backend, reverse, poison):
    # a_t = 0 cuts the row: a NaN or an infinity in a beyond the cut (at a
    # step the cut's own step does not depend on) never reaches the cut's
    # step nor the steps that see the row through it, whatever the chunk a
    # backend puts them in.
    for T in (SMALL_NAN_LENGTHS if backend.small else [2, 5, 33, 200, 1000]):
        a = np.full((2, T), 0.9, np.float32)
        b = np.ones((2, T), np.float32)
        for cut in {0, T // 2, T - 2} - {-1}:
            beyond = cut + 1 if reverse else cut - 1
            if not 0 <= beyond < T:
                continue
            x = a.copy()
            x[:, cut] = 0
            x[:, beyond] = poison
            y = backend.scan(x, b, reverse=reverse)
            ref = gt.linear_scan(x, b, reverse=reverse)
            # the cut's step and the steps that see the row through it
            part = slice(0, cut + 1) if reverse else slice(cut, T)
            assert np.isfinite(ref[:, part]).all()
            check(np.ascontiguousarray(y[:, part]), ref[:, part], np.float32, f"linear_scan T={T} cut={cut}")


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_scan_nonfinite_initial(backend, rng, reverse):
    T = 33 if backend.small else 300
    b = random_data(rng, (3, T), np.float64)
    init = np.array([np.nan, np.inf, 1.0])
    y = backend.scan(0.98, b, reverse=reverse, initial=init)
    ref = gt.linear_scan(0.98, b, reverse=reverse, initial=init)
    assert np.isnan(ref[0]).all() and np.isposinf(ref[1]).all() and np.isfinite(ref[2]).all()
    check(y, ref, np.float64, "linear_scan")


# Decays far from zero at every step whose products underflow within a few
# steps (a chunk's, a tile's, a thread's): no product of nonzero decays is a
# cut, so a NaN or an infinity reaches every earlier step of its episode (a
# later one, forward), as in the step-by-step references.  Negative decays
# check the infinities' signs.
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("poison", POISON, ids=["nan", "inf", "-inf"])
def test_nonfinite_through_decays_whose_products_underflow(backend, dtype, poison):
    import gaescan

    T = 61 if backend.small else 200
    hit = T // 2
    tiny = 1e-30 if dtype == np.float32 else 1e-100
    b = np.ones((3, T), dtype)
    b[:, hit] = poison
    a = np.full((3, T), tiny, dtype)
    a[1] = -tiny
    a[2, ::2] = -tiny
    for reverse in (True, False):
        y = backend.scan(a, b, reverse=reverse)
        ref = gt.linear_scan(a, b, reverse=reverse)
        assert (~np.isfinite(ref[:, :hit + 1] if reverse else ref[:, hit:])).all()
        check(y, ref, dtype, f"linear_scan reverse={reverse}")
    r, v = b, np.zeros((3, T), dtype)
    g = np.full((3, T), 0.5, dtype)
    g[:, ::3] = tiny  # per-step γ: the general paths
    check(backend.gae(r, v, gamma=g, lam=1.0).advantages, gt.gae(r, v, gamma=g, lam=1.0).advantages, dtype, "gae")
    lr = np.full((3, T), -30.0, dtype)  # e^-30 per step: products of 64 steps underflow
    for got, want in zip(gaescan.vtrace(r, v, lr, gamma=0.9, backend=backend.name), gt.vtrace(r, v, lr, gamma=0.9),
                         strict=True):
        check(got, want, dtype, "vtrace")


# A zero decay at a step that is no done: γ = 0 or λ = 0, or a V-trace
# log-ratio whose exponential underflows (e = 0, so c = 0).  Every backend and
# the references drop the carry there, as at a done and as linear_scan does at
# a_t = 0 (docs/semantics.md): a NaN after it reaches no step before it.
def _zero_decay_cases():
    """``{case: (call on a backend, reference)}``, both computed when called."""
    import gaescan

    r = np.ones((1, 9), np.float32)
    r[0, 5] = np.nan
    v = np.zeros((1, 9), np.float32)
    ids = np.arange(9, dtype=np.int32)[None]
    lr = np.zeros((1, 9), np.float32)
    lr[0, 3] = -800.0
    return {
        "gae lam=0": (lambda b: b.gae(r, v, gamma=0.9, lam=0.0), lambda: gt.gae(r, v, gamma=0.9, lam=0.0)),
        "gae gamma=0": (lambda b: b.gae(r, v, gamma=0.0, lam=0.9), lambda: gt.gae(r, v, gamma=0.0, lam=0.9)),
        "returns gamma=0": (lambda b: (b.returns(r, gamma=0.0),), lambda: (gt.discounted_returns(r, gamma=0.0),)),
        "turn_gae lam=0": (lambda b: gaescan.turn_gae(r, v, ids, gamma=0.9, lam=0.0, backend=b.name),
                           lambda: gt.turn_gae(r, v, ids, gamma=0.9, lam=0.0)),
        "vtrace lam=0": (lambda b: gaescan.vtrace(r, v, lr * 0, gamma=0.9, lam=0.0, backend=b.name),
                         lambda: gt.vtrace(r, v, lr * 0, gamma=0.9, lam=0.0)),
        "vtrace exp underflow": (lambda b: gaescan.vtrace(r, v, lr, gamma=0.9, backend=b.name),
                                 lambda: gt.vtrace(r, v, lr, gamma=0.9)),
    }


_ZERO_DECAY = _zero_decay_cases()


@pytest.mark.parametrize("case", list(_ZERO_DECAY))
def test_nonfinite_before_a_zero_decay(backend, case):
    call, reference = _ZERO_DECAY[case]
    got, want = call(backend), reference()
    # The NaN at step 5 stops at the zero decay: steps 0-2 stay finite.
    assert np.isnan(want[0][0, 5]) and np.isfinite(want[0][0, :3]).all()
    for x, y in zip(got, want, strict=True):
        check(x, y, np.float32, case)



# Zero decays on every kernel path: the calling thread's kernels (3 × 40),
# eight rows in SIMD lanes with pair rows beside them (19 × 4096, float32),
# batch-major and time-major, with each kind of flag.  A NaN in the middle of
# each row reaches back to the zero decay before it and no further.
ZERO_FORMS = ["gamma=0", "lam=0", "row-zeros", "step-zeros"]


def _zero_coefs(form, rng, shape, dtype):
    g = np.full(shape[:1] + (1,), 0.97, dtype)
    lam = 0.95
    if form == "gamma=0":
        return 0.0, lam
    if form == "lam=0":
        return 0.97, 0.0
    if form == "row-zeros":
        g[::2] = 0
        return g, lam
    g = np.broadcast_to(g, shape).copy()
    g[:, shape[1] // 4] = 0
    g[:, shape[1] // 2 - 3] = 0
    return g, lam


@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
@pytest.mark.parametrize("mode", ["plain", "dones", "mask", "term+trunc"])
@pytest.mark.parametrize("form", ZERO_FORMS)
def test_nan_stops_at_a_zero_decay_on_every_path(backend, rng, form, mode, time_major):
    import gaescan

    cases = [(np.float32, (3, 40)), (np.float64, (3, 40))]
    if not backend.small:
        cases.append((np.float32, (19, 4096)))
    for dtype, shape in cases:
        T = shape[1]
        r, v, nv = (random_data(rng, shape, dtype) for _ in range(3))
        r[:, T // 2] = np.nan
        gamma, lam = _zero_coefs(form, rng, shape, dtype)
        flags = {}
        if mode == "dones":
            flags["dones"] = random_flags(rng, shape, 0.002)
        elif mode == "mask":
            flags["mask"] = rng.random(shape) < 0.9
        elif mode == "term+trunc":
            flags = dict(terminated=random_flags(rng, shape, 0.002), truncated=random_flags(rng, shape, 0.002),
                         next_values=nv)
        lr = (rng.standard_normal(shape) * 0.3).astype(dtype)
        ids = np.sort(rng.integers(0, 64, shape), axis=1).astype(np.int32)
        arrays = dict(r=r, v=v, lr=lr, ids=ids, gamma=gamma, **flags)
        axis = -1
        if time_major:
            arrays = {k: (np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
                      for k, x in arrays.items()}
            axis = 0
        a = dict(arrays)
        r, v, lr, ids, gamma = a.pop("r"), a.pop("v"), a.pop("lr"), a.pop("ids"), a.pop("gamma")
        what = f"{form} {mode} {np.dtype(dtype).name} {shape}"
        kw = dict(gamma=gamma, lam=lam, axis=axis, **a)
        got, want = backend.gae(r, v, **kw), gt.gae(r, v, **kw)
        assert np.isnan(want[0]).any() and np.isfinite(want[0]).sum() > want[0].size // 2, what
        for x, y in zip(got, want, strict=True):
            check(x, y, dtype, "gae " + what)
        got, want = gaescan.vtrace(r, v, lr, backend=backend.name, **kw), gt.vtrace(r, v, lr, **kw)
        for x, y in zip(got, want, strict=True):
            check(x, y, dtype, "vtrace " + what)
        if mode != "term+trunc":
            rk = dict(gamma=gamma, axis=axis, **a)
            check(backend.returns(r, **rk), gt.discounted_returns(r, **rk), dtype, "returns " + what)
        if mode in ("plain", "mask") and form != "step-zeros":
            tk = dict(gamma=gamma, lam=lam, axis=axis, **a)
            got = gaescan.turn_gae(r, v, ids, backend=backend.name, **tk)
            want = gt.turn_gae(r, v, ids, **tk)
            for x, y in zip(got, want, strict=True):
                check(x, y, dtype, "turn_gae " + what)


@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
@pytest.mark.parametrize("mode", ["plain", "dones", "term+trunc"])
def test_nan_stops_at_an_underflowing_trace_weight(backend, rng, mode, time_major):
    # e^ℓ is 0 in float64 for ℓ = -800 and -inf: a zero trace weight c_t,
    # whatever the float width of the data (the float32 lanes blocks take
    # such a block in float64).
    import gaescan

    cases = [(np.float32, (3, 40)), (np.float64, (3, 40))]
    if not backend.small:
        cases += [(np.float32, (19, 4096)), (np.float64, (19, 4096))]
    for dtype, shape in cases:
        T = shape[1]
        r, v, nv = (random_data(rng, shape, dtype) for _ in range(3))
        r[:, T // 2] = np.nan
        lr = (rng.standard_normal(shape) * 0.3).astype(dtype)
        lr[:, T // 4] = -800.0
        lr[:, T // 2 - 2] = -np.inf
        kw = {}
        if mode == "dones":
            kw["dones"] = random_flags(rng, shape, 0.002)
        elif mode == "term+trunc":
            kw = dict(terminated=random_flags(rng, shape, 0.002), truncated=random_flags(rng, shape, 0.002),
                      next_values=nv)
        axis = -1
        if time_major:
            r, v, lr = (np.ascontiguousarray(x.T) for x in (r, v, lr))
            kw = {k: np.ascontiguousarray(x.T) for k, x in kw.items()}
            axis = 0
        got = gaescan.vtrace(r, v, lr, gamma=0.9, lam=0.95, axis=axis, backend=backend.name, **kw)
        want = gt.vtrace(r, v, lr, gamma=0.9, lam=0.95, axis=axis, **kw)
        before = want.vs[:, : T // 2 - 2] if axis == -1 else want.vs[: T // 2 - 2]
        assert np.isnan(want.vs).any() and np.isfinite(before).all()
        for x, y in zip(got, want, strict=True):
            check(x, y, dtype, f"vtrace {mode} {np.dtype(dtype).name} {shape}")


@pytest.mark.parametrize("zero", ["gamma", "lam", "lam row"])
def test_zero_decay_against_an_infinite_trace_weight(backend, rng, zero):
    # A zero γ or λ drops the carry whatever the clipped ratio: with c̄ = ∞ and a
    # log-ratio whose e^ℓ overflows (float64: above 709.8), 0 · ∞ is no NaN.
    import gaescan

    B, T = (3, 40) if backend.small else (19, 4096)
    r, v = random_data(rng, (B, T), np.float64), random_data(rng, (B, T), np.float64)
    lr = np.zeros((B, T))
    lr[:, T // 2] = 1000.0
    lr[:, T // 3] = np.inf
    kw = dict(gamma=0.0 if zero == "gamma" else 0.9, lam=0.0 if zero == "lam" else 0.95, c_bar=np.inf)
    if zero == "lam row":
        kw["lam"] = np.where(np.arange(B) % 2 == 0, 0.0, 0.95)[:, None]
    got = gaescan.vtrace(r, v, lr, backend=backend.name, **kw)
    want = gt.vtrace(r, v, lr, **kw)
    rows = slice(None) if zero != "lam row" else slice(0, None, 2)
    assert np.isfinite(want.vs[rows, : T // 2]).all() and np.isfinite(want.advantages[rows, : T // 3 - 1]).all()
    # (the rows of λ = 0.95 meet ∞ · D, which the contract leaves open)
    for x, y in zip(got, want, strict=True):
        check(x[rows], y[rows], np.float64, f"vtrace zero {zero}")


# ------------------------------------------------------------ CUDA tile edges

# Tiny CUDA geometries (threads per block, steps per thread), so that a row of
# 61 steps crosses thread, tile and look-back boundaries: one block per row
# group walking its tiles, and one block per tile with the look-back.
CUDA_TILES = {
    "rows": dict(threads=8, k=2, k_f64=3, rows_min_blocks=1),
    "lookback": dict(threads=8, k=3, k_f64=2, rows_min_blocks=10**9),
}


@pytest.mark.parametrize("tiles", list(CUDA_TILES))
def test_cuda_tile_edges(backend, rng, tiles):
    if backend.name != "cuda":
        pytest.skip("tile geometries of the CUDA backend")
    from gaescan.backends import cuda as cb

    with cb.override(**CUDA_TILES[tiles]):
        for dtype in DTYPES:
            gae_case(backend, rng, "plain", "scalar", dtype, 61)
            gae_case(backend, rng, "dones", "step", dtype, 61)
            gae_case(backend, rng, "mask", "scalar", dtype, 61)
            returns_case(backend, rng, "plain", "scalar", dtype, 61)
            scan_case(backend, rng, False, "scalar", dtype, 61)
            scan_case(backend, rng, True, "step-zeros", dtype, 61)
