"""A user adds a search space and a device as YAML files in a workspace and searches with them."""

import csv
import json

import yaml
from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()

TINY_SPACE = {
    "name": "tiny-mbv2",
    "kind": "mbv2",
    "description": "two stages, one optional exit",
    "stem": {"channels": 8},
    "stages": [{"depth": [1, 2], "channels": [8, 16], "expand": [1, 2], "kernel": 3},
               {"depth": 1, "channels": [16, 24], "expand": 2, "kernel": [3, 5], "stride": 2}],
    "head": {"channels": 32},
    "exits": {"after_stages": [1], "width": [8, 16]},
    "quantization": {"backbone_bits": [8, 4], "exit_bits": [8]},
}


def make_workspace(root, tmp_path):
    ws = tmp_path / "ws"
    (ws / "search_spaces").mkdir(parents=True)
    (ws / "hardware").mkdir()
    (ws / "search_spaces" / "tiny-mbv2.yaml").write_text(yaml.safe_dump(TINY_SPACE))
    device = yaml.safe_load((root / "hardware" / "edge-quad.yaml").read_text())
    device.update(name="edge-dual", cores=2, description="two-core variant")
    (ws / "hardware" / "edge-dual.yaml").write_text(yaml.safe_dump(device))
    return ws


def test_workspace_entries_are_listed_with_origin(root, tmp_path, monkeypatch):
    ws = make_workspace(root, tmp_path)
    monkeypatch.setenv("NASCTL_WORKSPACE", str(ws))
    spaces = {e["name"]: e["origin"] for e in json.loads(runner.invoke(app, ["space", "list", "--json"]).stdout)}
    assert spaces["tiny-mbv2"] == "workspace" and spaces["ee-mbv2"] == "packaged"
    devices = {e["name"]: e["origin"] for e in json.loads(runner.invoke(app, ["hw", "list", "--json"]).stdout)}
    assert devices["edge-dual"] == "workspace" and devices["edge-quad"] == "packaged"


def test_a_workspace_device_says_what_it_hides_and_an_unreadable_spec_is_marked(root, tmp_path, monkeypatch):
    ws = make_workspace(root, tmp_path)
    (ws / "hardware" / "edge-quad.yaml").write_text((root / "hardware" / "edge-quad.yaml").read_text())
    (ws / "hardware" / "broken").mkdir()
    (ws / "hardware" / "broken" / "spec.yaml").write_text("kind: [unclosed\n")
    monkeypatch.setenv("NASCTL_WORKSPACE", str(ws))
    devices = {e["name"]: e for e in json.loads(runner.invoke(app, ["hw", "list", "--json"]).stdout)}
    assert devices["edge-quad"]["origin"] == "workspace" and devices["edge-quad"]["hides"] == ["packaged"]
    assert "hides" not in devices["edge-dual"]
    assert devices["broken"]["kind"] == "" and "is not valid YAML" in devices["broken"]["error"]
    table = runner.invoke(app, ["hw", "list"]).stdout
    assert "hides the packaged one" in table and "(spec cannot be read)" in table
    lut = tmp_path / "c.csv"
    lut.write_text("op,in_ch,out_ch,in_h,in_w,out_h,out_w,kernel_h,kernel_w,stride,groups,w_bits,a_bits,fn,"
                   "latency_ms\n" + "".join(f"conv,16,16,{hw},{hw},{hw},{hw},3,3,1,1,32,32,relu,{hw * 1e-3}\n"
                                            for hw in (8, 16, 32)))
    fitted = runner.invoke(app, ["hw", "fit", "--device", "eyeriss-like", "--lut", str(lut)])
    assert fitted.exit_code == 0 and "it hides the packaged device of that name" in fitted.stdout, fitted.output


def test_search_with_a_new_space_and_device(root, tmp_path):
    ws = make_workspace(root, tmp_path)
    result = runner.invoke(app, ["--workspace", str(ws), "search", "--space", "tiny-mbv2", "--device", "edge-dual",
                                 "--budget", "3", "--epochs", "1", "--json"])
    assert result.exit_code == 0, result.output
    run_dir = json.loads(result.stdout)["run_dir"]
    assert run_dir.startswith(str(ws / "runs"))
    with open(f"{run_dir}/trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert {k for k in rows[0] if k.startswith("exit_rate_")} == {"exit_rate_s1", "exit_rate_final"}
    for r in rows:
        assert set(json.loads(r["arch"])) >= {"s1_depth", "s2_channels", "exit_s1", "backbone_bits"}
