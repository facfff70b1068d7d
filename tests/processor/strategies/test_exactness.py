"""Every strategy on P ranks gives the one-rank numbers: output, input gradient, parameter gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import shard_offsets, shard_sizes, sum_model_parallel_gradients
from processor.distributed.parameter_split import gather_full, split_of
from processor.strategies import ShardHybrid, ShardSequence, Strategy

RTOL = 1e-5


def _model(case: dict, strategy: str | Strategy) -> TransformerProcessor:
    torch.manual_seed(case["seed"])
    config = ProcessorConfig(
        num_layers=case.get("layers", 2),
        num_channels=case.get("channels", 24),
        num_heads=case["heads"],
        window_size=case["window"],
        mlp_hidden_ratio=2,
        num_chunks=case.get("chunks", 0),
        qk_norm=case.get("qk_norm", False),
        strategy=strategy,
        attention_block_size=case.get("block"),
        **case.get("settings", {}),
    )
    return TransformerProcessor(config).to(_dtype(case))


def _dtype(case: dict) -> torch.dtype:
    return torch.float64 if case.get("float64") else torch.get_default_dtype()


def _data(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(case["seed"] + 1)
    shape = (case["batch"], case["points"], case.get("channels", 24))
    return torch.randn(shape, generator=g, dtype=_dtype(case)), torch.randn(shape, generator=g, dtype=_dtype(case))


def segment_ids(case: dict) -> torch.Tensor | None:
    """Random contiguous runs over the whole sequence (some shorter than W, some spanning
    shards), ``(batch, points)`` when the case asks for per-member ids, else ``(points,)``."""
    if not case.get("segments"):
        return None
    g = torch.Generator().manual_seed(case["seed"] + 2)
    rows = []
    for _ in range(case["batch"] if case["segments"] == "per_member" else 1):
        lengths = torch.randint(1, 2 * (case["window"] or 8) + 3, (case["points"],), generator=g)
        ids = torch.repeat_interleave(torch.arange(case["points"]), lengths)[: case["points"]]
        rows.append(ids * 7 % 5 if case.get("repeat_ids") else ids)  # equal ids in separate runs too
    return torch.stack(rows) if case["segments"] == "per_member" else rows[0]


def _sizes(case: dict, ranks: int) -> list[int]:
    return case.get("sizes") or shard_sizes(case["points"], ranks)


def sharded_run(group, case: dict) -> dict:
    """One rank's part: forward its block, backward ``sum(y * cotangent)``, sum parameter grads."""
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model(case, case["strategy"])
    x_full, cotangent = _data(case)
    sizes = _sizes(case, ranks)
    start = shard_offsets(sizes)[rank]
    rows = slice(start, start + sizes[rank])
    x = x_full[:, rows].clone().requires_grad_()
    ids = segment_ids(case)
    model.split_parameters(group)  # shard_channels keeps this rank's share; the others all
    y = model(
        x,
        group=model.build_groups(group),  # shard_hybrid's sub-groups; the group itself for the others
        shard_sizes=sizes if case.get("pass_sizes") else None,
        segment_ids=None if ids is None else ids[..., rows],
    )
    (y * cotangent[:, rows]).sum().backward()
    sum_model_parallel_gradients(model.parameters(), group)
    return {
        "y": y.detach().numpy(),
        "dx": x.grad.numpy(),
        "grads": {n: gather_full(p.grad, split_of(p), group).numpy() for n, p in model.named_parameters()},
        "params": {n: v.numpy() for n, v in model.full_state_dict(group).items()},
    }


def one_rank_run(case: dict) -> dict:
    model = _model(case, "none")
    x_full, cotangent = _data(case)
    x = x_full.clone().requires_grad_()
    y = model(x, segment_ids=segment_ids(case))
    (y * cotangent).sum().backward()
    return {
        "y": y.detach().numpy(),
        "dx": x.grad.numpy(),
        "grads": {n: p.grad.numpy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy() for n, p in model.named_parameters()},
    }


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str, floor: float = 1e-30, tol: float = RTOL) -> None:
    """Max error <= ``tol`` of the tensor's largest value (or of ``floor``, if that is larger)."""
    scale = max(float(np.abs(expected).max()), floor)
    err = float(np.abs(actual - expected).max()) / scale
    assert err <= tol, f"{what}: max error {err:.2e} of the largest value (tolerance {tol:.0e})"


def _cases() -> list[tuple[str, int, dict]]:
    cases = []
    n = 101  # uneven over 2, 3 and 4 ranks
    for ranks in (2, 3, 4):
        smallest = min(shard_sizes(n, ranks))
        windows = [0, 1, 7, smallest + 5, 2 * smallest + 3, n]
        for i, window in enumerate(windows):
            batch = 1 + i % 2
            base = dict(points=n, window=window, batch=batch, heads=4, seed=10 * ranks + i, chunks=i % 3 % 2)
            cases.append(("shard_sequence", ranks, base))
            cases.append(("shard_heads", ranks, {**base, "heads": 6 if ranks == 4 else 4, "qk_norm": i % 2 == 1}))
        wide = dict(points=n, window=None, batch=2, heads=ranks + 1, channels=6 * (ranks + 1), seed=ranks)
        cases.append(("shard_heads", ranks, wide))
        cases.append(("shard_sequence", ranks, dict(points=n, window=None, batch=1, heads=4, seed=ranks)))
        # Tensor parallel: heads (5) and hidden channels (2 * 30) not divisible by 2 or 4.
        for i, window in enumerate((1, smallest + 5, None)):
            tp = dict(points=n, window=window, batch=1 + i % 2, heads=5, channels=30, seed=40 + ranks + i)
            cases.append(("shard_channels", ranks, {**tp, "qk_norm": i == 1, "chunks": i % 2}))
        # Segment ids sharded with the points, through every strategy.
        for i, strategy in enumerate(("shard_sequence", "shard_heads", "shard_channels")):
            window = (3, smallest + 4, 2 * smallest + 3)[(i + ranks) % 3]
            seg = dict(points=n, window=window, batch=2, heads=4, seed=60 + ranks + i)
            cases.append((strategy, ranks, {**seg, "segments": "per_member" if i % 2 else "shared"}))
        cases.append(
            ("shard_sequence", ranks, dict(points=n, window=None, batch=1, heads=4, seed=ranks, segments="shared"))
        )
        # float64, to round-off: segment runs spanning shards, a window wider than a shard.
        for i, strategy in enumerate(("shard_sequence", "shard_heads", "shard_channels")):
            f64 = dict(points=n, window=smallest + 2 + i, batch=2, heads=5, channels=30, seed=80 + ranks + i)
            cases.append((strategy, ranks, {**f64, "float64": True, "segments": "per_member", "qk_norm": True}))
    # Long enough that both sides take the blocked kernel path (several query blocks per rank).
    for strategy in ("shard_sequence", "shard_heads", "shard_channels"):
        cases.append((strategy, 3, dict(points=700, window=40, batch=2, heads=4, seed=7, block=16, chunks=1)))
        many = dict(points=700, window=40, batch=2, heads=4, seed=17, block=16, segments="per_member")
        cases.append((strategy, 4, {**many, "repeat_ids": True}))
        cases.append((strategy, 4, dict(points=523, window=23, batch=1, heads=4, seed=8, qk_norm=True)))
    # shard_sequence chooses the ring when a window reaches past a neighbour; force each way too.
    for ranks in (2, 4):
        forced = dict(points=n, batch=2, heads=4, seed=90 + ranks, qk_norm=True)
        cases.append((ShardSequence(ring=True), ranks, {**forced, "window": 6, "segments": "shared"}))
        cases.append((ShardSequence(ring=False), ranks, {**forced, "window": None, "chunks": 1}))
    cases += _hybrid_cases(n)
    cases += _anemoi_settings_cases(n)
    # Arbitrary (not balanced) shards, one shorter than the window: the halo spans several ranks.
    for strategy in ("shard_sequence", "shard_heads", "shard_channels"):
        cases.append(
            (
                strategy,
                4,
                dict(
                    points=101,
                    sizes=[5, 60, 3, 33],
                    window=10,
                    batch=2,
                    heads=4,
                    seed=9,
                    pass_sizes=True,
                    chunks=2,
                    layers=2,
                ),
            )
        )
        cases.append(
            (strategy, 3, dict(points=90, sizes=[1, 1, 88], window=4, batch=1, heads=3, seed=11, pass_sizes=True))
        )
    return cases


def _hybrid_cases(n: int) -> list[tuple[str | Strategy, int, dict]]:
    """Heads within groups, sequence across them: halo and ring across groups, P > heads."""
    hybrid = ShardHybrid
    smallest = min(shard_sizes(n, 4))
    base = dict(points=n, batch=2, heads=4, qk_norm=True)
    return [
        ("shard_hybrid", 2, {**base, "window": 9, "seed": 120}),  # default G = 2: shard_heads' case
        (hybrid(head_group_size=1), 3, {**base, "window": 2 * smallest + 3, "seed": 121, "heads": 3}),  # ring
        ("shard_hybrid", 4, {**base, "window": 7, "seed": 122, "batch": 1, "segments": "shared"}),  # G = 4
        # P = 4 as 2 x 2: 2 heads per rank, a halo across the two super-blocks.
        (hybrid(head_group_size=2), 4, {**base, "window": smallest + 5, "seed": 123, "chunks": 1}),
        # P > heads: 2 heads on 4 ranks; global attention, forced through the ring, with ids.
        (
            hybrid(head_group_size=2, ring=True),
            4,
            {**base, "window": None, "heads": 2, "seed": 124, "segments": "per_member"},
        ),
        (hybrid(head_group_size=2), 4, {**base, "window": None, "heads": 3, "seed": 125, "batch": 1}),
        (
            hybrid(head_group_size=2),
            4,
            {**base, "window": 11, "heads": 5, "channels": 30, "seed": 126, "float64": True, "segments": "shared"},
        ),
        (
            hybrid(head_group_size=2),
            4,
            dict(points=101, sizes=[5, 60, 3, 33], window=10, batch=2, heads=4, seed=127, pass_sizes=True, chunks=2),
        ),
    ]


# anemoi's settings: attention width, gated MLPs, softcap, ALiBi, rotary (global positions).
ALL_SETTINGS = dict(
    attn_channels=40,
    mlp_implementation="swiglu",
    softcap=1.5,
    use_alibi_slopes=True,
    use_rotary_embeddings=True,
)


def _anemoi_settings_cases(n: int) -> list[tuple[str | Strategy, int, dict]]:
    """Every strategy with all of anemoi's settings at once (float64, to round-off), each alone
    in fp32, a narrower attention than C, and the ring, the halo and the global window."""
    smallest = min(shard_sizes(n, 3))
    cases: list[tuple[str | Strategy, int, dict]] = []
    strategies: list[str | Strategy] = [
        "shard_sequence",
        ShardSequence(ring=True),
        "shard_heads",
        "shard_channels",
    ]
    for i, strategy in enumerate(strategies):
        f64 = dict(points=n, window=smallest + 5, batch=2, heads=4, seed=200 + i, float64=True, qk_norm=True)
        cases.append((strategy, 3, {**f64, "settings": ALL_SETTINGS, "segments": "per_member"}))
        glob = dict(points=n, window=None, batch=1, heads=4, seed=210 + i, chunks=1)
        cases.append((strategy, 2, {**glob, "settings": ALL_SETTINGS}))
    hybrid = dict(points=n, window=9, batch=2, heads=4, seed=220, float64=True, settings=ALL_SETTINGS)
    cases.append((ShardHybrid(head_group_size=2), 4, hybrid))
    cases.append((ShardHybrid(head_group_size=2, ring=True), 4, {**hybrid, "seed": 221, "window": None}))
    alone = [
        {"attn_channels": 16},
        {"mlp_implementation": "geglu"},
        {"mlp_implementation": "glu"},
        {"mlp_implementation": "reglu"},
        {"softcap": 0.8},
        {"use_alibi_slopes": True},
        {"use_rotary_embeddings": True},
    ]
    for i, settings in enumerate(alone):
        strategy = ("shard_sequence", "shard_heads", "shard_channels")[i % 3]
        one = dict(points=n, window=(3, smallest + 4, 2 * smallest + 3)[i % 3], batch=2, heads=4, seed=230 + i)
        cases.append((strategy, 3, {**one, "settings": settings, "segments": "shared" if i % 2 else None}))
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    "strategy,ranks,case",
    CASES,
    ids=[
        f"{s}-P{p}-N{c['points']}-W{c['window']}-B{c['batch']}{'-seg' if c.get('segments') else ''}"
        f"{'-f64' if c.get('float64') else ''}-{i}"
        for i, (s, p, c) in enumerate(CASES)
    ],
)
def test_matches_one_rank(rank_pool, strategy: str | Strategy, ranks: int, case: dict) -> None:
    case = {**case, "strategy": strategy}
    parts = rank_pool.run_ok(sharded_run, ranks, case)
    reference = one_rank_run(case)

    tol = 1e-10 if case.get("float64") else RTOL  # float64: to round-off
    assert_close(np.concatenate([p["y"] for p in parts], axis=1), reference["y"], "output", tol=tol)
    assert_close(np.concatenate([p["dx"] for p in parts], axis=1), reference["dx"], "input gradient", tol=tol)
    # Some gradients are zero up to round-off (the k-norm bias: softmax ignores a per-query
    # constant); measure those against a tenth of the model's largest gradient.
    floor = 0.1 * max(float(np.abs(g).max()) for g in reference["grads"].values())
    for name, expected in reference["grads"].items():
        for r, part in enumerate(parts):
            assert_close(part["grads"][name], expected, f"summed gradient of {name} on rank {r}", floor, tol)


def test_parameters_do_not_depend_on_rank_or_strategy(rank_pool) -> None:
    case = dict(points=40, window=3, batch=1, heads=4, seed=3, strategy="shard_sequence")
    parts = rank_pool.run_ok(sharded_run, 4, case)
    reference = one_rank_run(case)
    for part in parts:
        for name, value in reference["params"].items():
            np.testing.assert_array_equal(part["params"][name], value, err_msg=name)


def test_a_broken_halo_would_be_caught(rank_pool) -> None:
    """The comparison has teeth: dropping the halo (window 0 on the ranks) differs from W = 5."""
    case = dict(points=60, window=0, batch=1, heads=4, seed=5, strategy="shard_sequence")
    parts = rank_pool.run_ok(sharded_run, 3, case)
    reference = one_rank_run({**case, "window": 5})
    with pytest.raises(AssertionError):
        assert_close(np.concatenate([p["y"] for p in parts], axis=1), reference["y"], "output")
