"""`nasctl hw lut` and the optional ZigZag backend."""

import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import nasctl.cli.hw_lut  # noqa: F401  (registers `hw lut`)
from nasctl.cli import app
from nasctl.hardware.loader import load_device
from nasctl.hardware.lut import layer_from_row, read_lut
from nasctl.spaces.loader import load_space

runner = CliRunner()


def lut(tmp_path, *args):
    return runner.invoke(app, ["hw", "lut", "--space", "ee-mbv2", "--out", str(tmp_path / "lut.csv"), *args])


def test_analytical_table_holds_every_distinct_layer(tmp_path):
    result = lut(tmp_path, "--device", "eyeriss-like", "--samples", "3", "--seed", "1", "--json")
    assert result.exit_code == 0, result.output
    rows = read_lut(tmp_path / "lut.csv")
    space, device = load_space("ee-mbv2"), load_device("eyeriss-like")
    rng = np.random.default_rng(1)
    layers = {layer.shape_key(): layer
              for _ in range(3) for layer in space.to_layers(space.sample(rng), (3, 32, 32), 10)}
    assert len(rows) == len(layers) and {layer_from_row(r).shape_key() for r in rows} == set(layers)
    for row in rows:
        cost = device._layer_cost(layer_from_row(row))
        assert row["latency_ms"] == pytest.approx(cost.latency_ms, rel=1e-5)
        assert row["energy_mj"] == pytest.approx(cost.energy_mj, rel=1e-5)
    assert '"rows": %d' % len(rows) in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--device", "edge-single", "--backend", "magic"], "unknown backend 'magic'; allowed: analytical, zigzag"),
    (["--device", "edge-single", "--input-shape", "3x32x32"], "--input-shape '3x32x32'"),
    (["--device", "nope"], "unknown device 'nope'"),
    (["--device", "edge-single", "--samples", "0"], "--samples 0: "),
    (["--device", "h100", "--backend", "zigzag"], "prices analytical devices; 'h100' is not one"),
    (["--device", "eyeriss-like", "--backend", "zigzag"], "k x c x ox x oy MAC array"),
])
def test_user_errors_are_one_line(tmp_path, args, message):
    result = lut(tmp_path, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "lut.csv").exists()


def test_zigzag_backend_without_zigzag_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zigzag", None)  # import zigzag now fails, as when not installed
    result = lut(tmp_path, "--device", "edge-single", "--backend", "zigzag")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'nasctl[zigzag]'" in lines[0]


def test_analytical_latency_ranks_conv_layers_as_zigzag_does(tmp_path):
    """On edge-single (ZigZag's edge_tpu_like core), the distinct int8 conv layers of sampled
    ee-mbv2 networks (ZigZag's PEs have no precision scaling, so the width is held fixed)."""
    pytest.importorskip("zigzag")
    from scipy.stats import spearmanr

    from nasctl.hardware.zigzag_backend import zigzag_costs

    device, space = load_device("edge-single"), load_space("ee-mbv2")
    rng = np.random.default_rng(0)
    layers: dict = {}
    while len(layers) < 32:
        arch = {**space.sample(rng), "backbone_bits": 8, "exit_bits": 8}
        for layer in space.to_layers(arch, (3, 32, 32), 10):
            if layer.op == "conv":
                layers.setdefault(layer.shape_key()[:-1], layer)  # shapes, whatever the layer's name
    convs = list(layers.values())[:32]
    theirs = zigzag_costs(device, convs)
    ours = [device._layer_cost(layer) for layer in convs]
    rho = spearmanr([c.latency_ms for c in ours], [c.latency_ms for c in theirs]).statistic
    assert rho >= 0.8, rho
    # the CLI writes the same costs
    result = lut(tmp_path, "--device", "edge-single", "--backend", "zigzag", "--samples", "1")
    assert result.exit_code == 0, result.output
    rows = read_lut(tmp_path / "lut.csv")
    sampled = space.to_layers(space.sample(np.random.default_rng(0)), (3, 32, 32), 10)
    assert len(rows) == len({layer.shape_key() for layer in sampled if layer.op == "conv"})
    assert all(r["op"] == "conv" and r["latency_ms"] > 0 and r["energy_mj"] > 0 for r in rows)
