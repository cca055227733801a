import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nasctl import __version__
from nasctl.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"nasctl {__version__}"


@pytest.mark.parametrize("args", [[], ["search"], ["space"], ["space", "show"], ["hw"], ["hw", "show"], ["predict"],
                                  ["report"], ["runs"], ["runs", "compare"], ["predictor"], ["predictor", "train"]])
def test_help_everywhere(args):
    result = invoke(*args, "--help")
    assert result.exit_code == 0 and "Usage" in result.stdout


def test_cli_import_keeps_heavy_libraries_out():
    code = "import sys, nasctl.cli; print(sorted(m for m in ('torch', 'pymoo', 'optuna', 'pandas', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_space_list_and_show():
    listed = json.loads(invoke("space", "list", "--json").stdout)
    assert {"name": "ee-mbv2"}.items() <= listed[0].items()
    assert listed[0]["origin"] == "packaged"
    shown = json.loads(invoke("space", "show", "ee-mbv2", "--json").stdout)
    assert shown["knobs"]["backbone_bits"] == [32, 8, 4]
    assert invoke("space", "show", "ee-mbv2").exit_code == 0


def test_hw_list_and_show():
    listed = json.loads(invoke("hw", "list", "--json").stdout)
    assert "edge-quad" in [e["name"] for e in listed]
    result = invoke("hw", "show", "edge-quad", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["name"] == "edge-quad"


@pytest.mark.parametrize("args, code, message", [
    (["search", "--strategy", "foo"], 2, "unknown strategy 'foo'; allowed: "),
    (["search", "--space", "nope"], 2, "unknown search space 'nope'"),
    (["search", "--device", "nope"], 2, "unknown device 'nope'"),
    (["search", "--dataset", "nope"], 2, "nope"),
    (["search", "--budget", "0"], 2, "--budget 0: Input should be greater than or equal to 1"),
    (["search", "--train-device", "gpu"], 2, "--train-device gpu: Input should be 'auto', 'cpu' or 'cuda'"),
    (["search", "--objectives", "accuracy,speed"], 2, "unknown objective 'speed'"),
    (["search", "--budgett", "3"], 2, "No such option: --budgett"),
    (["search", "--budget", "many"], 2, "--budget many: "),
    (["hw", "show", "nope"], 2, "unknown device 'nope'; known: edge-quad"),
    (["space", "show", "nope"], 2, "unknown search space 'nope'; known: ee-mbv2"),
    (["--workspace", "/no/such/folder", "space", "list"], 2, "workspace '/no/such/folder' is not a folder"),
])
def test_user_errors_are_one_line(args, code, message):
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [[], ["runs"], ["hw"], ["space"], ["predictor"]])
def test_group_without_subcommand_prints_help_and_succeeds(args):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout and "Commands" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("flag, value, example", [
    ("--pin", "exit_s1", "e.g. --pin exit_s1=0,exit_s2=0,backbone_bits=8"),
    ("--exit-rates", "s1", "e.g. --exit-rates s1=0.3,s2=0.2"),
])
def test_assignment_flags_quote_their_own_example(flag, value, example):
    result = invoke("search", flag, value, "--print-config")
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"'{value}' is not NAME=VALUE ({example})" in line
    # the example itself is accepted
    assert invoke("search", flag, example.split()[-1], "--print-config").exit_code == 0


def test_space_list_names_a_spec_that_does_not_build(tmp_path):
    (tmp_path / "search_spaces").mkdir()
    spec = (tmp_path / "search_spaces" / "twice.yaml")
    spec.write_text("name: twice\nkind: mbv2\nstem: {channels: 8}\n"
                    "stages:\n  - {depth: 1, channels: [16, 16]}\nhead: {channels: 32}\n")
    result = invoke("--workspace", tmp_path, "space", "list", "--json")
    assert result.exit_code == 0, result.output
    row, = [r for r in json.loads(result.stdout) if r["name"] == "twice"]
    assert row["kind"] == "mbv2" and "channels: lists 16 more than once" in row["error"]
    warning, = result.stderr.strip().splitlines()
    assert warning.startswith("warning: space 'twice'") and "cannot be used" in warning
    assert "mbv2 (invalid)" in invoke("--workspace", tmp_path, "space", "list").stdout
