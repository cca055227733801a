"""Early-exit co-design searches: presets, exit policies, pinned (static) baselines, exit metrics."""

import csv
import json

import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()
TINY = ["--budget", "3", "--epochs", "1", "--strategy", "random"]
STATIC_INT8 = "exit_s1=0,exit_s2=0,exit_s1_width=16,exit_s2_width=16,exit_bits=8,backbone_bits=8"


def search(*args):
    return runner.invoke(app, ["search", *args])


def rows(run):
    with open(run / "trials.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_preset_settings_with_config_and_flags_on_top(tmp_path):
    resolved = yaml.safe_load(search("--preset", "eenn", "--print-config").stdout)
    assert resolved["space"] == "ee-mbv2" and resolved["device"] == "edge-quad"
    assert resolved["objectives"] == ["accuracy", "edp", "exit_overhead"]
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("budget: 9\nexit_policy: entropy\n")
    result = search("--preset", "eenn", "--config", str(cfg), "--seed", "5", "--print-config")
    resolved = yaml.safe_load(result.stdout)
    assert resolved["budget"] == 9 and resolved["exit_policy"] == "entropy" and resolved["seed"] == 5
    assert resolved["objectives"] == ["accuracy", "edp", "exit_overhead"]


def test_a_workspace_preset_is_found(tmp_path):
    (tmp_path / "ws" / "presets").mkdir(parents=True)
    (tmp_path / "ws" / "presets" / "quick.yaml").write_text("budget: 2\nepochs: 1\n")
    result = runner.invoke(app, ["--workspace", str(tmp_path / "ws"), "search", "--preset", "quick",
                                 "--print-config"])
    assert yaml.safe_load(result.stdout)["budget"] == 2


@pytest.mark.parametrize("args, message", [
    (["--preset", "nope"], "unknown preset 'nope'; known: eenn"),
    (["--exit-policy", "margin"], "--exit-policy margin: 'margin' is not one of: max-softmax, entropy"),
    (["--exit-rates", "s1=lots"], "'s1=lots' is not NAME=VALUE"),
    (["--batch-size", "0"], "--batch-size 0: Input should be greater than or equal to 1"),
    (["--exit-rates", "s1=0.7,s2=0.6"], "--exit-rates s1=0.7,s2=0.6: {'s1': 0.7, 's2': 0.6} is not allowed; give each early exit a share between 0 and 1, together at most 1"),
    (["--exit-rates", "s3=0.2"], "exit_rates: unknown exit(s) s3; early exits of space 'ee-mbv2': s1, s2"),
    (["--pin", "depth=2"], "pin: 'depth' is not a knob of space 'ee-mbv2'"),
    (["--pin", "backbone_bits=16"], "knob 'backbone_bits' = 16 is not one of: 32, 8, 4"),
    (["--preset", "eenn", "--device", "table:x.csv:lat"], "models latency only; objectives"),
    (["--max-weight-kib", "lots"], "--max-weight-kib lots: 'lots' is not allowed; give a finite KiB > 0, or 'device'"),
    (["--max-weight-kib", "device", "--device", "h100", "--objectives", "accuracy,latency_ms"],
     "max_weight_kib 'device': device 'h100' states no on-chip weight memory"),
])
def test_bad_settings_are_one_line(tmp_path, args, message):
    (tmp_path / "x.csv").write_text("arch,lat\n")
    result = search(*args, *TINY, "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_preset_search_records_exit_metrics_and_a_pinned_static_baseline(tmp_path):
    result = search("--preset", "eenn", *TINY, "--run-dir", str(tmp_path / "eenn"), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["constraints"] == ["weight_kib <= 4096"]  # edge-quad: 4 x 1 MiB on chip
    for r in rows(tmp_path / "eenn"):
        overhead, efficiency = float(r["exit_overhead"]), float(r["dynamic_efficiency"])
        assert overhead >= 0 and efficiency < 1
        if float(r["exit_rate_final"]) == 1.0:      # no input leaves early: heads are pure overhead
            assert (overhead > 0) == any(json.loads(r["arch"])[f"exit_s{i}"] for i in (1, 2))
        # each exit's own accuracy, for the exits the network has
        assert [r[f"exit_acc_s{i}"] != "" for i in (1, 2)] == [bool(json.loads(r["arch"])[f"exit_s{i}"]) for i in (1, 2)]
        assert all(0 <= float(r[f"exit_acc_{e}"]) <= 100 for e in ("s1", "s2", "final") if r[f"exit_acc_{e}"])
    result = search("--preset", "eenn", *TINY, "--pin", STATIC_INT8, "--run-dir", str(tmp_path / "static"))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((tmp_path / "static" / "config.yaml").read_text())["pin"]["backbone_bits"] == 8
    for r in rows(tmp_path / "static"):
        arch = json.loads(r["arch"])
        assert arch["backbone_bits"] == 8 and arch["exit_s1"] == arch["exit_s2"] == 0
        assert float(r["exit_overhead"]) == 0 and float(r["dynamic_efficiency"]) == pytest.approx(0, abs=1e-9)
        assert float(r["exit_rate_final"]) == 1.0


def test_benchmark_also_searches_the_early_exit_network_with_every_bit_width_at_int8(bench_module):
    from nasctl.spaces.loader import load_space

    bench = bench_module("eenn")
    searches = bench.plan({"space": "ee-mbv2", "seed": 0}, load_space("ee-mbv2"))
    assert list(searches) == ["eenn", "eenn-int8", "static-int8", "static-fp32"]
    assert "pin" not in searches["eenn"]
    # bits at 8, backbone and exit heads; exits and their thresholds left to the search
    assert searches["eenn-int8"]["pin"] == {"backbone_bits": 8, "exit_bits": 8}
    static = searches["static-int8"]["pin"]
    assert static["backbone_bits"] == 8 and static["exit_s1"] == static["exit_s2"] == 0


def test_benchmark_reports_the_exits_saving_apart_from_the_bits_saving(bench_module):
    from types import SimpleNamespace

    def row(trial, accuracy, edp, backbone_bits, exit_bits=8, s1=0.0):
        return {"trial": trial, "accuracy": accuracy, "edp": edp, "latency_ms": 1.0, "energy_mj": 1.0,
                "exit_overhead": 0.0, "dynamic_efficiency": 0.0, "exit_rate_s1": s1, "exit_rate_s2": 0.0,
                "exit_rate_final": 1 - s1, "feasible": True,
                "arch": json.dumps({"backbone_bits": backbone_bits, "exit_bits": exit_bits})}

    def run(*rows):
        return SimpleNamespace(trials=list(rows), feasible=list(rows), front=list(rows))

    done = {"eenn": run(row(0, 98.4, 1.0, 4, 4, 0.6)),             # int4 and exits
            "eenn-int8": run(row(0, 98.6, 3.0, 8, 8, 0.5)),        # exits alone
            "static-int8": run(row(0, 99.0, 10.0, 8), row(1, 98.5, 5.0, 8)),
            "static-fp32": run(row(0, 99.0, 100.0, 32))}
    result = bench_module("eenn").summarize(done)
    # the chosen eenn point (98.4%) against the lowest-EDP static int8 network at least as accurate (98.5%, EDP 5)
    assert result["edp"] == 1.0 and result["edp_reduction_vs_static_int8"] == pytest.approx(0.8)
    # the int8 early-exit point (98.6%) against the static int8 network at least as accurate (99.0%, EDP 10)
    exits = result["exits_int8"]
    assert exits["arch"] == {"backbone_bits": 8, "exit_bits": 8} and exits["exit_rates"]["s1"] == 0.5
    assert exits["matched_static_int8"] == {"trial": 0, "accuracy": 99.0, "edp": 10.0}
    assert exits["edp_reduction_vs_static_int8"] == pytest.approx(0.7)
    assert exits["edp_reduction_vs_static_fp32"] == pytest.approx(0.97)
