import json

import numpy as np
import pytest
import yaml

from nasctl.errors import UsageError
from nasctl.hardware.fit import calibrate, fit_from_lut, fit_from_models, read_models_csv, write_device
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import LutDevice, read_lut, row_from_layer
from nasctl.spaces.loader import load_space
from tests.cli.cli_helpers import onnx_model


def conv(cin, cout, hw, k=3, stride=1, groups=1, fn="relu"):
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return LayerSpec("conv", cin, cout, (hw, hw), (out, out), (k, k), stride, groups, fn=fn)


# A small pool of kernels and the true cost of each (ms).
POOL = [conv(16, 16, 32), conv(16, 32, 32, stride=2), conv(32, 32, 16), conv(32, 32, 16, groups=32, fn=""),
        conv(32, 64, 16, k=1), LayerSpec("add", 32, 32, (16, 16), (16, 16)), LayerSpec("pool", 64, 64, (16, 16),
        (1, 1), (16, 16), fn="avg"), LayerSpec("linear", 64, 10, (1, 1), (1, 1))]
TRUE = np.array([0.080, 0.045, 0.030, 0.012, 0.020, 0.004, 0.003, 0.002])
OVERHEAD = 0.015


def random_models(n, rng):
    """Models drawing 1-4 copies of random kernels from POOL; latency = Σ true costs + overhead."""
    models, latency = [], []
    for _ in range(n):
        counts = rng.integers(0, 4, len(POOL))
        counts[rng.integers(len(POOL))] += 1
        models.append([layer for layer, c in zip(POOL, counts) for _ in range(c)])
        latency.append(float(counts @ TRUE) + OVERHEAD)
    return models, latency


def test_fit_from_models_recovers_known_kernel_costs():
    models, latency = random_models(60, np.random.default_rng(0))
    fitted = fit_from_models("synthetic", models, latency)
    assert fitted.spec["fit"]["grouping"] == "kernels"
    device = fitted.device()
    for layer, cost in zip(POOL, TRUE):
        assert device.estimate([layer]).costs[0].latency_ms - OVERHEAD == pytest.approx(cost, rel=0.03)
    test, truth = random_models(20, np.random.default_rng(1))
    pred = np.array([device.estimate(m).latency_ms for m in test])
    assert np.max(np.abs(pred / truth - 1)) < 0.02


def test_few_models_fit_costs_per_op_type():
    """Latency linear in each type's work: a handful of models determine it, and it
    extends to kernels none of them contained."""
    rng = np.random.default_rng(2)
    per_mac, per_layer = 2e-8, 0.003
    models = [[conv(int(rng.choice([8, 16, 32])), int(rng.choice([16, 32, 64])), int(rng.choice([8, 16, 32])))
               for _ in range(int(rng.integers(2, 8)))] for _ in range(8)]
    latency = [sum(per_mac * l.macs + per_layer for l in m) + OVERHEAD for m in models]
    fitted = fit_from_models("few", models, latency)
    assert fitted.spec["fit"]["grouping"] in ("types", "types-shared")
    unseen = [conv(24, 48, 20), conv(48, 96, 10)]
    assert fitted.device().estimate(unseen).latency_ms == pytest.approx(
        sum(per_mac * l.macs + per_layer for l in unseen) + OVERHEAD, rel=0.03)


def test_cross_validation_holds_a_models_twin_rows_out_together():
    """A model measured twice is one model to cross-validation: its rows go to the same fold,
    so listing every model twice changes no grouping's CV error (a twin in training would
    price its own model, and the error of every grouping would drop toward the training fit's)."""
    models, latency = random_models(40, np.random.default_rng(3))
    noisy = list(np.array(latency) * np.exp(np.random.default_rng(4).normal(0, 0.05, len(latency))))
    once = fit_from_models("once", models, noisy).spec["fit"]["cv_rms_error_pct_by_grouping"]
    twice = fit_from_models("twice", models + models, noisy + noisy).spec["fit"]["cv_rms_error_pct_by_grouping"]
    shared = set(once) & set(twice)
    assert "kernels" in shared
    assert {g: twice[g] for g in shared} == pytest.approx({g: once[g] for g in shared}, abs=0.02)
    assert min(once.values()) > 1.0  # the 5% noise shows in every grouping's CV error


def test_the_cv_error_of_twin_rows_leaks_without_groups():
    from nasctl.hardware.fit import cv_rms_error, model_groups

    models, latency = random_models(30, np.random.default_rng(5))
    y = np.array(latency) * np.exp(np.random.default_rng(6).normal(0, 0.05, len(latency)))
    A = np.array([[sum(1 for layer in m if layer is k) for k in POOL] + [1] for m in models], dtype=float)
    A2, y2, twins = np.vstack([A, A]), np.r_[y, y], model_groups(models + models)
    assert list(twins) == list(range(30)) * 2
    honest = cv_rms_error(A2, y2, folds=30, groups=twins)
    assert honest == pytest.approx(cv_rms_error(A, y, folds=30), rel=1e-6)
    assert cv_rms_error(A2, y2, folds=60) < 0.9 * honest  # row by row, a twin prices its own model


def test_too_few_models_is_a_one_line_error():
    models, latency = random_models(3, np.random.default_rng(3))
    with pytest.raises(UsageError, match="too few"):
        fit_from_models("x", models, latency)


def test_fit_from_a_hand_made_table_and_write_it(tmp_path):
    lines = ["op,in_ch,out_ch,in_h,in_w,out_h,out_w,kernel_h,kernel_w,stride,groups,w_bits,a_bits,fn,latency_ms"]
    for cout in (8, 16, 32, 64, 128):
        for hw in (8, 16, 32):
            lines.append(f"conv,16,{cout},{hw},{hw},{hw},{hw},3,3,1,1,32,32,relu,{0.001 + hw * hw * cout * 144 * 1e-8:.6f}")
    (tmp_path / "phone.csv").write_text("\n".join(lines) + "\n")
    fitted = fit_from_lut("phone", read_lut(tmp_path / "phone.csv"))
    spec_path = write_device(tmp_path / "hardware" / "phone", fitted)
    spec = yaml.safe_load(spec_path.read_text())
    assert spec["kind"] == "lut" and spec["models_energy"] is False and "latency only" in spec["energy"]
    device = LutDevice.from_dict({**spec, "name": "phone"}, spec_path.parent)
    assert device.estimate([conv(16, 32, 16)]).latency_ms == pytest.approx(0.001 + 16 * 16 * 32 * 144 * 1e-8, rel=1e-4)
    assert device.estimate([conv(16, 48, 24)]).latency_ms == pytest.approx(0.001 + 24 * 24 * 48 * 144 * 1e-8,
                                                                           rel=0.1)


def test_calibration_recovers_a_scale_and_the_overheads():
    rows = [row_from_layer(layer, cost) for layer, cost in zip(POOL, TRUE)]
    models, _ = random_models(40, np.random.default_rng(4))
    latency = [1.5 * sum(TRUE[POOL.index(layer)] for layer in m) + 0.001 * len(m) + 0.02 for m in models]
    cal = calibrate(fit_from_lut("t", rows).device(), models, latency)
    assert list(cal["scale"].values()) == pytest.approx([1.5] * len(cal["scale"]), rel=0.02)
    assert cal["per_layer_ms"] == pytest.approx(0.001, abs=2e-4) and cal["per_model_ms"] == pytest.approx(0.02, rel=0.1)
    fitted = fit_from_lut("t", rows, (models, latency))
    pred = [fitted.device().estimate(m).latency_ms for m in models]
    assert np.allclose(pred, latency, rtol=0.02)


def test_models_csv_with_onnx_and_arch_columns(tmp_path, onnx_models):
    (tmp_path / "m.csv").write_text("onnx,latency_ms\n" + "".join(f"{p.name},{i + 1}\n" for i, p in enumerate(onnx_models)))
    layers, latency = read_models_csv(tmp_path / "m.csv")
    assert latency == [1.0, 2.0] and [layer.op for layer in layers[0]] == ["conv"]
    arch = "|nor_conv_3x3~0|+|skip_connect~0|nor_conv_1x1~1|+|avg_pool_3x3~0|none~1|nor_conv_3x3~2|"
    (tmp_path / "a.csv").write_text(f"arch,latency_ms\n{arch},3.5\n")
    layers, latency = read_models_csv(tmp_path / "a.csv", space=load_space("nb201"))
    assert latency == [3.5] and any(layer.op == "conv" for layer in layers[0])


@pytest.mark.parametrize("text, message", [
    ("arch,time\nx,1\n", "missing column latency_ms"),
    ("name,latency_ms\nx,1\n", "missing column arch or onnx"),
    ("onnx,latency_ms\nm.onnx,fast\n", "latency_ms 'fast' is not a number"),
    ("arch,latency_ms\n{},1\n", "needs --space"),
    ("onnx,latency_ms\nm.onnx,inf\n", "latency_ms 'inf' must be a finite time in ms, at least 1e-06"),
    ("onnx,latency_ms\nm.onnx,0\n", "latency_ms '0' must be a finite time in ms"),
    ("onnx,latency_ms\nm.onnx,1e-320\n", "latency_ms '1e-320' must be a finite time in ms, at least 1e-06"),
    ("arch,latency_ms,latency_ms\nx,1,999\n", "the column 'latency_ms' appears twice"),
    ("onnx,latency_ms\nm.onnx\n", "line 2: has fewer fields than the header"),
])
def test_malformed_models_tables(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(UsageError, match=message):
        read_models_csv(tmp_path / "m.csv")


def test_models_tables_are_read_as_utf8_with_or_without_a_byte_order_mark(tmp_path, onnx_models):
    (tmp_path / "m.csv").write_bytes(b"\xef\xbb\xbfonnx,latency_ms\n" + f"{onnx_models[0].name},1.5\n".encode())
    assert read_models_csv(tmp_path / "m.csv")[1] == [1.5]
    (tmp_path / "latin.csv").write_bytes("onnx,latency_ms\nm\xe9.onnx,1\n".encode("latin-1"))
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        read_models_csv(tmp_path / "latin.csv")


def test_a_device_written_over_a_profile_leaves_no_measurements_behind(tmp_path):
    from nasctl.hardware.fit import MEASUREMENTS_FILE

    models, latency = random_models(12, np.random.default_rng(4))
    fitted = fit_from_models("x", models, latency)
    folder = tmp_path / "hardware" / "x"
    folder.mkdir(parents=True)
    (folder / MEASUREMENTS_FILE).write_text("{}")  # a profile's, from a device of this name before
    (folder / "notes.txt").write_text("the user's own")
    write_device(folder, fitted)
    assert not (folder / MEASUREMENTS_FILE).exists() and (folder / "notes.txt").exists()
    fitted.files[MEASUREMENTS_FILE] = {"format": 2}
    write_device(folder, fitted)
    assert json.loads((folder / MEASUREMENTS_FILE).read_text()) == {"format": 2}


@pytest.fixture
def onnx_models(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    paths = []
    for i, cout in enumerate((8, 16)):
        w = numpy_helper.from_array(np.ones((cout, 3, 3, 3), np.float32), "w")
        graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, name="c")], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 16, 16])], [w])
        model = onnx_model(graph)
        path = tmp_path / f"m{i}.onnx"
        path.write_bytes(model.SerializeToString())
        paths.append(path)
    return paths


def test_fit_report_is_json_serialisable():
    models, latency = random_models(30, np.random.default_rng(5))
    fitted = fit_from_models("j", models, latency)
    json.dumps(fitted.spec)
    yaml.safe_dump(fitted.spec)


def test_a_fit_that_fails_while_written_leaves_the_device_that_was_there(tmp_path, monkeypatch):
    from nasctl.hardware.lut import LutDevice

    models, latency = random_models(12, np.random.default_rng(4))
    folder = tmp_path / "hardware" / "x"
    write_device(folder, fit_from_models("x", models, latency))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def fail(self):
        raise ValueError("array must not contain infs or NaNs")

    monkeypatch.setattr(LutDevice, "save_regressors", fail)
    with pytest.raises(ValueError):
        write_device(folder, fit_from_models("x", models, latency * 2))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the old device, whole
    assert [p.name for p in folder.parent.iterdir()] == ["x"]  # nothing half written beside it


def test_too_few_models_says_how_many_are_distinct():
    models, latency = random_models(3, np.random.default_rng(5))
    with pytest.raises(UsageError, match=r"6 models \(3 distinct\) are too few to fit from"):
        fit_from_models("x", models * 2, latency * 2)
