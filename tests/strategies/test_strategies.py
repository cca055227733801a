"""Every strategy runs through the same checks."""

import numpy as np
import pytest

from nasctl.objectives import pareto_mask
from nasctl.spaces.loader import load_space
from nasctl.strategies import STRATEGIES


def toy_objectives(space, arch):
    """Two conflicting objectives over the knob indices (minimise both)."""
    idx = space.to_indices(arch).astype(float)
    return np.array([idx.sum(), -(idx[:6] ** 2).sum()])


def drive(name, seed, budget=40, batch=10, constraint=None):
    space = load_space("ee-mbv2")
    strategy = STRATEGIES.get(name)()
    strategy.setup(space, 2, 0 if constraint is None else 1, seed=seed, budget=budget)
    proposed = []
    while len(proposed) < budget:
        archs = strategy.ask(min(batch, budget - len(proposed)))
        proposed += archs
        F = np.array([toy_objectives(space, a) for a in archs])
        G = np.array([[constraint(space, a)] for a in archs]) if constraint else np.zeros((len(archs), 0))
        strategy.tell(archs, F, G)
    return space, proposed


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_same_seed_same_proposals(name):
    assert drive(name, 5)[1] == drive(name, 5)[1]
    assert drive(name, 5)[1] != drive(name, 6)[1]


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_proposals_are_valid(name):
    space, proposed = drive(name, 1)
    for arch in proposed:
        assert space.validate(arch) == arch


def _hypervolume_proxy(F, ref):
    """Area dominated by F within the box up to ref (2-D, minimisation), by grid counting."""
    grid = np.stack(np.meshgrid(np.linspace(F[:, 0].min() - 1, ref[0], 200),
                                np.linspace(F[:, 1].min() - 1, ref[1], 200)), -1).reshape(-1, 2)
    return np.mean(np.any(np.all(F[None, :, :] <= grid[:, None, :], axis=2), axis=1))


def test_nsga2_improves_over_its_first_batch():
    space, proposed = drive("nsga2", 0, budget=120, batch=13)
    F = np.array([toy_objectives(space, a) for a in proposed])
    first = F[:13]
    ref = F.max(axis=0) + 1
    later = F[-40:]
    assert _hypervolume_proxy(later[pareto_mask(later)], ref) > _hypervolume_proxy(first[pareto_mask(first)], ref)


def test_nsga2_prefers_feasible_candidates():
    # constraint: sum of indices <= 8 (feasible where g <= 0)
    def constraint(space, arch):
        return space.to_indices(arch).sum() - 8.0

    space, proposed = drive("nsga2", 0, budget=120, batch=13, constraint=constraint)
    g = np.array([constraint(space, a) for a in proposed])
    assert (g[-26:] <= 0).mean() > (g[:13] <= 0).mean()
