"""gaescan.distributed on real torch.distributed process groups (gloo, CPU).

One spawn per world size (2 and 4 ranks) runs every case; each rank writes
its slice of every result, and the numbers it sent, to a file.  The parent
compares the concatenated slices with the float64 references of
``gaescan.testing`` on the whole rows.
"""

from __future__ import annotations

import os
import pickle
import socket

import numpy as np
import pytest

import gaescan.testing as gt

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - depends on the build
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

B, T = 5, 1500
# time cuts per world size: uneven slices; with 4 ranks one slice is empty
CUTS = {2: [0, 700, T], 4: [0, 301, 301, 1002, T]}


def _data() -> dict:
    rng = np.random.default_rng(20261202)
    f32 = np.float32
    d = dict(
        r=rng.standard_normal((B, T)).astype(f32),
        v=rng.standard_normal((B, T)).astype(f32),
        nv=rng.standard_normal((B, T)).astype(f32),
        dones=rng.random((B, T)) < 0.01,
        term=rng.random((B, T)) < 0.005,
        trunc=rng.random((B, T)) < 0.005,
        mask=rng.random((B, T)) < 0.85,
        a=rng.uniform(0.5, 1.0, (B, T)).astype(f32),
        lv=rng.standard_normal(B).astype(f32),
        la=rng.standard_normal(B).astype(f32),
        g_row=rng.uniform(0.9, 1.0, (B, 1)).astype(f32),
        init=rng.standard_normal(B).astype(f32),
        x=(1e4 + rng.standard_normal((B, T))).astype(f32),  # |mean| >> std: E[x^2] - E[x]^2 would cancel
    )
    d["mask"][1, 290:1100] = False  # one row with no valid step in the 4-rank run's middle slices
    d["lr"] = (0.7 * rng.standard_normal((B, T))).astype(f32)  # V-trace log-ratios
    d["lt"] = rng.standard_normal(B).astype(f32)  # V-trace last_trace
    d["r_bad"] = d["r"].copy()
    d["r_bad"][0, T - 3] = np.nan
    d["r_bad"][1, T - 3] = np.inf
    return d


# name -> (distributed call on slices s, reference on whole rows d); ``s`` and ``d`` hold the
# same keys, per-step arrays sliced in ``s``
CASES = {
    "gae_dones_mask_boundaries": (
        lambda m, s: m.gae(s["r"], s["v"], gamma=0.99, lam=0.95, dones=s["dones"], mask=s["mask"],
                           last_value=s["lv"], last_advantage=s["la"]),
        lambda d: gt.gae(d["r"], d["v"], gamma=0.99, lam=0.95, dones=d["dones"], mask=d["mask"],
                         last_value=d["lv"], last_advantage=d["la"]),
    ),
    "gae_next_values_term_trunc": (
        lambda m, s: m.gae(s["r"], s["v"], gamma=0.99, lam=0.9, next_values=s["nv"], terminated=s["term"],
                           truncated=s["trunc"]),
        lambda d: gt.gae(d["r"], d["v"], gamma=0.99, lam=0.9, next_values=d["nv"], terminated=d["term"],
                         truncated=d["trunc"]),
    ),
    "gae_per_row_gamma": (
        lambda m, s: m.gae(s["r"], s["v"], gamma=s["g_row"], lam=0.95, dones=s["dones"]),
        lambda d: gt.gae(d["r"], d["v"], gamma=d["g_row"], lam=0.95, dones=d["dones"]),
    ),
    "gae_float64_mask": (
        lambda m, s: m.gae(s["r"].astype(np.float64), s["v"].astype(np.float64), gamma=0.999, lam=0.97,
                           mask=s["mask"]),
        lambda d: gt.gae(d["r"].astype(np.float64), d["v"].astype(np.float64), gamma=0.999, lam=0.97,
                         mask=d["mask"]),
    ),
    # time-major slices, per-step λ, no dones: every step of every row takes the carry
    "gae_time_major_per_step_lam": (
        lambda m, s: tuple(x.T for x in m.gae(s["r"].T, s["v"].T, gamma=0.999, lam=s["a"].T, axis=0,
                                              last_advantage=s["la"])),
        lambda d: gt.gae(d["r"], d["v"], gamma=0.999, lam=d["a"], last_advantage=d["la"]),
    ),
    # γλ = 0.25: the carry's weight underflows to 0 within a slice (only its tail takes it)
    "gae_fast_decay_no_dones": (
        lambda m, s: m.gae(s["r"], s["v"], gamma=0.5, lam=0.5, last_advantage=1e30 * s["la"]),
        lambda d: gt.gae(d["r"], d["v"], gamma=0.5, lam=0.5, last_advantage=1e30 * d["la"]),
    ),
    # A NaN (row 0) and an infinity (row 1) in the last slice reach the whole row, across
    # slices whose carry weights underflow (no done): the carry added where it reaches
    "gae_nonfinite_across_fast_decay": (
        lambda m, s: m.gae(s["r_bad"], s["v"], gamma=0.5, lam=0.5),
        lambda d: gt.gae(d["r_bad"], d["v"], gamma=0.5, lam=0.5),
    ),
    "gae_torch": (
        lambda m, s: tuple(x.numpy() for x in m.gae(torch.from_numpy(s["r"]), torch.from_numpy(s["v"]), gamma=0.99,
                                                    lam=0.95, dones=torch.from_numpy(s["dones"]))),
        lambda d: gt.gae(d["r"], d["v"], gamma=0.99, lam=0.95, dones=d["dones"]),
    ),
    "vtrace_dones_mask_boundaries": (
        lambda m, s: m.vtrace(s["r"], s["v"], s["lr"], gamma=0.99, lam=0.95, c_bar=0.9, dones=s["dones"],
                              mask=s["mask"], last_value=s["lv"], last_trace=s["lt"]),
        lambda d: gt.vtrace(d["r"], d["v"], d["lr"], gamma=0.99, lam=0.95, c_bar=0.9, dones=d["dones"],
                            mask=d["mask"], last_value=d["lv"], last_trace=d["lt"]),
    ),
    "vtrace_next_values_term_trunc_torch": (
        lambda m, s: tuple(x.numpy() for x in m.vtrace(
            *(torch.from_numpy(s[k]) for k in ("r", "v", "lr")), gamma=0.99, rho_bar=2.0, pg_rho_bar=0.8,
            next_values=torch.from_numpy(s["nv"]), terminated=torch.from_numpy(s["term"]),
            truncated=torch.from_numpy(s["trunc"]))),
        lambda d: gt.vtrace(d["r"], d["v"], d["lr"], gamma=0.99, rho_bar=2.0, pg_rho_bar=0.8, next_values=d["nv"],
                            terminated=d["term"], truncated=d["trunc"]),
    ),
    "returns_dones_mask": (
        lambda m, s: m.discounted_returns(s["r"], gamma=0.99, dones=s["dones"], mask=s["mask"], last_value=s["lv"]),
        lambda d: gt.discounted_returns(d["r"], gamma=0.99, dones=d["dones"], mask=d["mask"], last_value=d["lv"]),
    ),
    "scan_forward": (
        lambda m, s: m.linear_scan(s["a"], s["r"], initial=s["init"]),
        lambda d: gt.linear_scan(d["a"], d["r"], initial=d["init"]),
    ),
    "scan_reverse": (
        lambda m, s: m.linear_scan(s["a"], s["r"], reverse=True, initial=s["init"]),
        lambda d: gt.linear_scan(d["a"], d["r"], reverse=True, initial=d["init"]),
    ),
    "whiten_mask": (
        lambda m, s: m.whiten(s["x"], s["mask"]),
        lambda d: gt.whiten(d["x"], d["mask"]),
    ),
    "whiten_torch_no_shift": (
        lambda m, s: m.whiten(torch.from_numpy(s["x"]), torch.from_numpy(s["mask"]), shift_mean=False,
                              ddof=0).numpy(),
        lambda d: gt.whiten(d["x"], d["mask"], shift_mean=False, ddof=0),
    ),
}
# statistics: every rank gets the moments of all ranks' elements
STAT_CASES = {
    "moments_mask": (lambda m, s: m.moments(s["x"], s["mask"]), lambda d: gt.moments(d["x"], d["mask"])),
    "moments_torch": (lambda m, s: tuple(f.numpy() for f in m.moments(torch.from_numpy(s["x"]))),
                      lambda d: gt.moments(d["x"])),
}
ROW_KEYS = ("lv", "la", "lt", "g_row", "init")


def _worker(rank: int, world: int, port: int, data_path: str, out_dir: str) -> None:
    import torch.distributed as tdist

    import gaescan.distributed as gd

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        with open(data_path, "rb") as f:
            d = pickle.load(f)
        lo, hi = CUTS[world][rank], CUTS[world][rank + 1]
        s = {k: (x if k in ROW_KEYS else x[:, lo:hi]) for k, x in d.items()}
        sent: list[int] = []
        real = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor

        def counting(out, inp, group=None, async_op=False):
            sent.append(inp.numel())
            return real(out, inp, group=group, async_op=async_op)

        tdist.all_gather_single = tdist.all_gather_into_tensor = counting
        results = {}
        for name, (call, _) in (CASES | STAT_CASES).items():
            del sent[:]
            res = call(gd, s)
            results[name] = ([np.asarray(x) for x in res] if isinstance(res, tuple) else [np.asarray(res)],
                             list(sent))
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
    finally:
        tdist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def run(request, tmp_path_factory):
    world = request.param
    tmp = tmp_path_factory.mktemp(f"dist{world}")
    d = _data()
    data_path = str(tmp / "data.pkl")
    with open(data_path, "wb") as f:
        pickle.dump(d, f)
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), data_path, str(tmp)), nprocs=world, join=True)
    ranks = []
    for r in range(world):
        with open(tmp / f"rank{r}.pkl", "rb") as f:
            ranks.append(pickle.load(f))
    return world, d, ranks


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_gets_its_slice_of_the_one_process_result(run, case):
    world, d, ranks = run
    ref = CASES[case][1](d)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    for k, want in enumerate(ref):
        parts = [ranks[r][case][0][k] for r in range(world)]
        for r, p in enumerate(parts):
            assert p.shape == (B, CUTS[world][r + 1] - CUTS[world][r])
        got = np.concatenate(parts, axis=1)
        gt.assert_close(got, want)


@pytest.mark.parametrize("case", list(STAT_CASES))
def test_every_rank_gets_the_moments_of_all_ranks(run, case):
    world, d, ranks = run
    want = STAT_CASES[case][1](d)
    for r in range(world):
        count, mean, m2 = ranks[r][case][0]
        assert float(count) == float(want.count)
        np.testing.assert_allclose(float(mean), float(want.mean), rtol=1e-12)
        np.testing.assert_allclose(float(m2), float(want.m2), rtol=1e-9)
        # the same merge, in rank order, on every rank: the same bits
        assert [x.tobytes() for x in ranks[r][case][0]] == [x.tobytes() for x in ranks[0][case][0]]


@pytest.mark.parametrize("case", list(CASES | STAT_CASES))
def test_exchange_is_o_rows_per_rank(run, case):
    # GAE and V-trace: two all-gathers of 2·B numbers (one with next_values); returns and scans: one;
    # statistics: one of three numbers, whatever the slice length.
    world, _, ranks = run
    if case.startswith(("whiten", "moments")):
        expected = [3]
    else:
        expected = [2 * B] * (1 if "next_values" in case or not case.startswith(("gae", "vtrace")) else 2)
    for r in range(world):
        assert ranks[r][case][1] == expected


def test_without_a_process_group_the_error_says_what_to_do():
    import gaescan.distributed as gd

    x = np.zeros((2, 3), np.float32)
    with pytest.raises(RuntimeError, match="init_process_group"):
        gd.gae(x, x, gamma=0.9, lam=0.9)
    with pytest.raises(RuntimeError, match="init_process_group"):
        gd.vtrace(x, x, x, gamma=0.9)


def test_packed_rows_are_refused_with_the_fix():
    import gaescan.distributed as gd

    x = np.zeros(6, np.float32)
    with pytest.raises(ValueError, match="per segment"):
        gd.gae(x, x, gamma=0.9, lam=0.9, cu_seqlens=np.array([0, 3, 6]))
    with pytest.raises(ValueError, match="per segment"):
        gd.vtrace(x, x, x, gamma=0.9, cu_seqlens=np.array([0, 3, 6]))
