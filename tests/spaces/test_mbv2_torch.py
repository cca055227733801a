import numpy as np
import pytest
import torch

from nasctl.evaluation.quant import ActQuant, QConv2d, QLinear
from nasctl.spaces.loader import load_space
from nasctl.spaces.mbv2_torch import Classifier, InvertedResidual


@pytest.fixture(scope="module")
def space():
    return load_space("ee-mbv2")


def _archs(space):
    archs = [space.sample(np.random.default_rng(s)) for s in range(6)]
    # cover expand == 1, both exits on, both off, and every bit width
    archs[0].update(s1_expand=1, exit_s1=1, exit_s2=1, backbone_bits=4, exit_bits=8)
    archs[1].update(exit_s1=0, exit_s2=0, backbone_bits=32, exit_bits=32)
    archs[2].update(s1_depth=2, s1_channels=16, s1_expand=1, backbone_bits=8, exit_bits=4)
    return archs


@pytest.mark.parametrize("input_shape", [(1, 8, 8), (3, 32, 32)])
def test_module_matches_to_layers_layer_for_layer(space, input_shape):
    for arch in _archs(space):
        specs = [l for l in space.to_layers(arch, input_shape, 10) if l.op in ("conv", "linear")]
        model = space.build(arch, input_shape, 10)
        mods = [m for m in model.modules() if isinstance(m, (QConv2d, QLinear))]
        out_hw = {}

        def record(mod, inputs, output):
            out_hw[mod] = tuple(output.shape[2:])

        hooks = [m.register_forward_hook(record) for m in mods if isinstance(m, QConv2d)]
        model.eval()
        outputs = model(torch.zeros(2, *input_shape))
        for h in hooks:
            h.remove()
        assert len(mods) == len(specs)
        for m, spec in zip(mods, specs):
            assert m.bits == spec.w_bits
            if isinstance(m, QConv2d):
                assert spec.op == "conv" and m.bias is None
                assert (m.in_channels, m.out_channels, m.kernel_size, m.stride[0], m.groups) == \
                       (spec.in_ch, spec.out_ch, spec.kernel, spec.stride, spec.groups)
                assert out_hw[m] == spec.out_hw
                # batch norm folds into one bias per output channel
                assert m.weight.numel() + m.out_channels == spec.params
            else:
                assert spec.op == "linear"
                assert (m.in_features, m.out_features) == (spec.in_ch, spec.out_ch)
                assert m.weight.numel() + m.bias.numel() == spec.params
        # every parameter is a conv/linear weight, a linear bias or a batch-norm scale and shift
        n_bn = sum(s.out_ch for s in specs if s.op == "conv")
        assert sum(p.numel() for p in model.parameters()) == sum(s.params for s in specs) + n_bn
        adds = sum(1 for l in space.to_layers(arch, input_shape, 10) if l.op == "add")
        assert adds == sum(1 for m in model.modules() if isinstance(m, InvertedResidual) and m.residual)
        assert len(outputs) == len(space.active_exits(arch))
        assert all(o.shape == (2, 10) for o in outputs)


def test_quantized_blocks_use_their_bits(space):
    arch = dict(_archs(space)[0], backbone_bits=4, exit_bits=8)
    model = space.build(arch, (1, 8, 8), 10)
    blocks = list(model.blocks)
    assert {m.bits for m in blocks[0].modules() if isinstance(m, QConv2d)} == {4}
    heads = [b for b in blocks if isinstance(b, Classifier)]
    bits = [{m.bits for m in h.modules() if isinstance(m, (QConv2d, QLinear, ActQuant))} for h in heads]
    assert bits == [{8}, {8}, {4}]  # two exit heads at 8 bits, the final classifier with the backbone


def test_forward_backward_trains_every_exit(space):
    arch = _archs(space)[0]
    model = space.build(arch, (1, 8, 8), 10)
    outputs = model(torch.randn(4, 1, 8, 8))
    sum(o.sum() for o in outputs).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_float_networks_residual_adds_are_the_sums_the_importer_reads(space, tmp_path):
    """A float block's projection accumulates its residual (fn "sum") in `to_layers` exactly
    where the ONNX importer reads one from the network's export; quantized blocks keep
    stand-alone adds."""
    from nasctl.hardware.onnx_import import import_onnx

    sums = []
    for arch in _archs(space):
        if arch["backbone_bits"] != 32:
            continue
        arch = {**arch, "exit_bits": 32}
        want = [(l.op, l.fn) for l in space.to_layers(arch, (1, 8, 8), 10) if l.op == "add"]
        path = tmp_path / "m.onnx"
        torch.onnx.export(space.build(arch, (1, 8, 8), 10).eval(), (torch.zeros(1, 1, 8, 8),), str(path),
                          dynamo=False, opset_version=17, do_constant_folding=True)
        got = [(l.op, l.fn) for l in import_onnx(path).layers if l.op == "add"]
        assert got == want
        sums += [fn for _, fn in want]
    assert sums and set(sums) == {"sum"}
    quantized = {**_archs(space)[2]}
    assert {l.fn for l in space.to_layers(quantized, (1, 8, 8), 10) if l.op == "add"} <= {""}
