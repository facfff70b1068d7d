"""Step hooks named in config (:mod:`training.hooks`): built with their own typed settings,
called in order at the loop's points, none by default."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.training.conftest import small_config
from tests.training.hooks.faults import fault_overrides
from tests.training.hooks.perturb import PERTURBATION
from training.config.schema import RunConfig
from training.config.settings import ConfigValueError, at_least, setting
from training.hooks import StepHook, StepHooks, load_hooks
from training.launch.launcher import prepare

CALLS: list[tuple[str, int, int]] = []


@dataclass
class CountingSettings:
    tag: int = setting(0, at_least(0))


class Counting(StepHook):
    """Records each call with its settings' tag."""

    Settings = CountingSettings

    def start_step(self, step, typical_step_s):
        CALLS.append(("start_step", step, self.settings.tag))

    def after_backward(self, step):
        CALLS.append(("after_backward", step, self.settings.tag))

    def checkpoint_write(self, step):
        return lambda written: CALLS.append(("written", written, self.settings.tag))


def _config(hooks: list[str], settings: dict) -> RunConfig:
    cfg = RunConfig(run_dir="/tmp/run")
    cfg.debug.hooks, cfg.debug.hook_settings = hooks, settings
    return cfg


def test_no_hooks_by_default_does_nothing_at_every_point():
    hooks = load_hooks(RunConfig(run_dir="/tmp/run"), rank=0, world=2)
    assert type(hooks) is StepHook
    x = torch.ones(1, 3, 2)
    assert hooks.model_inputs(0, x) is x and hooks.checkpoint_write(5) is None


def test_named_hooks_get_their_settings_and_are_called_in_order():
    name = f"{__name__}:Counting"
    perturb = "tests.training.hooks.perturb:PerturbInputs"
    hooks = load_hooks(_config([name, perturb], {"tag": 7, "perturb_rank": 1}), rank=1, world=2)
    assert isinstance(hooks, StepHooks) and len(hooks.hooks) == 2
    CALLS.clear()
    hooks.start_step(3, 0.1)
    hooks.after_backward(3)
    hooks.checkpoint_write(4)(100)
    assert CALLS == [("start_step", 3, 7), ("after_backward", 3, 7), ("written", 100, 7)]
    x = torch.zeros(1, 3, 2)
    assert torch.equal(hooks.model_inputs(3, x), x + PERTURBATION)  # rank 1 is the perturbed one
    other = load_hooks(_config([perturb], {"perturb_rank": 1}), rank=0, world=2)
    assert torch.equal(other.model_inputs(3, x), x)


def test_a_setting_out_of_range_is_refused_naming_it():
    with pytest.raises(ConfigValueError, match=r"debug.hook_settings.tag = -1 is out of range: expected >= 0"):
        load_hooks(_config([f"{__name__}:Counting"], {"tag": -1}), rank=0, world=1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            fault_overrides(fault_scope="rack"),
            r"config key debug.hook_settings.fault_scope = 'rack' is out of range: expected rank\|node",
        ),
        (["debug.hook_settings={fault_rank:1}"], r"debug.hook_settings.fault_rank is not a setting of the hooks in"),
        (["debug.hooks=[training.loop.trainer:Trainer]"], r"names .training.loop.trainer:Trainer., which is not a"),
        (["debug.hooks=[no.such.module:Hook]"], r"debug.hooks names 'no.such.module:Hook', which cannot be imported"),
        (["debug.hook_settings=3"], r"debug.hook_settings = 3: give a mapping"),
    ],
)
def test_what_no_hook_can_take_is_refused_before_any_rank_starts(tmp_path, small_dataset, overrides, message):
    with pytest.raises(ConfigValueError, match=message):
        prepare(small_config(tmp_path, small_dataset, *overrides))
