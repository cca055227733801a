"""Quantization-aware training: fake-quantized convolutions, linear layers and activations.

Fake quantization rounds a float tensor onto the integer grid of the target bit width and
maps it back to floats, so training sees the rounding error the deployed integer model
will have; gradients pass through the rounding unchanged (straight-through estimator).
Bit widths of 16 and 32 are left in floating point (fp16 loses no accuracy that matters
here), so those layers train as ordinary float layers.

Weights, b bits, symmetric per output channel c:
    q_max = 2^(b-1) - 1,  s_c = max|W_c| / q_max,  W_c ≈ s_c · clamp(round(W_c / s_c), -q_max, q_max)
Activations, b bits, asymmetric per tensor over a range [lo, hi] that always holds 0:
    s = (hi - lo) / (2^b - 1),  z = round(-lo / s),  x ≈ s · (clamp(round(x / s) + z, 0, 2^b - 1) - z)
The range is an exponential moving average of each training batch's min and max,
    lo ← lo + m · (min(x) - lo),   hi ← hi + m · (max(x) - hi),   m = 0.1
(the first batch sets it directly) and stays frozen in eval mode.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

FLOAT_BITS = 16  # at and above this width no fake quantization is applied


def fake_quant_weight(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric per-output-channel fake quantization of a conv or linear weight."""
    if bits >= FLOAT_BITS:
        return weight
    q_max = 2 ** (bits - 1) - 1
    scale = weight.detach().abs().amax(dim=tuple(range(1, weight.dim()))).clamp_min(1e-8) / q_max
    zero = torch.zeros(weight.shape[0], dtype=torch.int32, device=weight.device)
    # torch fake-quantizes float32 only; a float64 network (zero-cost proxies) casts around it
    return torch.fake_quantize_per_channel_affine(weight.float(), scale.float(), zero, 0, -q_max, q_max).to(weight.dtype)


def fake_quant_act(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, levels: int) -> torch.Tensor:
    """What `torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, levels)` gives, bit for
    bit on float32 (its CPU kernel: q = clamp(z + nearbyint(x · (1/s)), 0, levels), (q - z) · s,
    in float32), without gradients: in place on one new tensor, several times faster on
    the CPU - what measuring networks (validation, test, batch-norm recalibration) spends
    most of its time on."""
    return torch.mul(x, 1.0 / scale).round_().add_(zero).clamp_(0, levels).sub_(zero).mul_(scale)


class QConv2d(nn.Conv2d):
    """`nn.Conv2d` whose weight is fake-quantized to `bits` in every forward pass."""

    def __init__(self, *args, bits: int = 32, **kwargs):
        super().__init__(*args, **kwargs)
        self.bits = bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, fake_quant_weight(self.weight, self.bits), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"


class QLinear(nn.Linear):
    """`nn.Linear` whose weight is fake-quantized to `bits` in every forward pass."""

    def __init__(self, *args, bits: int = 32, **kwargs):
        super().__init__(*args, **kwargs)
        self.bits = bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, fake_quant_weight(self.weight, self.bits), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"


def _memory_order(x: torch.Tensor) -> torch.Tensor:
    """A view of `x` whose axes run in the order its elements lie in memory (a channels-last
    tensor's channels last): reductions over every element read it in one sweep."""
    return x.permute(*sorted(range(x.dim()), key=lambda d: -x.stride(d)))


class ActQuant(nn.Module):
    """Per-tensor activation fake quantizer with an EMA-tracked range (identity at >= 16 bits).

    Until it has seen a training batch the range is unknown and it passes inputs through.
    """

    def __init__(self, bits: int, momentum: float = 0.1):
        super().__init__()
        self.bits = bits
        self.momentum = momentum
        self.register_buffer("lo", torch.zeros(()))
        self.register_buffer("hi", torch.zeros(()))
        self.register_buffer("observed", torch.zeros((), dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits >= FLOAT_BITS:
            return x
        if self.training:
            with torch.no_grad():
                lo, hi = torch.aminmax(_memory_order(x))
                lo, hi = lo.clamp_max(0), hi.clamp_min(0)
                if self.observed:
                    lo = self.lo + self.momentum * (lo - self.lo)
                    hi = self.hi + self.momentum * (hi - self.hi)
                self.lo.copy_(lo)
                self.hi.copy_(hi)
                self.observed.fill_(True)
        elif not self.observed:
            return x
        levels = 2 ** self.bits - 1
        scale = ((self.hi - self.lo) / levels).clamp_min(1e-8)
        zero = torch.round(-self.lo / scale).clamp(0, levels).to(torch.int32)
        if x.dtype == torch.float32 and not (x.requires_grad and torch.is_grad_enabled()):
            return fake_quant_act(x, scale, zero, levels)
        return torch.fake_quantize_per_tensor_affine(x.float(), scale.float(), zero, 0, levels).to(x.dtype)

    def extra_repr(self) -> str:
        return f"bits={self.bits}"


class _FrozenConv(nn.Module):
    """A conv with its weight fake-quantized once, and the eval-mode batch norm after it
    (if any): either applied in place on the conv's new output - what conv then batch norm
    give, bit for bit, without a second new tensor - or, with `fold`, folded into the
    conv's weight and bias: conv(x, q(W)) · a + b = conv(x, q(W) · a) + b, one pass less,
    equal up to float rounding."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d | None, fold: bool = False):
        super().__init__()
        w = fake_quant_weight(conv.weight, conv.bits) if isinstance(conv, QConv2d) else conv.weight
        b = conv.bias
        if bn is not None and fold:
            a = torch.rsqrt(bn.running_var + bn.eps)
            if bn.weight is not None:
                a = a * bn.weight
            shift = -bn.running_mean * a + (bn.bias if bn.bias is not None else 0)
            b = shift if b is None else b * a + shift
            w = w * a.reshape(-1, *([1] * (w.dim() - 1)))
            bn = None
        self.weight, self.bias = w.detach(), None if b is None else b.detach()
        self.conv, self.bn = conv, bn
        self._unused = torch.empty(0), torch.empty(0)  # batch norm's saved statistics, not kept in eval mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, bn = self.conv, self.bn
        y = F.conv2d(x, self.weight, self.bias, c.stride, c.padding, c.dilation, c.groups)
        if bn is not None and y.device.type == "cpu":
            torch.ops.aten.native_batch_norm.out(y, bn.weight, bn.bias, bn.running_mean, bn.running_var, False, 0.0,
                                                 bn.eps, out=y, save_mean=self._unused[0], save_invstd=self._unused[1])
        elif bn is not None:  # other devices: batch norm as it is
            y = bn(y)
        return y


class _FrozenLinear(nn.Module):
    def __init__(self, linear: QLinear):
        super().__init__()
        self.weight, self.bias = fake_quant_weight(linear.weight, linear.bits).detach(), linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _FrozenActQuant(nn.Module):
    """An eval-mode `ActQuant` with its scale and zero point read once: the same values, bit
    for bit on float32 (clamp(round(x/s) + z, 0, L) - z = clamp(round(x/s), -z, L - z) on
    integers), in four passes over x instead of six, without per-call scalar arithmetic;
    with `inplace`, over x itself (a new tensor costs twice the memory traffic)."""

    def __init__(self, quant: ActQuant, inplace: bool = False):
        super().__init__()
        self.inplace = inplace  # overwrite the input: only where no other module reads it
        levels = 2 ** quant.bits - 1
        scale = ((quant.hi - quant.lo) / levels).clamp_min(1e-8)
        zero = float(torch.round(-quant.lo / scale).clamp(0, levels))
        self.inv, self.scale = float(1.0 / scale), float(scale)  # float32 values, exact as Python floats
        self.lo, self.hi = -zero, levels - zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace and x.dtype == torch.float32:
            return x.mul_(self.inv).round_().clamp_(self.lo, self.hi).mul_(self.scale)
        y = torch.mul(x.float(), self.inv).round_().clamp_(self.lo, self.hi).mul_(self.scale)
        return y if x.dtype == torch.float32 else y.to(x.dtype)


# Modules whose output is a new tensor: in a `Sequential`, a quantizer after one of them
# is the only reader of its input (modules in between, such as an in-place ReLU or a
# folded batch norm's Identity, pass that tensor on).  A module may also name children
# whose input only they read (`owned_inputs`).
_MAKES_NEW = (nn.Conv2d, nn.Linear, _FrozenConv, _FrozenLinear, nn.BatchNorm2d, nn.LayerNorm, nn.GELU,
              nn.AdaptiveAvgPool2d, nn.AvgPool2d, nn.MaxPool2d)


def _plain_conv(conv: nn.Module) -> bool:
    return type(conv) in (nn.Conv2d, QConv2d) and conv.padding_mode == "zeros"


@contextmanager
def frozen_for_inference(model: nn.Module, fold_batch_norm: bool = False):
    """`model` (in eval mode, without gradients) runs as an inference engine would for as
    long as the context lasts: weights are fake-quantized once instead of on every call,
    every batch norm that directly follows a conv in a `Sequential` runs in place on the
    conv's output, activation quantizers use their frozen ranges as plain scalars (in place
    on a tensor no other module reads), and a ReLU or ReLU6 whose clamp the quantizer after
    it already makes is left out.  It computes what the eval-mode network computes, bit for
    bit (up to the sign of a zero).  With `fold_batch_norm` the batch norms are folded into
    the convs' weights instead: one pass less, equal up to float rounding (an activation on
    a quantization step's edge may move a step).  The modules are put back on exit, so
    training, saving and export see `model` as it was."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []

    def swap(parent: nn.Module, name: str, new: nn.Module) -> None:
        swapped.append((parent, name, parent._modules[name]))
        parent._modules[name] = new

    try:
        with torch.no_grad():
            for parent in list(model.modules()):
                names = list(parent._modules)
                for i, name in enumerate(names):
                    child = parent._modules[name]
                    nxt = parent._modules[names[i + 1]] if i + 1 < len(names) else None
                    if _plain_conv(child):
                        bn = nxt if (isinstance(parent, nn.Sequential) and type(nxt) is nn.BatchNorm2d
                                     and nxt.track_running_stats and nxt.running_var is not None) else None
                        swap(parent, name, _FrozenConv(child, bn, fold=fold_batch_norm))
                        if bn is not None:
                            swap(parent, names[i + 1], nn.Identity())
                    elif type(child) is QLinear:
                        swap(parent, name, _FrozenLinear(child))
                    elif type(child) is ActQuant and child.bits < FLOAT_BITS and bool(child.observed):
                        owned = name in getattr(parent, "owned_inputs", ()) or (
                            isinstance(parent, nn.Sequential)
                            and any(isinstance(parent._modules[n], _MAKES_NEW) for n in names[:i]))
                        frozen = _FrozenActQuant(child, inplace=owned)
                        swap(parent, name, frozen)
                        before = parent._modules[names[i - 1]] if i else None
                        if isinstance(parent, nn.Sequential) and frozen.lo == 0 and (
                                type(before) is nn.ReLU or (type(before) is nn.ReLU6 and float(child.hi) <= 6)):
                            # a range from 0 to at most 6 clamps as the ReLU(6) before it does
                            swap(parent, names[i - 1], nn.Identity())
        yield model
    finally:
        for parent, name, old in reversed(swapped):
            parent._modules[name] = old
