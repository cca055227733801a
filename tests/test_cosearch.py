"""`nasctl search --co-search`: the device's knobs searched with the network."""

import csv
import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware.loader import load_device
from nasctl.report import layer_rows
from nasctl.runs import load as load_run
from nasctl.spaces.cosearch import co_search
from nasctl.spaces.loader import load_space

runner = CliRunner()
NB201_CELL = ("edge_1_0=nor_conv_3x3,edge_2_0=nor_conv_3x3,edge_2_1=skip_connect,edge_3_0=nor_conv_1x1,"
              "edge_3_1=avg_pool_3x3,edge_3_2=nor_conv_3x3")


def test_co_search_space_prices_each_candidate_on_its_own_accelerator():
    device = load_device("edge-quad")
    space = co_search(load_space("nb201"), device, "edge-quad")
    assert [v.name for v in space.variables()][-4:] == ["hw_cores", "hw_mac_array", "hw_weight_sram_kib",
                                                        "hw_act_sram_kib"]
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(4)]
    lat, en = space.path_costs(device, archs, (3, 32, 32), 10)
    for i, arch in enumerate(archs):
        net, hw = space.split(arch)
        report = device.derive(hw).estimate(space.inner.to_layers(net, (3, 32, 32), 10))
        assert lat[i, 0] == pytest.approx(report.latency_ms) and en[i, 0] == pytest.approx(report.energy_mj)


def test_co_search_records_the_accelerator_and_its_area_per_trial(table, tmp_path):
    path, _ = table
    result = runner.invoke(app, ["search", "--space", "nb201", "--device", "edge-quad", "--co-search",
                                 "--accuracy", f"table:{path}:acc", "--pin", NB201_CELL, "--budget", "6",
                                 "--max-weight-kib", "device", "--run-dir", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["constraints"] == ["weight_kib <= weight_capacity_kib"]
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["objectives"] == ["accuracy", "edp", "area_mm2"] and config["co_search"] is True
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    device = load_device("edge-quad")
    for r in rows:
        hw = {k.removeprefix("hw_"): v for k, v in json.loads(r["arch"]).items() if k.startswith("hw_")}
        derived = device.derive(hw)
        assert float(r["area_mm2"]) == pytest.approx(derived.spec.area_mm2, rel=1e-5)
        assert float(r["weight_capacity_kib"]) == derived.weight_capacity_bytes / 1024
        assert (r["feasible"] == "true") == (float(r["weight_kib"]) <= float(r["weight_capacity_kib"]))
    # one network (its knobs pinned), paired with six accelerators: one accuracy, six costs
    assert len({r["accuracy"] for r in rows}) == 1
    assert len({r["latency_ms"] for r in rows}) == len({r["arch"] for r in rows}) == 6
    # the report prices each layer on the trial's own accelerator: its costs add up to the trial's
    run = load_run(tmp_path / "run")
    for r in run.trials:
        layers = layer_rows(run, r)
        assert sum(lay.latency_ms for lay in layers) == pytest.approx(r["latency_ms"], rel=1e-5)
        assert sum(lay.energy_mj for lay in layers) == pytest.approx(r["energy_mj"], rel=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--device", "edge-single", "--co-search"],
     "device 'edge-single' has no co_search section; --co-search needs one listing choices"),
    (["--device", "h100", "--co-search"], "device 'h100' is not an analytical accelerator; --co-search needs one"),
    (["--objectives", "accuracy,area_mm2"], "objective area_mm2 is the chip area of a co-searched accelerator"),
])
def test_bad_co_search_settings_are_one_line(table, tmp_path, args, message):
    path, _ = table
    result = runner.invoke(app, ["search", "--space", "nb201", *args, "--accuracy", f"table:{path}:acc",
                                 "--budget", "2", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
