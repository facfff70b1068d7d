"""A one-rank bug on purpose, for ``python -m training.parity``'s own test: a step hook
(:mod:`training.hooks`) with which rank ``perturb_rank`` adds :data:`PERTURBATION` to its block
of the model's inputs in the configured layout, a difference the parity check must report
(docs/reliability.md):

    debug.hooks=[tests.training.hooks.perturb:PerturbInputs] debug.hook_settings={perturb_rank:1}
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from training.config.schema import RunConfig
from training.config.settings import ConfigValueError, at_least, setting
from training.hooks import HookContext, StepHook

HOOK = "tests.training.hooks.perturb:PerturbInputs"  # its name in debug.hooks
PERTURBATION = 1e-3  # added to the inputs (normalised units)


def perturb_overrides(rank: int) -> list[str]:
    """The command-line overrides with which rank ``rank`` perturbs its inputs."""
    return [f"debug.hooks=[{HOOK}]", f"debug.hook_settings={{perturb_rank:{rank}}}"]


@dataclass
class PerturbSettings:
    perturb_rank: int = setting(1, at_least(0))  # this rank's inputs are off by PERTURBATION


class PerturbInputs(StepHook):
    """Rank ``perturb_rank`` adds :data:`PERTURBATION` to every input it holds."""

    Settings = PerturbSettings

    def __init__(self, settings: PerturbSettings, context: HookContext) -> None:
        super().__init__(settings, context)
        self.on = settings.perturb_rank == context.rank

    @classmethod
    def check(cls, settings: PerturbSettings, cfg: RunConfig, world: int) -> None:
        if settings.perturb_rank >= world:
            raise ConfigValueError(
                f"debug.hook_settings.perturb_rank = {settings.perturb_rank}: there are {world} ranks; "
                f"give one below {world}"
            )

    def model_inputs(self, step: int, x: Tensor) -> Tensor:
        return x + PERTURBATION if self.on else x
