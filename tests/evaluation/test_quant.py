"""The activation fake quantizer's fast path (no gradients) equals torch's kernel bit for bit."""

import torch

from nasctl.evaluation.quant import ActQuant, fake_quant_act


def test_the_fast_activation_quantizer_gives_exactly_what_torch_fake_quantize_gives():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        bits = (4, 8)[trial % 2]
        levels = 2 ** bits - 1
        lo = -torch.rand((), generator=g) * 3 * (trial % 3 != 0)
        hi = torch.rand((), generator=g) * 8 + 0.01
        scale = ((hi - lo) / levels).clamp_min(1e-8)
        zero = torch.round(-lo / scale).clamp(0, levels).to(torch.int32)
        x = torch.randn(4000, generator=g) * 6
        x[:200] = (torch.arange(200) - 100 + 0.5) * scale  # ties: halfway between two levels
        assert torch.equal(fake_quant_act(x, scale, zero, levels),
                           torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, levels)), trial


def test_an_activation_quantizer_leaves_its_input_alone_and_trains_through_torch_kernel():
    q = ActQuant(4)
    x = torch.linspace(-1, 7, 101)
    q.train()
    q(x)  # observes the range
    q.eval()
    before = x.clone()
    with torch.no_grad():
        fast = q(x)
    assert torch.equal(x, before)
    x.requires_grad_(True)
    slow = q(x)
    assert torch.equal(fast, slow.detach()) and slow.requires_grad
