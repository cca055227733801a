import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from nasctl.hardware.lut import LUT_COLUMNS

from cli_helpers import invoke, one_line_error, onnx_model


def tiny_model(path, cout, hw=16):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(cout).standard_normal((cout, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4, name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, hw, hw])], [w])
    path.write_bytes(onnx_model(graph).SerializeToString())
    return path


def lut_csv(path):
    lines = [",".join(LUT_COLUMNS)]
    for cout in (8, 16, 32, 64):
        for hw in (8, 16, 32):
            lines.append(f"conv,3,{cout},{hw},{hw},{hw},{hw},3,3,1,1,32,32,relu,{0.002 + hw * hw * cout * 27 * 2e-8:.6g}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_show_unprofiled_cpu_local_says_how_to_profile():
    one_line_error(invoke("hw", "show", "cpu-local"), 2, "nasctl hw profile --device cpu-local")


def test_fit_from_a_table_writes_a_usable_device(ws, tmp_path):
    result = invoke("--workspace", ws, "hw", "fit", "--device", "phone", "--lut", lut_csv(tmp_path / "k.csv"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kernels"] == 12 and (ws / "hardware" / "phone" / "lut.csv").is_file()
    spec = yaml.safe_load((ws / "hardware" / "phone" / "spec.yaml").read_text())
    assert spec["kind"] == "lut" and spec["models_energy"] is False
    shown = json.loads(invoke("--workspace", ws, "hw", "show", "phone", "--json").stdout)
    assert shown["kind"] == "lut" and shown["kernels"] == 12 and shown["energy"].startswith("latency only")
    assert "phone" in [e["name"] for e in json.loads(invoke("--workspace", ws, "hw", "list", "--json").stdout)]


def test_fit_refuses_to_replace_a_device_of_the_same_name_unless_told(ws, tmp_path):
    """A fitted device is work (a profile takes a quarter of an hour): fitting another one
    under its name is a one-line error that leaves it as it was, until --overwrite."""
    fit = ("--workspace", ws, "hw", "fit", "--device", "phone", "--lut")
    assert invoke(*fit, lut_csv(tmp_path / "k.csv")).exit_code == 0
    folder = ws / "hardware" / "phone"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    other = tmp_path / "other.csv"
    other.write_text((tmp_path / "k.csv").read_text().replace(",relu,", ",,"))  # convs without the ReLU
    one_line_error(invoke(*fit, other), 2, "device 'phone' already exists")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    result = invoke(*fit, other, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    assert (folder / "lut.csv").read_bytes() != before["lut.csv"]


def test_a_fitted_device_prices_models_with_predict(ws, tmp_path):
    invoke("--workspace", ws, "hw", "fit", "--device", "phone", "--lut", lut_csv(tmp_path / "k.csv"))
    result = invoke("--workspace", ws, "predict", tiny_model(tmp_path / "m.onnx", 16), "--device", "phone", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["device"] == "phone" and doc["latency_ms"] > 0 and doc["energy_mj"] is None


def test_fit_help_documents_the_columns():
    text = " ".join(invoke("hw", "fit", "--help").stdout.split())
    for column in LUT_COLUMNS + ("energy_mj", "arch", "onnx"):
        assert column in text


def test_fit_table_with_a_missing_column_is_one_line(ws, tmp_path):
    path = lut_csv(tmp_path / "k.csv")
    path.write_text(path.read_text().replace(",stride", "", 1))
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "p", "--lut", path), 2, "missing column stride")


def test_fit_needs_an_input_and_a_workspace(ws, tmp_path):
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "p"), 2, "--lut FILE")
    one_line_error(invoke("hw", "fit", "--device", "p", "--lut", lut_csv(tmp_path / "k.csv")), 2, "--workspace")


def test_fit_from_measured_models(ws, tmp_path):
    rows = ["onnx,latency_ms"]
    for i, cout in enumerate((4, 8, 12, 16, 24, 32, 48, 64)):
        tiny_model(tmp_path / f"m{i}.onnx", cout)
        rows.append(f"m{i}.onnx,{0.01 + cout * 0.001}")
    (tmp_path / "models.csv").write_text("\n".join(rows) + "\n")
    result = invoke("--workspace", ws, "hw", "fit", "--device", "stopwatch", "--models", tmp_path / "models.csv",
                    "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["fit"]["grouping"] in ("types", "types-shared") and doc["fit"]["train_rms_error_pct"] < 5


def test_validate_prints_the_table_and_shares(ws, tmp_path):
    invoke("--workspace", ws, "hw", "fit", "--device", "phone", "--lut", lut_csv(tmp_path / "k.csv"))
    models = [tiny_model(tmp_path / "a.onnx", 8), tiny_model(tmp_path / "b.onnx", 32)]
    result = invoke("--workspace", ws, "hw", "validate", "--device", "phone", *models, "--rounds", 2)
    assert result.exit_code == 0, result.output
    assert "a" in result.stdout and "within ±10%" in result.stdout and "RMS error" in result.stdout
    doc = json.loads(invoke("--workspace", ws, "hw", "validate", "--device", "phone", *models, "--rounds", 2,
                            "--json").stdout)
    assert [m["model"] for m in doc["models"]] == ["a", "b"]
    assert all(m["measured_ms"] > 0 and m["predicted_ms"] > 0 for m in doc["models"])
    assert 0 <= doc["summary"]["within_10pct"] <= 1 and doc["summary"]["rms_error_pct"] >= 0
    # --by-kernel: each model profiled, its conv's in-context time beside the conv's price
    result = invoke("--workspace", ws, "hw", "validate", "--device", "phone", *models, "--rounds", 2, "--by-kernel")
    assert result.exit_code == 0, result.output
    assert "By kernel type" in result.stdout and "Layers priced furthest" in result.stdout
    doc = json.loads(invoke("--workspace", ws, "hw", "validate", "--device", "phone", *models, "--rounds", 2,
                            "--by-kernel", "--json").stdout)
    by = doc["by_kernel"]
    assert by["models"] == ["a", "b"] and [r["kernel"] for r in by["kernels"]] == ["conv"]
    assert by["kernels"][0]["layers"] == 2 and by["kernels"][0]["measured_ms"] > 0
    assert {r["model"] for r in by["worst_layers"]} == {"a", "b"}


def test_quick_profile_writes_the_local_device(ws, tmp_path):
    result = invoke("--workspace", ws, "hw", "profile", "--kernels", 20, "--rounds", 2, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    spec = yaml.safe_load((ws / "hardware" / "cpu-local" / "spec.yaml").read_text())
    assert spec["measurement"]["threads"] == 1 and spec["measurement"]["rounds"] == 2
    assert spec["models_energy"] is False and "latency only" in spec["energy"]
    assert doc["kernels"] > 0
    header = (ws / "hardware" / "cpu-local" / "lut.csv").read_text().splitlines()[0].split(",")
    assert header[:len(LUT_COLUMNS)] == list(LUT_COLUMNS) and set(header[len(LUT_COLUMNS):]) <= {"dequantized"}
    shown = invoke("--workspace", ws, "hw", "show", "cpu-local", "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["measurement"]["clock"] == "thread_cpu"
    # validating says how fast the machine runs now against the profile, and by what
    validated = invoke("--workspace", ws, "hw", "validate", "--device", "cpu-local",
                       tiny_model(tmp_path / "a.onnx", 8), "--rounds", 2)
    assert validated.exit_code == 0, validated.output
    speed = spec["measurement"]["speed_references"]["networks"]
    by = f"{len(speed)} of the profile's context networks" if speed else "3 reference networks"
    assert "The machine runs at" in validated.stdout and by in " ".join(validated.stdout.split())
    assert "With the predictions scaled by that speed" in validated.stdout
    # one chunk of networks: the machine's speed could not move between chunks, no warning
    assert "speed moved" not in invoke("--workspace", ws, "hw", "profile", "--refit").stderr
    # fitted again from the networks the profile saved, measuring nothing: the same device
    table = (ws / "hardware" / "cpu-local" / "lut.csv").read_text()
    again = invoke("--workspace", ws, "hw", "profile", "--refit", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["kernels"] == doc["kernels"]
    assert (ws / "hardware" / "cpu-local" / "lut.csv").read_text() == table


def test_a_profile_gains_chained_token_kernels_without_measuring_its_networks_again(ws, monkeypatch):
    from nasctl.hardware.measure import chains, profile

    result = invoke("--workspace", ws, "hw", "profile", "--kernels", 20, "--rounds", 2)
    assert result.exit_code == 0, result.output
    folder = ws / "hardware" / "cpu-local"
    networks = json.loads((folder / "measurements.json").read_text())["networks"]
    # (two of the kernels a full profile chains, each timed quickly)
    monkeypatch.setattr(chains, "chain_kernels", lambda: [chains.token_layer("linear", 32, 32, 4),
                                                          chains.token_layer("norm", 16, 16, 16, fn="layer")])
    monkeypatch.setattr(profile, "CHAIN_SPREAD_S", 0.0)
    one_line_error(invoke("--workspace", ws, "hw", "profile", "--refit", "--add-chains"), 2, "give one")
    added = invoke("--workspace", ws, "hw", "profile", "--add-chains", "--rounds", 2)
    assert added.exit_code == 0, added.output
    assert "and 2 chained kernels" in " ".join(added.stdout.split())
    doc = json.loads((folder / "measurements.json").read_text())
    assert doc["networks"] == networks and len(doc["chains"]) == 2
    spec = yaml.safe_load((folder / "spec.yaml").read_text())
    assert spec["measurement"]["chained_kernels"] == 2
    # a refit keeps them
    assert invoke("--workspace", ws, "hw", "profile", "--refit").exit_code == 0
    assert len(json.loads((folder / "measurements.json").read_text())["chains"]) == 2
    one_line_error(invoke("--workspace", ws, "hw", "profile", "--device", "board", "--add-chains"), 2,
                   "no device 'board'")


def test_profile_without_a_workspace_is_one_line():
    one_line_error(invoke("hw", "profile", "--kernels", 20), 2, "no workspace")


def test_refitting_a_device_never_profiled_is_one_line(ws):
    one_line_error(invoke("--workspace", ws, "hw", "profile", "--device", "board", "--refit"), 2,
                   "no device 'board'")
    assert not (ws / "hardware" / "board").exists()


def test_predicting_on_a_fitted_device_loads_its_saved_regressors(ws, tmp_path):
    # `hw fit` saves the fitted regressors: pricing needs neither scikit-learn nor scipy
    invoke("--workspace", ws, "hw", "fit", "--device", "phone", "--lut", lut_csv(tmp_path / "k.csv"))
    assert (ws / "hardware" / "phone" / "regressors.json").is_file()
    code = ("import sys\nfrom nasctl.cli import main\n"
            f"sys.argv = ['nasctl', '--workspace', {str(ws)!r}, 'predict', {str(tiny_model(tmp_path / 'a.onnx', 8))!r}, "
            "'--device', 'phone']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'sklearn', 'scipy.optimize') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "latency" in out and out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("args", [["predict", "model.onnx", "--device", "cpu-local"],
                                  ["search", "--device", "cpu-local", "--print-config"]])
def test_unprofiled_cpu_local_says_how_to_create_it(ws, args):
    result = invoke("--workspace", ws, *args)
    one_line_error(result, 2, "unknown device 'cpu-local'; known: edge-quad")
    assert result.stderr.strip().endswith("; create it with `nasctl hw profile`")


def test_other_unknown_devices_get_no_profile_hint(ws):
    result = invoke("--workspace", ws, "hw", "show", "nope")
    one_line_error(result, 2, "unknown device 'nope'; known: edge-quad")
    assert "hw profile" not in result.stderr


def test_device_names_that_read_as_files_or_clash_with_a_spec_file_are_refused(ws, tmp_path):
    fit = ("--workspace", ws, "hw", "fit", "--lut", lut_csv(tmp_path / "k.csv"), "--device")
    one_line_error(invoke(*fit, "phone.yaml"), 2, "device name 'phone.yaml' ends in .yaml")
    (ws / "hardware").mkdir(exist_ok=True)
    (ws / "hardware" / "acc.yaml").write_text("kind: analytical\n")
    one_line_error(invoke(*fit, "acc"), 2, "acc.yaml holds one of that name")
    assert not (ws / "hardware" / "acc").exists()


def test_validate_refuses_a_model_of_which_nothing_can_be_priced_before_timing(ws, tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Einsum", ["x", "x"], ["y"], equation="bij,bij->bij")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])])
    path = tmp_path / "einsum.onnx"
    path.write_bytes(onnx_model(graph).SerializeToString())
    result = invoke("--workspace", ws, "hw", "validate", "--device", "edge-quad", path)
    one_line_error(result, 2, "einsum.onnx: no op of it can be priced on 'edge-quad' (not priced: Einsum x1)")


def test_kind_that_is_not_a_name_is_one_line(ws):
    (ws / "hardware").mkdir(exist_ok=True)
    (ws / "hardware" / "odd.yaml").write_text("kind: [analytical]\n")
    one_line_error(invoke("--workspace", ws, "hw", "show", "odd"), 2, "kind: ['analytical'] is not a device kind")
    result = invoke("--workspace", ws, "hw", "list")
    assert result.exit_code == 0 and "warning: device 'odd'" in result.stderr


def test_lut_of_a_device_that_prices_none_of_the_layers_writes_nothing(ws, tmp_path):
    pools = tmp_path / "softmax.csv"  # a table of softmaxes only: nb201 networks have none
    pools.write_text(",".join(LUT_COLUMNS) + "\n" + "\n".join(
        f"softmax,{c},{c},1,1,1,1,1,1,1,1,32,32,,{c * 1e-5:.4g}" for c in (10, 100, 1000)) + "\n")
    assert invoke("--workspace", ws, "hw", "fit", "--device", "pools", "--lut", pools).exit_code == 0
    out = tmp_path / "z.csv"
    result = invoke("--workspace", ws, "hw", "lut", "--device", "pools", "--space", "nb201", "--out", out,
                    "--samples", 3)
    one_line_error(result, 2, "prices none of the")
    assert not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--grouping", "bogus"], "--grouping 'bogus' is not one of: kernels, types, types-shared"),
    (["--grouping", "types"], "--grouping goes with --models FILE"),
    (["--space", "nb201"], "--space describes the arch column of --models FILE"),
    (["--classes", "5", "--input-shape", "3,8,8"], "--input-shape, --classes describe the arch column"),
])
def test_fit_flags_that_would_be_ignored_are_refused(ws, tmp_path, extra, message):
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "x", "--lut", lut_csv(tmp_path / "k.csv"),
                          *extra), 2, message)
    assert not (ws / "hardware" / "x").exists()


def test_a_table_is_calibrated_only_against_enough_models_it_can_price(ws, tmp_path):
    rows = ["onnx,latency_ms"]
    for i, cout in enumerate((4, 8, 12, 16, 24, 32)):
        tiny_model(tmp_path / f"m{i}.onnx", cout)
        rows.append(f"m{i}.onnx,{0.01 + cout * 0.001}")
    (tmp_path / "six.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "one.csv").write_text("\n".join(rows[:2]) + "\n")
    fit = ("--workspace", ws, "hw", "fit", "--device", "cal", "--lut")
    result = invoke(*fit, lut_csv(tmp_path / "k.csv"), "--models", tmp_path / "six.csv", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fit"]["calibration"]["models"] == 6
    one_line_error(invoke(*fit, tmp_path / "k.csv", "--models", tmp_path / "one.csv", "--overwrite"), 2,
                   "it takes at least 3 distinct measured models, the file has 1")
    pools = tmp_path / "pools.csv"  # a table without convs, against conv models
    pools.write_text(",".join(LUT_COLUMNS) + "\n" + "\n".join(
        f"pool,16,16,{hw},{hw},{hw // 2},{hw // 2},2,2,2,1,32,32,avg,{hw * 1e-4:.4g}" for hw in (8, 16, 32)) + "\n")
    one_line_error(invoke(*fit, pools, "--models", tmp_path / "six.csv", "--overwrite"), 2,
                   "model 1 holds layers the table has no kernels to price (conv x1)")


def test_a_machine_whose_speed_moved_is_told_when_profiled_and_validated(ws, tmp_path, monkeypatch):
    # On a shared VM the same networks ran 0.84x-1.12x the median chunk's time within one
    # profile, and a model's measured time moved by 15% within a minute: the figures of such
    # a machine cannot be read closer than that, and the user is told so in one line.
    from nasctl.hardware.measure import profile

    assert invoke("--workspace", ws, "hw", "profile", "--kernels", 20, "--rounds", 2).exit_code == 0
    saved = ws / "hardware" / "cpu-local" / profile.MEASUREMENTS_FILE
    doc = json.loads(saved.read_text())
    refs = doc["reference_ms"][0]
    doc["chunk_of"] = [i % 2 for i in range(len(doc["networks"]))]  # the second chunk ran 1.3x slower
    doc["reference_ms"] = [refs, [1.3 * r for r in refs]]
    saved.write_text(json.dumps(doc))
    result = invoke("--workspace", ws, "hw", "profile", "--refit")
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if "speed moved" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "0.87x-1.13x" in warning[0]

    model = tiny_model(tmp_path / "a.onnx", 8)
    real = profile.validate_models

    def busier(device, paths, **kwargs):  # the machine runs 1.25x slower than when profiled
        doc = real(device, paths, **kwargs)
        doc["summary"]["machine_vs_profile"] = 1.25
        doc["summary"]["load_adjusted"] = profile.load_adjusted(doc["models"], doc["summary"])
        return doc

    monkeypatch.setattr(profile, "validate_models", busier)
    result = invoke("--workspace", ws, "hw", "validate", "--device", "cpu-local", model, "--rounds", 2)
    assert result.exit_code == 0, result.output
    assert "warning: the machine runs at 1.25x the time it was profiled at" in result.stderr
    shown = json.loads(invoke("--workspace", ws, "hw", "validate", "--device", "cpu-local", model, "--rounds", 2,
                              "--json").stdout)
    row = shown["models"][0]
    assert shown["summary"]["load_adjusted"]["median_pct"] == pytest.approx(
        (row["predicted_ms"] * 1.25 / row["measured_ms"] - 1) * 100)
