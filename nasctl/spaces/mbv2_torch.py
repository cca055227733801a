"""Torch modules for `kind: mbv2` networks, built from `Mbv2Space.plan()` blocks.

The module matches `Mbv2Space.to_layers` layer for layer: every conv uses padding k // 2,
and each conv is followed by batch norm (which a runtime folds into the conv's bias).

    stem    conv k×k stride s → BN → ReLU6
    mbconv  [1×1 expand → BN → ReLU6, when expand > 1] → k×k depthwise stride s → BN → ReLU6
            → 1×1 project → BN, plus the input when stride == 1 and in == out
    exit    1×1 conv to width → BN → ReLU6 → global average pool → linear to classes
    head    as an exit: the final classifier

Every block fake-quantizes its weights and activations to its own `bits`
(see `nasctl.evaluation.quant`; 16 and 32 bits stay float).  Activations are quantized
at the network input, after each conv unit (after the residual sum in an mbconv) and
after pooling.  `forward(x)` returns one logits tensor per exit, in plan order, the final
classifier last.
"""

from __future__ import annotations

import torch
from torch import nn

from ..evaluation.quant import ActQuant, QConv2d, QLinear
from .exit_net import ExitNet


def _conv_unit(cin: int, cout: int, k: int, stride: int, groups: int, bits: int, act: bool) -> nn.Sequential:
    """conv (no bias: BN carries it) → BN → [ReLU6 → activation quantizer]."""
    layers = [QConv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False, bits=bits), nn.BatchNorm2d(cout)]
    if act:
        layers += [nn.ReLU6(inplace=True), ActQuant(bits)]
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    owned_inputs = ("quant",)  # its quantizer reads a tensor nothing else does (see quant.frozen_for_inference)

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int, bits: int):
        super().__init__()
        hidden = cin * expand
        units = [_conv_unit(cin, hidden, 1, 1, 1, bits, act=True)] if expand != 1 else []
        units += [_conv_unit(hidden, hidden, kernel, stride, hidden, bits, act=True),
                  _conv_unit(hidden, cout, 1, 1, 1, bits, act=False)]
        self.body = nn.Sequential(*units)
        self.residual = stride == 1 and cin == cout
        self.quant = ActQuant(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.quant(x + y if self.residual else y)


class Classifier(nn.Module):
    """An exit head or the final classifier: 1×1 conv → pool → linear."""

    def __init__(self, cin: int, width: int, classes: int, bits: int):
        super().__init__()
        self.conv = _conv_unit(cin, width, 1, 1, 1, bits, act=True)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), ActQuant(bits))
        self.fc = QLinear(width, classes, bits=bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.conv(x)))


class Mbv2Net(ExitNet):
    """Blocks in plan order; a `Classifier` block emits logits and the backbone goes on."""

    head_type = Classifier


def build_mbv2(plan: list[dict], input_shape: tuple[int, int, int], classes: int) -> Mbv2Net:
    """The module for `plan` (from `Mbv2Space.plan`) on inputs of shape (C, H, W)."""
    blocks: list[nn.Module] = []
    for b in plan:
        kind, bits = b["type"], b["bits"]
        if kind == "stem":
            blocks.append(nn.Sequential(ActQuant(bits),
                                        _conv_unit(input_shape[0], b["out"], b["kernel"], b["stride"], 1, bits, act=True)))
        elif kind == "mbconv":
            blocks.append(InvertedResidual(b["in"], b["out"], b["expand"], b["kernel"], b["stride"], bits))
        elif kind in ("exit", "head"):
            blocks.append(Classifier(b["in"], b["width"], classes, bits))
        else:
            raise ValueError(f"unknown mbv2 block type {kind!r}")
    return Mbv2Net(blocks)
