"""The command line checked before Hydra runs: each refusal one line that names the key."""

from __future__ import annotations

import pytest

from training.config.schema import ConfigValueError
from training.launch.cli_check import check_overrides


@pytest.mark.parametrize(
    "argv, message",
    [
        (["logging.plots=maybe"], "config key logging.plots cannot be 'maybe': Value 'maybe' is not a valid bool"),
        (["trainer.steps=ten"], "config key trainer.steps cannot be 'ten': Value 'ten' of type 'str' could not be"),
        (["trainer.steps=1.5"], "config key trainer.steps cannot be 1.5: "),
        (["--multirun", "trainer.lr=0.1,fast"], "config key trainer.lr cannot be 'fast': "),
        (["-m", "trainer.steps=range(1,4)", "trainer.lr=choice(0.1,x)"], "config key trainer.lr cannot be 'x': "),
        (["data.forcing={a:1}"], "config key data.forcing cannot be {'a': 1}: Cannot merge DictConfig with ListConfig"),
        (["trainer.stepz=3"], "config key trainer.stepz is not a setting of the schema: did you mean trainer.steps?"),
        (["data.path=~/x.zarr"], "cannot read the command line: data.path=~/x.zarr: write data.path=$HOME/x.zarr"),
        (
            ["-m", "data.path=~/a,~/b"],
            "cannot read the command line: data.path=~/a,~/b: write data.path=$HOME/a,$HOME/b",
        ),
        (["data.path=~user/x", "trainer.steps=2"], "cannot read the command line: LexerNoViableAltException"),
    ],
)
def test_a_value_of_the_wrong_type_or_an_unknown_key_is_refused_naming_the_key(argv, message):
    with pytest.raises(ConfigValueError) as caught:
        check_overrides(argv)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), caught.value


@pytest.mark.parametrize(
    "argv",
    [
        ["trainer.steps=10", "logging.plots=false", "trainer.keep_best=yes"],
        ["model.window_size=null", "trainer.steps=${trainer.warmup_steps}"],  # optional; interpolation
        ["--multirun", "trainer.lr=0.1,0.01", "strategy=none,shard_heads"],
        ["--multirun", "trainer.lr=interval(1e-4,1e-2)", "trainer.steps=range(10,40,10)"],  # a sweeper draws the first
        ["data.open_dataset.select=[2t]", "+trainer.steps=3", "model.hidden_grid=data"],
    ],
)
def test_values_that_fit_their_settings_pass(argv):
    check_overrides(argv)
