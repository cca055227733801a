"""`kind: vit` (ee-vit): knobs, the torch module, its layers as devices and the ONNX
importer see them, input checks and a short training."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import yaml

from nasctl.errors import ConfigError, UsageError
from nasctl.spaces.loader import load_space
from nasctl.spaces.vit import VitSpace

# torch's TorchScript exporter (what nasctl's zoo uses too) warns that it is deprecated
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHAPES = ("op", "in_ch", "out_ch", "in_hw", "out_hw", "kernel", "stride", "groups", "fn", "bias")
DEVICES = ("edge-quad", "edge-single", "eyeriss-like", "mcu-m7", "h100")


@pytest.fixture(scope="module")
def space():
    return load_space("ee-vit")


def _spec(**changes) -> dict:
    from pathlib import Path

    data = yaml.safe_load((Path(__file__).parents[2] / "search_spaces" / "ee-vit.yaml").read_text())
    return {**data, **changes}


def _float(arch):
    return {**arch, "backbone_bits": 32, "exit_bits": 32, **({"attn_bits": 32} if "attn_bits" in arch else {})}


def _import(space, arch, tmp_path, input_shape=(1, 8, 8)):
    """The layers the ONNX importer reads from the export of `build(arch)`."""
    from nasctl.hardware.onnx_import import import_onnx

    model = space.build(arch, input_shape, 10).eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (torch.zeros(1, *input_shape),), str(path), dynamo=False, opset_version=17,
                      do_constant_folding=True)
    result = import_onnx(path)
    assert not result.unsupported
    return result.layers


def test_sample_and_mutate_give_valid_architectures_deterministically(space):
    for seed in range(20):
        arch = space.sample(np.random.default_rng(seed))
        assert space.validate(arch) == arch
        assert arch == space.sample(np.random.default_rng(seed))
        child = space.mutate(arch, np.random.default_rng(seed))
        assert space.validate(child) == child and child != arch
        assert child == space.mutate(arch, np.random.default_rng(seed))
        assert arch["width"] % arch["heads"] == 0
    assert space.exit_names() == ["g1", "g2", "final"]


def test_build_gives_one_output_per_active_exit_final_last(space):
    for seed in range(4):
        arch = space.sample(np.random.default_rng(seed))
        for g1, g2 in ((0, 0), (1, 0), (1, 1)):
            arch.update(exit_g1=g1, exit_g2=g2)
            outputs = space.build(arch, (1, 8, 8), 10)(torch.zeros(3, 1, 8, 8))
            assert len(outputs) == len(space.active_exits(arch)) == 1 + g1 + g2
            assert all(o.shape == (3, 10) for o in outputs)


@pytest.mark.parametrize("seed", range(8))
def test_to_layers_is_what_the_importer_reads_from_the_export(space, seed, tmp_path):
    arch = _float(space.sample(np.random.default_rng(100 + seed)))
    if seed < 2:
        arch.update(exit_g1=1, exit_g2=1, conv_stem=seed, patch=2 + 2 * seed)
    input_shape = (3, 8, 12) if seed == 7 else (1, 8, 8)
    got = _import(space, arch, tmp_path, input_shape)
    want = space.to_layers(arch, input_shape, 10)
    fields = SHAPES + ("w_bits", "a_bits")
    assert [tuple(getattr(l, f) for f in fields) for l in got] == [tuple(getattr(l, f) for f in fields) for l in want]
    # segments and roles: from the plan block each exported node lies in (/blocks.N/...)
    plan = space.plan(arch)
    for layer, spec in zip(got, want):
        n = int(re.search(r"/blocks\.(\d+)/", layer.name).group(1))
        assert spec.role == ("exit" if plan[n]["type"] == "exit" else "backbone")
        assert spec.segment == sum(b["type"] == "exit" for b in plan[:n])


@pytest.mark.parametrize("seed", range(3))
def test_quantized_architectures_have_the_layers_of_their_float_twin_at_their_bit_widths(seed, tmp_path):
    """Fake-quantized networks do not export through torch (4-bit and symmetric 8-bit
    ranges): their layers are the float export's, at the knobs' bit widths."""
    space = VitSpace.from_dict(_spec(quantization={"backbone_bits": [32, 8, 4], "exit_bits": [32, 8, 4],
                                                   "attn_bits": [32, 8, 4]}))
    arch = space.sample(np.random.default_rng(seed))
    arch.update(backbone_bits=(8, 4, 8)[seed], attn_bits=(4, 8, 8)[seed], exit_bits=(4, 8, 32)[seed], exit_g1=1)
    got = _import(space, _float(arch), tmp_path)
    want = space.to_layers(arch, (1, 8, 8), 10)
    assert [tuple(getattr(l, f) for f in SHAPES) for l in got] == [tuple(getattr(l, f) for f in SHAPES) for l in want]
    attention = re.compile(r"\.(q|k|v|q\.heads|k\.heads|v\.heads|scores|scale|softmax|mix|merge|proj)$")
    for layer in want:
        if layer.role == "exit":
            expected = arch["backbone_bits"] if layer.op == "pool" else arch["exit_bits"]
        else:
            expected = arch["attn_bits"] if attention.search(layer.name) else arch["backbone_bits"]
        assert layer.w_bits == layer.a_bits == expected, layer.name
    assert {l.op for l in want} >= {"conv", "linear", "matmul", "softmax", "norm", "add", "data", "pool"}
    assert "mul" not in {l.op for l in want}  # the scores' scaling is folded into their product


def test_every_shipped_device_prices_every_layer(space):
    from nasctl.hardware.loader import load_device

    archs = [space.sample(np.random.default_rng(s)) for s in range(4)]
    archs.append(space.largest())
    for name in DEVICES:
        device = load_device(name)
        for arch in archs:
            report = device.estimate(space.to_layers(arch, (1, 8, 8), 10))
            assert not report.unsupported, (name, report.unsupported)
            assert report.latency_ms > 0
        lat, _ = space.path_costs(device, archs, (1, 8, 8), 10)
        assert np.isfinite(lat[:, -1]).all()


def _one_line(excinfo, *words):
    text = str(excinfo.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_patch_that_does_not_divide_the_input_is_a_one_line_error(space):
    with pytest.raises(ConfigError) as e:
        space.check_fits((1, 6, 6), 10, 64)
    _one_line(e, "patch size 4", "6x6")
    space.check_fits((1, 8, 8), 10, 64)
    arch = {**space.sample(np.random.default_rng(0)), "patch": 4}
    with pytest.raises(ConfigError) as e:
        space.to_layers(arch, (3, 8, 10), 10)
    _one_line(e, "patch size 4", "8x10")


def test_heads_must_divide_widths_when_the_spec_loads(tmp_path):
    path = tmp_path / "bad-vit.yaml"
    path.write_text(yaml.safe_dump(_spec(name="bad-vit", heads=[1, 3])))
    with pytest.raises(UsageError) as e:
        load_space(str(path))
    _one_line(e, "heads 3 does not divide width 16")


def test_a_short_training_on_digits_beats_chance_with_calibrated_exits(space):
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings, evaluate

    arch = {**space.sample(np.random.default_rng(0)), "patch": 4, "width": 32, "heads": 2, "conv_stem": 0,
            "g1_depth": 1, "g2_depth": 1, "g3_depth": 1, "exit_g1": 1, "exit_g2": 1, "exit_tolerance": 2.0,
            "backbone_bits": 8, "exit_bits": 8}
    result = evaluate(space, arch, load_dataset("digits", 0), TrainSettings(epochs=2, threads=1), seed=0)
    assert result.accuracy > 25  # chance: 10
    assert len(result.exit_rates) == 3 and abs(sum(result.exit_rates) - 1) < 1e-9
    assert len(result.thresholds) == 2
    # calibrated to the tolerance on validation data (two epochs: one gives a transformer 18 steps)
    assert result.val_accuracy >= result.val_exit_accuracies[-1] - 2.0 - 1e-9


def test_the_eenn_benchmark_pins_every_bit_width_of_a_vit_space():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "eenn.py"
    spec = importlib.util.spec_from_file_location("eenn_benchmark", path)
    eenn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eenn)
    space = VitSpace.from_dict(_spec(quantization={"backbone_bits": [32, 8, 4], "exit_bits": [32, 8, 4],
                                                   "attn_bits": [32, 8, 4]}))
    static = eenn.static_pins(space, 8)
    assert static["exit_g1"] == static["exit_g2"] == 0 and static["backbone_bits"] == static["attn_bits"] == 8
    assert eenn.int8_pins(space) == {"backbone_bits": 8, "attn_bits": 8, "exit_bits": 8}
