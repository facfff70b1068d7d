"""The comparison of two layouts' records: differences worked by hand."""

from __future__ import annotations

import csv
import math

import torch

from training.parity.compare import (
    CSV_COLUMNS,
    compare,
    compare_quantity,
    largest_difference,
    table,
    within,
    worst_by_step,
    worst_of,
    write_csv,
)
from training.parity.record import StepRecord


def test_largest_difference_by_hand():
    assert largest_difference(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 2.0])) == 1.0
    assert largest_difference(torch.zeros(2), torch.zeros(3)) == math.inf  # another shape
    nan = float("nan")
    assert largest_difference(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.5])) == 0.5  # NaN in both: skipped
    assert largest_difference(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0])) == math.inf  # in one only
    assert largest_difference(torch.tensor([math.inf]), torch.tensor([-math.inf])) == math.inf


def test_each_tensor_is_measured_against_its_quantitys_scale():
    """Reference gradients: ``big`` up to 4, ``blind`` rounding noise of 1e-10: the difference is
    divided by 4 for both; measured against its own scale, ``blind``'s noise would be 100%."""
    ref = {"big": torch.tensor([4.0, -2.0]), "blind": torch.tensor([1e-10, -1e-10])}
    got = {"big": torch.tensor([4.0, -2.0004]), "blind": torch.tensor([-1e-10, 0.0])}
    rows = {r.tensor: r for r in compare_quantity(0, "gradients", got, ref)}
    assert math.isclose(rows["big"].max_rel_diff, 0.0004 / 4, rel_tol=1e-3)
    assert math.isclose(rows["big"].tensor_rel_diff, 0.0004 / 4, rel_tol=1e-3)
    assert math.isclose(rows["blind"].max_rel_diff, 2e-10 / 4, rel_tol=1e-3)
    assert math.isclose(rows["blind"].tensor_rel_diff, 2.0, rel_tol=1e-3)


def test_a_tensor_in_one_layout_only_is_infinite():
    rows = compare_quantity(0, "parameters", {"a": torch.ones(1)}, {"a": torch.ones(1), "b": torch.ones(1)})
    assert [(r.tensor, r.max_rel_diff) for r in rows] == [("a", 0.0), ("b", math.inf)]


def _record(loss: float, scale: float) -> StepRecord:
    return StepRecord(loss, {"w": torch.tensor([scale, 1.0])}, {"w": torch.tensor([1.0, 2.0 * scale])})


def test_worst_verdict_table_and_csv(tmp_path):
    reference = [_record(2.0, 1.0), _record(1.0, 1.0)]
    configured = [_record(2.0, 1.0), _record(1.0 + 3e-5, 1.0 + 1e-6)]
    rows = compare(reference, configured)
    assert [(r.step, r.quantity) for r in worst_by_step(rows)] == [
        (s, q) for s in (0, 1) for q in ("loss", "gradients", "parameters")
    ]
    worst = worst_of(rows)
    assert (worst.step, worst.quantity, worst.tensor) == (1, "loss", "loss")
    assert math.isclose(worst.max_rel_diff, 3e-5, rel_tol=1e-3)
    assert within(rows, 1e-4) and not within(rows, 1e-5)
    assert not within([*rows[:1], rows[0].__class__(0, "loss", "loss", float("nan"), float("nan"))], 1.0)
    assert "| 1 | loss | 3e-05 | loss |" in table(rows)
    with open(write_csv(rows, tmp_path / "parity.csv")) as f:
        lines = list(csv.reader(f))
    assert tuple(lines[0]) == CSV_COLUMNS and len(lines) == 1 + len(rows)


def test_elements_with_a_noise_level_gradient_are_shown_not_judged():
    """``blind``'s gradient is 1e-7 of the largest: its parameter is not judged; ``mixed``'s
    second element had a noise-level gradient at step 0, so it stays unjudged at step 1."""
    grads = [
        {"a": torch.tensor([1.0]), "blind": torch.tensor([1e-7]), "mixed": torch.tensor([1e-2, 1e-8])},
        {"a": torch.tensor([1.0]), "blind": torch.tensor([1e-7]), "mixed": torch.tensor([1e-2, 1e-2])},
    ]
    ref = {"a": torch.tensor([1.0]), "blind": torch.tensor([0.0]), "mixed": torch.tensor([1.0, 1.0])}
    got = {"a": torch.tensor([1.0]), "blind": torch.tensor([0.5]), "mixed": torch.tensor([1.0, 1.25])}
    rows = compare([StepRecord(1.0, g, ref) for g in grads], [StepRecord(1.0, g, got) for g in grads])
    params = {(r.step, r.tensor): r for r in rows if r.quantity == "parameters"}
    assert not params[(0, "blind")].judged and params[(0, "blind")].max_rel_diff == 0.5
    assert params[(1, "mixed")].judged and params[(1, "mixed")].max_rel_diff == 0.0
    assert params[(1, "mixed")].tensor_rel_diff == 0.25  # shown over every element
    assert within(rows, 1e-5) and worst_of(rows).max_rel_diff == 0.0


def test_a_nan_or_another_shape_is_judged_even_where_the_gradient_is_noise():
    grads = {"a": torch.tensor([1.0]), "blind": torch.tensor([0.0, 0.0])}
    ref = {"a": torch.tensor([1.0]), "blind": torch.tensor([0.0, 0.0])}
    for bad in (torch.tensor([0.0, float("nan")]), torch.tensor([0.0, 0.0, 0.0])):
        rows = compare([StepRecord(1.0, grads, ref)], [StepRecord(1.0, grads, {**ref, "blind": bad})])
        (row,) = [r for r in rows if r.tensor == "blind" and r.quantity == "parameters"]
        assert row.judged and row.max_rel_diff == math.inf
        assert not within(rows, 1.0)
