"""Does the encoder -> processor -> decoder path carry a neighbour's signal at initialisation?

``python -m benchmarks.mapper_sensitivity`` builds the default run's forecaster (its grids,
sizes and seed; ``model.mapper=...`` and any other override on the command line) for each
mapper kind, and for sampled data points ``i`` away from the poles measures the gradient of
the forecast tracer at ``i`` with respect to the input tracer at ``i`` itself and at the point
upstream of it (the data point nearest ``i`` shifted ``--shift-deg`` west: where the
tracer's eastward transport brings the next value from). It prints the median ratio
own / upstream: how much less a forecast hears its upstream neighbour than itself. A model
that must learn transport needs that ratio near one, not in the hundreds.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from hydra import compose, initialize_config_module
from scipy.spatial import cKDTree

import training.config.schema  # noqa: F401  (registers the schema)
from processor.geometry import unit_vectors
from processor.grids import get_grid
from processor.point_sets import point_set
from training.config.schema import run_config
from training.data.forcings import VariableRoles
from training.data.generate import VARIABLES
from training.launch.store_settings import derive_recipe
from training.model import ShardedGrids
from training.model.build import build_model

MAPPERS = ("mean_mlp", "graph_transformer")


def sensitivity(mapper: str, overrides: list[str], points: int, shift_deg: float, seed: int) -> dict[str, float]:
    """Median own and upstream sensitivities of the forecast tracer, and their ratio."""
    with initialize_config_module(config_module="configs", version_base="1.3"):
        composed = compose(config_name="config", overrides=["run_dir=unused", f"model.mapper={mapper}", *overrides])
        cfg = run_config(composed)
    data = get_grid(cfg.data.grid or "o32")
    derive_recipe(cfg, point_set(data.latitudes, data.longitudes))  # the model a run on this grid derives
    grids = ShardedGrids.build(
        data.latitudes,
        data.longitudes,
        get_grid(cfg.model.hidden_grid),
        1,
        0,
        cfg.model.encoder_neighbours,
        cfg.model.decoder_neighbours,
        cfg.model.mapper,
    )
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg, VariableRoles.build(VARIABLES, None, None), grids)
    tracer = VARIABLES.index("tracer")
    rng = np.random.default_rng(seed)
    away_from_poles = np.flatnonzero(np.abs(data.latitudes) < 60)
    chosen = rng.choice(away_from_poles, size=points, replace=False)
    tree = cKDTree(unit_vectors(data.latitudes, data.longitudes))
    _, upstream = tree.query(unit_vectors(data.latitudes[chosen], data.longitudes[chosen] - shift_deg))
    x = torch.randn(1, data.n_points, len(VARIABLES), generator=torch.Generator().manual_seed(seed))
    own, up = [], []
    for i, j in zip(chosen, upstream):
        x_in = x.clone().requires_grad_()
        model(x_in, grids, None)[0, i, tracer].backward()
        grad = x_in.grad[0, :, tracer]
        own.append(abs(float(grad[i])))
        up.append(abs(float(grad[j])))
    own_m, up_m = float(np.median(own)), float(np.median(up))
    return {"own": own_m, "upstream": up_m, "ratio": own_m / max(up_m, 1e-30)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=32, help="data points sampled (|lat| < 60)")
    parser.add_argument("--shift-deg", type=float, default=3.6, help="the tracer's eastward shift per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run's config")
    args = parser.parse_args(argv)
    print(f"forecast tracer sensitivity at initialisation, median over {args.points} points:")
    print("| mapper | d out_i / d x_i | d out_i / d x_upstream | own / upstream |\n|---|---:|---:|---:|")
    for mapper in MAPPERS:
        s = sensitivity(mapper, args.overrides, args.points, args.shift_deg, args.seed)
        print(f"| {mapper} | {s['own']:.3g} | {s['upstream']:.3g} | {s['ratio']:.3g} |")


if __name__ == "__main__":
    main()
