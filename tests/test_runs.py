import csv
import json
from pathlib import Path

import numpy as np
import pytest

from nasctl import runs
from nasctl.errors import ConfigError, UsageError
from nasctl.objectives import METRIC_TABLE
from nasctl.store import RunStore

COLUMNS = ["trial", "arch", "accuracy", "latency_ms", "energy_mj", "edp", "params", "macs", "feasible", "train_s"]


def make_run(path: Path, points, objectives=("accuracy", "edp"), feasible=None) -> Path:
    """A run folder whose trials have the given (accuracy, edp) values."""
    store = RunStore.create(path, "unused", COLUMNS)
    store.write_config({"space": "ee-mbv2", "device": "edge-quad", "strategy": "random", "seed": 0,
                        "objectives": list(objectives)})
    for i, (acc, edp) in enumerate(points):
        store.append({"trial": i, "arch": json.dumps({"depth": i % 3, "bits": 8}), "accuracy": acc,
                      "latency_ms": edp / 2, "energy_mj": 2.0, "edp": edp, "params": 1000 + i, "macs": 5000 + i,
                      "feasible": True if feasible is None else feasible[i], "train_s": 0.1})
    return path


# ------------------------------------------------------------------ hypervolume

def test_hypervolume_2d_hand_worked():
    # three staircase boxes: 3·1 + 2·1 + 1·1
    assert runs.hypervolume([[1, 3], [2, 2], [3, 1]], [4, 4]) == 6.0
    # a dominated point, a point beyond the reference and a duplicate add nothing
    assert runs.hypervolume([[1, 3], [2, 2], [3, 1], [3, 3], [5, 0], [2, 2]], [4, 4]) == 6.0
    assert runs.hypervolume([[1, 1]], [2, 3]) == 2.0
    assert runs.hypervolume(np.empty((0, 2)), [1, 1]) == 0.0


def test_hypervolume_3d_uses_the_exact_union():
    # two unit-thick slabs of volume 2 overlapping in one unit cube
    assert runs.hypervolume([[0, 1, 1], [1, 0, 1]], [2, 2, 2]) == pytest.approx(3.0)


def test_hypervolume_grows_when_a_dominating_point_is_added():
    F = np.random.default_rng(0).random((20, 2))
    ref = [1.1, 1.1]
    before = runs.hypervolume(F, ref)
    dominated = F[0] + 0.01
    assert runs.hypervolume(np.vstack([F, dominated]), ref) == pytest.approx(before)
    better = F.min(axis=0) - 0.05
    assert runs.hypervolume(np.vstack([F, better]), ref) > before


def test_reference_point_is_worst_plus_ten_percent_of_range_in_natural_units():
    rows = [{"accuracy": 90.0, "edp": 2.0}, {"accuracy": 80.0, "edp": 1.0}]
    ref = runs.reference_point(rows, ["accuracy", "edp"])
    assert ref == pytest.approx({"accuracy": 79.0, "edp": 2.1})
    # boxes (90-79)·(2.1-2) + (80-79)·(2-1)
    F = [[-90.0, 2.0], [-80.0, 1.0]]
    assert runs.hypervolume(F, [-79.0, 2.1]) == pytest.approx(2.1)
    # every trial alike: 10% of the value, or 1 where the value is 0
    assert runs.reference_point([{"accuracy": 50.0, "edp": 0.0}], ["accuracy", "edp"]) == \
        pytest.approx({"accuracy": 45.0, "edp": 1.0})
    assert runs.reference_point([], ["accuracy", "edp"]) is None


def test_run_hypervolume_counts_feasible_trials_only(tmp_path):
    path = make_run(tmp_path / "r", [(90, 2.0), (80, 1.0), (99, 0.1)], feasible=[True, True, False])
    summary = runs.summarise(runs.load(path))
    assert summary["reference_point"] == pytest.approx({"accuracy": 79.0, "edp": 2.1})
    assert summary["hypervolume"] == pytest.approx(2.1)
    assert (summary["trials"], summary["feasible"], summary["front_size"]) == (3, 2, 2)
    assert summary["best"]["accuracy"] == {"value": 90, "trial": 0}
    assert summary["best"]["edp"] == {"value": 1.0, "trial": 1}
    history = runs.hypervolume_history(runs.load(path), summary["reference_point"])
    assert history == pytest.approx([11 * 0.1, 2.1, 2.1])


# ------------------------------------------------------------------ summary.json

def test_reference_point_is_stored_and_reread(tmp_path):
    path = make_run(tmp_path / "r", [(90, 2.0), (80, 1.0)])
    written = runs.write_summary(path)
    stored = json.loads((path / runs.SUMMARY_FILE).read_text())
    assert stored["reference_point"] == pytest.approx({"accuracy": 79.0, "edp": 2.1})
    assert stored["hypervolume"] == pytest.approx(written["hypervolume"])

    # a reference point set by hand is honoured while it describes the same trials ...
    stored["reference_point"] = {"accuracy": 70.0, "edp": 3.0}
    (path / runs.SUMMARY_FILE).write_text(json.dumps(stored))
    again = runs.summarise(runs.load(path))
    assert again["reference_point"] == {"accuracy": 70.0, "edp": 3.0}
    assert again["hypervolume"] == pytest.approx(20 * 1 + 10 * 1)

    # ... and recomputed once the run has more trials
    RunStore(path, COLUMNS).append({"trial": 2, "arch": "{}", "accuracy": 85, "latency_ms": 1, "energy_mj": 1,
                                    "edp": 1.5, "params": 1, "macs": 1, "feasible": True, "train_s": 0})
    assert runs.write_summary(path)["reference_point"] == pytest.approx({"accuracy": 79.0, "edp": 2.1})


def test_a_run_that_lost_trials_leaves_its_summary_and_reference_point_alone(tmp_path, capsys):
    path = make_run(tmp_path / "r", [(90, 2.0), (80, 1.0), (85, 1.5)])
    runs.write_summary(path)
    stored = (path / runs.SUMMARY_FILE).read_text()
    lines = (path / "trials.csv").read_text().splitlines(keepends=True)
    (path / "trials.csv").write_text("".join(lines[:2]))  # cut short: one trial left
    assert runs.write_summary(path)["trials"] == 1
    assert (path / runs.SUMMARY_FILE).read_text() == stored
    assert "records 3 trials but the run now holds 1" in capsys.readouterr().err


# ------------------------------------------------------------------ reading trials.csv

def test_a_trial_still_being_written_is_left_out(tmp_path):
    path = make_run(tmp_path / "r", [(90, 2.0), (80, 1.0)])
    with open(path / "trials.csv", "a") as f:
        f.write('2,"{""depth"": 1}",7')  # no line end yet
    run = runs.load(path)
    assert [t["trial"] for t in run.trials] == [0, 1]
    assert run.trials[0]["feasible"] is True and run.trials[0]["params"] == 1000


def test_a_run_with_no_trials_yet_reads(tmp_path):
    path = make_run(tmp_path / "r", [])
    summary = runs.summarise(runs.load(path))
    assert (summary["trials"], summary["hypervolume"], summary["reference_point"]) == (0, None, None)


@pytest.mark.parametrize("edit, message", [
    (lambda text: text.replace("true,0.1\n", "true\n", 1), "line 2: 9 fields where the header has 10"),
    (lambda text: text.replace(",2,1000,", ",fast,1000,", 1), "line 2: edp 'fast' is not a finite number"),
    (lambda text: text.replace(",2,1000,", ",inf,1000,", 1), "line 2: edp 'inf' is not a finite number"),
    (lambda text: text.replace("true", "maybe", 1), "line 2: feasible 'maybe' is neither true nor false"),
    (lambda text: text.replace("accuracy,", "acc,", 1), "line 1: header lacks column(s) accuracy"),
    (lambda text: text.replace('"{', '"[', 1).replace('}"', ']"', 1), "line 2: arch is not a JSON object"),
    (lambda text: text.replace("\n1,", "\n0,", 1), "line 3: trial 0 is there twice (line 2 too)"),
])
def test_malformed_trials_are_one_line_errors_naming_the_line(tmp_path, edit, message):
    path = make_run(tmp_path / "r", [(90, 2.0), (80, 1.0)])
    trials = path / "trials.csv"
    trials.write_text(edit(trials.read_text().replace("\r\n", "\n")))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        runs.load(path)


def test_list_reports_every_run_and_survives_a_broken_one(tmp_path):
    make_run(tmp_path / "runs" / "a", [(90, 2.0), (80, 1.0)])
    make_run(tmp_path / "runs" / "b", [(70, 1.0)])
    (tmp_path / "runs" / "b" / "trials.csv").write_text("nonsense\n")
    (tmp_path / "runs" / "notes").mkdir()
    listed = {r["run"]: r for r in runs.list_runs()}
    assert set(listed) == {"a", "b"}
    assert listed["a"]["hypervolume"] == pytest.approx(2.1) and listed["a"]["front_size"] == 2
    assert "header lacks" in listed["b"]["problem"]


# ------------------------------------------------------------------ compare

def test_compare_measures_every_run_at_the_baselines_reference_point(tmp_path):
    base = runs.load(make_run(tmp_path / "base", [(90, 2.0), (80, 1.0)]))       # ref (79, 2.1), HV 2.1
    worse = runs.load(make_run(tmp_path / "worse", [(85, 2.0)]))                 # (85-79)·0.1
    better = runs.load(make_run(tmp_path / "better", [(95, 0.5), (60, 9.0)]))    # (95-79)·1.6; 2nd beyond ref
    result = runs.compare([worse, better], base, min_ratio=0.5)
    by_name = {r["run"]: r for r in result["runs"]}
    assert result["reference_point"] == pytest.approx({"accuracy": 79.0, "edp": 2.1})
    assert by_name[str(tmp_path / "worse")]["hv_ratio"] == pytest.approx(0.6 / 2.1)
    assert by_name[str(tmp_path / "better")]["hv_ratio"] == pytest.approx(16 * 1.6 / 2.1)
    assert by_name[str(tmp_path / "worse")]["passed"] is False and by_name[str(tmp_path / "better")]["passed"]
    assert by_name[str(tmp_path / "base")]["passed"] is None and result["passed"] is False
    assert (tmp_path / "base" / runs.SUMMARY_FILE).is_file()


def test_compare_refuses_runs_with_other_objectives(tmp_path):
    base = runs.load(make_run(tmp_path / "base", [(90, 2.0)]))
    other = runs.load(make_run(tmp_path / "other", [(90, 2.0)], objectives=("accuracy", "latency_ms")))
    with pytest.raises(UsageError, match="optimises accuracy,latency_ms but baseline"):
        runs.compare([other], base)


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan"), float("inf")])
def test_compare_refuses_a_meaningless_ratio(tmp_path, ratio):
    base = runs.load(make_run(tmp_path / "base", [(90, 2.0)]))
    with pytest.raises(UsageError, match="--min-hv-ratio"):
        runs.compare([base], base, min_ratio=ratio)


# ------------------------------------------------------------------ export

def test_export_round_trip_csv_and_json(tmp_path):
    run = runs.load(make_run(tmp_path / "r", [(90, 2.0), (80, 1.0), (70, 3.0)]))
    rows = runs.export_rows(run)
    assert list(rows[0])[:3] == ["trial", "arch.depth", "arch.bits"] and "arch" not in rows[0]
    with open(tmp_path / "t.csv", "w", newline="") as f:
        runs.write_export(rows, "csv", f)
    with open(tmp_path / "t.csv", newline="") as f:
        back = list(csv.DictReader(f))
    assert [int(r["arch.depth"]) for r in back] == [0, 1, 2]
    assert [float(r["edp"]) for r in back] == [2.0, 1.0, 3.0] and back[0]["feasible"] == "true"
    with open(tmp_path / "t.json", "w") as f:
        runs.write_export(runs.export_rows(run, front_only=True), "json", f)
    front = json.loads((tmp_path / "t.json").read_text())
    assert [(r["trial"], r["accuracy"], r["arch.depth"]) for r in front] == [(0, 90, 0), (1, 80, 1)]


# ------------------------------------------------------------------ every metric, as runs show it

ALL_COLUMNS = ["trial", "arch", *(m.name for m in METRIC_TABLE), "feasible", "train_s"]


def make_metric_run(path: Path, objectives) -> Path:
    """A run folder with every metric column, optimising `objectives`."""
    store = RunStore.create(path, "unused", ALL_COLUMNS)
    store.write_config({"space": "nb201", "device": "edge-quad", "strategy": "random", "seed": 0,
                        "objectives": list(objectives)})
    for i in range(3):
        store.append({"trial": i, "arch": json.dumps({"depth": i}), "accuracy": 80.0 + i, "latency_ms": 0.5 + i,
                      "energy_mj": 0.2 + 0.1 * i, "edp": 0.1 * (3 - i), "params": 1000 * (i + 1), "macs": 5000 * (i + 1),
                      "weight_kib": 4.0 + i, "exit_overhead": 0.01 * i, "dynamic_efficiency": 0.1 * i,
                      "area_mm2": 12.0 - i, "feasible": True, "train_s": 0.1})
    return path


@pytest.mark.parametrize("m", METRIC_TABLE, ids=lambda m: m.name)
def test_every_metric_is_summarised_and_shown_through_the_table(tmp_path, m):
    partner = "edp" if m.name != "edp" else "accuracy"
    run = runs.load(make_metric_run(tmp_path / "r", [m.name, partner]))
    summary = runs.summarise(run)
    values = [t[m.name] for t in run.trials]
    assert summary["best"][m.name]["value"] == (max if m.direction == "max" else min)(values)
    assert set(summary["reference_point"]) == {m.name, partner} and summary["hypervolume"] > 0
    assert runs.display(m.name, 2.0) == m.format(2.0)
    assert runs.display(m.name, 2.0, named=True).startswith(f"{m.label} ")
    assert m.label in runs.describe_reference(summary["reference_point"])
    units, factor = runs.hypervolume_units([m.name, partner])
    assert units.split(" × ")[0] == (m.unit or m.label) and factor == pytest.approx(m.scale * 1e6 ** (partner == "edp"))
    assert runs.DISPLAY[m.name] == (m.label, m.unit, m.scale)


def test_plot_axes_are_labelled_from_the_metric_table(tmp_path):
    run = runs.load(make_metric_run(tmp_path / "r", ["area_mm2", "weight_kib"]))
    pareto, hv = runs.plot(run, tmp_path / "plots")
    assert pareto.read_bytes()[:4] == b"\x89PNG" and hv.is_file()
    assert runs._axis_label("area_mm2") == "area (mm²), lower is better"
    assert runs._axis_label("dynamic_efficiency") == "dynamic efficiency (%), higher is better"


# ------------------------------------------------------------------ a run compared with itself

def test_a_run_compared_with_itself_is_held_to_the_gate(tmp_path):
    base = runs.load(make_run(tmp_path / "base", [(90, 2.0), (80, 1.0)]))
    again = runs.load(tmp_path / "base")
    result = runs.compare([again], base, min_ratio=1.5)
    (row,) = result["runs"]
    assert row["baseline"] and row["hv_ratio"] == 1.0 and row["passed"] is False and result["passed"] is False
    assert runs.compare([again], base, min_ratio=1.0)["runs"][0]["passed"] is True
    # a baseline not among the compared runs is not gated
    other = runs.load(make_run(tmp_path / "other", [(85, 2.0)]))
    rows = runs.compare([other], base, min_ratio=1.5)["runs"]
    assert rows[0]["passed"] is None and rows[1]["passed"] is False


# ------------------------------------------------------------------ trials.csv cut short, study.db intact

def make_run_with_study(path: Path, points) -> Path:
    """A run folder as a search writes it: each trial in the optuna study (study.db), then in trials.csv."""
    from nasctl.spaces.base import arch_key
    from nasctl.spaces.loader import load_space
    from nasctl.store import TrialStore

    space = load_space("nb201")
    store = RunStore.create(path, "unused", COLUMNS)
    store.write_config({"space": "nb201", "device": "edge-quad", "strategy": "random", "seed": 0,
                        "objectives": ["accuracy", "edp"]})
    study = TrialStore(f"sqlite:///{path / 'study.db'}", path.name, ["maximize", "minimize"], space)
    rng = np.random.default_rng(0)
    for acc, edp in points:
        arch = space.sample(rng)
        trial = study.start(arch, arch_key(arch))
        row = {"arch": arch_key(arch), "accuracy": acc, "latency_ms": edp / 2, "energy_mj": 2.0, "edp": edp,
               "params": 1000, "macs": 5000, "feasible": True, "train_s": 0.123456789}
        store.append({"trial": study.finish(trial, row, [acc, edp], {}), **row})
    return path


@pytest.mark.parametrize("damage", ["cut mid-row", "last row lost", "header only", "empty", "garbage", "missing"])
def test_a_damaged_trials_csv_is_read_from_the_study_with_one_warning(tmp_path, capsys, damage):
    path = make_run_with_study(tmp_path / "r", [(90, 2.0), (80, 1.0), (85, 1.5)])
    intact = runs.load(path)
    assert capsys.readouterr().err == ""  # trials.csv whole: no warning
    trials = path / "trials.csv"
    text = trials.read_text()
    lines = text.splitlines(keepends=True)
    if damage == "missing":
        trials.unlink()
    else:
        trials.write_text({"cut mid-row": text[:len(lines[0]) + 12], "last row lost": "".join(lines[:-1]),
                           "header only": lines[0], "empty": "", "garbage": "nonsense\n"}[damage])
    run = runs.load(path)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "study.db" in err[0], err
    assert "read the 3 finished trials" in err[0]
    assert run.trials == intact.trials  # typed as trials.csv gives them
    assert runs.summarise(run)["hypervolume"] == pytest.approx(runs.summarise(intact)["hypervolume"])


def test_a_moved_run_finds_its_study_and_a_run_without_one_reads_trials_csv_alone(tmp_path, capsys):
    path = make_run_with_study(tmp_path / "r", [(90, 2.0), (80, 1.0)])
    path.rename(tmp_path / "renamed")  # the study keeps the name of the folder it was made in
    (tmp_path / "renamed" / "trials.csv").write_text("trial,arch\n")
    assert len(runs.load(tmp_path / "renamed").trials) == 2 and "warning" in capsys.readouterr().err
    (tmp_path / "renamed" / "study.db").unlink()
    with pytest.raises(ConfigError, match="header lacks column"):
        runs.load(tmp_path / "renamed")
