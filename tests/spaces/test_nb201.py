import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.errors import ConfigError, UsageError
from nasctl.spaces.loader import load_space
from nasctl.spaces.nb201 import OPS

# NAS-Bench-201 / HW-NAS-Bench tables: never copied into the project, read where they lie.
DATA = Path(os.environ.get("NASCTL_NB201_DIR") or Path(__file__).resolve().parents[3] / "shared/benchmarks/nb201")
KNOBS = ["edge_1_0", "edge_2_0", "edge_2_1", "edge_3_0", "edge_3_1", "edge_3_2"]


@pytest.fixture
def space():
    return load_space("nb201")


def _read(name: str) -> list[dict]:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"NB201 table {path} absent (set NASCTL_NB201_DIR to the folder holding it)")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def hw_table():
    return _read("hwnasbench_nb201.csv")


def test_knobs_and_size(space):
    assert [v.name for v in space.variables()] == KNOBS
    assert all(v.choices == OPS for v in space.variables())
    assert space.size() == 15_625


def test_sample_and_mutate_stay_valid_and_seeded(space):
    assert space.sample(np.random.default_rng(4)) == space.sample(np.random.default_rng(4))
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(100)]
    assert len({space.format_arch(a) for a in archs}) > 90
    for arch in archs:
        child = space.mutate(arch, rng)
        assert child != arch and space.validate(child) == child


def test_string_round_trip_over_the_table(space, hw_table):
    strings = [row["arch_str"] for row in hw_table]
    archs = [space.parse_arch(s) for s in strings]
    assert [space.format_arch(a) for a in archs] == strings
    assert len({space.format_arch(a) for a in archs}) == 15_625
    # the JSON form (trials.csv's `arch` column) reads back too
    assert space.parse_arch(json.dumps(archs[0])) == archs[0]


def test_parse_reads_edges_in_nb201_order(space):
    arch = space.parse_arch("|nor_conv_3x3~0|+|none~0|skip_connect~1|+|avg_pool_3x3~0|nor_conv_1x1~1|none~2|")
    assert arch == {"edge_1_0": "nor_conv_3x3", "edge_2_0": "none", "edge_2_1": "skip_connect",
                    "edge_3_0": "avg_pool_3x3", "edge_3_1": "nor_conv_1x1", "edge_3_2": "none"}


@pytest.mark.parametrize("text", [
    "|conv_5x5~0|+|none~0|none~1|+|none~0|none~1|none~2|",            # unknown op
    "|none~0|+|none~0|none~1|",                                        # a node missing
    "|none~0|+|none~1|none~0|+|none~0|none~1|none~2|",                 # sources out of order
    "|none~0|+|none~0|none~1|+|none~0|none~1|none~2",                  # no closing bar
    "|none~0|none~0|none~1|none~0|none~1|none~2|",                     # no node separators
    "|none|+|none~0|none~1|+|none~0|none~1|none~2|",                   # no source
])
def test_bad_nb201_string_is_one_line_naming_it_and_the_format(space, text):
    with pytest.raises(UsageError) as e:
        space.parse_arch(text)
    msg = str(e.value)
    assert "\n" not in msg and text in msg and "|op~0|+|op~0|op~1|+|op~0|op~1|op~2|" in msg


def test_bad_json_architecture_names_it(space):
    with pytest.raises(UsageError, match="'edge_1_0=none' is not a JSON object"):
        space.parse_arch("edge_1_0=none")
    with pytest.raises(UsageError, match="edge_1_0.*conv.*one of"):
        space.parse_arch(json.dumps({k: "conv" for k in KNOBS}))


def test_layer_macs_equal_the_published_flops(space, hw_table):
    rows = [hw_table[i] for i in np.random.default_rng(0).choice(len(hw_table), 200, replace=False)]
    for row in rows:
        layers = space.to_layers(space.parse_arch(row["arch_str"]), (3, 32, 32), 10)
        macs = sum(layer.macs for layer in layers)
        assert macs == pytest.approx(float(row["cifar10_flops_M"]) * 1e6, rel=1e-6), row["arch_str"]


def test_degenerate_architectures_match_the_table(space, hw_table):
    degenerate = {row["arch_str"] for row in hw_table if space.is_degenerate(space.parse_arch(row["arch_str"]))}
    assert len(degenerate) == 341
    # NB201 trains exactly those to chance accuracy: their cell ignores its input
    chance = {row["arch_str"] for row in _read("nb201_acc.csv") if float(row["cifar10_test"]) == 10.0}
    assert degenerate == chance


def _arch(op_all: str, **over) -> dict:
    return {**{k: op_all for k in KNOBS}, **over}


def test_layer_list_follows_the_nb201_skeleton(space):
    layers = space.to_layers(_arch("nor_conv_3x3"), (3, 32, 32), 100)
    convs = [lay for lay in layers if lay.op == "conv" and ".edge_" in lay.name]
    assert len(convs) == 6 * 15 and all(lay.fn == "relu" and lay.kernel == (3, 3) for lay in convs)
    assert {(lay.in_ch, lay.in_hw) for lay in convs} == {(16, (32, 32)), (32, (16, 16)), (64, (8, 8))}
    adds = [lay for lay in layers if lay.op == "add"]
    assert len(adds) == (0 + 1 + 2) * 15 + 2  # node j sums j edges; plus the two reduction blocks
    reduce = [lay for lay in layers if lay.name.startswith("reduce1.")]
    assert [(lay.op, lay.stride, lay.out_hw) for lay in reduce] == [
        ("conv", 2, (16, 16)), ("conv", 1, (16, 16)), ("pool", 2, (16, 16)), ("conv", 1, (16, 16)), ("add", 1, (16, 16))]
    assert [lay.op for lay in layers[-3:]] == ["act", "pool", "linear"] and layers[-1].out_ch == 100


def test_skip_and_none_emit_nothing_pools_do(space):
    layers = space.to_layers(_arch("skip_connect", edge_3_2="avg_pool_3x3", edge_1_0="none"), (3, 32, 32), 10)
    cell = [lay for lay in layers if lay.name.startswith("stage")]
    pools = [lay for lay in cell if lay.op == "pool"]
    assert len(pools) == 15 and all(p.fn == "avg" and p.kernel == (3, 3) and p.stride == 1 for p in pools)
    # node 1 has no input (none); node 2 sums 2 edges; node 3 sums 3 edges
    assert sum(lay.op == "add" for lay in cell) == (1 + 2) * 15


def test_degenerate_detection(space):
    assert space.is_degenerate(_arch("none"))
    assert space.is_degenerate(_arch("nor_conv_3x3", edge_3_0="none", edge_3_1="none", edge_3_2="none"))
    assert space.is_degenerate(_arch("skip_connect", edge_1_0="none", edge_2_0="none", edge_3_0="none"))
    assert not space.is_degenerate(_arch("none", edge_2_0="nor_conv_1x1", edge_3_2="avg_pool_3x3"))


def test_input_that_cannot_be_halved_is_refused(space):
    with pytest.raises(UsageError, match="input 30x30 must be divisible by 4"):
        space.to_layers(_arch("skip_connect"), (3, 30, 30), 10)


def test_built_network_matches_the_layer_list_and_nb201_params(space):
    import torch

    arch = space.parse_arch("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
    model = space.build(arch, (3, 32, 32), 10)
    # NB201 publishes 0.802426 M parameters for this cell (arch_index 1) at C=16, N=5
    assert sum(p.numel() for p in model.parameters()) == 802_426
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == \
        sum(lay.op == "conv" for lay in space.to_layers(arch, (3, 32, 32), 10))
    torch.manual_seed(0)
    out = space.build(arch, (1, 8, 8), 5)(torch.randn(2, 1, 8, 8))
    assert len(out) == 1 and out[0].shape == (2, 5)
    dead = space.build(_arch("none"), (1, 8, 8), 5)(torch.randn(2, 1, 8, 8))[0]
    assert torch.allclose(dead[0], dead[1])  # a degenerate cell ignores its input


def test_layer_params_are_the_built_network_with_batch_norm_folded(space):
    import torch

    arch = space.parse_arch("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|"
                            "+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
    model = space.build(arch, (3, 32, 32), 10)
    bns = [m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # each batch norm but the last (before the classifier) folds into the conv before it as
    # its bias; the reduction shortcut's 1x1 conv has neither
    deployed = sum(p.numel() for p in model.parameters()) - 2 * sum(bns) + sum(bns[:-1])
    assert sum(lay.params for lay in space.to_layers(arch, (3, 32, 32), 10)) == deployed == 800_410


def test_spec_restricts_ops_and_rejects_unknown_ones(tmp_path):
    small = _variant(tmp_path, ops=["skip_connect", "nor_conv_3x3"])
    assert small.size() == 2 ** 6
    with pytest.raises(UsageError, match="avg_pool_3x3"):
        small.parse_arch("|avg_pool_3x3~0|+|skip_connect~0|skip_connect~1|+|skip_connect~0|skip_connect~1|skip_connect~2|")
    with pytest.raises(ConfigError, match="ops: .*sep_conv_3x3"):
        _variant(tmp_path, ops=["skip_connect", "sep_conv_3x3"])
    with pytest.raises(ConfigError, match="unused_ops"):
        _variant(tmp_path, unused_ops="prune")


def _variant(tmp_path, **over):
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "search_spaces/nb201.yaml").read_text())
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump({**spec, **over}))
    return load_space(str(path))


def test_unused_ops_can_be_dropped(space, tmp_path):
    drop = _variant(tmp_path, unused_ops="drop")
    # node 2's convs reach the output only through a `none` edge; node 3 = skip(node 0)
    dead = "|avg_pool_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|none~1|none~2|"
    bare = "|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|"
    assert drop.cell_edges(drop.parse_arch(dead)) == [(3, 0, "skip_connect")]
    assert space.cell_edges(space.parse_arch(dead)) == [
        (1, 0, "avg_pool_3x3"), (2, 0, "nor_conv_3x3"), (2, 1, "nor_conv_3x3"), (3, 0, "skip_connect")]
    shape = (3, 32, 32)
    assert [lay.shape_key() for lay in drop.to_layers(drop.parse_arch(dead), shape, 10)] == \
        [lay.shape_key() for lay in space.to_layers(space.parse_arch(bare), shape, 10)]
    assert sum(lay.op == "conv" for lay in space.to_layers(space.parse_arch(dead), shape, 10)) == 1 + 2 * 3 + 2 * 15  # stem, reductions, cells
    assert sum(p.numel() for p in drop.build(drop.parse_arch(dead), shape, 10).parameters()) == \
        sum(p.numel() for p in space.build(space.parse_arch(bare), shape, 10).parameters())
    # every edge of a connected cell reaches the output: nothing to drop
    full = "|nor_conv_3x3~0|+|nor_conv_1x1~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
    assert drop.to_layers(drop.parse_arch(full), shape, 10) == space.to_layers(space.parse_arch(full), shape, 10)


def test_cli_space_show():
    result = CliRunner().invoke(app, ["space", "show", "nb201", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["size"] == 15_625 and doc["knobs"] == {k: list(OPS) for k in KNOBS}
    result = CliRunner().invoke(app, ["space", "show", "nb201"])
    assert result.exit_code == 0 and "15,625 architectures" in result.stdout and "edge_3_2" in result.stdout


@pytest.mark.parametrize("cell, runs", [
    # node 1 unused, one conv's output, node 2 live: the conv runs
    ("|nor_conv_3x3~0|+|skip_connect~0|none~1|+|skip_connect~0|none~1|skip_connect~2|", [(1, 0, "nor_conv_3x3")]),
    # node 2 unused, one conv's output: runs
    ("|skip_connect~0|+|nor_conv_1x1~0|none~1|+|none~0|skip_connect~1|none~2|", [(2, 0, "nor_conv_1x1")]),
    # node 1 a lone conv, node 2 unused with no input: node 1 runs
    ("|nor_conv_3x3~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|", [(1, 0, "nor_conv_3x3")]),
    # both unused, each one conv's output from node 0: neither runs
    ("|nor_conv_3x3~0|+|nor_conv_3x3~0|none~1|+|skip_connect~0|none~1|none~2|", []),
    # node 1 a lone conv, node 2 unused pooling node 0: neither runs
    ("|nor_conv_3x3~0|+|avg_pool_3x3~0|none~1|+|skip_connect~0|none~1|none~2|", []),
    # node 2's one input a conv reading node 1, a lone conv: both run
    ("|nor_conv_3x3~0|+|none~0|nor_conv_1x1~1|+|skip_connect~0|none~1|none~2|",
     [(1, 0, "nor_conv_3x3"), (2, 1, "nor_conv_1x1")]),
    # an unused node summing two edges: left out, as with `drop`
    ("|skip_connect~0|+|nor_conv_3x3~0|nor_conv_1x1~1|+|skip_connect~0|skip_connect~1|none~2|", []),
])
def test_lone_convs_keeps_the_conv_of_an_unused_node_fed_by_it_alone(tmp_path, cell, runs):
    import torch

    lone, drop = _variant(tmp_path, unused_ops="lone-convs"), _variant(tmp_path, unused_ops="drop")
    arch = lone.parse_arch(cell)
    assert lone.cell_edges(arch) == sorted(drop.cell_edges(arch) + runs, key=lambda e: (e[0], e[1]))
    shape = (3, 32, 32)
    layers = lone.to_layers(arch, shape, 10)
    assert sum(lay.op == "conv" for lay in layers) == 1 + 2 * 3 + 15 * sum(op.startswith("nor_conv") for *_, op in
                                                                            lone.cell_edges(arch))
    built = lone.build(arch, shape, 10)  # the network runs the same convs
    assert sum(isinstance(m, torch.nn.Conv2d) for m in built.modules()) == sum(lay.op == "conv" for lay in layers)
