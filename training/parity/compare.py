"""Two layouts' records compared, step by step: the difference of every tensor, the worst of each
step and quantity, the verdict against a tolerance, and ``parity.csv``.

A tensor's ``max_rel_diff`` is ``max |a - b|`` over its elements divided by the *quantity's*
scale, the largest ``|b|`` of every tensor of that quantity at that step (``b`` the reference's;
for the loss, ``|b|``): the max-norm relative difference of the whole gradient (or of all the
parameters), broken down by tensor so that the worst is named. Measured against each tensor's
own scale instead (``tensor_rel_diff``, in ``parity.csv`` too), rounding noise would look like a
breach where the exact value is zero or nearly so.

Parameter elements whose reference gradient has been at most :data:`BLIND` of the largest
gradient, at this step or an earlier one, are shown but not judged: such a gradient is rounding
noise (the softmax is blind to a bias added to every key, whose gradient is 1e-10 of the
largest in either layout) or close to it, and Adam, dividing by ``|g| + eps``, turns a
noise-level gradient into a step of up to ``lr`` in either direction, so that the parameter
drifts apart by design, not by error. A tensor none of whose elements is judged is marked
``judged=0``; a NaN or inf in one layout only is judged wherever it is.

A difference is ``inf`` where the shapes differ, where a tensor is in one layout only, or
where one layout has a NaN or inf that the other has not.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from training.parity.record import StepRecord

QUANTITIES = ("loss", "gradients", "parameters")
CSV_COLUMNS = ("step", "quantity", "tensor", "max_rel_diff", "tensor_rel_diff", "judged")
BLIND = 1e-6  # a reference gradient at most this share of the largest: rounding noise


@dataclass(frozen=True)
class Difference:
    """The difference of one tensor (``loss`` for the loss) at one step."""

    step: int
    quantity: str  # one of QUANTITIES
    tensor: str
    max_rel_diff: float  # max |a - b| over the judged elements / the quantity's largest |b|
    tensor_rel_diff: float  # max |a - b| / the tensor's largest |b| (shown)
    judged: bool = True  # False: no element is judged, the loss is blind to them (see the module)


def largest_difference(value: Tensor, reference: Tensor) -> float:
    """``max |value - reference|`` in float64; ``inf`` for another shape or a NaN or inf in
    one of them only (or of another sign); 0 for empty tensors."""
    if value.shape != reference.shape:
        return math.inf
    a, b = value.double(), reference.double()
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b) or not torch.equal(_kinds(a[~finite_a]), _kinds(b[~finite_b])):
        return math.inf
    a, b = a[finite_a], b[finite_b]
    return (a - b).abs().max().item() if a.numel() else 0.0


def _kinds(t: Tensor) -> Tensor:
    """Non-finite values as comparable codes: NaN 0, inf 1, -inf -1."""
    return t.nan_to_num(0.0, 1.0, -1.0)


def _scale(t: Tensor) -> float:
    finite = t.double()[torch.isfinite(t)]
    return finite.abs().max().item() if finite.numel() else 0.0


def _ratio(diff: float, scale: float) -> float:
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0.0 else math.inf


def compare_quantity(
    step: int, quantity: str, got: dict[str, Tensor], ref: dict[str, Tensor], judged: dict[str, Tensor] | None = None
) -> list[Difference]:
    """The :class:`Difference` of every tensor of one quantity at one step; ``judged``: for a
    tensor named there, the mask of its elements to judge (none: the tensor is not judged)."""
    scale = max((_scale(t) for t in ref.values()), default=0.0)
    rows = []
    for name in sorted(set(ref) | set(got)):
        if name not in ref or name not in got:
            rows.append(Difference(step, quantity, name, math.inf, math.inf))
            continue
        whole = largest_difference(got[name], ref[name])
        mask = (judged or {}).get(name)
        if mask is None or math.isinf(whole):  # judged whole: a shape or a NaN/inf of one layout only
            diff, row_judged = whole, True
        elif mask.shape == ref[name].shape and bool(mask.any()):
            diff, row_judged = largest_difference(got[name][mask], ref[name][mask]), True
        else:
            diff, row_judged = whole, False
        rows.append(Difference(step, quantity, name, _ratio(diff, scale), _ratio(whole, _scale(ref[name])), row_judged))
    return rows


class JudgedElements:
    """The parameter elements judged so far: those whose reference gradient has stayed above
    :data:`BLIND` of the largest at every step (see the module)."""

    def __init__(self) -> None:
        self.masks: dict[str, Tensor] = {}

    def update(self, gradients: dict[str, Tensor]) -> dict[str, Tensor]:
        """Narrow the masks by this step's reference ``gradients``; the masks."""
        largest = max((_scale(g) for g in gradients.values()), default=0.0)
        for name, g in gradients.items():
            above = g.double().abs() > BLIND * largest
            self.masks[name] = above & self.masks[name] if name in self.masks else above
        return self.masks


def _scalar(value: float) -> Tensor:
    return torch.tensor(value, dtype=torch.float64)


def compare(reference: list[StepRecord], configured: list[StepRecord]) -> list[Difference]:
    """Every tensor's :class:`Difference` at every step, in step and quantity order."""
    rows, judged = [], JudgedElements()
    for step, (ref, got) in enumerate(zip(reference, configured)):
        rows += compare_quantity(step, "loss", {"loss": _scalar(got.loss)}, {"loss": _scalar(ref.loss)})
        rows += compare_quantity(step, "gradients", got.gradients, ref.gradients)
        masks = judged.update(ref.gradients)
        rows += compare_quantity(step, "parameters", got.parameters, ref.parameters, masks)
    return rows


def _key(diff: float) -> float:
    return math.inf if math.isnan(diff) else diff


def worst_by_step(rows: list[Difference]) -> list[Difference]:
    """The largest judged difference of each step and quantity (the first tensor on a tie)."""
    worst: dict[tuple[int, str], Difference] = {}
    for row in (r for r in rows if r.judged):
        key = (row.step, row.quantity)
        if key not in worst or _key(row.max_rel_diff) > _key(worst[key].max_rel_diff):
            worst[key] = row
    return list(worst.values())


def worst_of(rows: list[Difference]) -> Difference:
    """The largest judged difference of all (``rows`` holds the loss, always judged)."""
    return max((r for r in rows if r.judged), key=lambda r: _key(r.max_rel_diff))


def within(rows: list[Difference], tolerance: float) -> bool:
    """Whether every judged difference is at most ``tolerance`` (NaN is not)."""
    return all(_key(r.max_rel_diff) <= tolerance for r in rows if r.judged)


def table(rows: list[Difference]) -> str:
    """A Markdown table of the worst tensor of each step and quantity."""
    lines = ["| step | quantity | max relative difference | worst tensor |", "|---:|---|---:|---|"]
    for row in worst_by_step(rows):
        lines.append(f"| {row.step} | {row.quantity} | {row.max_rel_diff:.3g} | {row.tensor} |")
    return "\n".join(lines)


def write_csv(rows: list[Difference], path: Path) -> Path:
    """``parity.csv``: one line per step, quantity and tensor (:data:`CSV_COLUMNS`)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            diffs = [f"{row.max_rel_diff:.6e}", f"{row.tensor_rel_diff:.6e}"]
            writer.writerow([row.step, row.quantity, row.tensor, *diffs, int(row.judged)])
    return path
