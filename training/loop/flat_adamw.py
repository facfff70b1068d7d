"""AdamW over the whole model at once: its parameters and gradients as views of two flat
buffers, so that clipping is one norm and one scale, and the optimiser step one fused kernel,
rather than a few operators for each of the model's ~100 parameters.

On a small grid those per-parameter operators are a large part of the step: at 340 points
(115 parameters) torch's clipping and fused AdamW took 1.2 ms a step, over the flat buffers
0.3 ms (docs/training.md). DDP's ``gradient_as_bucket_view`` lays out gradients the same way.

Used when one rank holds the whole model (no DDP: it would own the gradients). Autograd then
adds each parameter's gradient into its view in place, so the gradients stay put from step to
step and :meth:`FlatAdamW.zero_grad` zeroes them rather than dropping them.

The state dict is a plain ``AdamW``'s over the model's parameters, so checkpoints move between
the two (and to several ranks). One difference: a parameter that got no gradient in a step
(none in this app's models: each step reaches every parameter) is stepped with a zero gradient
(its moments decay, weight decay applies), where torch's AdamW skips it. No ``amsgrad``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw


class FlatParameters:
    """``params`` turned into views of one flat buffer (``self.param``, a leaf), their
    gradients into views of another (``self.param.grad``), in order."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        if not flattenable(params):
            raise ValueError("FlatParameters: the parameters need one dtype and device, and all to require grad")
        self.params = params
        with torch.no_grad():
            self.param = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
        self.param.grad = torch.zeros_like(self.param)
        for p, data, grad in zip(params, self.views(self.param), self.views(self.param.grad)):
            p.data = data
            p.grad = grad
        self.grads = [p.grad for p in params]  # the views themselves, to see one replaced
        self.data_ptrs = [p.data_ptr() for p in params]

    def views(self, flat: Tensor) -> list[Tensor]:
        """``flat`` ``(total,)`` cut into tensors shaped like the parameters."""
        sizes = [p.numel() for p in self.params]
        return [piece.view_as(p) for piece, p in zip(flat.split(sizes), self.params)]

    def check(self) -> None:
        """Raise if a parameter or its gradient is no longer a view of the flat buffers (its
        ``.data`` or ``.grad`` replaced): the optimiser would step something the model does not use."""
        for p, grad, ptr in zip(self.params, self.grads, self.data_ptrs):
            if p.grad is not grad or p.data_ptr() != ptr:
                raise RuntimeError(
                    "FlatAdamW: a parameter's .data or .grad was replaced (model.zero_grad(set_to_none=True)? "
                    "model.to()?); zero the gradients with the optimiser's zero_grad()"
                )


def flattenable(params: list[nn.Parameter]) -> bool:
    """Whether ``params`` can share flat buffers: one dtype and device, floating, all trained."""
    return (
        bool(params)
        and len({(p.dtype, p.device) for p in params}) == 1
        and params[0].is_floating_point()
        and all(p.requires_grad for p in params)
    )


class FlatAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW(fused=True)`` over :class:`FlatParameters`: one param group (the
    model's parameters), state tensors that are views of flat moments, one fused step."""

    def __init__(self, flat: FlatParameters, lr: float, weight_decay: float) -> None:
        super().__init__(flat.params, lr=lr, weight_decay=weight_decay, fused=True)
        self.flat = flat
        self._check_group()
        self.steps_taken = torch.zeros((), dtype=torch.float32, device=flat.param.device)
        self.exp_avg = torch.zeros_like(flat.param)
        self.exp_avg_sq = torch.zeros_like(flat.param)
        self._share_state()

    def _check_group(self) -> None:
        if len(self.param_groups) != 1 or self.param_groups[0]["amsgrad"]:
            raise ValueError("FlatAdamW: one parameter group, without amsgrad (use torch.optim.AdamW)")

    def _share_state(self) -> None:
        """Each parameter's state: views of the flat moments and the one step count."""
        moments = zip(self.flat.views(self.exp_avg), self.flat.views(self.exp_avg_sq))
        for p, (exp_avg, exp_avg_sq) in zip(self.flat.params, moments):
            self.state[p] = {"step": self.steps_taken, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One AdamW step of the whole model, one fused kernel."""
        if closure is not None:
            raise ValueError("FlatAdamW.step takes no closure")
        self.flat.check()
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        adamw(
            [self.flat.param],
            [self.flat.param.grad],
            [self.exp_avg],
            [self.exp_avg_sq],
            [],
            [self.steps_taken],
            fused=True,
            amsgrad=group["amsgrad"],
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient. Never sets them to None (``set_to_none`` is ignored): autograd
        must keep adding into the views."""
        self.flat.param.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """A plain ``AdamW``'s state dict: each parameter its own step count (a plain AdamW that
        loaded one shared count would add to it once per parameter). No :meth:`FlatParameters.check`
        here: ``best.pt`` is written while the model holds its moving average."""
        state = super().state_dict()
        state["state"] = {index: {**entry, "step": entry["step"].clone()} for index, entry in state["state"].items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A plain ``AdamW``'s state dict (or this class's): its moments copied into the flat
        ones. Every parameter must have state and one step count, as after steps of one model."""
        super().load_state_dict(state_dict)
        self._check_group()
        loaded = [self.state.get(p, {}) for p in self.flat.params]
        steps = {float(s["step"]) for s in loaded if "step" in s}
        if any("exp_avg" not in s for s in loaded) and steps:
            raise ValueError("FlatAdamW: the optimiser state has moments for some parameters only")
        if len(steps) > 1:
            raise ValueError(f"FlatAdamW: the optimiser state counts different steps per parameter: {sorted(steps)}")
        with torch.no_grad():
            self.steps_taken.fill_(steps.pop() if steps else 0.0)
            for key, flat in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                for view, s in zip(self.flat.views(flat), loaded):
                    if key in s:
                        view.copy_(s[key])
                    else:
                        view.zero_()
        self._share_state()
