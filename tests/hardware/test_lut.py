from dataclasses import replace

import numpy as np
import pytest
import yaml

from nasctl.errors import ConfigError
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import (LUT_COLUMNS, LutDevice, LutSpec, features, layer_from_row, read_lut,
                                 row_from_layer, write_lut)


def conv(cin, cout, hw, k=3, stride=1, groups=1, fn="relu", bits=32):
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return LayerSpec("conv", cin, cout, (hw, hw), (out, out), (k, k), stride, groups, bits, bits, fn=fn)


def synthetic_rows(rng, n=80):
    """Conv kernels costing 1 µs + 1 ns per 100 MACs, with 3% noise; a few adds."""
    rows = []
    for _ in range(n):
        layer = conv(int(rng.choice([16, 32, 64])), int(rng.choice([16, 32, 64, 128])), int(rng.choice([8, 16, 32])),
                     k=int(rng.choice([1, 3])), stride=int(rng.choice([1, 2])))
        rows.append(row_from_layer(layer, (1e-3 + layer.macs * 1e-8) * rng.uniform(0.97, 1.03)))
    for hw in (8, 16, 32):
        add = LayerSpec("add", 32, 32, (hw, hw), (hw, hw))
        rows.append(row_from_layer(add, 1e-3 + add.in_elems * 1e-7))
    return rows


@pytest.fixture
def rows():
    return synthetic_rows(np.random.default_rng(0))


def device(rows, **spec):
    return LutDevice(LutSpec.model_validate({"name": "t", "kind": "lut", **spec}), rows)


def test_exact_hit_is_the_table_value_and_unseen_kernels_are_regressed(rows):
    dev = device(rows, overhead={"per_layer_ms": 0.0})
    first = layer_from_row(rows[0])
    cost = dev.estimate([first]).costs[0]
    assert cost.latency_ms == pytest.approx(rows[0]["latency_ms"]) and cost.mapping == "table"
    unseen = conv(48, 96, 24)
    cost = dev.estimate([unseen]).costs[0]
    assert "regressor" in cost.mapping
    assert cost.latency_ms == pytest.approx(1e-3 + unseen.macs * 1e-8, rel=0.15)


def test_regressed_conv_cost_is_positive_and_grows_with_macs(rows):
    dev = device(rows)
    sweep = [dev.estimate([conv(40, cout, 20)]).latency_ms for cout in (12, 24, 48, 96, 192, 384)]
    assert all(c > 0 for c in sweep)
    assert all(b >= a for a, b in zip(sweep, sweep[1:])) and sweep[-1] > 4 * sweep[0]


def test_ops_without_rows_are_unsupported(rows):
    report = device(rows).estimate([conv(8, 16, 8), LayerSpec("softmax", 10, 10, (1, 1), (1, 1))])
    assert report.unsupported == {"softmax": 1}


def test_overheads_per_layer_and_per_model(rows):
    plain, padded = device(rows), device(rows, overhead={"per_model_ms": 0.05, "per_layer_ms": 0.002})
    layers = [layer_from_row(r) for r in rows[:5]]
    assert padded.estimate(layers).latency_ms == pytest.approx(plain.estimate(layers).latency_ms + 0.05 + 5 * 0.002)
    assert "run overhead" in padded.estimate(layers).costs[0].mapping


def test_energy_is_modelled_only_where_the_table_has_it(rows):
    assert not device(rows).models_energy and device(rows).estimate([conv(8, 16, 8)]).energy_mj is None
    with_energy = [{**r, "energy_mj": r["latency_ms"] * 2} for r in rows]
    dev = device(with_energy, models_energy=True)
    assert dev.estimate([layer_from_row(with_energy[0])]).energy_mj == pytest.approx(with_energy[0]["energy_mj"])
    with pytest.raises(ConfigError, match="energy_mj"):
        device(rows, models_energy=True)


def test_table_round_trip_and_loading_from_a_folder(tmp_path, rows):
    write_lut(tmp_path / "lut.csv", rows)
    assert (tmp_path / "lut.csv").read_text().splitlines()[0] == ",".join(LUT_COLUMNS)
    back = read_lut(tmp_path / "lut.csv")
    assert [layer_from_row(r) for r in back] == [layer_from_row(r) for r in rows]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"kind": "lut", "name": "t"}))
    dev = LutDevice.from_dict({"kind": "lut", "name": "t"}, tmp_path)
    assert dev.describe()["kernels"] == len({layer_from_row(r).shape_key() for r in rows})


def _set_first_latency(text, value):
    lines = text.splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + f",{value}"
    return "\n".join(lines) + "\n"


def test_table_that_is_not_utf8_fails_in_one_line(tmp_path, rows):
    write_lut(tmp_path / "lut.csv", rows)
    path = tmp_path / "lut.csv"
    path.write_bytes(path.read_bytes().replace(b",relu,", b",r\xe9lu,", 1))
    with pytest.raises(ConfigError, match=r"lut.csv: is not UTF-8 text \(byte 0xe9 at offset \d+\)") as info:
        read_lut(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("edit, message", [
    (lambda text: text.replace("kernel_w,", "", 1), "missing column kernel_w"),
    (lambda text: text.replace("conv,", "convolution,", 1), "op 'convolution' is not one of"),
    (lambda text: text.replace(",relu,", ",relu,fast", 1), "latency_ms 'fast"),
    (lambda text: _set_first_latency(text, "inf"), "line 2: latency_ms 'inf' is not a finite number"),
    (lambda text: _set_first_latency(text, "nan"), "line 2: latency_ms 'nan' is not a finite number"),
    # a number near the float limits made the fits overflow (a traceback, and a device half written)
    (lambda text: _set_first_latency(text, "1e-309"), r"line 2: latency_ms 1e-309 is below 1e-06"),
    (lambda text: text.replace("\n", "\nconv,3,16\n", 1), "line 2: 3 fields, the header has 15"),
    (lambda text: "\n".join(line + ",extra" * (i == 1) for i, line in enumerate(text.splitlines())),
     "line 2: 16 fields, the header has 15"),
    (lambda text: text.replace("in_ch", "latency_ms", 1), "the column 'latency_ms' appears twice"),
    (lambda text: "\n".join([text.splitlines()[0], "conv,3,16,8,8,8,8,3,3,1,2,32,32,relu,0.01"]),
     "line 2: groups 2 does not divide in_ch 3 and out_ch 16"),
])
def test_malformed_tables_fail_in_one_line(tmp_path, rows, edit, message):
    write_lut(tmp_path / "lut.csv", rows)
    path = tmp_path / "lut.csv"
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError, match=message) as info:
        read_lut(path)
    assert "\n" not in str(info.value)


def test_features_tell_depthwise_and_activations_apart():
    dense, depthwise = conv(32, 32, 16), conv(32, 32, 16, groups=32)
    f = features([dense, depthwise])
    assert f.shape[0] == 2 and not np.array_equal(f[0], f[1])
    assert not np.array_equal(features([conv(32, 32, 16, fn="gelu")]), features([dense]))


def test_features_grade_channel_alignment_to_vector_blocks():
    from nasctl.hardware.lut import FEATURES

    col = FEATURES.index("out_ch_align")
    levels = features([conv(c, c, 8, groups=c) for c in (58, 116, 24, 48, 96)])[:, col]
    assert list(levels) == [1, 2, 3, 4, 4]  # 2, 4, 8 and whole blocks of 16


def test_features_of_a_batch_are_each_layers_own(rows):
    """A layer's features do not depend on the layers priced beside it (they are computed
    column by column over the batch): the profile's kernels and layers of every sub-kind,
    in one batch and one at a time, give the same matrix; no layers give no rows."""
    from nasctl.hardware.lut import FEATURES

    layers = [layer_from_row(r) for r in rows] + [conv(3, 16, 32, stride=2), conv(24, 24, 8, groups=24, bits=8),
                                                  conv(32, 32, 16, fn="gelu")]
    batch = features(layers)
    assert batch.shape == (len(layers), len(FEATURES))
    assert np.array_equal(batch, np.vstack([features([layer]) for layer in layers]))
    assert features([]).shape == (0, len(FEATURES))
    # each column where its name says: a strided stem conv and a gelu conv, read by name
    stem, gelu = features([layers[-3], layers[-1]])
    col = {name: i for i, name in enumerate(FEATURES)}
    assert stem[col["log_macs"]] == pytest.approx(np.log1p(layers[-3].macs))
    assert stem[col["stride"]] == 2 and stem[col["log_in_ch"]] == pytest.approx(np.log1p(3))
    assert gelu[col["fn_gelu"]] == 1 and stem[col["fn_gelu"]] == 0 and gelu[col["log_copies"]] == 0


def test_kernels_that_run_dequantized_are_priced_apart_or_as_fused(rows, tmp_path):
    from dataclasses import replace

    fused = [row_from_layer(conv(c, c, 16, bits=8), 1e-3 * c) for c in (8, 16, 32, 64)]
    apart = [{**r, "dequantized": 1, "latency_ms": 4 * r["latency_ms"]} for r in fused]
    write_lut(tmp_path / "lut.csv", rows + fused + apart)
    table = read_lut(tmp_path / "lut.csv")
    assert sum(r.get("dequantized", 0) for r in table) == 4
    layer = conv(24, 24, 16, bits=8)
    both, fused_only = device(table), device(rows + fused)
    assert both.estimate([replace(layer, dequantized=True)]).latency_ms > 2 * both.estimate([layer]).latency_ms
    # A table without dequantized kernels prices them as fused ones.
    assert fused_only.estimate([replace(layer, dequantized=True)]).latency_ms == \
        pytest.approx(fused_only.estimate([layer]).latency_ms)
    (tmp_path / "bad.csv").write_text((tmp_path / "lut.csv").read_text().replace(",1\n", ",yes\n", 1))
    with pytest.raises(ConfigError, match="dequantized 'yes' is not 0 or 1"):
        read_lut(tmp_path / "bad.csv")


def test_bit_widths_the_table_lacks_are_priced_as_float_kernels(rows):
    from dataclasses import replace

    dev = device(rows)  # float kernels only
    layer = conv(24, 48, 16)
    mixed = replace(layer, w_bits=32, a_bits=8, dequantized=True)  # float weights on quantized activations
    assert dev.estimate([mixed]).latency_ms == pytest.approx(dev.estimate([layer]).latency_ms)
    assert not dev.estimate([mixed]).unsupported


def test_fitted_regressors_are_saved_beside_the_table_and_reused_only_for_it(tmp_path, rows):
    import json

    from nasctl.hardware.fit import FittedDevice, write_device

    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "boost", "add": "ridge"}}
    write_device(tmp_path, FittedDevice("t", spec, rows))
    saved = json.loads((tmp_path / "regressors.json").read_text())
    # (three add rows are too few for ridge: additive)
    kinds = {k: json.loads(v)["kind"] for k, v in saved["types"].items()}
    assert kinds["conv"] == "boost" and kinds["add"] == "additive"
    unseen = [conv(48, 96, 24), conv(20, 40, 12, k=1), LayerSpec("add", 32, 32, (12, 12), (12, 12))]
    fitted = device(read_lut(tmp_path / "lut.csv"), **spec).estimate(unseen)  # fitted from the table
    loaded = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert loaded._saved  # the saved regressors are used: no fitting
    assert loaded.estimate(unseen).latency_ms == pytest.approx(fitted.latency_ms, rel=1e-9)
    # the table's distinct kernels come from the saved file too (faster than the CSV), as the CSV gives them
    from_csv = device(read_lut(tmp_path / "lut.csv"), **spec)
    assert saved["format"] == 8 and loaded._exact == from_csv._exact
    assert sorted(loaded._rows) == sorted(from_csv._rows)
    assert all(loaded._rows[k] == from_csv._rows[k] for k in from_csv._rows)
    # so is the largest kernel of each type (what decides whether a type covers a layer)
    assert loaded._largest == {k: device(read_lut(tmp_path / "lut.csv"), **spec)._largest_work(k)
                               for k in saved["largest"]}
    assert set(saved["largest"]) == set(loaded._rows)
    # another table (one row's time changed) ignores them and refits
    changed = [{**rows[0], "latency_ms": rows[0]["latency_ms"] * 2}, *rows[1:]]
    write_lut(tmp_path / "lut.csv", changed)
    again = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert not again._saved
    refitted = device(read_lut(tmp_path / "lut.csv"), **spec).estimate(unseen)
    assert again.estimate(unseen).latency_ms == pytest.approx(refitted.latency_ms, rel=1e-9)


def test_kernels_far_beyond_their_types_rows_are_priced_from_a_type_that_covers_them(rows):
    # quantized, dequantized sigmoids measured only on tiny tensors (their time is fixed
    # cost): a large one is priced from the float kernels, which cover its size
    tiny = [row_from_layer(LayerSpec("act", c, c, (1, 1), (1, 1), w_bits=8, a_bits=8, fn="sigmoid", dequantized=True),
                           2e-3 + c * 1e-4) for c in (8, 16, 32, 64, 128, 360)]
    floats = [row_from_layer(LayerSpec("act", c, c, (hw, hw), (hw, hw), fn="sigmoid"), 1e-3 + c * hw * hw * 1e-7)
              for c in (16, 64, 256) for hw in (8, 32, 112)]
    dev = device(rows + tiny + floats)
    big = LayerSpec("act", 96, 96, (112, 112), (112, 112), w_bits=8, a_bits=8, fn="sigmoid", dequantized=True)
    assert dev.estimate([big]).latency_ms < 3 * (1e-3 + 96 * 112 * 112 * 1e-7)
    small = LayerSpec("act", 48, 48, (1, 1), (1, 1), w_bits=8, a_bits=8, fn="sigmoid", dequantized=True)
    assert dev.estimate([small]).latency_ms == pytest.approx(2e-3 + 48 * 1e-4, rel=0.3)  # from its own rows


def test_a_type_of_a_few_large_rows_does_not_price_a_far_smaller_kernel(rows):
    # one int8 softmax measured, of 4 x 1601 x 1601 elements (20.8 ms): fitted to one row,
    # its additive model can hold all of it as fixed cost and price a 3 x 101 x 101 one at
    # 20.8 ms too.  That one is priced from the float softmaxes, which cover its size.
    def softmax(heads, tokens, bits=32):
        return LayerSpec("softmax", heads, heads, (tokens, tokens), (tokens, tokens), w_bits=bits, a_bits=bits)

    huge = [row_from_layer(softmax(4, 1601, 8), 20.8)]
    floats = [row_from_layer(softmax(h, t), 2e-3 + h * t * t * 2e-6) for h in (1, 3, 6) for t in (17, 50, 101, 197)]
    dev = device(rows + huge + floats)
    small = softmax(3, 101, 8)
    assert dev.estimate([small]).latency_ms == pytest.approx(2e-3 + 3 * 101 * 101 * 2e-6, rel=0.3)
    assert dev.estimate([softmax(4, 1601, 8)]).latency_ms == pytest.approx(20.8, rel=0.3)  # its own row's size


def dq_act(c, hw, fn):
    return LayerSpec("act", c, c, (hw, hw), (hw, hw), w_bits=8, a_bits=8, fn=fn, dequantized=True)


def test_a_large_kernel_is_priced_from_rows_of_its_own_computation(rows):
    # dequantized sigmoids measured only on tiny tensors, beside two large dequantized gelus
    # of the same kernel type: the gelus do not make the type cover a large sigmoid, which
    # is priced from the float sigmoids
    tiny = [row_from_layer(dq_act(c, 1, "sigmoid"), 2e-3 + c * 1e-4) for c in (8, 16, 32, 64, 128, 360)]
    gelu = [row_from_layer(dq_act(c, hw, "gelu"), 2e-3 + c * hw * hw * 4e-7) for c, hw in ((96, 48), (192, 48))]
    floats = [row_from_layer(LayerSpec("act", c, c, (hw, hw), (hw, hw), fn="sigmoid"), 1e-3 + c * hw * hw * 1e-7)
              for c in (16, 64, 256) for hw in (8, 32, 112)]
    dev = device(rows + tiny + gelu + floats)
    big = dq_act(96, 112, "sigmoid")
    assert dev.estimate([big]).latency_ms == pytest.approx(1e-3 + 96 * 112 * 112 * 1e-7, rel=0.3)
    large_gelu = dq_act(128, 64, "gelu")  # its own type's gelus cover it
    assert dev.estimate([large_gelu]).latency_ms == pytest.approx(2e-3 + 128 * 64 * 64 * 4e-7, rel=0.3)


def test_a_price_beyond_the_largest_kernel_grows_at_most_twice_as_fast_as_their_work(rows):
    # a regressor that extrapolates a hundredfold past the largest measured kernels (here one
    # that prices every layer at 1 s) is held to twice their time per unit of work (the
    # per-kernel offset and the working set add nothing here)
    gelu = [row_from_layer(dq_act(c, hw, "gelu"), 2e-3 + c * hw * hw * 4e-7) for c, hw in ((16, 8), (32, 16),
                                                                                         (64, 32), (96, 48))]
    dev = device(rows + gelu)

    class Wild:
        def predict(self, layers):
            return np.full(len(layers), np.log(1000.0))

    dev._models["act_w8a8_dq"] = [Wild()]
    inside, beyond = dq_act(64, 40, "gelu"), dq_act(96, 112, "gelu")
    assert dev.estimate([inside]).latency_ms == pytest.approx(1000.0)  # within the measured sizes: as regressed
    # ms per element read or written: the median of the three largest kernels'
    rate = np.median([(2e-3 + c * hw * hw * 4e-7) / (2 * c * hw * hw) for c, hw in ((32, 16), (64, 32), (96, 48))])
    assert dev.estimate([beyond]).latency_ms == pytest.approx(2.0 * rate * 2 * 96 * 112 * 112, rel=0.05)


def test_an_activation_beyond_its_own_largest_kernels_costs_at_least_their_time_per_element(rows):
    # A type's regressor prices an activation from all its sub-kinds' rows: here one that
    # gives every layer a microsecond, as cheap relus many times larger could.  A gelu
    # beyond the table's largest gelus (their time per element 0.6 ns) is priced at least at
    # their rate; one within their sizes as regressed; and a sub-kind whose largest kernel
    # took under FLOOR_MIN_MS (fixed cost mostly) sets no floor.
    gelu = [row_from_layer(LayerSpec("act", c, c, (t, 1), (t, 1), fn="gelu"), c * t * 6e-7)
            for c, t in ((32, 49), (64, 196), (128, 196), (384, 144))]
    sigmoid = [row_from_layer(LayerSpec("act", c, c, (1, 1), (1, 1), fn="sigmoid"), 1e-3) for c in (8, 16, 32)]
    dev = device(rows + gelu + sigmoid)

    class Flat:
        def predict(self, layers):
            return np.full(len(layers), np.log(1e-3))

    dev._models["act"] = [Flat()]
    assert dev.FLOOR_MIN_MS == 0.01
    beyond = LayerSpec("act", 256, 256, (1600, 1), (1600, 1), fn="gelu")  # 410,000 elements, 7.4x the largest
    assert dev.estimate([beyond]).latency_ms == pytest.approx(256 * 1600 * 6e-7, rel=0.05)
    assert dev.estimate([LayerSpec("act", 64, 64, (100, 1), (100, 1), fn="gelu")]).latency_ms == pytest.approx(1e-3)
    assert dev.estimate([LayerSpec("act", 64, 64, (4, 4), (4, 4), fn="sigmoid")]).latency_ms == pytest.approx(1e-3)


def test_ridge_holds_a_new_layers_features_within_the_fitted_range():
    # Pools nearly all 2x2: the one 3x3 row, ten times dearer, gives the kernel-area feature a
    # steep weight; a 9x9 pool must not be extrapolated along it to an absurd price.
    from nasctl.hardware.lut import fit_regressor

    layers, values = [], []
    for i, hw in enumerate((8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112)):
        k = 3 if i == 5 else 2
        layers.append(LayerSpec("pool", 16, 16, (hw, hw), (hw // 2, hw // 2), (k, k), 2, fn="avg"))
        values.append((1e-3 + hw * hw * 16 * 1e-7) * (10 if k == 3 else 1))
    model = fit_regressor("ridge", layers, np.array(values))
    wide = LayerSpec("pool", 16, 16, (32, 32), (12, 12), (9, 9), 2, fn="avg")
    price = float(np.exp(model.predict([wide]))[0])
    assert np.isfinite(price) and price < 10 * max(values)


@pytest.mark.parametrize("kind", ["boost", "nearest"])
def test_small_kernels_between_measured_sizes_pay_their_fixed_cost(kind):
    # Linear kernels costing 1 µs + 0.1 ns per MAC, measured small (256-1024 MACs) and large
    # (from 64k MACs); one in between (4096-8192 MACs) is priced near 1.5 µs, not in
    # proportion to its work from the rate of the small ones' neighbours.
    from nasctl.hardware.lut import fit_regressor

    rng = np.random.default_rng(0)
    shapes = [(i, o, t) for i in (8, 16) for o in (8, 16) for t in (4,)] + \
             [(i, o, t) for i in (64, 128, 256) for o in (64, 128, 256) for t in (4, 16, 64)]
    layers = [LayerSpec("linear", i, o, (t, 1), (t, 1)) for i, o, t in shapes]
    values = np.array([(1e-3 + l.macs * 1e-7) * rng.uniform(0.97, 1.03) for l in layers])
    model = fit_regressor(kind, layers, values)
    mid = [LayerSpec("linear", 32, 32, (4, 1), (4, 1)), LayerSpec("linear", 32, 64, (4, 1), (4, 1))]
    prices = np.exp(model.predict(mid))
    assert prices == pytest.approx([1e-3 + l.macs * 1e-7 for l in mid], rel=0.25)


def test_a_batched_product_pays_a_fixed_cost_per_product():
    # Attention scores over heads: a product of two activations [heads, T, d] @ [heads, d, T]
    # costs 0.5 µs + 0.4 µs per head + 0.1 ns per MAC (one GEMM call per head).  Fitted on
    # 1- and 4-head rows, the additive regressor prices 2 and 8 heads within 5%: the same
    # MACs over more heads cost more.  Weights saved before the per-product term price as
    # they did (the term weighs nothing).
    from nasctl.hardware.lut import _Additive, _terms, fit_regressor

    def scores(tokens, width, heads):
        return LayerSpec("matmul", width // heads, tokens, (tokens, heads), (tokens, heads))

    truth = lambda l: 5e-4 + 4e-4 * l.in_hw[1] + 1e-7 * l.macs  # noqa: E731
    rng = np.random.default_rng(0)
    seen = [scores(t, w, h) for t in (5, 17, 65) for w in (16, 32, 64) for h in (1, 4)]
    model = fit_regressor("additive", seen, np.array([truth(l) * rng.uniform(0.98, 1.02) for l in seen]))
    new = [scores(t, 32, h) for t in (9, 37) for h in (2, 8)]
    assert np.exp(model.predict(new)) == pytest.approx([truth(l) for l in new], rel=0.05)
    old = _Additive().restore({"w": model.state["w"][:5]})
    assert np.exp(old.predict(new)) == pytest.approx(_terms(new)[:, :5] @ model.w[:5])


def test_a_transpose_is_priced_by_the_copies_it_makes():
    # onnxruntime's CPU transpose costs a fixed part plus a few ns per copy of a contiguous
    # block (the trailing dims it leaves in place), about the same for blocks of 3 to 24
    # floats (benchmarks/transposes.py); the costs here are of that form.  Fitted on transposes moving the innermost dim (a copy per element) and on
    # head splits of 24-channel heads, the additive regressor prices a head split of
    # 12-channel heads (64 copies of 768 elements) within 10%, not at the per-element rate.
    from nasctl.hardware.lut import (FEATURES, FEATURES_BEFORE_COPIES, _copies, _Additive, _Ridge, _terms, features,
                                     fit_regressor)

    def split(tokens, heads, d):  # (tokens, heads, d) -> (heads, tokens, d)
        return LayerSpec("data", tokens, heads, (heads, d), (tokens, d), fn="strided")

    def inner(a, b, c):  # (a, b, c) -> (c, b, a): the innermost dim moves
        return LayerSpec("data", a, c, (b, c), (b, a), fn="strided")

    assert _copies(split(16, 4, 12)) == 64 and _copies(inner(16, 4, 12)) == 768
    assert _copies(LayerSpec("data", 16, 48, (48, 1), (16, 1), fn="transpose")) == 768  # tokens <-> channels
    assert _copies(LayerSpec("linear", 16, 16, (16, 1), (16, 1))) == 0
    truth = lambda l: 4e-4 + 9e-6 * _copies(l) + 1e-7 * l.in_elems  # noqa: E731
    rng = np.random.default_rng(0)
    seen = [inner(a, b, c) for a in (4, 16, 36) for b in (4, 9) for c in (4, 12, 32)] + \
           [split(t, h, 24) for t in (16, 64, 196) for h in (2, 4)]
    model = fit_regressor("additive", seen, np.array([truth(l) * rng.uniform(0.98, 1.02) for l in seen]))
    new = [split(16, 4, 12), split(64, 4, 12), split(196, 8, 6)]
    assert np.exp(model.predict(new)) == pytest.approx([truth(l) for l in new], rel=0.10)
    # Regressors saved before the copies were counted price as they did (the new term and
    # feature weigh nothing); so do those saved before the last feature (fn erf).
    old = _Additive().restore({"w": model.state["w"][:6]})
    assert np.exp(old.predict(new)) == pytest.approx(_terms(new)[:, :6] @ model.w[:6])
    ridge = fit_regressor("ridge", seen, np.array([truth(l) for l in seen]))
    state = ridge.state
    trimmed = {**{k: state[k][:-1] for k in ("mu", "sd", "lo", "hi")}, "w": state["w"][:-2] + state["w"][-1:]}
    restored = _Ridge().restore(trimmed)
    assert restored.w.shape == (len(FEATURES) + 1,) and restored.w[-2] == 0
    Z = np.clip((features(new)[:, :-1] - restored.mu[:-1]) / restored.sd[:-1], restored.lo[:-1], restored.hi[:-1])
    assert restored.predict(new) == pytest.approx(Z @ np.array(state["w"][:-2]) + state["w"][-1])
    # A nearest-neighbour regressor is fitted again from the rows at load: one saved before
    # reads the features of its day, and so finds the neighbours it found then.
    values = np.array([truth(l) for l in seen])
    nearest = fit_regressor("nearest", seen, values)
    assert nearest.state["features"] == len(FEATURES)
    again = fit_regressor("nearest", seen, values, nearest.state)
    assert again.predict(new) == pytest.approx(nearest.predict(new))
    before = fit_regressor("nearest", seen, values, {"fixed_work": nearest.state["fixed_work"]})
    assert before.Z.shape[1] == FEATURES_BEFORE_COPIES == FEATURES.index("log_copies")


def test_per_kernel_offsets_apply_by_kernel_group_down_to_a_floor(rows):
    from nasctl.hardware.lut import KERNEL_FLOOR_MS, kernel_group

    plain = device(rows)
    shifted = device(rows, overhead={"per_kernel_ms": {"conv": 0.002, "add": -1.0}})
    c, a = layer_from_row(rows[0]), layer_from_row(rows[-1])
    assert kernel_group(c) == "conv" and kernel_group(a) == "add"
    assert kernel_group(conv(16, 16, 8, groups=16)) == "conv_dw" and kernel_group(conv(16, 16, 8, bits=8)) == "conv"
    assert shifted.estimate([c]).latency_ms == pytest.approx(plain.estimate([c]).latency_ms + 0.002)
    assert shifted.estimate([a]).latency_ms == pytest.approx(min(plain.estimate([a]).latency_ms, KERNEL_FLOOR_MS))
    dw = conv(16, 16, 8, groups=16)  # a group without an offset is priced as before
    assert shifted.estimate([dw]).latency_ms == pytest.approx(plain.estimate([dw]).latency_ms)


def test_a_working_set_scales_a_models_kernels_but_not_its_run_overhead(rows):
    from nasctl.hardware.lut import working_set_bytes

    small = [layer_from_row(r) for r in rows[:3]]
    big = small + [conv(512, 512, 8)]  # 9.4 MB of weights
    ref = working_set_bytes(small)
    plain = device(rows, overhead={"per_model_ms": 0.01})
    scaled = device(rows, overhead={"per_model_ms": 0.01, "working_set": {"ref_bytes": ref, "slope": 0.05}})
    # at the reference working set the table's costs hold
    assert scaled.estimate(small).latency_ms == pytest.approx(plain.estimate(small).latency_ms)
    factor = 1 + 0.05 * np.log(working_set_bytes(big) / ref)
    assert factor > 1.15
    got, want = scaled.estimate(big), plain.estimate(big)
    assert got.latency_ms == pytest.approx((want.latency_ms - 0.01) * factor + 0.01)
    assert [c.latency_ms for c in got.costs[1:]] == pytest.approx([c.latency_ms * factor for c in want.costs[1:]])
    # a smaller model than the reference is priced lower, and the factor stays within 0.5-2
    assert scaled.estimate(small[:1]).latency_ms < plain.estimate(small[:1]).latency_ms
    steep = device(rows, overhead={"working_set": {"ref_bytes": 1.0, "slope": 1.0}})
    assert steep.estimate(small).latency_ms == pytest.approx(2.0 * device(rows).estimate(small).latency_ms)


def test_past_its_knee_a_working_set_slows_the_kernels_no_further(rows):
    from nasctl.hardware.lut import working_set_bytes

    small = [layer_from_row(r) for r in rows[:3]]
    big, bigger = small + [conv(512, 512, 8)], small + [conv(1024, 1024, 8)]  # 9.4 and 38 MB of weights
    ref, knee = working_set_bytes(small), working_set_bytes(big)
    plain = device(rows)
    kneed = device(rows, overhead={"working_set": {"ref_bytes": ref, "slope": 0.05, "knee_bytes": knee}})
    # below the knee it is the slope's; past it, every model is priced as one at the knee
    at_knee = 1 + 0.05 * np.log(knee / ref)
    assert kneed.estimate(big).latency_ms == pytest.approx(plain.estimate(big).latency_ms * at_knee)
    assert kneed.estimate(bigger).latency_ms == pytest.approx(plain.estimate(bigger).latency_ms * at_knee)
    assert kneed.estimate(small[:1]).latency_ms < plain.estimate(small[:1]).latency_ms


def test_a_classifier_reads_its_weights_from_the_caches_in_a_small_model_and_from_memory_in_a_large_one(rows):
    from dataclasses import replace

    from nasctl.hardware.lut import WeightStream, streams_weights, weight_bytes

    head = LayerSpec("linear", 1280, 1000, (1, 1), (1, 1), bias=True)  # a 5.1 MB classifier
    assert streams_weights(head)
    assert not streams_weights(LayerSpec("linear", 1280, 1000, (16, 1), (16, 1)))  # 16 rows: compute, not reading
    assert not streams_weights(replace(head, w_bits=8, a_bits=8)) and not streams_weights(conv(64, 64, 8))
    conv_head = LayerSpec("conv", 960, 1280, (1, 1), (1, 1))  # a 1x1 conv after global pooling: the same product
    assert streams_weights(conv_head) and not streams_weights(conv_head, convs=False)
    for other in (replace(conv_head, groups=2), replace(conv_head, kernel=(3, 3)),  # a 3x3 on a padded 1x1 map
                  replace(conv_head, in_hw=(2, 2), stride=2), replace(conv_head, in_hw=(2, 2), kernel=(2, 2)),
                  replace(conv_head, w_bits=8, a_bits=8), replace(conv_head, dequantized=True)):
        assert not streams_weights(other), other
    table = rows + [row_from_layer(head, 0.1)]  # its resident time
    stream = {"cache_bytes": 10e6, "width": 0.2, "resident_ms_per_mb": 0.02, "streamed_ms_per_mb": 0.045}
    plain, streaming = device(table), device(table, overhead={"weight_stream": stream})
    small = [layer_from_row(r) for r in rows[:3]] + [head]  # 5.2 MB of weights
    large = [conv(512, 512, 8)] * 3 + [head]  # 33 MB
    assert weight_bytes(small) < 6e6 and weight_bytes(large) > 30e6
    mb = head.params * 4 / 1e6
    for layers, least, most in ((small, 0.0, 0.05), (large, 0.95, 1.0)):  # share of the way to memory speed
        got, want = streaming.estimate(layers), plain.estimate(layers)
        extra = got.costs[-1].latency_ms - want.costs[-1].latency_ms
        assert least * mb * 0.025 <= extra <= most * mb * 0.025
        assert extra == pytest.approx(mb * (WeightStream(**stream).rate(weight_bytes(layers)) - 0.02))
        assert [c.latency_ms for c in got.costs[:-1]] == [c.latency_ms for c in want.costs[:-1]]
        assert got.costs[-1].mapping == "table + weights streamed"
    # the same classifier costs about twice as much in the large model as in the small one
    assert streaming.estimate(large).costs[-1].latency_ms > 1.9 * streaming.estimate(small).costs[-1].latency_ms
    # a conv head reads its weights alike where the fit counted such convs; a device fitted
    # before they counted (no `convs`) kept their reading in its rows and prices them as it did
    model = large[:-1] + [replace(conv_head, in_ch=1280, out_ch=1000)]
    with_conv = table + [row_from_layer(model[-1], 0.1)]
    want = device(with_conv).estimate(model).costs[-1].latency_ms
    extra = model[-1].params * 4 / 1e6 * (WeightStream(**stream).rate(weight_bytes(model)) - 0.02)
    assert extra > 0.1
    for counted, want_extra in ((True, extra), (False, 0.0)):
        dev = device(with_conv, overhead={"weight_stream": {**stream, **({"convs": True} if counted else {})}})
        assert dev.estimate(model).costs[-1].latency_ms - want == pytest.approx(want_extra)


def test_layers_of_a_few_rows_pay_for_reading_their_weights_from_memory_in_a_model_too_large_for_the_caches(rows):
    """`overhead.weight_reread`: a float linear layer of a few tokens (ViT-B/16's 37) or a
    conv of a few output pixels pays its weights' megabytes times the curve's rate beyond
    its resident price, by the model's weight bytes; a layer of many rows, an int8 one, a
    classifier of one row (`weight_stream`'s) and every other layer pay nothing more."""
    from dataclasses import replace

    from nasctl.hardware.lut import WeightStream, rereads_weights, weight_bytes

    mlp = LayerSpec("linear", 768, 3072, (37, 1), (37, 1), bias=True)  # 9.4 MB, 37 tokens
    assert rereads_weights(mlp, 64) and not rereads_weights(mlp, 16)
    last_stage = conv(512, 512, 5)  # a 3x3 conv on a 5x5 map: 25 rows
    assert rereads_weights(last_stage, 64)
    for other in (replace(mlp, in_hw=(197, 1), out_hw=(197, 1)), replace(mlp, w_bits=8, a_bits=8),
                  replace(mlp, dequantized=True), LayerSpec("linear", 768, 1000, (1, 1), (1, 1)),
                  LayerSpec("conv", 768, 1000, (1, 1), (1, 1)), conv(64, 64, 56), LayerSpec("act", 768, 768, (37, 1), (37, 1))):
        assert not rereads_weights(other, 64), other
    assert rereads_weights(replace(LayerSpec("conv", 768, 1000, (1, 1), (1, 1)), kernel=(3, 3)), 64)  # 3x3 on 1x1
    table = rows + [row_from_layer(mlp, 1.0), row_from_layer(last_stage, 0.4)]
    reread = {"cache_bytes": 100e6, "width": 0.5, "resident_ms_per_mb": 0.0, "streamed_ms_per_mb": 0.03,
              "convs": True, "max_rows": 64}
    plain, rereading = device(table), device(table, overhead={"weight_reread": reread})
    assert not rereading.additive
    small = [conv(16, 16, 32), mlp]  # 9.4 MB of weights: they stay in the caches
    large = [conv(16, 16, 32), last_stage] + [mlp] * 36  # 350 MB: they do not
    for layers, most in ((small, 0.002), (large, 0.03)):
        got, want = rereading.estimate(layers), plain.estimate(layers)
        share = WeightStream(**reread).rate(weight_bytes(layers))
        assert got.costs[0].latency_ms == want.costs[0].latency_ms  # a conv of 1024 rows
        for i in (1, len(layers) - 1):
            extra = got.costs[i].latency_ms - want.costs[i].latency_ms
            assert extra == pytest.approx(layers[i].params * 4 / 1e6 * share)
            assert extra <= layers[i].params * 4 / 1e6 * most
    big = rereading.estimate(large).costs[-1]
    assert big.mapping.endswith("+ weights streamed") and big.latency_ms > 1.25 * plain.estimate(large).costs[-1].latency_ms


def test_spatial_convs_and_pointwise_layers_of_a_few_rows_pay_the_rate_of_their_own_curve(rows):
    """`overhead.weight_reread` as a list: a spatial conv of a few output pixels pays its own
    curve's rate beyond its resident one, a pointwise layer the other's; none pays for a
    layer over `max_bytes`.  A curve saved as one dict (fits before) prices both alike."""
    from nasctl.hardware.lut import WeightStream, reread_kind, weight_bytes

    spatial = conv(512, 512, 4)  # a 3x3 conv on a 4x4 map: 9.4 MB
    pointwise = LayerSpec("linear", 768, 3072, (37, 1), (37, 1), bias=True)  # 9.4 MB, 37 tokens
    too_big = conv(1024, 1024, 4)  # 37.7 MB
    assert (reread_kind(spatial), reread_kind(pointwise), reread_kind(conv(512, 512, 4, k=1))) == (
        "spatial", "pointwise", "pointwise")
    table = rows + [row_from_layer(spatial, 0.7), row_from_layer(pointwise, 1.0), row_from_layer(too_big, 4.0)]
    curve = {"cache_bytes": 20e6, "width": 0.5, "convs": True, "max_rows": 64, "min_bytes": 0.8e6,
             "max_bytes": 16e6}
    reread = [{**curve, "resident_ms_per_mb": 0.025, "streamed_ms_per_mb": 0.06, "kernels": "spatial"},
              {**curve, "resident_ms_per_mb": 0.015, "streamed_ms_per_mb": 0.015, "kernels": "pointwise"}]
    plain, rereading = device(table), device(table, overhead={"weight_reread": reread})
    rate_of = {id(spatial): reread[0], id(pointwise): reread[1]}
    for layers in ([conv(16, 16, 32), spatial, pointwise, too_big], [spatial, pointwise, too_big] * 6):
        got, want = rereading.estimate(layers), plain.estimate(layers)
        weights = weight_bytes(layers)
        for layer, a, b in zip(layers, got.costs, want.costs):
            curve_of = rate_of.get(id(layer))  # (a conv of 1024 rows, and one over the cap, pay nothing more)
            paid = 0.0 if curve_of is None else layer.weight_bytes / 1e6 * (
                WeightStream(**curve_of).rate(weights) - curve_of["resident_ms_per_mb"])
            assert a.latency_ms - b.latency_ms == pytest.approx(paid, abs=1e-12)
    # in a model of 57 MB of weights the spatial conv pays 0.29 ms more than its 0.7 ms row
    # (the pointwise layer, whose curve is flat, nothing beyond its resident rate: the loop above)
    assert 0.25 < rereading.estimate([spatial, pointwise, too_big]).costs[0].latency_ms - 0.7 < 0.35
    old = device(table, overhead={"weight_reread": {**reread[0], "kernels": "all"}})
    both = [spatial, pointwise]
    extra = old.estimate(both).costs[1].latency_ms - plain.estimate(both).costs[1].latency_ms
    beyond = WeightStream(**reread[0]).rate(weight_bytes(both)) - 0.025
    assert extra == pytest.approx(pointwise.weight_bytes / 1e6 * beyond)


def test_a_working_set_without_a_positive_reference_is_refused_in_one_line(tmp_path, rows):
    from nasctl.hardware.loader import load_device

    folder = tmp_path / "hardware" / "t"
    folder.mkdir(parents=True)
    write_lut(folder / "lut.csv", rows)
    (folder / "spec.yaml").write_text("kind: lut\noverhead:\n  working_set: {ref_bytes: 0, slope: 0.02}\n")
    with pytest.raises(ConfigError, match=r"spec.yaml: overhead.working_set.ref_bytes: .*greater than 0") as info:
        load_device(str(folder / "spec.yaml"))
    assert "\n" not in str(info.value)


def slow_grouped_rows(rng, n=40):
    """Grouped convs (4 or 8 groups) costing 1 µs + 3 ns per 100 MACs: three times a dense
    conv's time per MAC (`synthetic_rows`), as onnxruntime runs small groups."""
    rows = []
    for _ in range(n):
        layer = conv(int(rng.choice([32, 64, 96])), int(rng.choice([32, 64, 96])), int(rng.choice([8, 16, 32])),
                     groups=int(rng.choice([4, 8])), stride=int(rng.choice([1, 2])))
        rows.append(row_from_layer(layer, (1e-3 + 3 * layer.macs * 1e-8) * rng.uniform(0.97, 1.03)))
    return rows


def test_grouped_convs_are_a_kernel_type_of_their_own_priced_from_dense_convs_where_the_table_has_none(rows):
    from nasctl.hardware.lut import kernel_group, kernel_type

    grouped = conv(48, 48, 16, groups=6)  # 8 channels a group
    assert kernel_type(grouped) == "conv_g" and kernel_type(conv(48, 48, 16, groups=6, bits=8)) == "conv_g_w8a8"
    assert kernel_group(grouped) == "conv_g" and kernel_type(conv(48, 48, 16, groups=48)) == "conv_dw"
    # A table without grouped convs prices them from its dense convs, with the dense offset.
    dense_only = device(rows, overhead={"per_kernel_ms": {"conv": 0.002}})
    cost = dense_only.estimate([grouped]).costs[0]
    assert "regressor" in cost.mapping
    assert cost.latency_ms == pytest.approx(device(rows).estimate([grouped]).latency_ms + 0.002)
    # Grouped convs that run at 3x a dense conv's time per MAC: priced from their own rows.
    both = device(rows + slow_grouped_rows(np.random.default_rng(1)), overhead={"per_kernel_ms": {"conv": 0.002}})
    truth = 1e-3 + 3 * grouped.macs * 1e-8
    assert both.estimate([grouped]).latency_ms == pytest.approx(truth + 0.002, rel=0.15)
    assert abs(dense_only.estimate([grouped]).latency_ms / (truth + 0.002) - 1) > 0.3
    # dense convs are priced as before: the grouped rows are not theirs
    plain = conv(48, 96, 24)
    assert both.estimate([plain]).latency_ms == pytest.approx(dense_only.estimate([plain]).latency_ms)


def depthwise_rows(channels, sizes, ms_of, kernels=(3, 5), strides=(1, 2)):
    """Depthwise convs of these channel counts and input sizes, costing `ms_of(layer)` with 3% noise."""
    rng = np.random.default_rng(2)
    layers = [conv(c, c, hw, k=k, stride=s, groups=c, fn="") for c in channels for hw in sizes for k in kernels
              for s in strides]
    return [row_from_layer(l, ms_of(l) * rng.uniform(0.97, 1.03)) for l in layers]


def per_channel(layer):
    """A depthwise conv run channel by channel: 0.4 µs a channel + 0.2 ns per MAC."""
    return 4e-4 * layer.groups + 2e-7 * layer.macs


def blocked(layer):
    """An aligned depthwise conv: 1 µs a call + 0.05 ns per MAC."""
    return 1e-3 + 5e-8 * layer.macs


def test_depthwise_convs_run_channel_by_channel_are_a_kernel_type_of_their_own(rows):
    """onnxruntime runs a float depthwise conv whose channels are not a multiple of 4 one
    channel at a time (58 channels at 28x28: 3x the time of 56 or 60): such convs are priced
    from their own rows; a table without any prices them as the other depthwise convs, with
    their offset.  An int8 one runs the integer kernel (its offset is the depthwise one);
    a dequantized one runs the float kernel."""
    from dataclasses import replace

    from nasctl.hardware.lut import kernel_group, kernel_type

    odd, even = conv(58, 58, 28, groups=58, fn=""), conv(56, 56, 28, groups=56, fn="")
    assert kernel_type(odd) == kernel_group(odd) == "conv_dw_nchw" and kernel_type(even) == "conv_dw"
    int8 = conv(58, 58, 28, groups=58, bits=8, fn="")
    assert kernel_type(int8) == "conv_dw_w8a8" and kernel_group(int8) == "conv_dw"
    dequantized = replace(int8, dequantized=True)
    assert kernel_type(dequantized) == "conv_dw_nchw_w8a8_dq" and kernel_group(dequantized) == "conv_dw_nchw"
    aligned = depthwise_rows((16, 32, 64, 96), (7, 14, 28, 56), blocked)
    offsets = {"per_layer_ms": 0.0, "per_kernel_ms": {"conv_dw": 0.002}}
    aligned_only = device(rows + aligned, overhead=offsets)
    assert aligned_only.estimate([odd]).latency_ms == pytest.approx(blocked(odd) + 0.002, rel=0.15)
    both = device(rows + aligned + depthwise_rows((6, 18, 30, 58, 90), (7, 14, 28), per_channel), overhead=offsets)
    assert both.estimate([odd]).latency_ms == pytest.approx(per_channel(odd), rel=0.15)
    assert both.estimate([even]).latency_ms == pytest.approx(aligned_only.estimate([even]).latency_ms)


@pytest.mark.parametrize("kind", ["additive", "nearest", "boost"])
def test_a_depthwise_conv_run_channel_by_channel_pays_a_fixed_cost_per_channel(kind):
    # Measured at 5-20 px, 58 channels at 28x28 and 162 at 40x40 (ShuffleNetV2's, ReXNet's)
    # are priced within 15%: a channel's fixed cost is paid by every channel, and the time
    # per unit of (work + fixed work) carries to larger inputs.  A fixed cost per layer
    # would carry the small inputs' time per MAC and price them 1.1-2x high.
    from nasctl.hardware.lut import _fixed_work, fit_regressor

    seen = depthwise_rows((6, 9, 18, 30, 42, 90, 366, 906), (5, 7, 12, 20), per_channel)
    layers = [layer_from_row(r) for r in seen]
    values = np.array([r["latency_ms"] for r in seen])
    assert _fixed_work(layers, np.log(values)) == pytest.approx(4e-4 / 2e-7, rel=0.1)
    new = [conv(58, 58, 28, groups=58, fn=""), conv(162, 162, 40, groups=162, fn=""),
           conv(58, 58, 56, stride=2, groups=58, fn="")]
    model = fit_regressor(kind, layers, values)
    assert np.exp(model.predict(new)) == pytest.approx([per_channel(l) for l in new], rel=0.15)


def test_residual_sums_are_priced_apart_from_stand_alone_adds_and_as_adds_where_the_table_has_none(rows):
    """A conv's residual sum costs next to nothing in context (the conv accumulates it): its
    own rows price it, and the stand-alone adds keep theirs; a table without sums prices
    them as adds."""
    from nasctl.hardware.lut import kernel_group, kernel_type

    add = LayerSpec("add", 32, 32, (12, 12), (12, 12))
    summed = LayerSpec("add", 32, 32, (12, 12), (12, 12), fn="sum")
    assert kernel_type(summed) == kernel_group(summed) == "add_sum" and kernel_type(add) == "add"
    assert kernel_type(LayerSpec("add", 32, 32, (12, 12), (12, 12), w_bits=8, a_bits=8, fn="sum")) == "add_sum_w8a8"
    adds_only = device(rows, overhead={"per_kernel_ms": {"add": 0.002}})
    assert adds_only.estimate([summed]).latency_ms == pytest.approx(adds_only.estimate([add]).latency_ms)
    sums = [row_from_layer(LayerSpec("add", 32, 32, (hw, hw), (hw, hw), fn="sum"), 1e-4) for hw in (8, 16, 32)]
    both = device(rows + sums, overhead={"per_kernel_ms": {"add": 0.002, "add_sum": 0.0}})
    assert both.estimate([summed]).latency_ms == pytest.approx(1e-4, rel=0.3)
    assert both.estimate([add]).latency_ms == pytest.approx(adds_only.estimate([add]).latency_ms)
    assert both.estimate([add]).latency_ms > 10 * both.estimate([summed]).latency_ms


def test_adds_fused_into_a_layer_norm_and_strided_ops_are_priced_apart_and_as_their_op_where_the_table_has_none(rows):
    """An add fused with the layer norm after it (`SKIP`), a strided transpose or reduction
    (`STRIDED`): their own rows price them, the others keep theirs; a table without such
    rows prices them as the plain add, transpose or average they also are."""
    from nasctl.hardware.layers import SKIP, STRIDED
    from nasctl.hardware.lut import as_general, kernel_type

    def add(t, fn=""):
        return LayerSpec("add", 64, 64, (t, 1), (t, 1), fn=fn)

    def transpose(t, fn="transpose"):
        return LayerSpec("data", 64, 64, (t, 4), (t, 4), fn=fn)

    plain = [row_from_layer(add(t), 2e-7 * 64 * t) for t in (16, 64, 196, 400)]
    fused = [row_from_layer(add(t, SKIP), 2e-6 * 64 * t) for t in (16, 64, 196, 400)]
    moved = [row_from_layer(transpose(t), 3e-7 * 256 * t) for t in (16, 64, 196, 400)]
    assert kernel_type(add(100, SKIP)) == "add_skip" and kernel_type(transpose(100, STRIDED)) == "data_strided"
    assert as_general(add(100, SKIP)) == add(100) and as_general(transpose(100, STRIDED)) == transpose(100)
    without = device(rows + plain + moved, overhead={"per_layer_ms": 0.0})
    assert without.estimate([add(100, SKIP)]).latency_ms == pytest.approx(without.estimate([add(100)]).latency_ms)
    assert without.estimate([transpose(100, STRIDED)]).latency_ms == pytest.approx(
        without.estimate([transpose(100)]).latency_ms)
    both = device(rows + plain + fused + moved, overhead={"per_layer_ms": 0.0})
    assert both.estimate([add(100, SKIP)]).latency_ms == pytest.approx(2e-6 * 6400, rel=0.3)
    assert both.estimate([add(100)]).latency_ms == pytest.approx(without.estimate([add(100)]).latency_ms)


def test_attention_keys_transpose_is_told_from_the_split_into_heads_of_the_same_folded_shapes(rows):
    """[1, T, heads, d] -> [1, heads, d, T] (attention's keys) and -> [1, heads, T, d] (the
    split into heads) fold to the same shapes where T = d; the keys' transpose moves the
    innermost dim (`MOVES_INNER`), element by element, and is priced apart: its own rows
    price it, its copies are its elements; the regressors read it as a transpose, and a
    table made before it was told apart prices it by its "transpose" row."""
    from nasctl.hardware.layers import MOVES_INNER, chw, transpose_fn
    from nasctl.hardware.lut import FEATURES, _copies, features

    def transpose(t, h, d, perm):
        shape = (1, t, h, d)
        (ci, ih), (co, oh) = chw(shape), chw(tuple(shape[a] for a in perm))
        return LayerSpec("data", ci, co, ih, oh, fn=transpose_fn(shape, perm))

    keys, split = transpose(16, 2, 16, (0, 2, 3, 1)), transpose(16, 2, 16, (0, 2, 1, 3))
    assert (keys.fn, split.fn) == (MOVES_INNER, "transpose")
    assert replace(keys, fn="transpose").shape_key() == split.shape_key()  # the same but for the label
    assert (_copies(keys), _copies(split)) == (512, 32)  # element by element; blocks of d = 16
    column = FEATURES.index("fn_transpose")
    assert features([keys])[0, column] == features([split])[0, column] == 1.0
    old = device(rows + [row_from_layer(split, 1e-3)], overhead={"per_layer_ms": 0.0})
    assert old.estimate([keys]).latency_ms == pytest.approx(1e-3)  # the row of its day
    both = device(rows + [row_from_layer(split, 1e-3), row_from_layer(keys, 3e-3)], overhead={"per_layer_ms": 0.0})
    assert (both.estimate([keys]).latency_ms, both.estimate([split]).latency_ms) == pytest.approx((3e-3, 1e-3))


def test_layer_norms_run_op_by_op_are_priced_apart_and_as_fused_ones_where_the_table_has_none(rows):
    """A layer norm spelled out over the channels of an NCHW tensor runs op by op
    (`LAYER_OPS`), about twice a fused one's time: its own rows price it and the fused
    norms keep theirs, which it no longer shares descriptors with; a table without such
    rows prices it as the fused layer norm it also is."""
    from nasctl.hardware.layers import LAYER_OPS
    from nasctl.hardware.lut import as_general, kernel_group, kernel_type

    def norm(c, hw, fn="layer"):
        return LayerSpec("norm", c, c, (hw, hw), (hw, hw), fn=fn)

    sizes = [(16, 8), (24, 12), (32, 16), (40, 20), (48, 24), (64, 32)]
    fused = [row_from_layer(norm(c, hw), 1e-6 * c * hw * hw) for c, hw in sizes]
    ops = [row_from_layer(norm(c, hw, LAYER_OPS), 2e-6 * c * hw * hw) for c, hw in sizes]
    assert kernel_type(norm(40, 40, LAYER_OPS)) == kernel_group(norm(40, 40, LAYER_OPS)) == "norm_ops"
    assert kernel_type(norm(40, 40)) == "norm" and as_general(norm(40, 40, LAYER_OPS)) == norm(40, 40)
    fused_only = device(rows + fused, overhead={"per_layer_ms": 0.0})
    assert fused_only.estimate([norm(40, 30, LAYER_OPS)]).latency_ms == pytest.approx(
        fused_only.estimate([norm(40, 30)]).latency_ms)
    both = device(rows + fused + ops, overhead={"per_layer_ms": 0.0})
    assert both.estimate([norm(40, 30, LAYER_OPS)]).latency_ms == pytest.approx(2e-6 * 40 * 900, rel=0.25)
    assert both.estimate([norm(40, 30)]).latency_ms == pytest.approx(1e-6 * 40 * 900, rel=0.25)


def test_plain_kernel_int8_max_pools_are_priced_apart_and_as_max_pools_where_the_table_has_none(rows):
    """An 8-bit max pool onnxruntime runs in its plain channels-first kernel (`MAX_NCHW`)
    costs many times one in the channels-last layout: its own rows price it, the other
    pools keep theirs; a table without such rows prices it as the max pool it is."""
    from nasctl.hardware.layers import MAX_NCHW
    from nasctl.hardware.lut import kernel_type

    def pool(hw, fn="max"):
        return LayerSpec("pool", 32, 32, (hw, hw), (hw // 2, hw // 2), (2, 2), 2, w_bits=8, a_bits=8, fn=fn)

    fast = [row_from_layer(pool(hw), 1e-6 * hw * hw) for hw in (8, 12, 16, 24, 32, 48)]
    slow = [row_from_layer(pool(hw, MAX_NCHW), 2e-5 * hw * hw) for hw in (8, 12, 16, 24, 32, 48)]
    assert kernel_type(pool(20, MAX_NCHW)) == "pool_nchw_w8a8" and kernel_type(pool(20)) == "pool_w8a8"
    fast_only = device(rows + fast, overhead={"per_layer_ms": 0.0})
    assert fast_only.estimate([pool(20, MAX_NCHW)]).latency_ms == pytest.approx(
        fast_only.estimate([pool(20)]).latency_ms)
    both = device(rows + fast + slow, overhead={"per_layer_ms": 0.0})
    assert both.estimate([pool(20, MAX_NCHW)]).latency_ms == pytest.approx(2e-5 * 400, rel=0.3)
    assert both.estimate([pool(20)]).latency_ms == pytest.approx(fast_only.estimate([pool(20)]).latency_ms)


def test_a_layer_priced_as_a_kernel_it_is_told_apart_from_is_named_as_such(rows):
    """Where a table holds no rows of a layer's kernel type, the layer is priced as a kernel
    it is told apart from (an 8-bit max pool run channels-first as a channels-last one, at
    a thirtieth of its time; a grouped conv as a dense one): `stand_ins` counts such layers
    by their type and the type priced as, and their mapping says so.  A table with rows of
    their own names none; an int8 conv priced from the float conv a QDQ group runs is
    priced as its own kernel, not named."""
    from collections import Counter

    from nasctl.hardware.layers import MAX_NCHW

    def pool(hw, fn="max"):
        return LayerSpec("pool", 32, 32, (hw, hw), (hw // 2, hw // 2), (2, 2), 2, w_bits=8, a_bits=8, fn=fn)

    fast = [row_from_layer(pool(hw), 1e-6 * hw * hw) for hw in (8, 12, 16, 24, 32, 48)]
    slow = [row_from_layer(pool(hw, MAX_NCHW), 2e-5 * hw * hw) for hw in (8, 12, 16, 24, 32, 48)]
    layers = [pool(20, MAX_NCHW), pool(20), pool(28, MAX_NCHW), conv(32, 32, 16, groups=4), conv(32, 32, 16, bits=8)]
    fast_only = device(rows + fast)
    assert fast_only.stand_ins(layers) == Counter({("pool_nchw_w8a8", "pool_w8a8"): 2, ("conv_g", "conv"): 1})
    costs = fast_only.estimate(layers).costs
    assert costs[0].mapping.endswith("regressor of pool_w8a8 (no pool_nchw_w8a8 rows)")
    assert costs[3].mapping.endswith("regressor of conv (no conv_g rows)")
    assert "(no " not in costs[1].mapping and "(no " not in costs[4].mapping
    both = device(rows + fast + slow)
    assert both.stand_ins(layers) == Counter({("conv_g", "conv"): 1})
    assert "(no " not in both.estimate(layers).costs[0].mapping


def test_a_plain_kernel_int8_max_pool_far_larger_than_its_rows_is_priced_from_them_not_as_a_faster_kernel(rows):
    """A profile may hold only a few small channels-first 8-bit max pools (they arise in
    few int8 structures): SqueezeNet 1.1's 128 x 39 x 39 pool, 60x the largest of two such
    rows, was priced as a channels-last pool, at 1/50 of its time (the model -25%, against
    -2% from a profile of four rows up to 46,000 elements).  Beyond its own kernels it is
    priced at their time per element; only a table with none of them prices it as another
    max pool."""
    from nasctl.hardware.layers import MAX_NCHW

    def pool(hw, fn="max", ch=32):
        return LayerSpec("pool", ch, ch, (hw, hw), (hw // 2, hw // 2), (3, 3), 2, w_bits=8, a_bits=8, fn=fn)

    fast = [row_from_layer(pool(hw), 1e-6 * 32 * hw * hw / 16) for hw in (8, 16, 32, 48, 64, 96)]
    slow = [row_from_layer(pool(hw, MAX_NCHW), 4e-6 * 32 * hw * hw) for hw in (8, 10)]  # 4 ns per element
    table = device(rows + fast + slow, overhead={"per_layer_ms": 0.0})
    large = pool(39, MAX_NCHW, ch=128)  # 195,000 elements, 60x the largest row
    assert table.estimate([large]).latency_ms == pytest.approx(4e-6 * 128 * 39 * 39, rel=0.25)
    assert table.estimate([pool(39, ch=128)]).latency_ms < table.estimate([large]).latency_ms / 10
    fast_only = device(rows + fast, overhead={"per_layer_ms": 0.0})
    assert fast_only.estimate([large]).latency_ms == pytest.approx(fast_only.estimate([pool(39, ch=128)]).latency_ms)


def test_regressors_saved_before_grouped_convs_had_a_type_are_read_with_the_types_taken_again(tmp_path, rows):
    import json

    from nasctl.hardware.fit import FittedDevice, write_device

    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "boost", "conv_g": "ridge"}}
    table = rows + slow_grouped_rows(np.random.default_rng(1))
    write_device(tmp_path, FittedDevice("t", spec, table))
    doc = json.loads((tmp_path / "regressors.json").read_text())
    assert "conv_g" in doc["types"] and "conv_g" in doc["merged"]["types"]
    # as format 4 wrote it: the grouped convs among the dense ones, one conv regressor for both
    doc.update(format=4, types={k: v for k, v in doc["types"].items() if k != "conv_g"})
    doc["merged"]["types"] = ["conv" if t == "conv_g" else t for t in doc["merged"]["types"]]
    (tmp_path / "regressors.json").write_text(json.dumps(doc))
    old = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert "conv" not in old._saved and "add" in old._saved  # the conv regressor lost rows: fitted again
    fresh = device(read_lut(tmp_path / "lut.csv"), **spec)
    layers = [conv(48, 48, 16, groups=6), conv(48, 96, 24)]
    assert old.estimate(layers).latency_ms == pytest.approx(fresh.estimate(layers).latency_ms, rel=1e-9)


def test_regressors_saved_before_channel_by_channel_depthwise_convs_had_a_type_are_refitted(tmp_path, rows):
    import json

    from nasctl.hardware.fit import FittedDevice, write_device

    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "boost", "conv_dw": "nearest"}}
    table = rows + depthwise_rows((16, 32, 64), (7, 14, 28), blocked) + depthwise_rows((18, 58), (7, 14), per_channel)
    write_device(tmp_path, FittedDevice("t", spec, table))
    doc = json.loads((tmp_path / "regressors.json").read_text())
    assert doc["format"] == 8 and "conv_dw_nchw" in doc["types"]
    fresh = device(read_lut(tmp_path / "lut.csv"), **spec)
    layers = [conv(58, 58, 28, groups=58, fn=""), conv(48, 48, 20, groups=48, fn=""), conv(48, 96, 24)]
    saved = LutDevice.from_dict({"name": "t", **spec}, tmp_path)  # its regressors restored, a call per channel
    assert "conv_dw_nchw" in saved._saved
    assert saved.estimate(layers).latency_ms == pytest.approx(fresh.estimate(layers).latency_ms, rel=1e-9)
    # as format 5 wrote it: all depthwise convs one type
    doc.update(format=5, types={k: v for k, v in doc["types"].items() if k != "conv_dw_nchw"})
    doc["merged"]["types"] = ["conv_dw" if t == "conv_dw_nchw" else t for t in doc["merged"]["types"]]
    (tmp_path / "regressors.json").write_text(json.dumps(doc))
    old = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert "conv_dw" not in old._saved and "conv" in old._saved  # conv_dw lost rows: fitted again
    assert old.estimate(layers).latency_ms == pytest.approx(fresh.estimate(layers).latency_ms, rel=1e-9)
    # ... once: the file was written again as this version writes it, so the next start fits nothing
    assert json.loads((tmp_path / "regressors.json").read_text())["format"] == 8
    again = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert {"conv_dw", "conv_dw_nchw", "conv"} <= set(again._saved)
    assert again.estimate(layers).latency_ms == pytest.approx(fresh.estimate(layers).latency_ms, rel=1e-9)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def multiplier_rows(rng, n=30):
    """Depthwise convs with a channel multiplier of 2 or 4 (one input channel a group) at 3x
    an aligned depthwise conv's time per MAC (`blocked`), as onnxruntime runs them."""
    rows = []
    for _ in range(n):
        c = int(rng.choice([16, 32, 48]))
        layer = conv(c, c * int(rng.choice([2, 4])), int(rng.choice([8, 16, 32])), k=int(rng.choice([3, 5, 7])),
                     stride=int(rng.choice([1, 2])), groups=c, fn="")
        rows.append(row_from_layer(layer, (1e-3 + 15e-8 * layer.macs) * rng.uniform(0.97, 1.03)))
    return rows


def test_a_depthwise_conv_with_a_channel_multiplier_is_priced_as_a_grouped_conv_not_a_depthwise_one(tmp_path, rows):
    """onnxruntime runs a depthwise conv whose groups have several output channels (FastViT's
    downsampling: 48 -> 96 channels in 48 groups) group by group, at a third of a depthwise
    conv's speed per MAC: a kernel type of its own (`conv_mult`), priced from its own rows,
    else from the grouped convs' rows, else from the dense convs'.  Regressors saved before
    it was told apart (format 6), whose depthwise rows held such convs, are fitted again."""
    import json

    from nasctl.hardware.fit import FittedDevice, write_device
    from nasctl.hardware.lut import kernel_type

    mult = conv(48, 96, 32, k=7, stride=2, groups=48, fn="")
    assert kernel_type(mult) == "conv_mult" and kernel_type(conv(48, 96, 32, k=7, groups=48, fn="", bits=8)) == \
        "conv_mult_w8a8"
    assert kernel_type(conv(48, 48, 32, k=7, groups=48, fn="")) == "conv_dw"
    assert kernel_type(conv(18, 36, 32, groups=18, fn="")) == "conv_mult"  # not run channel by channel either
    assert kernel_type(conv(48, 96, 32, groups=24, fn="")) == "conv_g"
    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "boost", "conv_dw": "nearest", "conv_g": "ridge"}}
    table = rows + depthwise_rows((16, 32, 64), (8, 16, 32), blocked, kernels=(3, 5, 7)) + \
        slow_grouped_rows(np.random.default_rng(1)) + multiplier_rows(np.random.default_rng(3))
    write_device(tmp_path, FittedDevice("t", spec, table))
    fresh = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    truth = 1e-3 + 15e-8 * mult.macs
    assert fresh.estimate([mult]).latency_ms == pytest.approx(truth, rel=0.2)
    assert fresh.estimate([mult]).latency_ms > 2 * blocked(mult)  # a depthwise conv's price is a third of it
    grouped = conv(48, 48, 16, groups=6)  # the grouped convs are priced from their own rows alone
    assert fresh.estimate([grouped]).latency_ms == pytest.approx(
        device(rows + slow_grouped_rows(np.random.default_rng(1)), **spec).estimate([grouped]).latency_ms)
    # a table without multiplier convs prices them as grouped convs; without those, as dense convs
    without = device(rows + slow_grouped_rows(np.random.default_rng(1)), **spec).estimate([mult]).costs[0]
    assert "regressor" in without.mapping and without.latency_ms > 0
    assert device(rows, **spec).estimate([mult]).costs[0].latency_ms > 0
    # as format 6 wrote it: the multiplier convs among the depthwise ones
    doc = json.loads((tmp_path / "regressors.json").read_text())
    c = doc["merged"]["columns"]
    doc["merged"]["types"] = ["conv_dw" if g == i and g > 1 else t for t, g, i in
                              zip(doc["merged"]["types"], c["groups"], c["in_ch"])]
    doc["format"] = 6
    (tmp_path / "regressors.json").write_text(json.dumps(doc))
    old = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert "conv_dw" not in old._saved and {"conv_g", "conv"} <= set(old._saved)
    assert old.estimate([mult]).latency_ms == pytest.approx(fresh.estimate([mult]).latency_ms, rel=1e-9)


def test_a_device_whose_regressors_file_cannot_be_written_again_still_prices(tmp_path, rows, monkeypatch):
    import json

    from nasctl.hardware.fit import FittedDevice, write_device

    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "boost"}}
    write_device(tmp_path, FittedDevice("t", spec, rows + depthwise_rows((18, 58), (7, 14), per_channel)))
    doc = json.loads((tmp_path / "regressors.json").read_text())
    (tmp_path / "regressors.json").write_text(json.dumps({**doc, "format": 5}))

    def refuse(self):
        raise PermissionError("read-only")

    monkeypatch.setattr(LutDevice, "save_regressors", refuse)
    old = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    layer = conv(58, 58, 28, groups=58, fn="")
    fresh = device(read_lut(tmp_path / "lut.csv"), **spec)
    assert old.estimate([layer]).latency_ms == pytest.approx(fresh.estimate([layer]).latency_ms, rel=1e-9)
    assert json.loads((tmp_path / "regressors.json").read_text())["format"] == 5


def test_a_saved_device_prices_with_nearest_neighbours_without_fitting_or_scipy(tmp_path, rows):
    import subprocess
    import sys

    from nasctl.hardware.fit import FittedDevice, write_device

    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "nearest"}}
    write_device(tmp_path, FittedDevice("t", spec, rows))
    expected = device(read_lut(tmp_path / "lut.csv"), **spec).estimate([conv(48, 96, 24)]).latency_ms
    code = ("import sys\nfrom pathlib import Path\nfrom nasctl.hardware.layers import LayerSpec\n"
            "from nasctl.hardware.lut import LutDevice\n"
            f"dev = LutDevice.from_dict({{'name': 't', **{spec!r}}}, Path({str(tmp_path)!r}))\n"
            "layer = LayerSpec('conv', 48, 96, (24, 24), (24, 24), (3, 3), 1, 1, 32, 32, fn='relu')\n"
            "cost = dev.estimate([layer]).costs[0]\n"
            "print(cost.latency_ms, cost.mapping, 'scipy.optimize' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) == pytest.approx(expected, rel=1e-9)
    assert out[1] == "nearest" and out[-1] == "False"  # its fixed work was saved: no least-squares fit


def test_a_dense_conv_of_fewer_input_channels_than_a_vector_block_is_priced_by_its_own_work(tmp_path):
    """onnxruntime runs a dense conv of fewer input channels than a vector block (16 floats)
    on its input as it is, and pads more to whole blocks (`benchmarks/conv_channels.py`: 8 ->
    32 channels, 3x3 at 47x47, 0.12 ms, 16 -> 32 0.20 ms, 20 or 24 -> 32 what 32 -> 32 took):
    a conv of 8 input channels costs half of one of 16, not the same.  Regressors saved
    before (format 7), which counted 8-15 channels as 16, are fitted again for the types
    holding them."""
    import json

    from nasctl.hardware.fit import FittedDevice, write_device
    from nasctl.hardware.lut import BLOCK

    up = lambda c: -(-c // BLOCK) * BLOCK  # noqa: E731

    def truth(layer):
        cin = up(layer.in_ch) if layer.in_ch >= BLOCK else layer.in_ch
        return 1e-3 + 2e-8 * (layer.macs // layer.in_ch * cin)

    rng = np.random.default_rng(0)
    table = [row_from_layer(layer, truth(layer) * rng.uniform(0.98, 1.02))
             for cin in (3, 4, 6, 10, 12, 14, 16, 20, 24, 32, 48, 64) for cout in (16, 32, 64) for hw in (8, 16, 32, 64)
             for layer in [conv(cin, cout, hw)]]
    table += [row_from_layer(LayerSpec("add", 32, 32, (hw, hw), (hw, hw)), 1e-3 + hw * hw * 32e-7)
              for hw in (8, 16, 32)]
    spec = {"kind": "lut", "lut": "lut.csv", "regressors": {"conv": "nearest", "add": "ridge"}}
    write_device(tmp_path, FittedDevice("t", spec, table))
    fresh = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    for layer in (conv(8, 32, 47), conv(8, 48, 24), conv(24, 32, 47), conv(3, 32, 47)):  # shapes the table lacks
        assert fresh.estimate([layer]).latency_ms == pytest.approx(truth(layer), rel=0.15), layer
    # as format 7 wrote it: the conv type's saved regressor dropped (it held 8-15 channel convs), the add's kept
    doc = json.loads((tmp_path / "regressors.json").read_text())
    doc["format"] = 7
    (tmp_path / "regressors.json").write_text(json.dumps(doc))
    old = LutDevice.from_dict({"name": "t", **spec}, tmp_path)
    assert "conv" not in old._saved and "add" in old._saved
    assert old.estimate([conv(8, 32, 47)]).latency_ms == pytest.approx(fresh.estimate([conv(8, 32, 47)]).latency_ms,
                                                                        rel=1e-9)
    assert json.loads((tmp_path / "regressors.json").read_text())["format"] == 8  # written again, fitted once
