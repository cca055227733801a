"""The reference zoo: every family exports, runs in onnxruntime, and imports with no
unsupported op and the MACs torch counts."""

import numpy as np
import pytest
import torch
from torch import nn

from nasctl.hardware import zoo
from nasctl.hardware.onnx_import import import_onnx

# A model of most families (exporting the whole zoo takes about 40 s); every zoo model
# was checked the same way when it was added.
CHECKED = ["resnet8-w64-32", "mbv3-small-0.75-192", "unet-bilinear-96", "unet-transpose-128", "vit-tiny-32",
           "convmixer-192-32", "mlpmixer-s-64"]
QUANTIZED = "resnet8-w64-32-int8"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    names = [*CHECKED, QUANTIZED]
    return dict(zip(names, zoo.export_zoo(tmp_path_factory.mktemp("zoo"), names)))


def torch_macs(name: str) -> int:
    """MACs of conv, transposed conv and linear layers by forward hooks, plus attention's
    two activation products (2·T²·dim per attention block)."""
    model, shape = zoo.build(name)
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        x = inputs[0]
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            taps = module.kernel_size[0] * module.kernel_size[1]
        if isinstance(module, nn.Conv2d):
            total += output.numel() * module.in_channels // module.groups * taps
        elif isinstance(module, nn.ConvTranspose2d):
            total += x.numel() * module.out_channels // module.groups * taps
        elif isinstance(module, nn.Linear):
            total += output.numel() * module.in_features
        elif isinstance(module, zoo.Attention):
            total += 2 * x.shape[1] ** 2 * x.shape[2]

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(torch.zeros(shape))
    for h in handles:
        h.remove()
    return total


def test_zoo_covers_the_families():
    assert len(zoo.ZOO) >= 25
    prefixes = {name.split("-")[0] for name in zoo.ZOO}
    assert {"vgg", "resnet8", "resnet26", "mbv2", "mbv3", "efficientnet", "shufflenetv2", "squeezenet", "densenet",
            "unet", "vit", "convmixer", "mlpmixer"} <= prefixes
    for name in zoo.ZOO:
        _, shape = zoo.ZOO[name]()
        assert shape[0] == 1 and 32 <= shape[-1] <= 224, name


@pytest.mark.parametrize("name", CHECKED)
def test_zoo_model_runs_and_imports_with_torch_macs(exported, name):
    import onnxruntime as ort

    path = exported[name]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    out = session.run(None, {inp.name: np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)})[0]
    assert np.isfinite(out).all()

    result = import_onnx(path)
    assert not result.unsupported and not result.notes
    macs = sum(layer.macs for layer in result.layers)
    assert macs == pytest.approx(torch_macs(name), rel=0.01)


def test_quantized_zoo_model_imports_at_8_bits(exported):
    import onnxruntime as ort

    path = exported[QUANTIZED]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros(session.get_inputs()[0].shape, np.float32)})[0].shape == (1, 10)
    result = import_onnx(path)
    assert not result.unsupported
    assert {(l.w_bits, l.a_bits) for l in result.layers if l.op in ("conv", "linear")} == {(8, 8)}
    assert sum(layer.macs for layer in result.layers) == torch_macs(zoo.QUANTIZED[QUANTIZED])


def test_export_is_deterministic_and_refuses_unknown_names(exported, tmp_path):
    again, = zoo.export_zoo(tmp_path, ["vit-tiny-32"])
    assert again.read_bytes() == exported["vit-tiny-32"].read_bytes()
    with pytest.raises(KeyError, match="unknown zoo model"):
        zoo.export_zoo(tmp_path, ["resnet-1000"])
