import csv
import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Two tiny real searches (seeds 0 and 1), run once for this file."""
    base = tmp_path_factory.mktemp("real-runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        mp.delenv("NASCTL_WORKSPACE", raising=False)
        for seed in (0, 1):
            result = invoke("search", "--budget", 3, "--epochs", 1, "--seed", seed, "--run-dir", base / f"s{seed}")
            assert result.exit_code == 0, result.output
    return base / "s0", base / "s1"


def one_error_line(result, code: int) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_compare_gate_passes_at_a_low_ratio_and_fails_at_an_impossible_one(real_runs):
    s0, s1 = real_runs
    passed = invoke("runs", "compare", s0, "--baseline", s1, "--min-hv-ratio", 0.05, "--json")
    assert passed.exit_code == 0, passed.output
    doc = json.loads(passed.stdout)
    baseline, other = doc["runs"]
    assert baseline["baseline"] and baseline["hv_ratio"] == 1.0
    assert other["run"] == str(s0) and other["hv_ratio"] >= 0.05 and doc["passed"]
    assert doc["reference_point"] == json.loads((s1 / "summary.json").read_text())["reference_point"]

    failed = invoke("runs", "compare", s0, "--baseline", s1, "--min-hv-ratio", 1000)
    line = one_error_line(failed, 1)
    assert f"run '{s0}'" in line and f"{other['hv_ratio']:.3f}" in line and "1000" in line
    assert "FAIL" in failed.stdout and "reference point" in failed.stdout


def test_list_and_show_json(real_runs, tmp_path):
    for name, path in zip("ab", real_runs):
        shutil.copytree(path, tmp_path / "runs" / name)
    listed = json.loads(invoke("runs", "list", "--json").stdout)
    assert [r["run"] for r in listed] == ["a", "b"]
    assert {"space", "device", "strategy", "seed", "trials", "front_size", "hypervolume", "created"} <= set(listed[0])
    assert listed[0]["trials"] == 3 and listed[1]["seed"] == 1

    result = invoke("runs", "show", "a", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    with open(tmp_path / "runs" / "a" / "pareto.csv", newline="") as f:
        assert [t["trial"] for t in shown["front"]] == [int(r["trial"]) for r in csv.DictReader(f)]
    assert set(shown["reference_point"]) == {"accuracy", "edp"} and shown["hypervolume"] > 0
    assert set(shown["best"]) >= {"accuracy", "edp", "latency_ms"}
    stored = json.loads((tmp_path / "runs" / "a" / "summary.json").read_text())
    assert stored["reference_point"] == shown["reference_point"]

    text = invoke("runs", "show", "a")
    assert text.exit_code == 0 and "reference point" in text.stdout and "Pareto front" in text.stdout
    assert invoke("runs", "list").exit_code == 0


def test_plot_writes_two_pngs(real_runs, tmp_path):
    result = invoke("runs", "plot", real_runs[0], "--out", tmp_path / "plots")
    assert result.exit_code == 0, result.output
    paths = [tmp_path / "plots" / "pareto.png", tmp_path / "plots" / "hypervolume.png"]
    assert result.stdout.split() == [str(p) for p in paths]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_export_round_trip(real_runs, tmp_path):
    run = real_runs[0]
    assert invoke("runs", "export", run, "--format", "json", "--out", tmp_path / "t.json").exit_code == 0
    exported = json.loads((tmp_path / "t.json").read_text())
    with open(run / "trials.csv", newline="") as f:
        trials = list(csv.DictReader(f))
    assert len(exported) == len(trials) == 3
    for row, trial in zip(exported, trials):
        assert {k.removeprefix("arch."): v for k, v in row.items() if k.startswith("arch.")} == json.loads(trial["arch"])
        assert row["accuracy"] == float(trial["accuracy"]) and row["trial"] == int(trial["trial"])

    front = invoke("runs", "export", run, "--front")  # csv on stdout
    with open(run / "pareto.csv", newline="") as f:
        assert [r["trial"] for r in csv.DictReader(front.stdout.splitlines())] == [r["trial"] for r in csv.DictReader(f)]


def test_user_errors_are_one_line(real_runs, tmp_path):
    s0, _ = real_runs
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text((s0 / "config.yaml").read_text())
    shutil.copytree(s0, tmp_path / "broken")
    with open(tmp_path / "broken" / "trials.csv", "a") as f:
        f.write("7,{},oops\n")
    shutil.copytree(s0, tmp_path / "latency")
    config = yaml.safe_load((s0 / "config.yaml").read_text())
    (tmp_path / "latency" / "config.yaml").write_text(yaml.safe_dump({**config, "objectives": ["accuracy", "latency_ms"]}))
    cases = [
        (["runs", "show", "nope"], 2, "run 'nope' not found"),
        (["runs", "show", tmp_path / "empty"], 2, "holds no trials.csv"),
        (["runs", "show", tmp_path / "broken"], 2, "trials.csv: line 5: 3 fields where the header has"),
        (["runs", "compare", tmp_path / "latency", "--baseline", s0], 2, "optimises accuracy,latency_ms but baseline"),
        (["runs", "compare", s0, "--min-hv-ratio", 0], 2, "--min-hv-ratio 0 is not allowed"),
        (["runs", "compare", s0, "--min-hv-ratio", "high"], 2, "Invalid value for '--min-hv-ratio'"),
        (["runs", "export", s0, "--format", "xml"], 2, "Invalid value for '--format'"),
    ]
    for args, code, message in cases:
        result = invoke(*args)
        assert message in one_error_line(result, code), args
        assert result.stdout == "", args


@pytest.mark.parametrize("command", [[], ["list"], ["show"], ["compare"], ["export"], ["plot"]])
def test_help(command):
    result = invoke("runs", *command, "--help")
    assert result.exit_code == 0 and "Usage" in result.stdout


def test_list_without_runs():
    assert json.loads(invoke("runs", "list", "--json").stdout) == []
    assert "No runs in" in invoke("runs", "list").stdout
