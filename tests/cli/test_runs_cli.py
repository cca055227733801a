import csv
import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.objectives import METRIC_TABLE

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
    (tmp_path / "broken" / "study.db").unlink()  # with the study, trials.csv's damage is read around
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
        (["runs", "compare", s0, "--min-hv-ratio", "high"], 2, "--min-hv-ratio high: "),
        (["runs", "export", s0, "--format", "xml"], 2, "--format xml: "),
        # an output path that is a folder, or under a file: one line naming it, not a traceback
        (["runs", "export", s0, "--out", tmp_path], 2, f"cannot use '{tmp_path}': Is a directory"),
        (["runs", "plot", s0, "--out", tmp_path / "afile"], 2, f"cannot use '{tmp_path / 'afile'}': File exists"),
        (["runs", "export", s0, "--out", tmp_path / "afile" / "t.csv"], 2, "cannot use '"),
    ]
    (tmp_path / "afile").write_text("not a folder")
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


# ------------------------------------------------------------------ a run compared with itself

@pytest.mark.parametrize("args", [["--baseline", "SELF"], []])
def test_a_run_against_itself_fails_a_gate_above_one(real_runs, args):
    s0, _ = real_runs
    result = invoke("runs", "compare", s0, *[s0 if a == "SELF" else a for a in args], "--min-hv-ratio", 1.5)
    line = one_error_line(result, 1)
    assert f"run '{s0}' hypervolume ratio 1.000 is below --min-hv-ratio 1.5" in line
    gate = [row for row in result.stdout.splitlines() if "HV ratio ≥ 1.5" in row]
    assert len(gate) == 1 and "FAIL" in gate[0]
    assert "1.000" in next(row for row in result.stdout.splitlines() if row.startswith("│ HV ratio "))
    doc = json.loads(invoke("runs", "compare", s0, *[s0 if a == "SELF" else a for a in args], "--min-hv-ratio", 1.5,
                            "--json").stdout)
    assert doc["passed"] is False and doc["runs"][0]["hv_ratio"] == 1.0 and doc["runs"][0]["passed"] is False
    assert invoke("runs", "compare", s0, *[s0 if a == "SELF" else a for a in args], "--min-hv-ratio", 1).exit_code == 0


def test_the_default_baseline_is_not_gated_beside_other_runs(real_runs):
    s0, s1 = real_runs
    doc = json.loads(invoke("runs", "compare", s1, s0, "--min-hv-ratio", 0.05, "--json").stdout)
    assert [r["passed"] for r in doc["runs"]] == [None, True]


# ------------------------------------------------------------------ trials.csv cut short

def test_a_truncated_trials_csv_is_read_from_study_db_with_a_warning(real_runs, tmp_path):
    shutil.copytree(real_runs[0], tmp_path / "runs" / "cut")
    whole = json.loads(invoke("runs", "show", "cut", "--json").stdout)
    trials = tmp_path / "runs" / "cut" / "trials.csv"
    trials.write_bytes(trials.read_bytes()[:300])  # the header and part of the first row
    for args in (["runs", "show", "cut", "--json"], ["runs", "list", "--json"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        warning = result.stderr.strip().splitlines()
        assert len(warning) == 1 and warning[0].startswith("warning: ") and "study.db" in warning[0], result.stderr
        doc = json.loads(result.stdout)
        shown = doc if args[1] == "show" else doc[0]
        assert shown["trials"] == whole["trials"] == 3 and shown["hypervolume"] == pytest.approx(whole["hypervolume"])


# ------------------------------------------------------------------ named objectives in study.db

def test_the_study_names_its_objectives(real_runs, co_search_run):
    import optuna

    for run, names in ((real_runs[0], ["accuracy", "edp"]), (co_search_run, ["accuracy", "edp", "area_mm2"])):
        study = optuna.load_study(study_name=None, storage=f"sqlite:///{run / 'study.db'}")
        assert study.metric_names == names


# ------------------------------------------------------------------ every metric, through the one table

NB201_CELL = ("edge_1_0=nor_conv_3x3,edge_2_0=nor_conv_3x3,edge_2_1=skip_connect,edge_3_0=nor_conv_1x1,"
              "edge_3_1=avg_pool_3x3,edge_3_2=nor_conv_3x3")


@pytest.fixture(scope="module")
def co_search_run(tmp_path_factory):
    """A small real `--co-search` run: one NB201 cell (accuracy from a table) on six accelerators."""
    import itertools

    from nasctl.spaces.loader import load_space

    base = tmp_path_factory.mktemp("co-search")
    space = load_space("nb201")
    names = [v.name for v in space.variables()]
    with open(base / "acc.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch_str", "acc"])
        for i, ops in enumerate(itertools.product(*(v.choices for v in space.variables()))):
            w.writerow([space.format_arch(dict(zip(names, ops))), 80 + i % 7])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        mp.delenv("NASCTL_WORKSPACE", raising=False)
        result = invoke("search", "--space", "nb201", "--device", "edge-quad", "--co-search", "--accuracy",
                        f"table:{base / 'acc.csv'}:acc", "--pin", NB201_CELL, "--budget", 6,
                        "--run-dir", base / "runs" / "cs")
        assert result.exit_code == 0, result.output
    return base / "runs" / "cs"


def test_show_list_compare_and_plot_a_co_search_run(co_search_run, tmp_path):
    shutil.copytree(co_search_run, tmp_path / "runs" / "cs")
    shown = invoke("runs", "show", "cs")
    assert shown.exit_code == 0, shown.output
    assert "Traceback" not in shown.output and shown.stderr == ""
    assert "area_mm2 ↓ (mm²)" in shown.stdout and "area " in shown.stdout and " mm²" in shown.stdout
    assert "% × µJ·µs × mm²" in shown.stdout  # the hypervolume's unit
    doc = json.loads(invoke("runs", "show", "cs", "--json").stdout)
    assert doc["objectives"] == ["accuracy", "edp", "area_mm2"] and doc["trials"] == 6
    assert set(doc["reference_point"]) == {"accuracy", "edp", "area_mm2"} and "area_mm2" in doc["best"]
    listed = invoke("runs", "list")
    assert listed.exit_code == 0 and "cs" in listed.stdout and "Traceback" not in listed.output, listed.output
    assert json.loads(invoke("runs", "list", "--json").stdout)[0]["trials"] == 6
    compared = invoke("runs", "compare", "cs", "--baseline", "cs")
    assert compared.exit_code == 0 and "best area_mm2" in compared.stdout, compared.output
    plotted = invoke("runs", "plot", "cs", "--out", tmp_path / "plots")
    assert plotted.exit_code == 0, plotted.output


ALL_COLUMNS = ["trial", "arch", *(m.name for m in METRIC_TABLE), "feasible", "train_s"]


@pytest.mark.parametrize("m", METRIC_TABLE, ids=lambda m: m.name)
def test_runs_show_and_list_show_every_metric_with_its_label_and_unit(tmp_path, m):
    from nasctl.store import RunStore

    partner = "edp" if m.name != "edp" else "accuracy"
    store = RunStore.create(tmp_path / "runs" / "r", "unused", ALL_COLUMNS)
    store.write_config({"space": "nb201", "device": "edge-quad", "strategy": "random", "seed": 0,
                        "objectives": [m.name, partner]})
    hw = {"hw_cores": 2, "hw_mac_array": "k4-c4-ox8-oy8", "hw_weight_sram_kib": 512, "hw_act_sram_kib": 256}
    for i in range(3):  # a co-searched accelerator's knobs, as area_mm2 comes with them
        store.append({"trial": i, "arch": json.dumps({"depth": i, **hw}), "accuracy": 80.0 + i, "latency_ms": 0.5 + i,
                      "energy_mj": 0.2 + 0.1 * i, "edp": 0.1 * (3 - i), "params": 1000 * (i + 1),
                      "macs": 5000 * (i + 1), "weight_kib": 4.0 + i, "exit_overhead": 0.01 * i,
                      "dynamic_efficiency": 0.1 * i, "area_mm2": 12.0 - i, "feasible": True, "train_s": 0.1})
    shown = invoke("runs", "show", "r")
    assert shown.exit_code == 0, shown.output
    objectives_line = next(line for line in shown.stdout.splitlines() if line.startswith("objectives: "))
    assert f"{m.name} {m.arrow}" + (f" ({m.unit})" if m.unit else "") in objectives_line
    reference_line = next(line for line in shown.stdout.splitlines() if line.startswith("hypervolume "))
    assert f"{m.label} " in reference_line and (m.unit in reference_line)
    best_row = next(line for line in shown.stdout.splitlines() if line.startswith("│") and f" {m.name} {m.arrow} " in line)
    assert best_row.split("│")[1].strip() == m.label and (m.unit in best_row.split("│")[3])
    listed = invoke("runs", "list")
    assert listed.exit_code == 0 and "│ r " in listed.stdout, listed.output


def test_search_help_lists_every_metric():
    result = runner.invoke(app, ["search", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for m in METRIC_TABLE:
        assert m.name in result.stdout
