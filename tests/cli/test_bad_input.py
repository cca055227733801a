"""Input a new user might give by mistake: each is refused in one line, before any work
(and before any run folder is made)."""

import json
import os
import subprocess
import sys

import numpy as np

import pytest

from cli_helpers import invoke, one_line_error, onnx_model


@pytest.mark.parametrize("seed", ["4294967296", "-1"])
def test_seed_out_of_range_is_refused_before_a_run_folder(tmp_path, seed):
    result = invoke("search", "--seed", seed, "--budget", "1", "--epochs", "1")
    one_line_error(result, 2, f"--seed {seed}")
    assert "0 <= seed < 4294967296" in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_largest_seed_is_accepted_and_leaves_room_for_each_worker():
    assert invoke("search", "--seed", str(2**32 - 1), "--print-config").exit_code == 0
    one_line_error(invoke("search", "--seed", str(2**32 - 1), "--workers", "2", "--print-config"), 2,
                   "allowed: 0 <= seed <= 4294967294")


@pytest.mark.parametrize("flag, value, message", [
    ("--max-latency-ms", "inf", "--max-latency-ms inf: inf is not a finite number"),
    ("--max-energy-mj", "inf", "--max-energy-mj inf: inf is not a finite number"),
    ("--lr", "inf", "--lr inf: inf is not a finite number"),
    ("--exit-tolerance", "1000", "less than or equal to 100"),
    ("--max-weight-kib", "inf", "'inf' is not allowed; give a finite KiB > 0"),
])
def test_settings_that_no_search_can_hold_are_refused(flag, value, message):
    one_line_error(invoke("search", flag, value, "--print-config"), 2, message)


def test_max_accuracy_drop_needs_a_baseline():
    one_line_error(invoke("search", "--max-accuracy-drop", "0.5", "--print-config"), 2,
                   "--max-accuracy-drop 0.5: needs --accuracy-baseline")


def test_max_accuracy_drop_in_a_config_file_needs_a_baseline(tmp_path):
    (tmp_path / "c.yaml").write_text("max_accuracy_drop: 2.0\n")
    one_line_error(invoke("search", "--config", tmp_path / "c.yaml", "--print-config"), 2,
                   "max_accuracy_drop: needs accuracy_baseline")


def test_the_same_knob_twice_in_pin_is_refused():
    one_line_error(invoke("search", "--pin", "exit_s1=0,exit_s1=1", "--print-config"), 2,
                   "'exit_s1' is given twice")


NOISY = """
import sys, warnings
import nasctl.cli.hw as hw
real = hw.load_device
def noisy(name):  # the kind of warning a library gives during real work
    warnings.warn("overflow encountered in exp", RuntimeWarning)
    return real(name)
hw.load_device = noisy
sys.argv = ["nasctl", "hw", "show", "edge-quad", "--json"]
from nasctl.cli import main
main()
"""


@pytest.mark.parametrize("env, shown", [({}, False), ({"NASCTL_WARNINGS": "1"}, True)])
def test_library_warnings_stay_off_the_terminal_unless_asked_for(env, shown):
    environ = {k: v for k, v in os.environ.items() if k not in ("NASCTL_WARNINGS", "PYTHONWARNINGS")}
    result = subprocess.run([sys.executable, "-c", NOISY], capture_output=True, text=True, env={**environ, **env})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "edge-quad"
    assert ("RuntimeWarning: overflow encountered in exp" in result.stderr) == shown, result.stderr


# -- files that are not UTF-8 text ------------------------------------------------------
LATIN1 = "# f\xfcr den Chip\n".encode("latin-1")  # 0xfc: not UTF-8


def _not_utf8(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(LATIN1 + text.encode())
    return path


def test_space_spec_that_is_not_utf8(root, tmp_path):
    path = _not_utf8(tmp_path / "s.yaml", (root / "search_spaces" / "ee-mbv2.yaml").read_text())
    one_line_error(invoke("space", "show", path), 2, f"{path}: is not UTF-8 text (byte 0xfc at offset 3)")


def test_device_spec_that_is_not_utf8(root, tmp_path):
    path = _not_utf8(tmp_path / "d.yaml", (root / "hardware" / "edge-quad.yaml").read_text())
    one_line_error(invoke("hw", "show", path), 2, f"{path}: is not UTF-8 text")
    one_line_error(invoke("search", "--device", path, "--print-config"), 2, f"{path}: is not UTF-8 text")


@pytest.mark.parametrize("name, text", [("c.toml", "budget = 3\n"), ("c.yaml", "budget: 3\n")])
def test_config_file_that_is_not_utf8(tmp_path, name, text):
    path = _not_utf8(tmp_path / name, text)
    one_line_error(invoke("search", "--config", path, "--print-config"), 2, f"{path}: is not UTF-8 text")


def test_config_file_with_a_byte_order_mark_is_read(tmp_path):
    (tmp_path / "c.toml").write_bytes(b"\xef\xbb\xbfbudget = 3\n")
    result = invoke("search", "--config", tmp_path / "c.toml", "--print-config")
    assert result.exit_code == 0, result.output
    assert "budget: 3" in result.stdout


# -- device specs with numbers no device has ---------------------------------------------
@pytest.mark.parametrize("key, value, message", [
    ("clock_mhz", ".inf", "clock_mhz: Input should be a finite number"),
    ("dram_gb_s", ".nan", "dram_gb_s: Input should be a finite number"),
    ("clock_mhz", "-400", "clock_mhz: Input should be greater than 0"),
])
def test_device_spec_numbers_must_be_finite_and_positive(root, tmp_path, key, value, message):
    lines = [f"{key}: {value}" if line.startswith(f"{key}:") else line
             for line in (root / "hardware" / "edge-quad.yaml").read_text().splitlines()]
    path = tmp_path / "d.yaml"
    path.write_text("\n".join(lines) + "\n")
    one_line_error(invoke("hw", "show", path), 2, message)


# -- a LUT device given by the path of its YAML -------------------------------------------
def _lut_device(folder, name="spec.yaml"):
    """A LUT device folder, as `nasctl hw profile` leaves one: spec.yaml beside lut.csv, the
    table holding every kernel of ee-mbv2 on digits (1 µs + 10 ns per 1000 MACs and 0.1 ns
    per element moved), so a search prices every candidate."""
    import yaml

    from nasctl.hardware.lut import row_from_layer, write_lut
    from nasctl.spaces.loader import load_space

    space, rng = load_space("ee-mbv2"), np.random.default_rng(0)
    layers = {}
    for _ in range(20):
        for layer in space.to_layers(space.sample(rng), (1, 8, 8), 10):
            layers.setdefault(layer.shape_key(), layer)
    rows = [row_from_layer(l, 1e-3 + l.macs * 1e-8 + (l.in_elems + l.out_elems) * 1e-7) for l in layers.values()]
    folder.mkdir(parents=True)
    write_lut(folder / "lut.csv", rows)
    (folder / name).write_text(yaml.safe_dump({"kind": "lut", "description": "a copied LUT device"}))
    return folder / name


def test_lut_device_by_the_path_of_its_yaml(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    spec = _lut_device(tmp_path / "elsewhere" / "copied-lut")
    w = numpy_helper.from_array(np.ones((16, 1, 3, 3), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], [w])
    onnx.save(onnx_model(graph), tmp_path / "m.onnx")
    for device in (spec, spec.parent, f"elsewhere{os.sep}copied-lut"):  # the YAML, or its folder
        result = invoke("predict", tmp_path / "m.onnx", "--device", device, "--json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["device"] == "copied-lut" and doc["latency_ms"] > 0 and not doc["unsupported"]
    result = invoke("hw", "show", spec, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["table"] == str(spec.parent / "lut.csv")


def test_search_on_a_lut_device_by_the_path_of_its_yaml(tmp_path):
    spec = _lut_device(tmp_path / "dev", name="my-device.yaml")
    result = invoke("search", "--device", spec, "--budget", "1", "--epochs", "1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["objectives"] == ["accuracy", "latency_ms"] and doc["front"]
    assert all(row["latency_ms"] > 0 for row in doc["front"])


def test_a_folder_without_a_spec_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(invoke("hw", "show", f"empty{os.sep}"), 2, "device folder 'empty/' holds no spec.yaml")


# -- datasets that would train silently to nonsense ----------------------------------------
@pytest.mark.parametrize("edit, message", [
    (lambda a: a["x_train"].__setitem__((3, 0, 0), np.nan), "x_train holds 1 NaN or infinite pixel value(s)"),
    (lambda a: a["y_train"].__setitem__(0, 99), "labels run up to 99 but no training image has label 10"),
])
def test_search_refuses_a_dataset_before_a_run_folder(tmp_path, edit, message):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((50, 8, 8)), "y_train": np.arange(50) % 10,
              "x_test": rng.random((10, 8, 8)), "y_test": np.arange(10)}
    edit(arrays)
    np.savez(tmp_path / "d.npz", **arrays)
    result = invoke("search", "--dataset", tmp_path / "d.npz", "--budget", "1", "--epochs", "1")
    one_line_error(result, 2, message)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# -- search spaces too large for this machine --------------------------------------------
def test_space_show_refuses_a_space_too_large_to_train(root, tmp_path):
    import yaml

    data = yaml.safe_load((root / "search_spaces" / "ee-mbv2.yaml").read_text())
    data["stages"][2]["channels"] = [48, 100000]  # 3,577 GiB to train its largest network
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(data))
    result = invoke("space", "show", tmp_path / "big.yaml")
    one_line_error(result, 2, "big.yaml: stages.2.channels: 100000 makes the largest architecture")
    assert "allowed on this machine: up to" in result.stderr


def test_search_refuses_activations_beyond_memory_before_a_run_folder(tmp_path, monkeypatch):
    import nasctl.spaces.mbv2 as mbv2

    monkeypatch.setattr(mbv2, "machine_memory", lambda: 256 * 2**20)
    result = invoke("search", "--batch-size", "1024", "--budget", "1", "--epochs", "1")
    one_line_error(result, 2, "search space 'ee-mbv2': its largest architecture needs ")
    assert "for a batch of 1024 at input 1x8x8" in result.stderr and "or the batch size" in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("command", [("hw", "profile", "--quick"), ("hw", "bundle", "--out", "b")])
def test_kernels_beyond_what_fits_in_memory_are_refused(tmp_path, command):
    result = invoke("--workspace", tmp_path, *command, "--kernels", "1000000000")
    assert result.exit_code == 2 and "--kernels" in result.output and "100000" in result.output, result.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "hardware").exists()


@pytest.mark.parametrize("args, message", [
    (["search", "--objectives", "", "--print-config"], "--objectives: the value '' is empty"),
    (["search", "--storage=", "--print-config"], "--storage: the value is empty"),
    (["search", "--pin", " ", "--print-config"], "--pin: the value ' ' is empty"),
    (["predict", "", "--device", "edge-quad"], "argument 2 is empty"),
])
def test_an_empty_value_is_refused_not_read_as_the_default(args, message):
    """An unset shell variable (`--objectives "$OBJ"`) gives an empty value: refused, where
    it was silently the flag's default."""
    one_line_error(invoke(*args), 2, message)


@pytest.mark.parametrize("args, message", [
    (["hw", "bundle", "--out", "b", "--kernels", "0"], "--kernels 0: Input should be greater than or equal to 20"),
    (["hw", "validate", "--rounds=1", "m.onnx"], "--rounds 1: Input should be greater than or equal to 2"),
    (["hw", "validate", "--spread", "inf", "m.onnx"], "--spread inf: Input should be less than or equal to 600"),
])
def test_a_value_out_of_range_is_named_with_its_flag(args, message):
    one_line_error(invoke(*args), 2, message)


def test_a_yaml_key_given_twice_is_refused_not_the_last_kept(tmp_path):
    (tmp_path / "c.yaml").write_text("budget: 2\nepochs: 1\nbudget: 30\n")
    one_line_error(invoke("search", "--config", tmp_path / "c.yaml", "--print-config"), 2,
                   "c.yaml: line 3: key 'budget' is given twice (line 1 too)")
    (tmp_path / "s.yaml").write_text("name: s\nkind: mbv2\nstem: {channels: 8, channels: 4}\n")
    one_line_error(invoke("space", "show", tmp_path / "s.yaml"), 2, "line 3: key 'channels' is given twice")


@pytest.mark.parametrize("flag, value, message", [
    ("--pin", "foo=1", "pin: 'foo' is not a knob of space 'ee-mbv2'"),
    ("--strategy", "nope", "unknown strategy 'nope'"),
    ("--surrogate", "nope", "unknown predictor model 'nope'"),
])
def test_print_config_checks_what_the_search_would(flag, value, message):
    one_line_error(invoke("search", flag, value, "--print-config"), 2, message)


def test_a_file_where_a_folder_belongs_and_back_is_named(tmp_path):
    (tmp_path / "folder.yaml").mkdir()
    one_line_error(invoke("search", "--config", tmp_path / "folder.yaml", "--print-config"), 2,
                   "folder.yaml' is a folder, not a file")
    (tmp_path / "afile").write_text("x")
    one_line_error(invoke("search", "--run-dir", tmp_path / "afile", "--budget", "1", "--epochs", "1"), 2,
                   "afile' is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("text, message", [
    ("budget: true\n", "budget: True is not a value of this setting (a yes/no was given)"),
    ('co_search: "yes"\n', "co_search: 'yes' is not true or false"),
])
def test_a_config_file_value_of_the_wrong_kind_is_not_coerced(tmp_path, text, message):
    (tmp_path / "c.yaml").write_text(text)
    one_line_error(invoke("search", "--config", tmp_path / "c.yaml", "--print-config"), 2, message)
