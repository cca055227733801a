"""The conformance kit (nasctl.testing) on every shipped space, device and strategy, and
on deliberately broken ones, which it must refuse."""

from pathlib import Path

import pytest

from nasctl.errors import NasctlError
from nasctl.hardware.base import CostModel, LayerCost
from nasctl.hardware.loader import load_device
from nasctl.spaces.loader import load_space
from nasctl.strategies import STRATEGIES
from nasctl.testing import check_device, check_space, check_strategy

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted(ROOT.glob("search_spaces/*.yaml")) + sorted(ROOT.glob("search_spaces/*/spec.yaml"))
DEVICES = sorted(ROOT.glob("hardware/*.yaml")) + sorted(ROOT.glob("hardware/*/spec.yaml"))
SHAPE, CLASSES = (3, 32, 32), 10


def _id(path):
    return path.parent.name if path.name == "spec.yaml" else path.stem


def shipped_space(path):
    try:
        return load_space(str(path))
    except (NasctlError, ImportError) as e:  # a kind whose module is not there (yet)
        pytest.skip(f"{_id(path)} does not load: {e}")


@pytest.mark.parametrize("path", SPACES, ids=_id)
def test_every_shipped_space_conforms(path):
    check_space(shipped_space(path), SHAPE, CLASSES, samples=3)


@pytest.mark.parametrize("path", DEVICES, ids=_id)
def test_every_shipped_device_conforms(path):
    check_device(load_device(str(path)))


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_every_strategy_conforms(name):
    check_strategy(STRATEGIES.get(name), load_space("nb201"), budget=12)


def test_a_space_whose_layers_miss_a_conv_is_refused():
    space = load_space("ee-mbv2")

    class Dropping(type(space)):
        def to_layers(self, arch, input_shape, classes):
            layers = super().to_layers(arch, input_shape, classes)
            i = next(i for i, layer in enumerate(layers) if layer.op == "conv")
            return layers[:i] + layers[i + 1:]

    broken = Dropping(space.spec)
    with pytest.raises(AssertionError, match="to_layers disagrees with build .* only in the built module: 1 x"):
        check_space(broken, SHAPE, CLASSES, samples=1)


def test_a_space_that_calls_a_knob_idle_that_changes_its_network_is_refused():
    space = load_space("ee-mbv2")

    class Careless(type(space)):  # an exit's width called idle even where the exit is on
        def idle_knobs(self, arch):
            return [v.name for v in self.variables() if v.name.endswith("_width")]

    with pytest.raises(AssertionError, match="only in idle knobs .* yet its layers differ"):
        check_space(Careless(space.spec), SHAPE, CLASSES, samples=3, build=False)


def test_a_space_whose_samples_are_not_seeded_is_refused():
    space = load_space("nb201")

    class Unseeded(type(space)):
        def sample(self, rng):
            import numpy as np
            return super().sample(np.random.default_rng())

    with pytest.raises(AssertionError, match="same seed gave different architectures"):
        check_space(Unseeded(space.spec), SHAPE, CLASSES, samples=3, build=False)


class Backwards(CostModel):
    """Cheaper the more multiply-accumulates a layer has."""

    name = "backwards"

    def _layer_cost(self, layer):
        return LayerCost(1e3 / (1 + layer.macs), 1e3 / (1 + layer.macs))


class CheapWide(CostModel):
    """Costs grow with MACs, but a 32-bit layer costs less than an 8-bit one."""

    name = "cheap-wide"

    def _layer_cost(self, layer):
        cost = layer.macs * 1e-6 * (2.0 if layer.w_bits < 16 else 1.0) + 1e-3
        return LayerCost(cost, cost)


def test_a_device_cheaper_for_more_macs_is_refused():
    with pytest.raises(AssertionError, match=r"device 'backwards': conv32x8 \(.* MACs\) has a lower latency"):
        check_device(Backwards())


def test_a_device_dearer_at_fewer_bits_is_refused():
    with pytest.raises(AssertionError, match="device 'cheap-wide': a 8-bit conv costs more latency"):
        check_device(CheapWide())


def test_a_strategy_that_proposes_twice_is_refused():
    random = STRATEGIES.get("random")

    class Repeating(random):
        def _ask(self, n):
            self.rng = __import__("numpy").random.default_rng(self.seed)
            return [self.space.sample(self.rng)]

    with pytest.raises(AssertionError, match="twice"):
        check_strategy(Repeating, load_space("nb201"), budget=4)


@pytest.mark.parametrize("unused_ops", ["drop", "lone-convs"])
def test_nb201_conventions_conform(unused_ops):
    """What a `kind: nb201` space builds is what its layers price, under every convention
    for unused ops (samples enough to hold unused nodes)."""
    from nasctl.spaces.nb201 import Nb201Space

    from nasctl.testing import _draws

    base = load_space("nb201")
    space, run = (Nb201Space(base.spec.model_copy(update={"unused_ops": v})) for v in (unused_ops, "run"))
    assert any(space.cell_edges(a) != run.cell_edges(a) for pair in _draws(space, 3, 12) for a in pair)
    check_space(space, SHAPE, CLASSES, samples=12, seed=3)
