"""A conformance kit for search spaces, devices and strategies, nasctl's own and plugins'.

Call these from your own tests (pytest or any runner); each raises AssertionError with a
message saying what is wrong::

    from nasctl.testing import check_device, check_space, check_strategy

    def test_my_space():
        check_space(MySpace.from_dict({...}), input_shape=(1, 8, 8), classes=10)

    def test_my_device():
        check_device(MyDevice.from_dict({...}))

    def test_my_strategy():
        check_strategy(MyStrategy, load_space("nb201"))

`check_space` samples and mutates a few architectures, builds each (torch is imported
only there) and runs it once on a batch of zeros; keep the input shape small.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from .hardware.layers import OPS, LayerSpec
from .spaces.base import SearchSpace, Variable, arch_key

__all__ = ["check_space", "check_device", "check_strategy", "drive", "toy_objectives", "NineSpace",
           "layers_of_module", "compute_layers"]


# -- spaces -------------------------------------------------------------------------------

def check_space(space: SearchSpace, input_shape: tuple[int, int, int], classes: int, *,
                samples: int = 4, seed: int = 0, build: bool = True) -> None:
    """Check a search space against the contract of `nasctl.spaces.base.SearchSpace`:

    - its knobs: named once each, with at least one choice each, none repeated;
    - `sample` and `mutate` give the same architectures from the same seed, and valid ones
      (`validate` returns them unchanged, knobs in `variables()` order); a mutation differs
      from its parent wherever some knob has two choices or more;
    - `encode` gives vectors of one length, finite, for every architecture;
    - `to_layers` gives LayerSpecs of known ops and positive sizes, the same for the same
      architecture, with exit segments within the architecture's active exits;
    - `active_exits` lies within `exit_names()` in its order, the final classifier last;
    - with `build`, the torch module's Conv/Linear layers match the conv/linear LayerSpecs
      (count, in/out channels, kernel, stride, groups) and one forward pass gives one
      (batch x classes) output per active exit;
    - `idle_knobs` are knobs of the space, and changing them changes nothing: the same
      `canonical` form (a valid architecture that keeps every other knob), the same layers
      and active exits and, with `build`, the same weights from the same torch seed.
    """
    name = getattr(space, "name", type(space).__name__)
    variables = list(space.variables())
    assert variables, f"space '{name}': variables() is empty"
    knobs = [v.name for v in variables]
    assert len(set(knobs)) == len(knobs), f"space '{name}': knob names repeat: {knobs}"
    for v in variables:
        assert isinstance(v, Variable), f"space '{name}': knob {v!r} is not a Variable"
        assert len(v.choices) >= 1, f"space '{name}': knob '{v.name}' has no choices"
        assert len(set(map(repr, v.choices))) == len(v.choices), \
            f"space '{name}': knob '{v.name}' repeats a choice: {v.choices}"

    first = _draws(space, seed, samples)
    assert _draws(space, seed, samples) == first, \
        f"space '{name}': sample/mutate with the same seed gave different architectures"
    archs = [a for pair in first for a in pair]
    can_change = any(len(v.choices) > 1 for v in variables)
    for parent, child in first:
        for arch, what in ((parent, "sampled"), (child, "mutated")):
            try:
                valid = space.validate(arch)
            except Exception as e:
                raise AssertionError(f"space '{name}': a {what} architecture is refused by validate: "
                                     f"{arch_key(arch)}: {e}") from None
            assert valid == dict(arch), f"space '{name}': validate changed a {what} architecture {arch_key(arch)}"
            assert list(arch) == knobs, (f"space '{name}': a {what} architecture's knobs {list(arch)} are not "
                                         f"in variables() order {knobs}")
        if can_change:
            assert child != parent, f"space '{name}': mutate returned its parent unchanged: {arch_key(parent)}"

    for kind in ("ordinal", "onehot"):
        lengths = set()
        for arch in archs:
            x = np.asarray(space.encode(arch, kind), dtype=float)
            assert x.ndim == 1 and np.all(np.isfinite(x)), \
                f"space '{name}': encode(..., '{kind}') is not a finite vector for {arch_key(arch)}"
            lengths.add(len(x))
        assert len(lengths) == 1, f"space '{name}': encode(..., '{kind}') lengths differ: {sorted(lengths)}"

    exit_names = list(space.exit_names())
    assert exit_names, f"space '{name}': exit_names() is empty"
    assert len(set(exit_names)) == len(exit_names), f"space '{name}': exit_names() repeat: {exit_names}"
    for arch in archs:
        key = arch_key(arch)
        active = list(space.active_exits(arch))
        assert active and active[-1] == exit_names[-1], \
            f"space '{name}': active_exits {active} of {key} does not end with the final exit '{exit_names[-1]}'"
        assert all(e in exit_names for e in active) and \
            [e for e in exit_names if e in active] == active, \
            f"space '{name}': active_exits {active} of {key} are not among exit_names() {exit_names} in its order"
        layers = space.to_layers(arch, input_shape, classes)
        assert layers == space.to_layers(arch, input_shape, classes), \
            f"space '{name}': to_layers gave different layers for the same architecture {key}"
        _check_layers(name, key, layers, len(active))
        if build:
            _check_build(space, name, key, arch, layers, active, input_shape, classes)
        _check_idle(space, name, key, arch, variables, layers, active, input_shape, classes, build)


def _draws(space: SearchSpace, seed: int, n: int) -> list[tuple[dict, dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        parent = space.sample(rng)
        out.append((parent, space.mutate(parent, rng)))
    return out


def _check_layers(name: str, key: str, layers: Sequence[LayerSpec], n_exits: int) -> None:
    assert layers, f"space '{name}': to_layers gave no layers for {key}"
    for layer in layers:
        assert isinstance(layer, LayerSpec), f"space '{name}': to_layers gave {layer!r}, not a LayerSpec"
        where = f"space '{name}': layer {layer.name or layer.op} of {key}"
        assert layer.op in OPS, f"{where}: unknown op '{layer.op}'"
        assert min(layer.in_ch, layer.out_ch, *layer.in_hw, *layer.out_hw, *layer.kernel, layer.stride,
                   layer.groups) >= 1, f"{where}: sizes must be positive: {layer}"
        assert 0 <= layer.segment < n_exits, \
            f"{where}: segment {layer.segment} is outside its {n_exits} active exit(s)"
    assert any(layer.segment == n_exits - 1 for layer in layers), \
        f"space '{name}': no layer of {key} lies before the final exit (segment {n_exits - 1})"


def compute_layers(layers: Sequence[LayerSpec]) -> list[tuple]:
    """The conv and linear LayerSpecs as (op, in, out, kernel, stride, groups)."""
    out = []
    for layer in layers:
        if layer.op in ("conv", "conv_transpose"):
            out.append((layer.op, layer.in_ch, layer.out_ch, tuple(layer.kernel), layer.stride, layer.groups))
        elif layer.op == "linear":
            out.append(("linear", layer.in_ch, layer.out_ch, (1, 1), 1, 1))
    return out


def layers_of_module(module) -> list[tuple]:
    """A torch module's Conv1d/2d, ConvTranspose2d and Linear layers in the form of
    `compute_layers` (a Conv1d's kernel k is k x 1: a sequence of T is T x 1)."""
    import torch.nn as nn

    out = []
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d)):
            kernel = tuple(m.kernel_size) + (1,) * (2 - len(m.kernel_size))
            op = "conv_transpose" if isinstance(m, nn.ConvTranspose2d) else "conv"
            out.append((op, m.in_channels, m.out_channels, kernel, m.stride[0], m.groups))
        elif isinstance(m, nn.Linear):
            out.append(("linear", m.in_features, m.out_features, (1, 1), 1, 1))
    return out


def _check_build(space, name, key, arch, layers, active, input_shape, classes) -> None:
    import torch

    module = space.build(arch, input_shape, classes)
    assert isinstance(module, torch.nn.Module), f"space '{name}': build gave {type(module).__name__}, not a module"
    specs, built = Counter(compute_layers(layers)), Counter(layers_of_module(module))
    if specs != built:
        only_specs = "; ".join(f"{n} x {k}" for k, n in (specs - built).items()) or "none"
        only_built = "; ".join(f"{n} x {k}" for k, n in (built - specs).items()) or "none"
        raise AssertionError(
            f"space '{name}': to_layers disagrees with build for {key} (op, in, out, kernel, stride, groups): "
            f"only in to_layers: {only_specs}; only in the built module: {only_built}")
    module.eval()
    with torch.no_grad():
        outputs = module(torch.zeros(2, *input_shape))
    assert isinstance(outputs, (list, tuple)), \
        f"space '{name}': the built module returns {type(outputs).__name__}, not a list of one output per exit"
    assert len(outputs) == len(active), \
        f"space '{name}': the built module of {key} gives {len(outputs)} output(s) for active exits {active}"
    for exit_name, out in zip(active, outputs):
        assert tuple(out.shape) == (2, classes), \
            f"space '{name}': exit '{exit_name}' of {key} outputs shape {tuple(out.shape)}, expected (2, {classes})"


def _check_idle(space, name, key, arch, variables, layers, active, input_shape, classes, build) -> None:
    idle = list(space.idle_knobs(arch))
    knobs = [v.name for v in variables]
    assert set(idle) <= set(knobs), f"space '{name}': idle_knobs {idle} of {key} are not all knobs of the space"
    canon = space.canonical(arch)
    assert space.validate(canon) == canon and space.canonical(canon) == canon, \
        f"space '{name}': canonical of {key} is not a valid architecture that is its own canonical form"
    assert all(canon[k] == arch[k] for k in knobs if k not in idle), \
        f"space '{name}': canonical of {key} changed a knob that is not idle: {arch_key(canon)}"
    other = {**arch, **{v.name: v.choices[-1] for v in variables if v.name in idle}}
    if other == dict(arch):
        return
    what = f"space '{name}': {arch_key(other)} differs from {key} only in idle knobs {idle}, yet"
    assert space.canonical(other) == canon, f"{what} its canonical form differs"
    assert list(space.active_exits(other)) == active, f"{what} its active exits differ"
    assert space.to_layers(other, input_shape, classes) == layers, f"{what} its layers differ"
    if build:
        import torch

        weights = []
        for a in (arch, other):
            torch.manual_seed(0)
            weights.append(space.build(a, input_shape, classes).state_dict())
        same = weights[0].keys() == weights[1].keys() and all(
            weights[0][k].shape == weights[1][k].shape and torch.equal(weights[0][k], weights[1][k])
            for k in weights[0])
        assert same, f"{what} its built network's weights differ"


# -- devices ------------------------------------------------------------------------------

def _conv(ch: int, hw: int, bits: int = 32) -> LayerSpec:
    return LayerSpec("conv", ch, ch, (hw, hw), (hw, hw), (3, 3), w_bits=bits, a_bits=bits, name=f"conv{ch}x{hw}")


def check_device(device, *, bits: Sequence[int] = (32, 16, 8, 4)) -> None:
    """Check a device (a `nasctl.hardware.base.CostModel`):

    - it prices a conv and a linear layer, at a positive, finite latency (and energy,
      where `models_energy`), the same each time;
    - a conv of more multiply-accumulates never costs less, and one of 64 times the MACs
      costs more (latency, and energy where modelled);
    - at the bit widths of `bits` it prices, a lower width never costs more.
    """
    name = getattr(device, "name", type(device).__name__)
    assert isinstance(name, str) and name, f"device {device!r}: no name"
    assert isinstance(device.describe(), dict), f"device '{name}': describe() is not a dict"
    empty = device.estimate([])
    assert empty.latency_ms == 0, f"device '{name}': an empty network costs {empty.latency_ms} ms"

    def price(layer: LayerSpec):
        report = device.estimate([layer])
        if report.unsupported:
            return None
        return report.latency_ms, report.energy_mj

    linear = LayerSpec("linear", 64, 10, (1, 1), (1, 1), name="linear")
    for layer in (_conv(16, 16), linear):
        cost = price(layer)
        assert cost is not None, f"device '{name}': cannot price a {layer.op} layer ({layer})"
        _positive(name, layer, cost, device.models_energy)
        assert price(layer) == cost, f"device '{name}': prices the same {layer.op} layer differently twice"

    # MACs grow 4x a step: channels, then the feature map
    ladder = [_conv(16, 8), _conv(32, 8), _conv(32, 16), _conv(64, 16)]
    costs = [price(layer) for layer in ladder]
    for layer, cost in zip(ladder, costs):
        assert cost is not None, f"device '{name}': cannot price {layer.name} ({layer})"
        _positive(name, layer, cost, device.models_energy)
    for metric, i in (("latency", 0), ("energy", 1)):
        if i == 1 and not device.models_energy:
            continue
        values = [c[i] for c in costs]
        for (a, va), (b, vb) in zip(zip(ladder, values), zip(ladder[1:], values[1:])):
            assert vb >= va * (1 - 1e-9), (f"device '{name}': {b.name} ({b.macs:,} MACs) has a lower {metric} "
                                           f"({vb:.6g}) than {a.name} ({a.macs:,} MACs, {va:.6g})")
        assert values[-1] > values[0], (f"device '{name}': {ladder[-1].name} ({ladder[-1].macs:,} MACs) costs no "
                                        f"more {metric} ({values[-1]:.6g}) than {ladder[0].name} "
                                        f"({ladder[0].macs:,} MACs, {values[0]:.6g})")

    priced = [(b, price(_conv(32, 16, b))) for b in sorted(bits, reverse=True)]
    priced = [(b, c) for b, c in priced if c is not None]
    for metric, i in (("latency", 0), ("energy", 1)):
        if i == 1 and not device.models_energy:
            continue
        for hi, chi in priced:
            for lo, clo in priced:
                if lo < hi:
                    assert clo[i] <= chi[i] * (1 + 1e-9), (
                        f"device '{name}': a {lo}-bit conv costs more {metric} ({clo[i]:.6g}) than "
                        f"the same conv at {hi} bits ({chi[i]:.6g})")


def _positive(name: str, layer: LayerSpec, cost, models_energy: bool) -> None:
    latency, energy = cost
    assert math.isfinite(latency) and latency > 0, f"device '{name}': {layer.name or layer.op} costs {latency} ms"
    if models_energy:
        assert energy is not None and math.isfinite(energy) and energy > 0, \
            f"device '{name}': {layer.name or layer.op} costs {energy} mJ (models_energy is set)"


# -- strategies ---------------------------------------------------------------------------

def toy_objectives(space: SearchSpace, arch) -> np.ndarray:
    """Two conflicting objectives over the knob indices (minimise both)."""
    idx = space.to_indices(arch).astype(float)
    return np.array([idx.sum(), -(idx[: len(idx) // 2] ** 2).sum()])


def drive(strategy_cls, space: SearchSpace, seed: int, n_total: int, *, max_ask: int | None = None,
          pool: bool = False, constraint=None) -> tuple[list[dict], list[int]]:
    """Run a strategy as the search engine does: ask for what the budget has left (or at
    most `max_ask`), evaluate on `toy_objectives` (and `constraint(space, arch)`, feasible
    where <= 0, if given), tell; returns every proposal and each ask's size."""
    strategy = strategy_cls()
    strategy.setup(space, 2, 0 if constraint is None else 1, seed=seed, budget=n_total, pool=pool)
    proposed, sizes = [], []
    while len(proposed) < n_total:
        asked = min(n_total - len(proposed), max_ask or n_total)
        archs = strategy.ask(asked)
        assert archs, f"{strategy_cls.__name__} proposed nothing with {n_total - len(proposed)} of its budget left"
        assert len(archs) <= asked, f"{strategy_cls.__name__} proposed {len(archs)} architectures, asked for {asked}"
        sizes.append(len(archs))
        proposed += archs
        G = np.array([[constraint(space, a)] for a in archs]) if constraint else np.zeros((len(archs), 0))
        strategy.tell(archs, np.array([toy_objectives(space, a) for a in archs]), G)
    return proposed, sizes


class NineSpace(SearchSpace):
    """Nine architectures: two knobs of three choices."""

    name = "nine"

    def variables(self):
        return (Variable("a", (1, 2, 3)), Variable("b", ("x", "y", "z")))

    def to_layers(self, arch, input_shape, classes):
        raise NotImplementedError

    def build(self, arch, input_shape, classes):
        raise NotImplementedError


def check_strategy(strategy_cls, space: SearchSpace, *, budget: int = 16, seed: int = 0) -> None:
    """Check a strategy (a `nasctl.strategies.base.Strategy` subclass) on `space`:

    - the same seed gives the same proposals, another seed others;
    - proposals are valid architectures of the space, knobs in `variables()` order, none
      proposed twice;
    - an ask never returns more than asked for (nor nothing while the space has more);
    - it stops proposing once a small space (nine architectures) is used up.
    """
    who = strategy_cls.__name__
    knobs = [v.name for v in space.variables()]
    first, _ = drive(strategy_cls, space, seed, budget)
    assert drive(strategy_cls, space, seed, budget)[0] == first, f"{who}: the same seed gave other proposals"
    if space.size() > 10 * budget:
        assert drive(strategy_cls, space, seed + 1, budget)[0] != first, \
            f"{who}: seeds {seed} and {seed + 1} gave the same proposals"
    for arch in first:
        try:
            valid = space.validate(arch)
        except Exception as e:
            raise AssertionError(f"{who}: proposed an invalid architecture {arch_key(arch)}: {e}") from None
        assert valid == dict(arch), f"{who}: proposed {arch_key(arch)}, which validate changes"
        assert list(arch) == knobs, f"{who}: a proposal's knobs {list(arch)} are not in variables() order {knobs}"
    keys = [arch_key(a) for a in first]
    assert len(set(keys)) == len(keys), f"{who}: proposed {len(keys) - len(set(keys))} architecture(s) twice"

    _, sizes = drive(strategy_cls, space, seed, 6, max_ask=2)
    assert max(sizes) <= 2, f"{who}: asked for at most 2, proposed {max(sizes)}"
    strategy = strategy_cls()
    strategy.setup(space, 2, 0, seed=seed, budget=4)
    assert strategy.ask(0) == [], f"{who}: ask(0) proposed architectures"

    nine = NineSpace()
    strategy = strategy_cls()
    strategy.setup(nine, 2, 0, seed=seed, budget=20)
    proposed: list[dict] = []
    archs: list[dict] = []
    for _ in range(30):
        archs = strategy.ask(20 - len(proposed))
        if not archs:
            break
        proposed += archs
        strategy.tell(archs, np.array([toy_objectives(nine, a) for a in archs]), np.zeros((len(archs), 0)))
    assert not archs, f"{who}: still proposing after a space of nine architectures ran out"
    keys = [arch_key(a) for a in proposed]
    assert len(set(keys)) == len(keys) <= 9, f"{who}: proposed {len(keys)} architectures of a space of nine"
