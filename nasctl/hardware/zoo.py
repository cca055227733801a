"""A reference zoo of small-to-medium ONNX models for checking cost models.

Each entry of `ZOO` builds a torch module and names its input shape (batch 1).  The
families cover what devices meet in practice: plain conv stacks (VGG), residual basic
and bottleneck blocks (ResNet), inverted residuals with and without squeeze-excite
(MobileNetV2/V3, EfficientNet), channel shuffle (ShuffleNetV2), fire modules (SqueezeNet),
dense concatenation (DenseNet), encoder-decoders with upsampling (UNet), and small vision
transformers (patch-embedding conv, LayerNorm, attention, GELU MLP), plus a ConvMixer
(stand-alone batch norm after GELU) and an MLP-Mixer (token mixing through transposes).
Inputs are 32-224 px; each model runs in about 0.5-50 ms on one CPU thread.

`export_zoo(out_dir)` writes `NAME.onnx` for every entry (opset 17, weights drawn from
`torch.manual_seed(0)`), and the int8 variants named in `QUANTIZED` (QDQ format, made
with onnxruntime's static quantization, calibrated on seeded random inputs).

This module imports torch; nothing on the `nasctl predict` path imports it.
"""

from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

OPSET = 17


def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """conv (padding k // 2, no bias) → batch norm → activation."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def _head(cin: int, classes: int) -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


# --- plain conv stacks ---------------------------------------------------------------

class VGG(nn.Module):
    """3x3 conv-BN-ReLU stages separated by 2x2 max pooling ("M" in `plan`)."""

    def __init__(self, plan: Sequence[int | str], classes: int = 10, hidden: int = 0):
        super().__init__()
        layers, cin = [], 3
        for item in plan:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers.append(conv_bn(cin, int(item)))
                cin = int(item)
        self.features = nn.Sequential(*layers)
        fc = [nn.Linear(cin, hidden), nn.ReLU(), nn.Linear(hidden, classes)] if hidden else [nn.Linear(cin, classes)]
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), *fc)

    def forward(self, x):
        return self.classifier(self.features(x))


# --- residual networks ---------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, width, 3, stride), conv_bn(width, width, 3, 1, act=None))
        self.short = (conv_bn(cin, width, 1, stride, act=None) if stride != 1 or cin != width
                      else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, cout, 1, act=None))
        self.short = (conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout
                      else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


class ResNet(nn.Module):
    """A stem, then stages of `depths[i]` blocks of width `widths[i]` (the first of each
    stage but the first at stride 2)."""

    def __init__(self, block, depths: Sequence[int], widths: Sequence[int], stem: int,
                 stem_stride: int = 1, stem_pool: bool = False, classes: int = 10):
        super().__init__()
        layers = [conv_bn(3, stem, 7 if stem_stride > 1 else 3, stem_stride)]
        if stem_pool:
            layers.append(nn.MaxPool2d(3, 2, 1))
        cin = stem
        for i, (depth, width) in enumerate(zip(depths, widths)):
            for j in range(depth):
                layers.append(block(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width * block.expansion
        self.features = nn.Sequential(*layers)
        self.head = _head(cin, classes)

    def forward(self, x):
        return self.head(self.features(x))


# --- inverted residuals (MobileNetV2/V3, EfficientNet) -------------------------------

class SqueezeExcite(nn.Module):
    """Global pool → 1x1 reduce → act → 1x1 expand → gate → scale the input."""

    def __init__(self, ch: int, squeeze: int, act=nn.ReLU, gate=nn.Hardsigmoid):
        super().__init__()
        self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(ch, squeeze, 1), act(),
                                nn.Conv2d(squeeze, ch, 1), gate())

    def forward(self, x):
        return x * self.fc(x)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, hidden: int, k: int, stride: int, act=nn.ReLU6,
                 se: Callable[[int], nn.Module] | None = None):
        super().__init__()
        layers = [conv_bn(cin, hidden, 1, act=act)] if hidden != cin else []
        layers.append(conv_bn(hidden, hidden, k, stride, groups=hidden, act=act))
        if se is not None:
            layers.append(se(hidden))
        layers.append(conv_bn(hidden, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _div8(v: float) -> int:
    return max(8, int(v + 4) // 8 * 8)


class MobileNetV2(nn.Module):
    # expansion, channels, repeats, stride
    PLAN = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, width: float, classes: int = 1000, first_stride: int = 2):
        super().__init__()
        cin = _div8(32 * width)
        layers = [conv_bn(3, cin, 3, first_stride, act=nn.ReLU6)]
        for t, c, n, s in self.PLAN:
            cout = _div8(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, cin * t, 3, s if i == 0 else 1))
                cin = cout
        last = max(1280, _div8(1280 * width)) if width > 1 else 1280
        layers.append(conv_bn(cin, last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.head = _head(last, classes)

    def forward(self, x):
        return self.head(self.features(x))


class MobileNetV3(nn.Module):
    # kernel, hidden, out, squeeze-excite, hardswish, stride
    SMALL = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
             (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
             (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
             (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]
    LARGE = [(3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
             (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
             (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
             (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
             (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1)]

    def __init__(self, plan, width: float, last: int, classes: int = 1000):
        super().__init__()
        cin = _div8(16 * width)
        layers = [conv_bn(3, cin, 3, 2, act=nn.Hardswish)]
        for k, hidden, out, se, hs, s in plan:
            hidden, out = _div8(hidden * width), _div8(out * width)
            layers.append(InvertedResidual(cin, out, hidden, k, s, act=nn.Hardswish if hs else nn.ReLU,
                                           se=(lambda c: SqueezeExcite(c, _div8(c / 4))) if se else None))
            cin = out
        layers.append(conv_bn(cin, 6 * cin, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6 * cin, last),
                                  nn.Hardswish(), nn.Linear(last, classes))

    def forward(self, x):
        return self.head(self.features(x))


class EfficientNet(nn.Module):
    """EfficientNet-B0-like: MBConv blocks with SiLU and sigmoid-gated squeeze-excite."""

    # expansion, channels, repeats, stride, kernel
    PLAN = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
            (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]

    def __init__(self, width: float, depth: float, classes: int = 1000):
        super().__init__()
        cin = _div8(32 * width)
        layers = [conv_bn(3, cin, 3, 2, act=nn.SiLU)]
        for t, c, n, s, k in self.PLAN:
            cout = _div8(c * width)
            for i in range(max(1, round(n * depth))):
                se = partial(SqueezeExcite, squeeze=max(1, cin // 4), act=nn.SiLU, gate=nn.Sigmoid)
                layers.append(InvertedResidual(cin, cout, cin * t, k, s if i == 0 else 1, act=nn.SiLU, se=se))
                cin = cout
        layers.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.head = _head(1280, classes)

    def forward(self, x):
        return self.head(self.features(x))


# --- channel shuffle, fire modules, dense blocks -------------------------------------

def channel_shuffle(x, groups: int = 2):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.left = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None), conv_bn(cin, half, 1))
        right_in = cin if stride > 1 else half
        self.right = nn.Sequential(conv_bn(right_in, half, 1), conv_bn(half, half, 3, stride, groups=half, act=None),
                                   conv_bn(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.right(b)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        return channel_shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, widths: Sequence[int], repeats=(4, 8, 4), last: int = 1024, classes: int = 1000):
        super().__init__()
        layers = [conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 24
        for width, n in zip(widths, repeats):
            for i in range(n):
                layers.append(ShuffleUnit(cin, width, 2 if i == 0 else 1))
                cin = width
        layers.append(conv_bn(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.head = _head(last, classes)

    def forward(self, x):
        return self.head(self.features(x))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x):
        s = self.squeeze(x)
        return torch.cat([self.e1(s), self.e3(s)], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1: fire modules between max pools, a 1x1 conv classifier, average pool."""

    def __init__(self, scale: float = 1.0, classes: int = 1000):
        super().__init__()

        def fire(cin, s, e):
            return Fire(int(cin * scale), int(s * scale), int(e * scale))

        pool = partial(nn.MaxPool2d, 3, 2, ceil_mode=True)
        self.features = nn.Sequential(
            nn.Conv2d(3, int(64 * scale), 3, 2), nn.ReLU(), pool(),
            fire(64, 16, 64), fire(128, 16, 64), pool(),
            fire(128, 32, 128), fire(256, 32, 128), pool(),
            fire(256, 48, 192), fire(384, 48, 192), fire(384, 64, 256), fire(512, 64, 256))
        self.classifier = nn.Sequential(nn.Conv2d(int(512 * scale), classes, 1), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.classifier(self.features(x))


class DenseLayer(nn.Module):
    """BN → ReLU → 1x1 conv (4 x growth) → BN → ReLU → 3x3 conv (growth), concatenated."""

    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, padding=1,
                                                                                   bias=False))

    def forward(self, x):
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    def __init__(self, growth: int, blocks: Sequence[int], stem: int, classes: int = 10, stem_stride: int = 1):
        super().__init__()
        layers, cin = [conv_bn(3, stem, 3, stem_stride)], stem
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(cin, growth))
                cin += growth
            if i < len(blocks) - 1:  # transition: BN → ReLU → 1x1 conv halving channels → 2x2 avg pool
                layers += [nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cin // 2, 1, bias=False), nn.AvgPool2d(2)]
                cin //= 2
        layers += [nn.BatchNorm2d(cin), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = _head(cin, classes)

    def forward(self, x):
        return self.head(self.features(x))


# --- encoder-decoder -----------------------------------------------------------------

class UNet(nn.Module):
    """Two 3x3 conv-BN-ReLU per level; max-pool down; `up` = "nearest" or "bilinear"
    (Resize) or "transpose" (2x2 transposed conv) back up; skips concatenated."""

    def __init__(self, widths: Sequence[int], up: str = "nearest", cin: int = 3, classes: int = 2):
        super().__init__()

        def double(a, b):
            return nn.Sequential(conv_bn(a, b), conv_bn(b, b))

        self.up_mode = up
        self.down = nn.ModuleList()
        c = cin
        for w in widths:
            self.down.append(double(c, w))
            c = w
        self.ups = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.ups.append(nn.ConvTranspose2d(c, c, 2, 2) if up == "transpose" else nn.Identity())
            self.dec.append(double(c + w, w))
            c = w
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, block, skip in zip(self.ups, self.dec, reversed(skips[:-1])):
            if self.up_mode == "transpose":
                x = up(x)
            else:
                x = F.interpolate(x, scale_factor=2.0, mode=self.up_mode,
                                  align_corners=False if self.up_mode == "bilinear" else None)
            x = block(torch.cat([x, skip], 1))
        return self.out(x)


# --- transformers and mixers ---------------------------------------------------------

class Attention(nn.Module):
    """Multi-head self-attention on [1, T, dim]: q, k, v projections, softmax(q kᵀ / √d) v,
    output projection.  Its two activation-by-activation products cost 2·T²·dim MACs."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape

        def split(y):
            return y.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch-embedding conv, class token, learned position embedding, pre-norm blocks."""

    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int, mlp_ratio: int = 4,
                 classes: int = 10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, mlp_ratio * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls, x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class ConvMixer(nn.Module):
    """Patch conv → GELU → BN, then blocks of residual (depthwise conv → GELU → BN) and
    pointwise conv → GELU → BN: batch norm after the activation stays a layer of its own."""

    def __init__(self, dim: int, depth: int, kernel: int, patch: int, classes: int = 10):
        super().__init__()

        def unit(conv):
            return nn.Sequential(conv, nn.GELU(), nn.BatchNorm2d(dim))

        self.stem = unit(nn.Conv2d(3, dim, patch, patch))
        self.blocks = nn.ModuleList(nn.ModuleList([unit(nn.Conv2d(dim, dim, kernel, groups=dim, padding=kernel // 2)),
                                                   unit(nn.Conv2d(dim, dim, 1))]) for _ in range(depth))
        self.head = _head(dim, classes)

    def forward(self, x):
        x = self.stem(x)
        for dw, pw in self.blocks:
            x = pw(x + dw(x))
        return self.head(x)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, token_mlp: int, channel_mlp: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token = nn.Sequential(nn.Linear(tokens, token_mlp), nn.GELU(), nn.Linear(token_mlp, tokens))
        self.channel = nn.Sequential(nn.Linear(dim, channel_mlp), nn.GELU(), nn.Linear(channel_mlp, dim))

    def forward(self, x):
        x = x + self.token(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, depth: int, classes: int = 10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, dim, dim // 2, 4 * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


# --- the zoo -------------------------------------------------------------------------

ModelFactory = Callable[[], tuple[nn.Module, tuple[int, ...]]]


def _entry(make: Callable[[], nn.Module], size: int, channels: int = 3) -> ModelFactory:
    return lambda: (make(), (1, channels, size, size))


ZOO: dict[str, ModelFactory] = {
    "vgg-s-32": _entry(lambda: VGG([48, 48, "M", 96, 96, "M", 192, 192, "M"]), 32),
    "vgg-m-64": _entry(lambda: VGG([32, "M", 64, "M", 128, 128, "M", 256, 256, "M", 256, 256], hidden=256), 64),
    "vgg-l-96": _entry(lambda: VGG([64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M"]), 96),
    "resnet8-w64-32": _entry(lambda: ResNet(BasicBlock, [1, 1, 1], [64, 128, 256], stem=64), 32),
    "resnet20-w24-32": _entry(lambda: ResNet(BasicBlock, [3, 3, 3], [24, 48, 96], stem=24), 32),
    "resnet18-w32-112": _entry(lambda: ResNet(BasicBlock, [2, 2, 2, 2], [32, 64, 128, 256], stem=32,
                                              stem_stride=2, stem_pool=True, classes=1000), 112),
    "resnet26-bottleneck-96": _entry(lambda: ResNet(Bottleneck, [2, 2, 2, 2], [16, 32, 64, 128], stem=32,
                                                    stem_stride=2, classes=100), 96),
    "resnet50-w16-128": _entry(lambda: ResNet(Bottleneck, [3, 4, 6, 3], [16, 32, 64, 128], stem=16,
                                              stem_stride=2, stem_pool=True, classes=1000), 128),
    "mbv2-0.35-160": _entry(lambda: MobileNetV2(0.35), 160),
    "mbv2-0.5-128": _entry(lambda: MobileNetV2(0.5), 128),
    "mbv2-1.0-224": _entry(lambda: MobileNetV2(1.0), 224),
    "mbv2-1.4-cifar-32": _entry(lambda: MobileNetV2(1.4, classes=10, first_stride=1), 32),
    "mbv3-small-0.75-192": _entry(lambda: MobileNetV3(MobileNetV3.SMALL, 0.75, 1024), 192),
    "mbv3-small-1.0-224": _entry(lambda: MobileNetV3(MobileNetV3.SMALL, 1.0, 1024), 224),
    "mbv3-large-0.5-160": _entry(lambda: MobileNetV3(MobileNetV3.LARGE, 0.5, 1280), 160),
    "efficientnet-0.5-128": _entry(lambda: EfficientNet(0.5, 0.5), 128),
    "shufflenetv2-0.5-224": _entry(lambda: ShuffleNetV2([48, 96, 192]), 224),
    "shufflenetv2-1.0-128": _entry(lambda: ShuffleNetV2([116, 232, 464]), 128),
    "squeezenet-0.5-192": _entry(lambda: SqueezeNet(0.5, classes=100), 192),
    "squeezenet-1.1-224": _entry(lambda: SqueezeNet(1.0), 224),
    "densenet-k12-32": _entry(lambda: DenseNet(12, [4, 4, 4], stem=24), 32),
    "densenet-k16-64": _entry(lambda: DenseNet(16, [4, 6, 8], stem=32, stem_stride=2, classes=100), 64),
    "unet-nearest-64": _entry(lambda: UNet([16, 32, 64, 128], "nearest"), 64),
    "unet-bilinear-96": _entry(lambda: UNet([16, 32, 64], "bilinear", classes=4), 96),
    "unet-transpose-128": _entry(lambda: UNet([8, 16, 32, 64], "transpose", cin=1), 128, channels=1),
    "vit-tiny-32": _entry(lambda: ViT(32, 4, 128, 4, 4), 32),
    "vit-small-64": _entry(lambda: ViT(64, 8, 192, 6, 3), 64),
    "vit-patch16-224": _entry(lambda: ViT(224, 16, 192, 4, 3, classes=1000), 224),
    "convmixer-192-32": _entry(lambda: ConvMixer(192, 6, 5, 2), 32),
    "mlpmixer-s-64": _entry(lambda: MLPMixer(64, 8, 128, 4), 64),
}

# int8 variants (QDQ), each from the zoo model it names.
QUANTIZED: dict[str, str] = {"resnet8-w64-32-int8": "resnet8-w64-32", "mbv2-0.5-128-int8": "mbv2-0.5-128"}


def build(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The zoo model `name` in eval mode with weights drawn from seed 0 (the caller's torch
    random state is left as it was), and its input shape."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        model, shape = ZOO[name]()
        for m in model.modules():  # trained-looking batch-norm statistics, so folded weights differ
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval(), shape


def _export(model: nn.Module, shape: tuple[int, ...], path: Path) -> Path:
    """TorchScript-based exporter (the dynamo one needs onnxscript), opset 17."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice
        torch.onnx.export(model, (torch.zeros(shape),), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["output"], do_constant_folding=True)
    return path


def _quantize(float_path: Path, path: Path, shape: tuple[int, ...], samples: int = 8) -> Path:
    """Static int8 quantization (QDQ, per-tensor) after onnxruntime's pre-processing,
    calibrated on seeded random inputs."""
    import numpy as np
    from onnxruntime.quantization import quant_pre_process

    from .measure.context import quantize_int8

    prepared = float_path.with_name("prepared.onnx")
    quant_pre_process(float_path, prepared)
    rng = np.random.default_rng(0)
    quantize_int8(prepared, path, [{"input": rng.standard_normal(shape, dtype=np.float32)} for _ in range(samples)])
    return path


def export_zoo(out_dir: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Write `NAME.onnx` into `out_dir` for each name (default: the whole zoo, int8 variants
    included); returns the paths in the order given."""
    import tempfile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = list(names) if names is not None else [*ZOO, *QUANTIZED]
    unknown = [n for n in wanted if n not in ZOO and n not in QUANTIZED]
    if unknown:
        raise KeyError(f"unknown zoo model(s) {', '.join(unknown)}; known: {', '.join([*ZOO, *QUANTIZED])}")
    paths = []
    for name in wanted:
        path = out_dir / f"{name}.onnx"
        if name in ZOO:
            paths.append(_export(*build(name), path))
            continue
        model, shape = build(QUANTIZED[name])
        with tempfile.TemporaryDirectory() as tmp:
            float_path = _export(model, shape, Path(tmp) / "float.onnx")
            paths.append(_quantize(float_path, path, shape))
    return paths
