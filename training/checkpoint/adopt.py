"""A saved model for the commands that use one (evaluation, prediction): the checkpoint a
configuration names, and the configuration made the checkpoint's own.

As a resumed training run continues from its saved settings, ``python -m training.evaluate`` and
``python -m training.predict`` start from the settings the checkpoint was written with (its
model, data, strategy, trainer and evaluation settings), and only what their command line sets
explicitly changes them: a run trained with ``data=zarr data.path=S`` is evaluated with
``evaluate.checkpoint=...`` alone. The command line may change what does not change the
parameters: the ranks and the strategy (a checkpoint holds full tensors, so it loads on any),
``trainer.precision``, ``data.path`` or ``data.open_dataset`` (a moved store), lead time,
evaluation and prediction settings; a setting the parameters depend on (``model.num_channels``,
``data.forcing``, ...) set to another value than the checkpoint's is refused in one line naming it.
Never taken from the checkpoint: :data:`OWN_KEYS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processor.runtime.torchrun import under_torchrun
from training.checkpoint.files import CheckpointError, load_training_checkpoint
from training.checkpoint.resume import RUNTIME_MODEL_KEYS
from training.config.checks import AUTO, check_config
from training.config.saved_names import current_names
from training.config.schema import ModelConfig, RunConfig, schema_keys
from training.config.settings import from_settings, sets_key, settings_not_given, to_settings
from training.distributed.device import check_local_ranks, launch_world

# This command's own settings, never the checkpoint's: where it runs and writes, on which device,
# which checkpoint, and the training run's debugging aids, step hooks and parity settings.
OWN_KEYS = (
    "run_dir",
    "trainer.device",
    "trainer.resume",
    "trainer.stop_at_step",
    "evaluate.checkpoint",
    "predict",
    "logging.run_name",
    "debug",
    "parity",
)
# Data settings the parameters depend on (the grid's learned features, the input and output
# channels); every model setting does too, except the runtime ones (resume's RUNTIME_MODEL_KEYS).
DATA_PARAMETER_KEYS = ("grid", "variables", "forcing", "diagnostic")
READ_FROM_STORE = ("data.grid", "data.variables")  # null: read from the store, then checked on load
# Null or auto: derived from the store (training/launch/store_settings.py); the checkpoint's value
# is what its store gave, so a command line leaving them to the derivation takes it.
DERIVED_MODEL_KEYS = (
    "model.hidden_grid",
    "model.hidden_stride",
    "model.baseline",
    "model.trainable_size",
    "model.multistep_input",
    "model.field_input",
)


def checkpoint_path(cfg: RunConfig, key: str) -> Path:
    """The checkpoint named by ``<key>.checkpoint`` (``key``: ``evaluate`` or ``predict``; None:
    the run directory's latest), which must exist."""
    given = getattr(cfg, key).checkpoint
    path = Path(given).expanduser() if given else Path(cfg.run_dir) / "checkpoints" / "latest.pt"
    if not path.exists():
        raise CheckpointError(f"{key}.checkpoint: no checkpoint at {path}; give {key}.checkpoint=/path/to/latest.pt")
    return path.resolve()


def adopt_checkpoint(resolved: RunConfig, key: str, given: list[str] | None = None) -> None:
    """Make ``resolved`` describe the checkpoint's model (``<key>`` is ``evaluate`` or
    ``predict``) and record the path. Runs before the dataset is opened, so grid and variables
    are checked against the store.

    ``given``: the keys this command line set (:func:`training.launch.run_settings.given_keys`):
    every other setting is the checkpoint's (:data:`OWN_KEYS` aside), and a given one the
    parameters depend on must be the checkpoint's value (:func:`check_given_settings`).
    None (the API): ``resolved`` as it is, but for the checkpoint's model section and, where
    unset here, its variables, grid and lead time."""
    path = checkpoint_path(resolved, key)
    saved = current_names(load_training_checkpoint(path)[1])  # under today's names
    if given is None:
        _take_model(resolved, saved)
    else:
        check_given_settings(saved, resolved, given, path)
        take_saved_settings(resolved, saved, given)
        check_adopted(resolved)
    getattr(resolved, key).checkpoint = str(path)
    source_store = path.parent.parent / "mlflow.db"
    if resolved.logging.tracking_uri is None and source_store.exists():
        resolved.logging.tracking_uri = f"sqlite:///{source_store}"  # beside the run it evaluates


def _take_model(resolved: RunConfig, saved: dict[str, Any]) -> None:
    """The checkpoint's model section and, when unset in ``resolved``, its variables, grid and lead time."""
    resolved.model = from_settings(ModelConfig, saved["model"])
    data, saved_data = resolved.data, saved.get("data") or {}
    for name in ("variables", "grid", "lead_time"):
        if getattr(data, name) is None:
            setattr(data, name, saved_data.get(name))


def parameter_keys(saved: dict[str, Any]) -> list[str]:
    """The settings of checkpoint settings ``saved`` that its parameters depend on."""
    model = [f"model.{k}" for k in saved.get("model") or {} if k not in RUNTIME_MODEL_KEYS]
    return [*model, *(f"data.{k}" for k in DATA_PARAMETER_KEYS)]


def check_given_settings(saved: dict[str, Any], resolved: RunConfig, given: list[str], path: Path) -> None:
    """Raise ``CheckpointError`` naming the first setting the command line gives (``given``) that the
    parameters depend on, at another value than in the checkpoint's settings ``saved``."""
    mine = to_settings(resolved)
    for key in parameter_keys(saved):
        section, name = key.split(".")
        if not sets_key(key, given) or name not in (saved.get(section) or {}):
            continue
        value, was = mine[section].get(name), saved[section][name]
        left_to_store = (value is None and key in READ_FROM_STORE) or (
            value in (None, AUTO) and key in DERIVED_MODEL_KEYS
        )
        if value != was and not left_to_store:
            raise CheckpointError(
                f"{key} = {value} on the command line, but checkpoint {path} was trained with {key} = {was}: "
                f"its parameters need that value (leave {key} out to take the checkpoint's)"
            )


def take_saved_settings(resolved: RunConfig, saved: dict[str, Any], given: list[str]) -> None:
    """``resolved`` (in place) with every setting the command line does not give from ``saved``.
    An attention path that ``attention_path=auto`` measured on the training host is measured
    again here (``auto``), unless the command line names one."""
    adopted = from_settings(RunConfig, settings_not_given(saved, given, OWN_KEYS, schema_keys()), base=resolved)
    for name in vars(adopted):
        setattr(resolved, name, getattr(adopted, name))
    model = resolved.model
    if model.attention_auto is not None and not sets_key("model.attention_path", given):
        model.attention_path, model.attention_auto = "auto", None


def check_adopted(resolved: RunConfig) -> None:
    """The checks the launcher made before the checkpoint's settings were taken, again: the
    strategy on the ranks (:func:`training.config.checks.check_config`) and the local ranks' devices."""
    t = resolved.trainer
    if resolved.strategy.name != "auto":  # auto is checked once it has picked
        check_config(resolved, launch_world(t.nprocs))
    if not under_torchrun():
        check_local_ranks(t.device, t.nprocs, resolved.debug.share_gpu)
