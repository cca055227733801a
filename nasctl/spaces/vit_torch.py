"""Torch modules for `kind: vit` networks, built from `VitSpace.plan()` blocks.

The module matches `VitSpace.to_layers` layer for layer, in the order its ONNX export
lists them:

    stem    conv k×k stride 1 (padding k // 2) → BN → ReLU
    embed   conv p×p stride p → tokens [B, T, C] → + learned position embedding
    block   x + proj(attention(q(n), k(n), v(n))), n = LayerNorm(x), then x + fc2(GELU(fc1(LayerNorm(x))));
            attention per head: softmax(q kᵀ · d^-½) v
    exit    mean over tokens → LayerNorm → linear to width → GELU → linear to classes
    head    mean over tokens → LayerNorm → linear to classes (the final classifier)

Weights and activations are fake-quantized to each block's `bits` (`nasctl.evaluation.quant`;
16 and 32 bits stay float); in a transformer block the attention - its projections, q, k,
v and the attention probabilities - takes `attn_bits`.  `forward(x)` returns one logits
tensor per exit, in plan order, the final classifier last.
"""

from __future__ import annotations

import torch
from torch import nn

from ..evaluation.quant import ActQuant, QConv2d, QLinear
from .exit_net import ExitNet


class Stem(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, bits: int):
        super().__init__()
        self.body = nn.Sequential(ActQuant(bits), QConv2d(cin, cout, kernel, 1, kernel // 2, bias=False, bits=bits),
                                  nn.BatchNorm2d(cout), nn.ReLU(inplace=True), ActQuant(bits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class PatchEmbed(nn.Module):
    def __init__(self, cin: int, width: int, patch: int, tokens: int, bits: int, first: bool):
        super().__init__()
        self.quant_in = ActQuant(bits) if first else nn.Identity()
        self.conv = QConv2d(cin, width, patch, patch, bits=bits)
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 1.0)
        self.quant = ActQuant(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.quant_in(x)).flatten(2).transpose(1, 2)
        return self.quant(x + self.pos)


class Block(nn.Module):
    """One pre-norm transformer block on [B, T, C] tokens."""

    def __init__(self, width: int, heads: int, hidden: int, bits: int, attn_bits: int):
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.norm1 = nn.Sequential(nn.LayerNorm(width), ActQuant(attn_bits))
        self.q, self.k, self.v = (QLinear(width, width, bits=attn_bits) for _ in range(3))
        self.qq, self.qk, self.qv, self.qp, self.qo = (ActQuant(attn_bits) for _ in range(5))
        self.proj = QLinear(width, width, bits=attn_bits)
        self.quant1 = ActQuant(bits)
        self.norm2 = nn.Sequential(nn.LayerNorm(width), ActQuant(bits))
        self.fc1 = QLinear(width, hidden, bits=bits)
        self.act = nn.Sequential(nn.GELU(), ActQuant(bits))
        self.fc2 = QLinear(hidden, width, bits=bits)
        self.quant2 = ActQuant(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        n = self.norm1(x)
        q = self.qq(self.q(n)).reshape(b, t, h, c // h).transpose(1, 2)      # [B, h, T, d]
        k = self.qk(self.k(n)).reshape(b, t, h, c // h).permute(0, 2, 3, 1)  # [B, h, d, T]
        v = self.qv(self.v(n)).reshape(b, t, h, c // h).transpose(1, 2)      # [B, h, T, d]
        att = self.qp(torch.softmax(torch.matmul(q, k) * self.scale, dim=-1))
        y = self.qo(torch.matmul(att, v)).transpose(1, 2).reshape(b, t, c)
        x = self.quant1(x + self.proj(y))
        return self.quant2(x + self.fc2(self.act(self.fc1(self.norm2(x)))))


class Classifier(nn.Module):
    """An exit head (with `hidden`) or the final classifier, on the mean of the tokens."""

    def __init__(self, width: int, hidden: int | None, classes: int, bits: int):
        super().__init__()
        self.quant = ActQuant(bits)
        self.norm = nn.Sequential(nn.LayerNorm(width), ActQuant(bits))
        if hidden:
            self.fc = nn.Sequential(QLinear(width, hidden, bits=bits), nn.GELU(), ActQuant(bits),
                                    QLinear(hidden, classes, bits=bits))
        else:
            self.fc = QLinear(width, classes, bits=bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.quant(x.mean(dim=1))))


class VitNet(ExitNet):
    """Blocks in plan order; a `Classifier` block emits logits and the backbone goes on."""

    head_type = Classifier


def build_vit(plan: list[dict], input_shape: tuple[int, int, int], classes: int) -> VitNet:
    """The module for `plan` (from `VitSpace.plan`) on inputs of shape (C, H, W)."""
    ch = input_shape[0]
    blocks: list[nn.Module] = []
    for b in plan:
        blocks.append(build_block(b, ch, input_shape, classes, first=not blocks))
        ch = b["out"] if b["type"] == "stem" else ch
    return VitNet(blocks)


def build_block(b: dict, ch: int, input_shape: tuple[int, int, int], classes: int, first: bool) -> nn.Module:
    """The module of one plan block `b` reading `ch` channels of the image (a stem or a
    patch embedding; `first`: it reads the network's input)."""
    kind, bits = b["type"], b["bits"]
    if kind == "stem":
        return Stem(ch, b["out"], b["kernel"], bits)
    if kind == "embed":
        p, (_, h, w) = b["patch"], input_shape
        return PatchEmbed(ch, b["out"], p, (h // p) * (w // p), bits, first=first)
    if kind == "block":
        return Block(b["width"], b["heads"], b["hidden"], bits, b["attn_bits"])
    if kind in ("exit", "head"):
        return Classifier(b["width"], b.get("hidden"), classes, bits)
    raise ValueError(f"unknown vit block type {kind!r}")
