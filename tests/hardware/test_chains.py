"""Token kernels too short for onnxruntime's profiler, timed end to end in chains (`hw profile`)."""
import json
from dataclasses import replace

import numpy as np
import pytest

from nasctl.errors import UsageError
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import layer_from_row, row_from_layer
from nasctl.hardware.measure.chains import (CHAIN_LENGTHS, KEYS, SPLIT, attention_chain, attention_kernels,
                                            chain_kernels, chain_link, chain_network, chained_ms, chained_rows,
                                            heads_transpose, link_layers, measure_chains, token_layer, way_back)
from nasctl.hardware.onnx_import import import_onnx

SOFTMAX = LayerSpec("softmax", 2, 2, (16, 16), (16, 16))  # of 2 heads over 16 tokens
SCORES = LayerSpec("matmul", 16, 16, (16, 2), (16, 2), bias=False)  # 2 heads of 16 over 16 tokens
MIX = LayerSpec("matmul", 16, 16, (16, 2), (16, 2), bias=False)


@pytest.mark.parametrize("layer", [
    token_layer("linear", 16, 16, 4),
    token_layer("linear", 16, 64, 16, fn="gelu"),  # with its way back, as a transformer's MLP has it
    token_layer("norm", 32, 32, 16, fn="layer"),
    token_layer("add", 48, 48, 64),
    SOFTMAX,
    LayerSpec("matmul", 8, 4, (4, 4), (4, 4), bias=False),  # the scores' product: 4 heads of 8 over 4 tokens
    heads_transpose(64, 2, 24, SPLIT),
    heads_transpose(4, 2, 16, KEYS),
])
def test_a_chain_holds_the_kernel_as_often_as_asked_and_the_importer_reads_it_so(tmp_path, layer):
    back = way_back(layer)
    assert (back is None) == (layer.op != "linear" or layer.out_ch == layer.in_ch)
    if back is not None:
        assert (back.in_ch, back.out_ch, back.fn) == (layer.out_ch, layer.in_ch, "")
    link = [lay.shape_key() for lay in link_layers(layer)]
    assert layer.shape_key() in link
    if layer.op == "linear":
        assert sorted(link) == sorted({layer.shape_key()} | ({back.shape_key()} if back else set()))
    keys = {}
    for k in (2, 5):
        path = tmp_path / f"chain{k}.onnx"
        path.write_bytes(chain_network(layer, k).SerializeToString())
        keys[k] = [lay.shape_key() for lay in import_onnx(path).layers]
    # three more links, three more of each of the link's kernels and nothing else: the
    # slope over chain lengths is the link's
    for key in keys[5]:
        assert keys[5].count(key) - keys[2].count(key) == 3 * link.count(key)
    assert len(keys[5]) - len(keys[2]) == 3 * len(link)


@pytest.mark.parametrize("heads,width,patch", [(1, 16, 4), (2, 32, 2), (4, 48, 2)])
def test_the_attention_kernels_chained_are_those_an_ee_vit_block_holds(heads, width, patch):
    from nasctl.spaces.loader import load_space

    space = load_space("ee-vit")
    arch = {**space.sample(np.random.default_rng(0)), "heads": heads, "width": width, "patch": patch,
            "conv_stem": 0, "backbone_bits": 32, "exit_bits": 32}
    tokens = (8 // patch) ** 2
    attention = [lay.shape_key() for lay in space.to_layers(arch, (1, 8, 8), 10)
                 if lay.name.endswith((".heads", ".scores", ".softmax", ".mix", ".merge"))]
    assert len(attention) == 7 * sum(arch[f"g{g}_depth"] for g in (1, 2, 3))
    links = {lay.shape_key() for k in attention_kernels((tokens,), (width,), (heads,)) for lay in link_layers(k)}
    assert set(attention) <= links  # every attention kernel of its blocks is chained, the keys' transpose too


def test_every_kernel_a_profile_chains_can_be_built_and_other_token_counts_are_refused():
    kernels = chain_kernels()
    assert len({k.shape_key() for k in kernels}) == len(kernels) == 90 + 117
    assert {(k.op, k.fn) for k in kernels} == {("linear", ""), ("linear", "gelu"), ("norm", "layer"), ("add", ""),
                                              ("softmax", ""), ("matmul", ""), ("data", "transpose"),
                                              ("data", "strided"), ("data", "inner")}
    assert {k.in_ch if k.op == "data" else k.in_hw[0] for k in kernels} == {4, 16, 64}
    for k in kernels[::7]:
        chain_network(k, 2)
    with pytest.raises(ValueError, match="cannot chain a kernel of 9 tokens"):
        chain_network(token_layer("linear", 16, 16, 9), 2)
    with pytest.raises(ValueError, match="unknown attention chain 'heads': one of softmax, scores, split, keys"):
        attention_chain("heads", 16, 2, 8, 2)


def _entry(layer: LayerSpec, per_link_ms: float, base_ms: float = 0.01) -> dict:
    """A chain of `layer` (as `measure_chains` records it) whose links take `per_link_ms`."""
    return {"row": row_from_layer(layer, 0.0), "lengths": list(CHAIN_LENGTHS),
            "ms": [base_ms + per_link_ms * k for k in CHAIN_LENGTHS]}


def test_a_link_s_cost_is_shared_out_among_its_kernels_those_a_shorter_link_prices_first():
    plain, wide = token_layer("linear", 32, 32, 4), token_layer("linear", 32, 128, 4, fn="gelu")
    assert chained_ms(_entry(plain, 7.6e-4)) == pytest.approx(7.6e-4)
    assert chained_ms(_entry(wide, 3e-3)) == pytest.approx(3e-3)
    split = heads_transpose(16, 2, 16, SPLIT)
    projection = token_layer("linear", 32, 32, 16)
    link = link_layers(split)  # split, scores, softmax, mix, merge, the projection
    assert sorted(lay.shape_key() for lay in link if lay.op != "data") == sorted(
        lay.shape_key() for lay in (SCORES, SOFTMAX, MIX, projection))
    merge = next(lay for lay in link if lay.op == "data" and lay.shape_key() != split.shape_key())
    chains = [_entry(split, 9e-3), _entry(SCORES, 5e-3), _entry(plain, 7.6e-4),
              _entry(SOFTMAX, 1e-3), _entry(wide, 3e-3), _entry(projection, 1e-3)]
    assert [len(chain_link(e)) for e in chains] == [6, 3, 1, 1, 2, 1]
    rows = chained_rows(chains)
    got = {layer_from_row(r).shape_key(): r["latency_ms"] for r in rows}
    assert len(rows) == len(got)  # one row a kernel
    assert got == pytest.approx({
        plain.shape_key(): 7.6e-4, projection.shape_key(): 1e-3,
        wide.shape_key(): 1.5e-3, way_back(wide).shape_key(): 1.5e-3,  # a widening pair halves its link
        SOFTMAX.shape_key(): 1e-3,
        SCORES.shape_key(): 2e-3,  # (5 - 1) / 2: the scores' and the mix's product are of one shape here
        split.shape_key(): 1.5e-3, merge.shape_key(): 1.5e-3})  # (9 - 2 x 2 - 1 - 1) / 2
    # rows come in the chains' order, whatever order their costs were worked out in
    assert [layer_from_row(r).op for r in rows][:2] == ["data", "data"]


def test_chains_are_timed_for_real_and_each_link_adds_time():
    from nasctl.hardware.measure.runner import Protocol

    layer = token_layer("linear", 48, 192, 16, fn="gelu")
    (entry,) = measure_chains([layer], Protocol(rounds=4, repeats=2, warmup=1))
    assert entry["lengths"] == list(CHAIN_LENGTHS) and layer_from_row(entry["row"]).shape_key() == layer.shape_key()
    assert entry["ms"][0] < entry["ms"][1] < entry["ms"][2]
    assert 0 < chained_ms(entry) < 0.05


def _token_networks(n: int = 40, seed: int = 3):
    """Measured networks of convs and a 4-token linear layer whose profiled time is floored
    (0.1 µs), as onnxruntime's profiler leaves such a kernel; it takes 0.8 µs."""
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    rng = np.random.default_rng(seed)
    token = token_layer("linear", 32, 32, 4)
    nets = []
    for i in range(n):
        layers = [LayerSpec("conv", c, c, (hw, hw), (hw, hw), (3, 3), name=f"k{j}:conv")
                  for j, (c, hw) in enumerate(zip(rng.integers(8, 65, 4).tolist(), rng.integers(6, 17, 4).tolist()))]
        layers.append(replace(token, name="k9:linear"))
        times = [2e-3 + layer.macs * 1e-8 for layer in layers[:-1]] + [1e-4]
        nets.append(MeasuredNetwork(f"net {i}", layers, times, [1.0] * len(layers), 0.01 + sum(times[:-1]) + 8e-4))
    return token, nets


def test_chained_rows_take_the_place_of_the_profiled_rows_the_profiler_could_not_resolve(tmp_path):
    from nasctl.hardware.fit import MEASUREMENTS_FILE, write_device
    from nasctl.hardware.measure.profile import fit_profile, refit_profile

    token, nets = _token_networks()
    chains = [_entry(token, 8e-4), _entry(token_layer("norm", 32, 32, 4, fn="layer"), 5e-4)]
    plain = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]], chains)
    assert fitted.spec["measurement"]["chained_kernels"] == 2
    rows = [r for r in fitted.rows if layer_from_row(r).shape_key() == token.shape_key()]
    assert len(rows) == 1  # one row of that shape: the chained one, not the profiled ones beside it
    model = nets[0].layers  # (the run overhead goes to a model's first layer)
    assert fitted.device().estimate(model).costs[-1].latency_ms == pytest.approx(8e-4, rel=0.25)
    assert plain.device().estimate(model).costs[-1].latency_ms < 4e-4  # from the profiled rows: far too low

    folder = tmp_path / "hardware" / "cpu-local"
    write_device(folder, fitted)
    doc = json.loads((folder / MEASUREMENTS_FILE).read_text())
    assert doc["chains"] == chains  # saved beside the networks: a refit keeps them
    assert refit_profile("cpu-local", folder).rows == fitted.rows
    for broken in ({"row": {}}, {**chains[0], "row": {"op": "linear"}}):
        (folder / MEASUREMENTS_FILE).write_text(json.dumps({**doc, "chains": [broken]}))
        with pytest.raises(UsageError, match="cannot read the measured context networks"):
            refit_profile("cpu-local", folder)
