"""FlatAdamW: the steps of torch's fused AdamW (clipped as the step clips), a state dict that moves
both ways between the two, and a clear error when the flat layout was broken."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from processor.distributed import clip_grad_norm_
from training.loop.flat_adamw import FlatAdamW, FlatParameters, flattenable

SHAPES = [(6, 5), (5,), (3, 4, 2), (1,), (7, 3)]


def _params(seed: int = 0) -> list[nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]


def _gradients(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator) * (step + 1) for shape in SHAPES]


def _train(params: list[nn.Parameter], optimiser: torch.optim.Optimizer, clipped: list[nn.Parameter], steps: range):
    """``steps`` steps of the given gradients, accumulated as autograd does, clipped at 1."""
    for step in steps:
        loss = sum((p * g).sum() for p, g in zip(params, _gradients(step)))
        loss.backward()
        clip_grad_norm_(clipped, 1.0)
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)


def _plain(params: list[nn.Parameter]) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=0.1, weight_decay=0.05, fused=True)


def _flat(params: list[nn.Parameter]) -> FlatAdamW:
    return FlatAdamW(FlatParameters(params), lr=0.1, weight_decay=0.05)


def test_its_steps_are_fused_adamws_and_the_parameters_stay_views():
    plain_params, flat_params = _params(), _params()
    flat = _flat(flat_params)
    _train(plain_params, _plain(plain_params), plain_params, range(5))
    _train(flat_params, flat, [flat.flat.param], range(5))
    for want, got, view in zip(plain_params, flat_params, flat.flat.views(flat.flat.param)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert got.data_ptr() == view.data_ptr()
    assert float(flat.flat.param.grad.abs().max()) == 0.0  # zeroed, not dropped
    assert not torch.equal(flat_params[0], _params()[0])  # it did step


@pytest.mark.parametrize("direction", ["plain to flat", "flat to plain"])
def test_the_state_dict_moves_between_plain_and_flat_adamw(direction):
    first, second = (_plain, _flat) if direction == "plain to flat" else (_flat, _plain)
    reference = _params()
    reference_optimiser = _plain(reference)
    _train(reference, reference_optimiser, reference, range(6))

    params = _params()
    optimiser = first(params)
    _train(params, optimiser, list(params), range(3))
    saved = optimiser.state_dict()
    resumed = [nn.Parameter(p.detach().clone()) for p in params]
    continued = second(resumed)
    continued.load_state_dict(saved)
    _train(resumed, continued, list(resumed), range(3, 6))
    for want, got in zip(reference, resumed):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_fresh_state_dict_loads_as_no_steps_taken():
    params = _params()
    flat = _flat(params)
    flat.load_state_dict(_plain(_params()).state_dict())
    assert float(flat.steps_taken) == 0.0
    assert float(flat.exp_avg.abs().max()) == 0.0


def test_a_state_with_different_step_counts_is_refused():
    params = _params()
    plain = _plain(params)
    _train(params, plain, params, range(2))
    state = plain.state_dict()
    state["state"][0]["step"] = torch.tensor(7.0)
    with pytest.raises(ValueError, match="different steps per parameter"):
        _flat(_params()).load_state_dict(state)


def test_gradients_dropped_by_the_model_are_an_error_not_a_silent_no_op():
    params = _params()
    model = nn.ParameterList(params)
    flat = _flat(params)
    model.zero_grad(set_to_none=True)  # autograd would now write gradients the optimiser never sees
    with pytest.raises(RuntimeError, match=r"\.data or \.grad was replaced"):
        flat.step()


def test_only_one_dtype_and_device_of_trained_parameters_is_flattened():
    params = _params()
    assert flattenable(params)
    assert not flattenable([*params, nn.Parameter(torch.zeros(2, dtype=torch.float64))])
    assert not flattenable([*params, nn.Parameter(torch.zeros(2), requires_grad=False)])
    assert not flattenable([])
    with pytest.raises(ValueError, match="one dtype and device"):
        FlatParameters([nn.Parameter(torch.zeros(2, dtype=torch.float64)), *params])
