from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import training.config.schema  # noqa: F401  (registers the schema)
from training.data import generate_rossby_haurwitz


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """Rossby-Haurwitz waves on o16 (1600 points), 40 six-hourly dates."""
    return generate_rossby_haurwitz(tmp_path_factory.mktemp("data") / "rh_o16.zarr", "o16", steps=40, seed=3)


# A run of seconds: 6 steps, validated and checkpointed every 3, scored at 2 leads from 2 dates,
# no pictures (their drawing cost more than the run: a test that reads them sets PICTURES).
PICTURES = "logging.plots=true"
SHORT_RUN = [
    "logging.plots=false",
    "trainer.steps=6",
    "trainer.val_interval=3",
    "trainer.val_batches=2",
    "trainer.checkpoint_interval=3",
    "trainer.warmup_steps=2",
    "trainer.timeout_s=120",
    "evaluate.steps=2",  # the last validation dates: 2 leads from 2 initial dates
    "evaluate.samples=2",
]


def small_overrides(run_dir: Path, dataset: Path) -> list[str]:
    """The overrides that shrink the default config to seconds: o16 data, o8 hidden grid, 2 layers
    of 32 channels (also usable on a ``python -m training`` command line)."""
    return [
        f"run_dir={run_dir}",
        f"data.path={dataset}",
        "data.grid=o16",
        "data.generate=false",
        "model.hidden_grid=o8",
        "model.num_layers=2",
        "model.num_channels=32",
        "model.num_heads=4",
        "model.window_size=40",
        "trainer.nprocs=2",  # the model split over two ranks, as a larger grid derives; o8's 576 would run one
        "trainer.batch_size=1",  # as the default run's 5,248 points derive; o16's 1,600 would take 4
        *SHORT_RUN,
    ]


def small_config(run_dir: Path, dataset: Path, *overrides: str):
    """The default config shrunk to seconds (see :func:`small_overrides`)."""
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="config", overrides=[*small_overrides(run_dir, dataset), *overrides])


def train_sharded_and_single(tmp_path: Path, store: Path, *settings: str) -> list[Path]:
    """Two training runs of 2 steps on ``store`` under ``settings``: over 3 ranks in one model (in
    ``tmp_path/sharded``) and on one rank (``tmp_path/single``); after checking that their losses
    are finite and equal to fp32 tolerance, their checkpoints' folders ``[sharded, single]``."""
    from training.app import run

    settings = ("trainer.steps=2", *settings)
    sharded = run(small_config(tmp_path / "sharded", store, *settings, "trainer.nprocs=3", "trainer.ranks_per_model=3"))
    single = run(
        small_config(
            tmp_path / "single", store, *settings, "strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"
        )
    )
    losses = [np.array([m["train/loss"] for _, m in result["history"]]) for result in (sharded, single)]
    assert len(losses[0]) == 2 and np.isfinite(losses[0]).all()
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    return [tmp_path / d / "checkpoints" for d in ("sharded", "single")]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, small_dataset):
    """The default config shrunk (2 ranks, shard_sequence, 6 steps, step 4 profiled, pictures drawn), trained once
    for every test that only reads its outputs: ``(run directory, result)``."""
    from training.app import run

    run_dir = tmp_path_factory.mktemp("trained")
    return run_dir, run(small_config(run_dir, small_dataset, "logging.profile_after=4", PICTURES))
