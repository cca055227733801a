import csv
import json
from pathlib import Path

import numpy as np
import pytest

from nasctl import runs
from nasctl.errors import ConfigError, UsageError
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
    (lambda text: text.replace(",2,1000,", ",fast,1000,", 1), "line 2: edp 'fast' is not a number"),
    (lambda text: text.replace("true", "maybe", 1), "line 2: feasible 'maybe' is neither true nor false"),
    (lambda text: text.replace("accuracy,", "acc,", 1), "line 1: header lacks column(s) accuracy"),
    (lambda text: text.replace('"{', '"[', 1).replace('}"', ']"', 1), "line 2: arch is not a JSON object"),
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
