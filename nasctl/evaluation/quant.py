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
                lo, hi = x.min().clamp_max(0), x.max().clamp_min(0)
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
