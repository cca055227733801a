"""A weight-sharing supernet of a `kind: mbv2` or `kind: vit` space: one set of weights
holding every architecture of the space, early exits and bit widths included.

Storage is the space's *full* network: the plan where every knob takes its largest choice
(every stage or group at its largest depth, width, expansion, kernel or MLP ratio; a vit at
its smallest patch, with its stem; every early exit on at its largest width), at 32 bits.
A sub-network (any architecture of the space) takes from it

  - depth: the first d blocks of each stage (mbv2) or block group (vit);
  - width, expansion, MLP ratio: the first channels of every weight, batch norm, layer
    norm, linear layer and position embedding (the input channels of a stage's first
    block are the previous stage's width; a block expanded 1x has no expand convolution
    and its depthwise convolution takes the first `in` channels of the full one);
  - heads: the same q, k and v channels split into its own number of heads;
  - kernel: the centre k×k of the full depthwise kernel;
  - patch size and stem (vit): a patch embedding and position embedding of its own for
    every (stem, patch) pair the space offers - kept beside the full network's blocks -
    and the stem's weights where it has one;
  - exits: the heads of the exits it has on, their first `width` channels;
  - bit widths: its own fake quantizers at its bits (nasctl.evaluation.quant) over the
    shared weights; batch-norm statistics and activation ranges are recalibrated for
    each sub-network at its bits before it is measured (`recalibrate`).

`forward(x, arch)` runs the sub-network's own module (built without memory, on torch's
meta device) over views of the shared tensors (`torch.func.functional_call`), so
gradients reach the shared weights, and `extract(arch)` - a plain `space.build` module
holding copies of the same tensors - computes exactly what `forward(x, arch)` does.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from ..errors import UsageError
from ..spaces.mbv2 import Mbv2Space
from ..spaces.vit import VitSpace

LAYOUT_CACHE = 4096  # architectures whose block layout is kept
SCRATCH_CACHE = 256  # block modules `network` keeps to assemble networks from


class _Mbv2:
    """How a supernet of a `kind: mbv2` space lays out its blocks."""

    reversed_knobs: tuple = ()  # knobs whose smallest choice is the larger network
    # `nasctl supernet train`'s epochs unless given: ee-mbv2's supernet ranked candidates no
    # better after 20 (Kendall tau 0.354 against 0.360 after 10, tune set)
    default_epochs = 10

    def __init__(self, space: Mbv2Space, input_shape, classes):
        from ..spaces.mbv2_torch import Mbv2Net

        self.space, self.input_shape, self.classes, self.net_type = space, input_shape, classes, Mbv2Net

    def storage(self, full_arch: dict) -> tuple[nn.Module, list]:
        """(the full network, the logical position of each of its blocks)."""
        from ..spaces.mbv2_torch import build_mbv2

        return build_mbv2(self.space.plan(full_arch), self.input_shape, self.classes), \
            [pos for _, pos in self.walk(full_arch)]

    def walk(self, arch: dict):
        """(plan block, its logical position) in plan order: ("stem",), ("mbconv", stage,
        d), ("exit", name), ("head",)."""
        d_in_stage, stage = 0, 0
        stage_of = []
        for i, st in enumerate(self.space.spec.stages, 1):
            stage_of += [i] * arch[f"s{i}_depth"]
        m = 0
        for b in self.space.plan(arch):
            if b["type"] == "mbconv":
                s = stage_of[m]
                d_in_stage = d_in_stage + 1 if s == stage else 0
                stage = s
                m += 1
                yield b, ("mbconv", s, d_in_stage)
            elif b["type"] == "exit":
                yield b, ("exit", b["name"])
            else:
                yield b, (b["type"],)

    def build_block(self, b: dict, pos: tuple) -> nn.Module:
        from ..spaces.mbv2_torch import build_mbv2

        return build_mbv2([b], self.input_shape, self.classes).blocks[0]

    def block_key(self, b: dict, pos: tuple):
        return _signature(b)

    def full_rest(self, b: dict, pos: tuple, rest: str, full_arch: dict) -> str:
        """The name, within the full network's block at `pos`, of the tensor `rest` of `b`."""
        if (b["type"] == "mbconv" and b["expand"] == 1 and full_arch[f"s{pos[1]}_expand"] != 1
                and rest.startswith("body.")):
            u, tail = rest[len("body."):].split(".", 1)  # no expand unit: body.0 is the full block's body.1
            return f"body.{int(u) + 1}.{tail}"
        return rest


class _Vit:
    """How a supernet of a `kind: vit` space lays out its blocks."""

    reversed_knobs = ("patch",)  # the smallest patch gives the most tokens
    # ee-vit's supernet ranked candidates best at 60 epochs of 10, 30, 60 and 120 (Kendall tau
    # 0.63 on the tune set, 0.60 held out against the mean of 10 trainings; README.md), 2.6
    # minutes on two cores
    default_epochs = 60

    def __init__(self, space: VitSpace, input_shape, classes):
        from ..spaces.vit_torch import VitNet

        self.space, self.input_shape, self.classes, self.net_type = space, input_shape, classes, VitNet

    def storage(self, full_arch: dict) -> tuple[nn.Module, list]:
        """The full network's blocks, then a patch embedding of the largest width for every
        other (stem, patch) pair of the space."""
        from ..spaces.vit_torch import VitNet

        walked = list(self.walk(full_arch))
        blocks = [self.build_block(b, pos) for b, pos in walked]
        positions = [pos for _, pos in walked]
        embed = next(b for b, _ in walked if b["type"] == "embed")
        for stem, patch in itertools.product(self._choices("conv_stem"), self._choices("patch")):
            pos = ("embed", stem, patch)
            if pos not in positions:
                blocks.append(self.build_block({**embed, "patch": patch}, pos))
                positions.append(pos)
        return VitNet(blocks), positions

    def _choices(self, name: str) -> tuple:
        return next(v.choices for v in self.space.variables() if v.name == name)

    def walk(self, arch: dict):
        """(plan block, its logical position) in plan order: ("stem",), ("embed", stem,
        patch), ("block", group, d), ("exit", name), ("head",)."""
        group_of = [(i, d) for i in range(1, len(self.space.spec.groups) + 1) for d in range(arch[f"g{i}_depth"])]
        m = 0
        for b in self.space.plan(arch):
            if b["type"] == "block":
                yield b, ("block", *group_of[m])
                m += 1
            elif b["type"] == "embed":
                yield b, ("embed", arch["conv_stem"], b["patch"])
            elif b["type"] == "exit":
                yield b, ("exit", b["name"])
            else:
                yield b, (b["type"],)

    def build_block(self, b: dict, pos: tuple) -> nn.Module:
        from ..spaces.vit_torch import build_block

        stem = pos[0] == "embed" and pos[1]
        ch = self.space.spec.stem.channels if stem else self.input_shape[0]
        return build_block(b, ch, self.input_shape, self.classes, first=not stem)

    def block_key(self, b: dict, pos: tuple):
        return (pos[:2] if pos[0] == "embed" else None, _signature(b))

    def full_rest(self, b: dict, pos: tuple, rest: str, full_arch: dict) -> str:
        return rest


KINDS = {Mbv2Space: _Mbv2, VitSpace: _Vit}


def _signature(b: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in b.items() if k != "name"))


def default_epochs(space) -> int:
    """The epochs a supernet of `space` trains for unless told."""
    return KINDS[type(base_space(space))].default_epochs


def base_space(space):
    """The space under a pinned one, of a kind supernets cover; a one-line error for others."""
    inner = getattr(space, "inner", space)
    if type(inner) not in KINDS:
        raise UsageError(f"space '{space.name}' is of a kind supernets do not cover yet; allowed: "
                         f"{', '.join(k.__name__.removesuffix('Space').lower() for k in KINDS)}")
    return inner


class Supernet(nn.Module):
    def __init__(self, space, input_shape: tuple[int, int, int], classes: int):
        super().__init__()
        self.space = base_space(space)
        self.input_shape, self.classes = tuple(input_shape), classes
        self.kind = KINDS[type(self.space)](self.space, self.input_shape, classes)
        self.full_arch = self.largest(bits=32)
        self.full, positions = self.kind.storage(self.full_arch)
        self._full_index = {pos: n for n, pos in enumerate(positions)}
        self._full_keys = set(self.full.state_dict(keep_vars=True))
        self._blocks_cache: dict = {}
        self._layouts: OrderedDict = OrderedDict()
        self._scratch: OrderedDict = OrderedDict()

    # -- architectures -------------------------------------------------------------------
    def _choice(self, pick, bits: int | None = None, exits: bool = True) -> dict:
        other = min if pick is max else max
        flags = {f"exit_{e}" for e in self.space.exit_names() if e != "final"}
        arch = {}
        for v in self.space.variables():
            chosen = (other if v.name in self.kind.reversed_knobs else pick)(v.choices)
            if v.name in flags:
                chosen = int(exits)
            elif bits is not None and v.name.endswith("_bits"):
                chosen = bits if bits in v.choices else pick(v.choices)
            arch[v.name] = chosen
        return arch

    def largest(self, bits: int | None = None) -> dict:
        """Every knob at its largest choice (a vit's patch at its smallest), exits on;
        bits at `bits` (the space's largest where it offers no such width, the largest
        choice where None)."""
        return self._choice(max, bits)

    def smallest(self) -> dict:
        """Every knob at its smallest choice (bits too; a vit's patch at its largest), exits on."""
        return self._choice(min)

    def sample(self, rng: np.random.Generator) -> dict:
        return self.space.sample(rng)

    # -- weights of a sub-network ----------------------------------------------------------
    def _block_module(self, b: dict, pos: tuple) -> nn.Module:
        """One plan block's module on the meta device (structure only), cached by its shape."""
        key = self.kind.block_key(b, pos)
        mod = self._blocks_cache.get(key)
        if mod is None:
            with torch.device("meta"):
                mod = self.kind.build_block(b, pos)
            self._blocks_cache[key] = mod
        return mod

    def _layout(self, arch: dict) -> list[tuple[nn.Module, bool, list]]:
        """Per plan block of `arch`: its module, whether it is a head, and
        (its state_dict key, the full network's key, shape) per tensor.  Cached."""
        key = tuple(sorted(arch.items()))
        layout = self._layouts.get(key)
        if layout is not None:
            self._layouts.move_to_end(key)
            return layout
        layout = []
        for b, pos in self.kind.walk(arch):
            mod = self._block_module(b, pos)
            m = self._full_index[pos]
            pairs = []
            for rest, value in mod.state_dict(keep_vars=True).items():
                full_key = f"blocks.{m}.{self.kind.full_rest(b, pos, rest, self.full_arch)}"
                if full_key not in self._full_keys:
                    raise KeyError(f"{rest} of block {pos} has no counterpart {full_key} in the full network")
                pairs.append((rest, full_key, value.shape))
            layout.append((mod, b["type"] in ("exit", "head"), pairs))
        self._layouts[key] = layout
        if len(self._layouts) > LAYOUT_CACHE:
            self._layouts.popitem(last=False)
        return layout

    def _full_tensors(self) -> dict[str, torch.Tensor]:
        full = dict(self.full.named_parameters())
        full.update(self.full.named_buffers())
        return full

    def tensors(self, arch: dict) -> dict[str, torch.Tensor]:
        """The sub-network's state_dict (keys as `space.build` names them) as views of the
        shared tensors: gradients and batch-norm updates reach the shared ones."""
        full = self._full_tensors()
        return {f"blocks.{n}.{rest}": _crop(full[fk], shape)
                for n, (_, _, pairs) in enumerate(self._layout(self.space.validate(arch))) for rest, fk, shape in pairs}

    def forward(self, x: torch.Tensor, arch: dict, tensors: dict | None = None) -> list[torch.Tensor]:
        """The sub-network `arch`'s outputs (one logits tensor per active exit, final
        last), computed by its own blocks' modules over `tensors` (default: views of the
        shared ones; see `tensors`)."""
        layout = self._layout(self.space.validate(arch))
        full = self._full_tensors() if tensors is None else None
        outputs = []
        for n, (mod, is_head, pairs) in enumerate(layout):
            if tensors is None:
                local = {rest: _crop(full[fk], shape) for rest, fk, shape in pairs}
            else:
                local = {rest: tensors[f"blocks.{n}.{rest}"] for rest, _, _ in pairs}
            mod.train(self.training)
            y = torch.func.functional_call(mod, local, (x,), strict=True)
            if is_head:
                outputs.append(y)
            else:
                x = y
        return outputs

    def network(self, arch: dict) -> nn.Module:
        """A scratch network of `arch`: a `space.build` network (the same modules, the same
        state_dict keys) holding copies of its shared tensors, assembled from block modules
        kept between calls (so a call invalidates the network of the previous one where
        the two share a block).  What `extract` gives, without building modules: for
        measuring thousands of candidates."""
        layout = self._layout(self.space.validate(arch))
        full = self._full_tensors()
        blocks = []
        with torch.no_grad():
            for (meta, _, pairs), (b, pos) in zip(layout, self.kind.walk(arch)):
                key = (pos, _signature(b))
                mod = self._scratch.get(key)
                if mod is None:
                    mod = self._scratch[key] = self.kind.build_block(b, pos)
                    if len(self._scratch) > SCRATCH_CACHE:
                        self._scratch.popitem(last=False)
                else:
                    self._scratch.move_to_end(key)
                own = mod.state_dict(keep_vars=True)
                for rest, fk, shape in pairs:
                    own[rest].copy_(_crop(full[fk], shape))
                blocks.append(mod)
        net = self.kind.net_type.__new__(self.kind.net_type)
        nn.Module.__init__(net)
        net.blocks = nn.ModuleList(blocks)
        return net

    def extract(self, arch: dict) -> nn.Module:
        """A plain `space.build` module of `arch` holding copies of its shared tensors."""
        net = self.space.build(arch, self.input_shape, self.classes)
        net.load_state_dict({k: v.detach().clone() for k, v in self.tensors(arch).items()})
        return net.train(self.training)


def _crop(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The first entries of `t` along each axis to `shape`; the spatial axes of a conv
    weight (2 and 3 of four) centre-cropped instead."""
    if t.shape == shape:
        return t
    index = []
    for axis, (have, want) in enumerate(zip(t.shape, shape)):
        if want > have:
            raise ValueError(f"cannot crop {tuple(t.shape)} to {tuple(shape)}")
        start = (have - want) // 2 if t.dim() == 4 and axis >= 2 else 0
        index.append(slice(start, start + want))
    return t[tuple(index)]


def recalibrate(model: nn.Module, x: torch.Tensor, batch: int) -> None:
    """Batch-norm statistics and activation-quantizer ranges of `model` measured afresh on
    `x` (in batches of `batch`): each batch norm's running mean and variance become the
    average over the batches, each range starts from the first batch (quant.ActQuant's
    moving average after it).  Weights are left as they are; `model` ends in eval mode."""
    from ..evaluation.quant import ActQuant

    momenta = {}
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            momenta[mod] = mod.momentum
            mod.momentum = None  # a cumulative average
        elif isinstance(mod, ActQuant):
            mod.observed.fill_(False)
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), batch):
            model(x[i:i + batch])
    for mod, m in momenta.items():
        mod.momentum = m
    model.eval()
