"""The activation fake quantizer's fast path (no gradients) equals torch's kernel bit for bit."""

import numpy as np
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


def test_a_frozen_activation_quantizer_gives_exactly_what_the_eval_mode_quantizer_gives():
    from nasctl.evaluation.quant import _FrozenActQuant

    g = torch.Generator().manual_seed(1)
    for trial in range(100):
        q = ActQuant((4, 8)[trial % 2]).train()
        q(torch.randn(500, generator=g) * 4 - 3 * (trial % 3 == 0))  # a range with and without negatives
        q.eval()
        x = torch.randn(4000, generator=g) * 6
        with torch.no_grad():
            assert torch.equal(_FrozenActQuant(q)(x), q(x)), trial


def _calibrated_mbv2(bits: int):
    from nasctl.spaces.loader import load_space

    space = load_space("ee-mbv2")
    arch = space.sample(np.random.default_rng(3))
    arch.update({k: bits for k in arch if k.endswith("_bits")})
    torch.manual_seed(0)
    net = space.build(arch, (1, 8, 8), 10)
    net.train()
    with torch.no_grad():
        for _ in range(3):  # batch-norm statistics and quantizer ranges away from their defaults
            net(torch.randn(32, 1, 8, 8))
    return net.eval()


def test_a_network_frozen_for_inference_computes_exactly_what_it_computes_in_eval_mode_and_is_given_back_unchanged():
    from nasctl.evaluation.quant import frozen_for_inference

    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(2)).to(memory_format=torch.channels_last)
    for bits in (8, 32):
        net = _calibrated_mbv2(bits)
        state = {k: v.clone() for k, v in net.state_dict().items()}
        modules = [type(m) for m in net.modules()]
        with torch.no_grad():
            plain = net(x)
            for fold in (False, True):
                with frozen_for_inference(net, fold_batch_norm=fold):
                    before = x.clone()
                    frozen = net(x)
                    assert torch.equal(x, before)  # quantizers work in place only on tensors they alone read
                    left = {type(m) for m in net.modules()}
                    assert (torch.nn.ReLU6 in left) == (bits == 32)  # at 8 bits the quantizer after it clamps
                for a, b in zip(plain, frozen):
                    if not fold:
                        assert torch.equal(a, b), bits  # bit for bit
                    else:  # folding changes float rounding: an activation on a step's edge may move a step
                        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 if bits == 32 else 0.05), bits
                        assert (a.argmax(1) == b.argmax(1)).float().mean() > 0.95
        assert [type(m) for m in net.modules()] == modules
        assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
