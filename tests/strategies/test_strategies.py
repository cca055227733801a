"""Conformance suite: every registered strategy goes through the same checks (in the
spirit of optuna's optuna/testing/pytest_samplers.py).  A strategy added to the
registry is picked up here without a line of its own."""

import warnings

import numpy as np
import pytest
from pymoo.indicators.hv import HV

from nasctl import testing
from nasctl.errors import UsageError
from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space
from nasctl.strategies import STRATEGIES
from nasctl.testing import toy_objectives

ALL = STRATEGIES.names()
LEARNING = [n for n in ALL if n != "random"]  # random search is the baseline: it does not learn
SPACES = ["ee-mbv2", "nb201"]                  # ordered knobs; unordered (op-name) knobs


def budget(name):
    # the GP sampler spends ~0.2 s a proposal after its first 10; the RL policy needs a
    # few more updates than the others to show it learns on these toys
    return {"gp": 16, "rl": 120}.get(name, 60)


def window(name):
    """How many proposals are compared: the first ones against the last ones."""
    return min(20, budget(name) // 3)


def small(space, arch):
    """A constraint: few knobs away from their first choice (feasible where <= 0)."""
    return np.count_nonzero(space.to_indices(arch)) - len(space.variables()) // 2


def drive(name, space, seed, n_total, constraint=None, max_ask=None, pool=False):
    """`nasctl.testing.drive` of the strategy registered as `name`."""
    return testing.drive(STRATEGIES.get(name), space, seed, n_total, max_ask=max_ask, pool=pool,
                         constraint=constraint)


@pytest.fixture(scope="module", params=SPACES)
def space(request):
    return load_space(request.param)


@pytest.mark.parametrize("name", ALL)
def test_same_seed_same_proposals_other_seed_others(name, space):
    n = budget(name)
    first = drive(name, space, 5, n)[0]
    assert drive(name, space, 5, n)[0] == first
    assert drive(name, space, 6, n)[0] != first


@pytest.mark.parametrize("name", ALL)
def test_proposals_are_valid_new_and_in_knob_order(name, space):
    proposed, _ = drive(name, space, 1, budget(name))
    knobs = [v.name for v in space.variables()]
    for arch in proposed:
        assert space.validate(arch) == arch
        assert list(arch) == knobs  # the engine keys trials on the JSON of the architecture
    assert len({arch_key(a) for a in proposed}) == len(proposed)


@pytest.mark.parametrize("name", ALL)
def test_never_more_than_asked(name):
    _, sizes = drive(name, load_space("nb201"), 0, 12, max_ask=3)
    assert max(sizes) <= 3
    assert drive(name, load_space("nb201"), 0, 12, max_ask=1)[1] == [1] * 12


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_bayesian_samplers_propose_one_at_a_time_or_a_pool_to_screen(name):
    space = load_space("nb201")
    assert drive(name, space, 0, 4)[1] == [1] * 4
    # past the samplers' 10 random trials, so the third pool comes from the model
    proposed, sizes = drive(name, space, 0, 24, max_ask=8, pool=True)
    assert sizes == [8, 8, 8] and len({arch_key(a) for a in proposed}) == 24
    assert drive(name, space, 0, 24, max_ask=8, pool=True)[0] == proposed


@pytest.mark.parametrize("name", ALL)
def test_quiet(name, capfd):
    """No warnings (optuna's experimental or deprecation ones), no log lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drive(name, load_space("nb201"), 0, budget(name), constraint=small)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def hypervolume(F, lo, hi):
    return HV(ref_point=np.full(2, 1.1))((F - lo) / (hi - lo))


def dominated_share(F, of):
    """Mean share of the rows of F that dominate each row of `of`."""
    return np.mean([np.mean(np.all(F <= f, axis=1) & np.any(F < f, axis=1)) for f in of])


@pytest.mark.parametrize("name", LEARNING)
def test_improves_over_its_first_proposals(name, space):
    proposed, _ = drive(name, space, 0, budget(name))
    F = np.array([toy_objectives(space, a) for a in proposed])
    lo, hi, w = F.min(axis=0), F.max(axis=0), window(name)
    assert hypervolume(F[-w:], lo, hi) > 1.1 * hypervolume(F[:w], lo, hi)
    # and the last proposals lie nearer the front: fewer of the run's architectures
    # dominate them (random search stays near a ratio of 1)
    assert dominated_share(F, F[:w]) > 2 * dominated_share(F, F[-w:])


@pytest.mark.parametrize("name", LEARNING)
def test_learns_to_meet_a_constraint(name, space):
    proposed, _ = drive(name, space, 0, budget(name), constraint=small)
    feasible = np.array([small(space, a) <= 0 for a in proposed])
    w = window(name)
    assert feasible[-w:].mean() >= feasible[:w].mean() + 0.2


def test_unknown_strategy_is_one_clear_line():
    with pytest.raises(UsageError, match=r"^unknown strategy 'foo'; allowed: agemoea, gp, local, nsga2"):
        STRATEGIES.get("foo")


def test_random_proposes_every_architecture_of_a_small_space_once():
    space = load_space("nb201")
    strategy = STRATEGIES.get("random")()
    strategy.setup(space, 2, 0, seed=3, budget=20000)
    first = strategy.ask(10_000)
    rest = strategy.ask(10_000)
    keys = {arch_key(a) for a in first + rest}
    assert len(first) == 10_000 and len(rest) == space.size() - 10_000 == len(keys) - 10_000
    assert strategy.ask(1) == []


def drive_failing(name, space, seed, n_total, fails):
    """As `drive`, but architectures for which `fails(idx)` holds are told as failed trials
    are: the worst values (the search loop's FAILED_PENALTY) and every constraint violated."""
    from nasctl.strategies.base import FAILED_PENALTY

    strategy = STRATEGIES.get(name)()
    strategy.setup(space, 2, 0, seed=seed, budget=n_total)
    proposed = []
    while len(proposed) < n_total:
        archs = strategy.ask(n_total - len(proposed))
        proposed += archs
        F = np.array([np.full(2, FAILED_PENALTY) if fails(space.to_indices(a)) else toy_objectives(space, a)
                      for a in archs])
        strategy.tell(archs, F, np.zeros((len(archs), 0)))
    return proposed


def test_rl_learns_not_to_propose_what_fails():
    # a fifth of the space fails (say, a knob choice the device cannot run)
    space = load_space("nb201")
    fails = lambda idx: idx[0] == 1  # noqa: E731
    proposed = drive_failing("rl", space, 0, 200, fails)
    failed = np.array([fails(space.to_indices(a)) for a in proposed])
    assert failed[-100:].mean() < 0.05  # uniform draws would hold 20%


def test_rl_depends_only_on_the_order_of_the_objective_values():
    """Rewards come from ranks: rescaling an objective or transforming it monotonically
    (a latency in s instead of ms, its logarithm) leaves the search unchanged."""
    space = load_space("nb201")

    def run(transform):
        strategy = STRATEGIES.get("rl")()
        strategy.setup(space, 2, 0, seed=3, budget=80)
        proposed = []
        while len(proposed) < 80:
            archs = strategy.ask(80 - len(proposed))
            proposed += archs
            F = np.array([toy_objectives(space, a) for a in archs])
            strategy.tell(archs, transform(F), np.zeros((len(archs), 0)))
        return proposed

    plain = run(lambda F: F)
    assert run(lambda F: np.column_stack([1e-3 * F[:, 0], np.exp(F[:, 1] / 10)])) == plain
