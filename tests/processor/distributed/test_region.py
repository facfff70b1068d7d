"""The sharded region: shard_points / gather_points / reduce_scatter_points on P ranks give one
rank's values and gradients, for any N (also N < P), dim, batch and dtype; a toy model with
replicated and sharded parts equals one rank; bad input raises on every rank."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import (
    CommCounter,
    Transport,
    gather_points,
    parallelize_gradients,
    reduce_scatter_points,
    shard_offsets,
    shard_points,
    shard_sizes,
    sum_model_parallel_gradients,
)
from tests.rank_pool import RankError

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def _shape(case: dict) -> tuple[int, ...]:
    """``(batch, N, 3)`` for dim 1, ``(batch, 2, N)`` for dim -1, ``(N, batch, 2)`` for dim 0."""
    n, b = case["n"], case["batch"]
    return {1: (b, n, 3), -1: (b, 2, n), 0: (n, b, 2)}[case["dim"]]


def _tensor(case: dict, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(_shape(case), generator=g, dtype=torch.float64).to(getattr(torch, case["dtype"]))


def _sizes(case: dict, ranks: int) -> list[int]:
    return case.get("sizes") or shard_sizes(case["n"], ranks)


def _block(full: np.ndarray, case: dict, ranks: int, rank: int) -> np.ndarray:
    sizes = _sizes(case, ranks)
    start = shard_offsets(sizes)[rank]
    return np.take(full, range(start, start + sizes[rank]), axis=case["dim"])


def _f(y: torch.Tensor) -> torch.Tensor:
    """An elementwise nonlinearity, so that gradients depend on where each value is."""
    return torch.tanh(y) * y


def region_case(group, case: dict) -> dict:
    """x (full) -> shard -> f -> gather -> f -> loss; replicated loss: one cotangent for all
    ranks; rank_local: a cotangent of each rank's own, the loss trained being their sum."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    counter = CommCounter()
    transport = Transport(counter)
    sizes = case.get("sizes") if case.get("pass_sizes") else None
    x = _tensor(case, case["seed"]).requires_grad_()
    local = shard_points(x, group, case["dim"], sizes=sizes, transport=transport)
    h = _f(local)
    h.retain_grad()
    y = gather_points(h, group, case["dim"], downstream=case["downstream"], transport=transport)
    seed = case["seed"] + 1 + (rank if case["downstream"] == "rank_local" else 0)
    (_f(y) * _tensor(case, seed)).sum().backward()
    return {
        "local": local.detach().numpy(),
        "y": y.detach().numpy(),
        "dx": x.grad.numpy(),
        "dh": h.grad.numpy(),
        "bytes": dict(counter.bytes_sent),
        "calls": dict(counter.calls),
    }


def one_rank_region(case: dict, ranks: int) -> dict:
    x = _tensor(case, case["seed"]).requires_grad_()
    y = _f(x)
    y.retain_grad()
    seeds = [case["seed"] + 1 + r for r in range(ranks if case["downstream"] == "rank_local" else 1)]
    cotangent = sum(_tensor(case, s) for s in seeds)
    (_f(y) * cotangent).sum().backward()
    return {"x": x.detach().numpy(), "y": y.detach().numpy(), "dx": x.grad.numpy(), "dy": y.grad.numpy()}


def assert_close(actual: np.ndarray, expected: np.ndarray, tol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-30)
    err = float(np.abs(actual - expected).max(initial=0.0)) / scale
    assert err <= tol, f"{what}: max error {err:.1e} of the largest value (tolerance {tol:.0e})"


def _expected_bytes(case: dict, ranks: int) -> dict[str, int]:
    """Per rank: gather's all-gather forward and shard's backward; rank_local adds a
    reduce-scatter. Each sends (P - 1) chunks of the longest block, padding included."""
    shape = _shape(case)
    width = int(np.prod(shape)) // case["n"] if case["n"] else 0
    chunk = max(_sizes(case, ranks)) * width * (8 if case["dtype"] == "float64" else 4)
    sent = {"all_gather": 2 * (ranks - 1) * chunk}
    if case["downstream"] == "rank_local":
        sent["reduce_scatter"] = (ranks - 1) * chunk
    return {k: v for k, v in sent.items() if v}


def _region_cases() -> list[tuple[int, dict]]:
    cases = []
    for ranks in (2, 3, 4):
        for i, n in enumerate((4 * ranks, 4 * ranks + 1, ranks - 1, 7)):
            for downstream in ("replicated", "rank_local"):
                dim = (1, -1, 0, 1)[i]
                dtype = "float64" if (i + ranks) % 2 else "float32"
                seed = 100 * ranks + 10 * i + (downstream == "rank_local")
                cases.append(
                    (ranks, dict(n=n, dim=dim, batch=1 + i % 2, dtype=dtype, downstream=downstream, seed=seed))
                )
    uneven = dict(n=11, dim=1, batch=2, dtype="float64", sizes=[0, 7, 1, 3], pass_sizes=True, seed=5)
    cases += [(4, {**uneven, "downstream": d}) for d in ("replicated", "rank_local")]
    return cases


REGION_CASES = _region_cases()


@pytest.mark.parametrize(
    "ranks,case",
    REGION_CASES,
    ids=[f"P{p}-N{c['n']}-dim{c['dim']}-B{c['batch']}-{c['dtype']}-{c['downstream']}" for p, c in REGION_CASES],
)
def test_region_matches_one_rank(rank_pool, ranks: int, case: dict) -> None:
    parts = rank_pool.run_ok(region_case, ranks, case)
    ref = one_rank_region(case, ranks)
    tol = TOLERANCE[case["dtype"]]
    for r, part in enumerate(parts):
        np.testing.assert_array_equal(part["local"], _block(ref["x"], case, ranks, r), err_msg=f"block of rank {r}")
        np.testing.assert_array_equal(part["y"], ref["y"], err_msg=f"gathered tensor on rank {r}")
        assert_close(part["dh"], _block(ref["dy"], case, ranks, r), tol, f"gather's block gradient, rank {r}")
        assert_close(part["dx"], ref["dx"], tol, f"full input gradient on rank {r}")
        assert part["bytes"] == _expected_bytes(case, ranks), f"bytes counted on rank {r}"


def test_the_wrong_downstream_is_wrong(rank_pool) -> None:
    """The semantics have teeth: rank_local for a replicated loss is P times too large;
    replicated for rank-local losses misses the other ranks' terms."""
    case = dict(n=10, dim=1, batch=1, dtype="float64", seed=1)
    ranks = 2
    for told, truth in (("rank_local", "replicated"), ("replicated", "rank_local")):
        parts = rank_pool.run_ok(wrong_downstream_case, ranks, {**case, "downstream": told, "truth": truth})
        ref = one_rank_region({**case, "downstream": truth}, ranks)
        if truth == "replicated":
            assert_close(parts[0]["dx"], ranks * ref["dx"], 1e-12, "P times too large")
        else:
            with pytest.raises(AssertionError):
                assert_close(parts[0]["dx"], ref["dx"], 1e-5, "missing contributions")


def wrong_downstream_case(group, case: dict) -> dict:
    """:func:`region_case` with the loss of ``case["truth"]`` but gather told ``case["downstream"]``."""
    import torch.distributed as dist

    x = _tensor(case, case["seed"]).requires_grad_()
    y = gather_points(_f(shard_points(x, group)), group, downstream=case["downstream"])
    seed = case["seed"] + 1 + (dist.get_rank(group) if case["truth"] == "rank_local" else 0)
    (_f(y) * _tensor(case, seed)).sum().backward()
    return {"dx": x.grad.numpy()}


def reduce_scatter_case(group, case: dict) -> dict:
    """Each rank's own full term -> this rank's block of the sum -> f -> loss (summed over ranks)."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    counter = CommCounter()
    x = _tensor(case, case["seed"] + rank).requires_grad_()
    out = reduce_scatter_points(x, group, case["dim"], transport=Transport(counter))
    cotangent = torch.from_numpy(_block(_tensor(case, 99).numpy(), case, dist.get_world_size(group), rank))
    (_f(out) * cotangent).sum().backward()
    return {"out": out.detach().numpy(), "dx": x.grad.numpy(), "bytes": dict(counter.bytes_sent)}


@pytest.mark.parametrize("ranks,n,dim", [(2, 9, 1), (3, 2, -1), (4, 13, 0)])
def test_reduce_scatter_points_matches_one_rank(rank_pool, ranks: int, n: int, dim: int) -> None:
    case = dict(n=n, dim=dim, batch=2, dtype="float64", seed=7 * ranks)
    parts = rank_pool.run_ok(reduce_scatter_case, ranks, case)
    total = sum(_tensor(case, case["seed"] + r) for r in range(ranks)).requires_grad_()
    (_f(total) * _tensor(case, 99)).sum().backward()
    chunk = max(shard_sizes(n, ranks)) * int(np.prod(_shape(case))) // n * 8
    for r, part in enumerate(parts):
        assert_close(part["out"], _block(total.detach().numpy(), case, ranks, r), 1e-12, f"block of the sum, rank {r}")
        assert_close(part["dx"], total.grad.numpy(), 1e-12, f"gradient of rank {r}'s term")
        assert part["bytes"] == {"reduce_scatter": (ranks - 1) * chunk, "all_gather": (ranks - 1) * chunk}


# --- A toy model: replicated embedding -> sharded processor -> replicated global head ---------

C_IN, C, C_OUT = 5, 16, 3


class ToyModel(nn.Module):
    """``(batch, N, C_IN)`` -> ``(batch, C_OUT)``; only the processor runs on blocks of points."""

    def __init__(self, points: int, strategy: str) -> None:
        super().__init__()
        config = ProcessorConfig(2, C, 2, window_size=3, mlp_hidden_ratio=2, num_chunks=1, strategy=strategy)
        self.embed = nn.Linear(C_IN, C)
        self.processor = TransformerProcessor(config)
        self.head = nn.Linear(points * C, C_OUT)  # global: every point, in order

    def forward(self, x: torch.Tensor, group=None, downstream: str = "replicated") -> torch.Tensor:
        h = shard_points(self.embed(x), group)  # (batch, n_rank, C)
        h = self.processor(h, group=group)
        y = gather_points(h, group, downstream=downstream)  # (batch, N, C), on every rank
        return self.head(y.flatten(1))


def _toy(case: dict, strategy: str) -> tuple[ToyModel, torch.Tensor, torch.Tensor]:
    """Model, input ``(batch, N, C_IN)`` and one target ``(batch, C_OUT)`` per rank."""
    dtype = getattr(torch, case["dtype"])
    torch.manual_seed(case["seed"])
    model = ToyModel(case["n"], strategy).to(dtype)
    g = torch.Generator().manual_seed(case["seed"] + 1)
    x = torch.randn(case["batch"], case["n"], C_IN, generator=g, dtype=torch.float64).to(dtype)
    targets = torch.randn(case["ranks"], case["batch"], C_OUT, generator=g, dtype=torch.float64).to(dtype)
    return model, x, targets


def toy_case(group, case: dict) -> dict:
    """Replicated loss (target 0 on every rank) or rank-local losses (target r on rank r, the
    loss trained being their sum); then the parameter gradients that need it are summed."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    model, x, targets = _toy(case, "shard_sequence")
    if case.get("ddp"):  # the processor's sum happens in backward
        model.processor = parallelize_gradients(model.processor, mp_group=group)
    x.requires_grad_()
    out = model(x, group, case["downstream"])
    rank_local = case["downstream"] == "rank_local"
    ((out - targets[rank if rank_local else 0]) ** 2).sum().backward()
    # The processor always; the head (after the gather) only when each rank's loss differs.
    region = () if case.get("ddp") else model.processor.parameters()
    sum_model_parallel_gradients([*region, *(model.head.parameters() if rank_local else ())], group)
    return {"out": out.detach().numpy(), "dx": x.grad.numpy(), "grads": _grads(model)}


def _grads(model: nn.Module) -> dict[str, np.ndarray]:
    return {n.replace(".module.", "."): p.grad.numpy() for n, p in model.named_parameters()}


def one_rank_toy(case: dict) -> dict:
    model, x, targets = _toy(case, "none")
    x.requires_grad_()
    out = model(x)
    used = targets if case["downstream"] == "rank_local" else targets[:1]
    sum(((out - t) ** 2).sum() for t in used).backward()
    return {"out": out.detach().numpy(), "dx": x.grad.numpy(), "grads": _grads(model)}


TOY_CASES = [
    dict(ranks=2, n=30, batch=1, dtype="float32", downstream="replicated", seed=1),
    dict(ranks=3, n=31, batch=2, dtype="float64", downstream="rank_local", seed=2),
    dict(ranks=3, n=31, batch=1, dtype="float64", downstream="rank_local", seed=5, ddp=True),
    dict(ranks=4, n=29, batch=2, dtype="float32", downstream="rank_local", seed=3),
    dict(ranks=4, n=30, batch=1, dtype="float64", downstream="replicated", seed=4),
]


@pytest.mark.parametrize(
    "case",
    TOY_CASES,
    ids=[f"P{c['ranks']}-N{c['n']}-{c['dtype']}-{c['downstream']}{'-ddp' * c.get('ddp', 0)}" for c in TOY_CASES],
)
def test_toy_model_matches_one_rank(rank_pool, case: dict) -> None:
    parts = rank_pool.run_ok(toy_case, case["ranks"], case)
    ref = one_rank_toy(case)
    tol = TOLERANCE[case["dtype"]] if case["dtype"] == "float32" else 1e-10
    floor = 0.1 * max(float(np.abs(g).max()) for g in ref["grads"].values())
    for r, part in enumerate(parts):
        assert_close(part["out"], ref["out"], tol, f"output on rank {r}")
        assert_close(part["dx"], ref["dx"], tol, f"input gradient on rank {r}")
        for name, want in ref["grads"].items():
            got = part["grads"][name]
            err = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), floor)
            assert err <= tol, f"gradient of {name} on rank {r}: relative error {err:.1e}"


# --- Bad input: the same ValueError on every rank ----------------------------------------------


def bad_input_case(group, problem: str) -> str:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    x = torch.randn(2, 10, 4)
    block = torch.randn(2, 3, 4)
    calls = {
        "dim": lambda: shard_points(x, group, dim=3 if rank == 1 else 1),
        "sizes_sum": lambda: shard_points(x, group, sizes=[5] * ranks),
        "sizes_length": lambda: gather_points(block, group, sizes=[3] * (ranks - 1)),
        "negative_size": lambda: shard_points(x, group, sizes=[-1, 11] + [0] * (ranks - 2)),
        "other_dims": lambda: gather_points(torch.randn(2, 3, 4 if rank == 0 else 5), group),
        "full_shape": lambda: shard_points(torch.randn(2, 10 + (rank == 1), 4), group),
        "sizes_blocks": lambda: gather_points(torch.randn(2, 3 + (rank == ranks - 1), 4), group, sizes=[3] * ranks),
        "downstream": lambda: gather_points(block, group, downstream="mean" if rank == ranks - 1 else "replicated"),
        "dtype": lambda: gather_points(block.double() if rank == 0 else block, group),
        "requires_grad": lambda: gather_points(block.requires_grad_(rank == 1), group),
        "scalar": lambda: reduce_scatter_points(torch.tensor(1.0), group, dim=0),
        "rs_dim": lambda: reduce_scatter_points(x, group, dim=-4),
    }
    calls[problem]()
    return "ran"


BAD_INPUT = [
    ("dim", 2, r"shard_points: dim 3 is out of range for a 3-d tensor of shape \(2, 10, 4\) \(on ranks \[1\]\)"),
    ("sizes_sum", 3, r"shard_points: sizes \[5, 5, 5\] sum to 15, not to the 10 rows of dim 1"),
    ("sizes_length", 4, r"gather_points: sizes \[3, 3, 3\] has 3 entries for 4 ranks"),
    ("negative_size", 2, r"sizes \[-1, 11\] must all be >= 0"),
    ("other_dims", 3, r"gather_points: arguments differ between rank 0 and ranks \[1, 2\]: shape: "),
    ("full_shape", 2, r"shard_points: arguments differ between rank 0 and ranks \[1\]: shape: \(2, 10, 4\) on"),
    ("sizes_blocks", 3, r"gather_points: sizes \[3, 3, 3\] do not match the blocks the ranks hold, \[3, 3, 4\]"),
    ("downstream", 2, r"downstream must be one of \['replicated', 'rank_local'\], got 'mean' \(on ranks \[1\]\)"),
    ("dtype", 2, r"arguments differ .*dtype: torch.float64 on ranks \[0\], torch.float32 on ranks \[1\]"),
    ("requires_grad", 3, r"arguments differ .*grad: False on ranks \[0, 2\], True on ranks \[1\]"),
    ("scalar", 2, r"reduce_scatter_points: a 0-d tensor has no dim to split"),
    ("rs_dim", 4, r"reduce_scatter_points: dim -4 is out of range"),
]


@pytest.mark.parametrize("problem,ranks,message", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_raises_on_every_rank(rank_pool, problem: str, ranks: int, message: str) -> None:
    results = rank_pool.run(bad_input_case, ranks, problem)
    for r, result in enumerate(results):
        assert isinstance(result, RankError), f"rank {r} did not raise: {result}"
        assert result.type == "ValueError", f"rank {r}: {result.type}: {result.message}"
        assert re.search(message, result.message), f"rank {r}: {result.message}"
        assert "\n" not in result.message
    assert len({r.message for r in results}) == 1, [r.message for r in results]


def test_one_rank_is_the_identity_and_checks_its_input() -> None:
    x = torch.randn(2, 5, 3)
    assert shard_points(x, None) is x and gather_points(x, None, sizes=[5]) is x
    assert reduce_scatter_points(x, None, dim=-1) is x
    with pytest.raises(ValueError, match="dim 3 is out of range"):
        shard_points(x, None, dim=3)
    with pytest.raises(ValueError, match=r"sizes \[4\] give this rank 4 rows, it holds 5"):
        gather_points(x, None, sizes=[4])
    with pytest.raises(ValueError, match=r"sizes \[2, 3\] has 2 entries for 1 ranks"):
        shard_points(x, None, sizes=[2, 3])


def unchecked_case(group, n: int) -> dict:
    """``check=False`` with the sizes given: no agreement gather, the same numbers."""
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    sizes = shard_sizes(n, ranks)
    x = torch.arange(2.0 * n).view(2, n)
    local = shard_points(x, group, -1, sizes=sizes, check=False)
    full = gather_points(local * (rank + 1), group, -1, sizes=sizes, check=False)
    summed = reduce_scatter_points(full, group, -1, sizes=sizes, check=False)
    return {"local": local.numpy(), "full": full.numpy(), "summed": summed.numpy()}


def test_unchecked_calls_give_the_same_numbers(rank_pool) -> None:
    n, ranks = 7, 3
    parts = rank_pool.run_ok(unchecked_case, ranks, n)
    x = np.arange(2.0 * n).reshape(2, n)
    scale = np.concatenate([np.full(s, r + 1.0) for r, s in enumerate(shard_sizes(n, ranks))])
    for r, part in enumerate(parts):
        rows = slice(
            shard_offsets(shard_sizes(n, ranks))[r], shard_offsets(shard_sizes(n, ranks))[r] + part["local"].shape[1]
        )
        np.testing.assert_array_equal(part["local"], x[:, rows])
        np.testing.assert_array_equal(part["full"], x * scale)
        np.testing.assert_array_equal(part["summed"], ranks * (x * scale)[:, rows])
