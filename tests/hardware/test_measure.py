import json
from collections import Counter
from dataclasses import replace

import numpy as np
import onnx
import pytest

from nasctl.errors import UsageError
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import LUT_COLUMNS, OPTIONAL_COLUMNS, LutDevice, kernel_type, layer_from_row, read_lut
from nasctl.hardware.onnx_import import import_onnx
from nasctl.hardware.measure.attribution import attribute, in_context_costs, measure_networks
from nasctl.hardware.measure.context import TAG, NetBuilder, quantize, random_network
from nasctl.hardware.measure.profile import profile_machine
from nasctl.hardware.measure.timing import Protocol, measure_models


def tiny(tmp_path, name, convs):
    b = NetBuilder(np.random.default_rng(0), (1, 8, 16, 16))
    x = "input"
    for _ in range(convs):
        x = b.conv(x, 8, 3, act="relu")
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(b.model(x).SerializeToString())
    return path


def test_protocol_times_are_positive_repeatable_and_ordered(tmp_path):
    small, large = tiny(tmp_path, "small", 1), tiny(tmp_path, "large", 8)
    # the defaults, with the rounds spread over a second: the minimum holds on a busy machine
    protocol = Protocol(rounds=15, repeats=3, spread_s=1.0)
    first = measure_models([small, large], protocol)
    second = measure_models([small, large], protocol)
    assert np.all(first > 0) and first[1] > first[0]
    # generous: other processes share this machine, and on a shared VM its speed moved by a
    # third within the hour (a 14 us model measured 21 us a few seconds later) - a busy spell
    # longer than the rounds' second reaches every round of one measurement, so of three
    # measurements two agree
    times = [first, second]
    if not np.all(np.abs(second / first - 1) < 0.5):
        times.append(measure_models([small, large], protocol))
    assert any(np.all(np.abs(a / b - 1) < 0.5) for i, a in enumerate(times) for b in times[i + 1:])


def test_rounds_spread_over_time_escape_a_busy_spell():
    # A run that costs 2 ms of CPU during the first 0.3 s (a busy spell: the machine's other
    # work slows it) and 0.2 ms after.  Unpaced, all 5 rounds fall in the spell; spread over
    # a second, the later rounds find the machine quiet again.
    import time

    from nasctl.hardware.measure.runner import interleaved_min

    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    for spread, least, most in ((0.0, 1.5, 1e9), (1.0, 0.0, 0.6)):
        start = time.perf_counter()
        run = lambda: spin(0.002 if time.perf_counter() - start < 0.3 else 0.0002)  # noqa: E731
        took = interleaved_min([run], Protocol(rounds=5, repeats=1, warmup=0, spread_s=spread))[0]
        assert least <= took <= most, (spread, took)
        assert time.perf_counter() - start >= spread


def test_a_model_is_timed_by_its_median_session(monkeypatch):
    # Each model opened in three sessions, the first of them slow for the whole measurement
    # (its buffers in slower memory): the time is the typical sessions', one per model.
    import time

    from nasctl.hardware.measure import runner

    opened = []

    class Session:
        def __init__(self, model):
            self.cost = (0.002 if model not in opened else 0.0005) * (1 + 0.5 * (model == "b"))
            opened.append(model)

        def get_inputs(self):
            return []

        def run(self, outputs, feed):
            end = time.thread_time() + self.cost
            while time.thread_time() < end:
                pass

    monkeypatch.setattr(runner, "make_session", lambda model, threads, prefix=None: Session(model))
    times = runner.measure_models(["a", "b"], Protocol(rounds=3, repeats=1, warmup=0, sessions=3))
    assert times.shape == (2,) and opened == ["a", "b"] * 3
    assert times == pytest.approx([0.5, 0.75], rel=0.3)


@pytest.mark.parametrize("seed", range(6))
def test_context_networks_are_valid_and_fully_importable(tmp_path, seed):
    model, description = random_network(np.random.default_rng(seed), max_macs=2e6)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    result = import_onnx(path)
    assert not result.unsupported and result.layers
    assert all(layer.name.startswith("k") for layer in result.layers)


def test_int8_networks_carry_quantized_bit_widths_and_tags(tmp_path):
    rng = np.random.default_rng(0)
    b = NetBuilder(rng, (1, 3, 16, 16))
    y = b.conv(b.conv("input", 16, 3, act="relu"), 16, 3)
    model = quantize(b.model(y), rng)
    assert {n.op_type for n in model.graph.node} >= {"QuantizeLinear", "DequantizeLinear", "Conv"}
    assert all(TAG.search(n.name) for n in model.graph.node)  # weight and input dequantization included
    path = tmp_path / "q.onnx"
    path.write_bytes(model.SerializeToString())
    layers = import_onnx(path).layers
    assert [(layer.w_bits, layer.a_bits) for layer in layers] == [(8, 8), (8, 8)]
    assert kernel_type(layers[0]) == "conv_w8a8"


def ort_float_nodes(path, tmp_path) -> set[str]:
    """The names of the model's nodes that onnxruntime runs as they are (not fused into
    another op, which may keep the name)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    source = {(n.name, n.op_type) for n in onnx.load(str(path)).graph.node}
    return {n.name for n in onnx.load(options.optimized_model_filepath).graph.node if (n.name, n.op_type) in source}


def test_quantized_layers_onnxruntime_cannot_fuse_run_dequantized(tmp_path):
    # A residual block: the block's input feeds a conv and the add, so neither the conv
    # reading it, the conv writing it, nor the add fuses into an integer kernel.
    rng = np.random.default_rng(0)
    b = NetBuilder(rng, (1, 3, 16, 16))
    x = b.conv(b.conv("input", 16, 3, act="relu"), 16, 3, act="relu")
    y = b.add(b.conv(b.conv(x, 16, 3, act="relu"), 16, 3), x)
    y = b.conv(b.conv(y, 16, 3, act="relu"), 16, 1)
    path = tmp_path / "q.onnx"
    path.write_bytes(quantize(b.model(y), rng).SerializeToString())
    layers = import_onnx(path).layers
    assert [(l.op, l.dequantized) for l in layers] == [
        ("conv", False), ("conv", True), ("conv", True), ("conv", False), ("add", True), ("conv", False),
        ("conv", False)]
    ran_apart = ort_float_nodes(path, tmp_path)
    assert [l.name in ran_apart for l in layers] == [l.dequantized for l in layers]
    assert kernel_type(layers[1]) == "conv_w8a8_dq" and kernel_type(layers[0]) == "conv_w8a8"


@pytest.mark.parametrize("seed", range(3))
def test_dequantized_marks_match_what_onnxruntime_fuses_in_context_networks(tmp_path, monkeypatch, seed):
    from nasctl.hardware import onnx_import

    # the importer's own reading of the graph's structure, where onnxruntime cannot be asked
    monkeypatch.setattr(onnx_import, "_in_runtime", lambda path: None)
    rng = np.random.default_rng(seed)
    model, _ = random_network(rng, max_macs=5e6)
    while not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        model, _ = random_network(rng, max_macs=5e6)
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    ran_apart = ort_float_nodes(path, tmp_path)
    source = {n.name for n in model.graph.node}
    fusable = [l for l in import_onnx(path).layers if l.op in ("conv", "linear", "add", "concat") and l.name in source]
    assert fusable and [l.name in ran_apart for l in fusable] == [l.dequantized for l in fusable]


def layer(tag):
    return LayerSpec("conv", 8, 8, (8, 8), (8, 8), name=f"k{tag}:conv_0")


def test_attribution_of_profiled_nodes():
    # A node the runtime adds after a kernel counts for that kernel; a layout reorder (into
    # or out of the blocked channel layout) for none: it is there for a pair of kernels
    # that run in different layouts, and counting it for either makes that kernel's rows
    # depend on its neighbours (see `in_context_costs` for where its time goes).
    times, counts = attribute([("k1:act_0_nchwc", 0.010), ("ReorderOutput", 0.002), ("k2:conv_1", 0.005),
                               ("k2:conv_1_token_3", 0.001), ("ReorderInput_token_4", 0.003)],
                              [layer(1), layer(2)])
    assert times == pytest.approx([0.010, 0.006]) and counts == [1, 2]
    # A node the runtime made of kernels that ran no node of their own stands for them.
    add = LayerSpec("add", 8, 8, (8, 8), (8, 8), name="k2:add_1")
    norm = LayerSpec("norm", 8, 8, (8, 8), (8, 8), fn="layer", name="k3:ln_2")
    times, _ = attribute([("k1:a", 0.010), ("SkipLayerNormalization", 0.004), ("k4:b", 0.020)],
                         [layer(1), add, norm, layer(4)])
    assert times == pytest.approx([0.010, 0.002, 0.002, 0.020])
    # A kernel without a layer (a reshape) counts for the layer before it.
    times, _ = attribute([("k1:a", 0.010), ("k2:reshape_1", 0.001), ("k3:b", 0.020)], [layer(1), layer(3)])
    assert times == pytest.approx([0.011, 0.020])


def test_layers_of_one_int8_kernel_get_the_times_of_their_own_nodes(tmp_path):
    # An int8 swish: the conv, its sigmoid and its product are one kernel (one tag) of
    # three layers, each with its output quantized.  Each layer gets its own node and the
    # quantization of its output, not a third of the kernel; the kernel's rest (its
    # weights' dequantization) goes in proportion, and the kernel's total is kept.
    def int8(name, **attrs):
        return LayerSpec(name.split(":")[1].split("_")[0], 8, 8, (8, 8), (8, 8), w_bits=8, a_bits=8, name=name, **attrs)

    conv, sig, mul = int8("k2:conv_3"), int8("k2:act_4", fn="sigmoid"), int8("k2:mul_5")
    nodes = [("k1:conv_0", 0.020), ("k2:c6_DequantizeLinear", 0.004), ("k2:conv_3", 0.030),
             ("k2:conv_3_QuantizeLinear", 0.005), ("k2:conv_3_DequantizeLinear", 0.004), ("k2:sigmoid_4", 0.007),
             ("k2:sig_4_QuantizeLinear", 0.005), ("k2:mul_5", 0.006), ("k2:act_5_QuantizeLinear", 0.004)]
    times, counts = attribute(nodes, [int8("k1:conv_0"), conv, sig, mul])
    own = np.array([0.039, 0.012, 0.010])
    assert times == pytest.approx([0.020, *(own + 0.004 * own / own.sum())])
    assert sum(times) == pytest.approx(sum(ms for _, ms in nodes)) and sum(counts) == pytest.approx(len(nodes))
    # The context networks name their nodes so: profiled by onnxruntime, an int8 swish
    # conv's time goes mostly to the conv.
    b = NetBuilder(np.random.default_rng(0), (1, 16, 24, 24))
    y = b.conv(b.conv("input", 64, 3, act="relu"), 64, 3, act="swish")
    model = quantize(b.model(y), np.random.default_rng(0))
    measured = measure_networks([(model, "swish")], Protocol(rounds=3, sessions=1), tmp_path)[0]
    kinds = [(layer.op, layer.fn) for layer in measured.layers]
    assert [k for k in kinds if k[0] != "conv"] == [("act", "sigmoid"), ("mul", "")] and len(kinds) == 4
    assert TAG.search(measured.layers[1].name).group(1) == TAG.search(measured.layers[3].name).group(1)
    assert measured.layer_ms[1] > 2 * max(measured.layer_ms[2:])

def test_quick_profile_builds_a_device_that_prices_layers(tmp_path):
    # enough rounds that a busy machine cannot drown the sizes in noise (the sweep below)
    fitted = profile_machine("cpu-local", Protocol(rounds=4, repeats=2, warmup=1), kernels=60, seed=9)
    from nasctl.hardware.fit import write_device

    folder = tmp_path / "hardware" / "cpu-local"
    write_device(folder, fitted)
    rows = read_lut(folder / "lut.csv")
    header = (folder / "lut.csv").read_text().splitlines()[0].split(",")
    assert header[:len(LUT_COLUMNS)] == list(LUT_COLUMNS) and set(header[len(LUT_COLUMNS):]) <= set(OPTIONAL_COLUMNS)
    assert all(r["latency_ms"] > 0 for r in rows)
    m = fitted.spec["measurement"]
    assert m["clock"] == "thread_cpu" and m["threads"] == 1 and m["run_overhead_ms"] >= 0
    device = LutDevice.from_dict({"name": "cpu-local", **fitted.spec}, folder)
    assert not device.models_energy
    per_layer = fitted.spec["overhead"]["per_layer_ms"]

    hit = layer_from_row(rows[0])
    cost = device.estimate([LayerSpec("add", 1, 1, (1, 1), (1, 1)), hit]).costs[1]
    # too few context networks to fit per-kernel offsets on held-out folds: none, and the spec says why
    assert fitted.spec["overhead"]["per_kernel_ms"] == {} and "not fitted" in fitted.spec["fit"]["kernel_offsets"]["note"]
    # a profiled device prices its own kernels by their type's regressor (each row is one
    # network's noisy in-context time); a spec that trusts exact rows prices the row as stored
    assert fitted.spec["exact_rows"] is False and cost.mapping.endswith("regressor")
    exact = LutDevice.from_dict({"name": "cpu-local", **fitted.spec, "exact_rows": True}, folder)
    cost = exact.estimate([LayerSpec("add", 1, 1, (1, 1), (1, 1)), hit]).costs[1]
    assert cost.mapping == "table" and cost.latency_ms == pytest.approx(rows[0]["latency_ms"] + per_layer)
    convs = [r for r in rows if r["op"] == "conv" and r["groups"] == 1]
    assert convs, "a profile always measures dense convs"
    sweep = [device.estimate([LayerSpec("conv", 48, c, (20, 20), (20, 20), (3, 3), fn="relu")]).latency_ms
             for c in (24, 48, 96, 192, 384)]
    assert all(s > 0 for s in sweep) and sweep[-1] > sweep[0]

    # The measured networks are kept beside the table: the device fits again from them alone,
    # to the same table, and each network's kernels and run overhead add up to its time.
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import MEASUREMENTS_FILE, refit_profile

    again = refit_profile("cpu-local", folder)
    assert again.rows == fitted.rows and again.spec["overhead"] == fitted.spec["overhead"]
    doc = json.loads((folder / MEASUREMENTS_FILE).read_text())
    assert [MeasuredNetwork.from_dict(d).to_dict() for d in doc["networks"]] == doc["networks"]
    # each layer's time is attributed again from the profiled nodes kept beside it, as the
    # code attributes them when it refits
    assert all(d["nodes"] for d in doc["networks"])
    (folder / MEASUREMENTS_FILE).write_text(json.dumps({**doc, "networks": [
        {**d, "layer_ms": [0.0] * len(d["layer_ms"])} for d in doc["networks"]]}))
    assert refit_profile("cpu-local", folder).rows == fitted.rows
    (folder / MEASUREMENTS_FILE).write_text("{}")
    with pytest.raises(UsageError, match="cannot read the measured context networks"):
        refit_profile("cpu-local", folder)


def test_a_full_profile_draws_every_tenth_context_network_large_and_a_quick_one_none(tmp_path, monkeypatch):
    """Published models run their kernels slower than small networks do (their tensors
    leave the caches); a profile of LARGE_FROM kernels or more measures large networks
    (0.1-1 GMAC) beside the small ones, their kernels not counted against the budget, and
    any one of them builds again alone from the profile's seed and seeding."""
    import nasctl.hardware.measure.profile as profile

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    assert profile.seeding_for(99) == profile.SEEDING_PLAIN and profile.seeding_for(100) == profile.SEEDING_GROUPED
    nets = profile.context_networks(600, seed=7)

    def macs(model) -> int:
        path = tmp_path / "net.onnx"
        onnx.save(model, str(path))
        return sum(layer.macs for layer in import_onnx(path).layers)

    large = [i for i in range(len(nets)) if profile.is_large(i, profile.SEEDING_LARGE)]
    assert large and all(i % profile.LARGE_EVERY == profile.LARGE_EVERY - 1 for i in large)
    for i in large:
        assert nets[i][1].startswith("large ") and macs(nets[i][0]) >= 0.5e8
        again = profile.context_network(7, i, profile.SEEDING_LARGE)[0]
        assert again.SerializeToString() == nets[i][0].SerializeToString()
    small = [i for i in range(len(nets)) if i not in large]
    assert np.median([macs(nets[i][0]) for i in small]) < 0.5e8
    counted = sum(len({m.group(1) for n in nets[i][0].graph.node if (m := TAG.search(n.name))}) for i in small)
    before_last = counted - len({m.group(1) for n in nets[small[-1]][0].graph.node if (m := TAG.search(n.name))})
    assert before_last < 600 <= counted  # the budget counts the small networks' kernels only
    assert not any(profile.is_large(i, profile.SEEDING_PLAIN) for i in range(len(nets)))


def test_a_full_profile_draws_every_tenth_other_network_with_channel_counts_not_multiples_of_4(tmp_path, monkeypatch):
    """onnxruntime runs a depthwise conv whose channels are not a multiple of 4 channel by
    channel (`lut._plain_depthwise`); a full profile draws every tenth network (not a large
    one) with channel counts of any integer, which hold such convs at every size.  Profiles
    drawn before build the networks they measured: the others are the same networks."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import odd_width_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    nets = profile.context_networks(400, seed=7)
    odd = [i for i in range(len(nets)) if profile.is_odd_width(i, profile.SEEDING_ODD)]
    assert odd and all(i % 10 == profile.ODD_AT for i in odd)
    assert not any(profile.is_odd_width(i, s) for i in range(len(nets)) for s in (profile.SEEDING_LARGE,
                                                                                   profile.SEEDING_PLAIN))
    for i in odd:
        model, description = nets[i]
        assert description.startswith("odd-width ")
        assert profile.context_network(7, i, profile.SEEDING_ODD)[0].SerializeToString() == model.SerializeToString()
    plain_dw, widths = 0, []
    for k in range(10):
        onnx.save(odd_width_network(np.random.default_rng([7, k]))[0], str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        plain_dw += sum(kernel_type(layer) == "conv_dw_nchw" for layer in layers)
        widths += [layer.out_ch for layer in layers if layer.op == "conv"]
    assert plain_dw >= 10 and np.mean([w % 4 != 0 for w in widths]) > 0.5
    for i in (0, 1, 3, 5, 13):  # the other networks: as a profile drawn before drew them
        assert profile.context_network(7, i, profile.SEEDING_ODD)[0].SerializeToString() == \
            profile.context_network(7, i, profile.SEEDING_LARGE)[0].SerializeToString()


def test_a_full_profile_draws_every_tenth_other_network_with_strided_transposes_and_reductions(tmp_path, monkeypatch):
    """onnxruntime runs a transpose that moves the innermost axis, and an L2 norm or a
    reduction of axes with others inside them, without contiguous blocks (`layers.STRIDED`):
    4-20x the time per element.  A full profile draws every tenth network (not a large
    one) from the hybrid blocks that hold them (MobileViT, ConvNeXt-V2, EdgeNeXt); the
    other networks are those a profile drawn before drew."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import strided_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    nets = profile.context_networks(400, seed=7)
    strided = [i for i in range(len(nets)) if profile.is_strided(i, profile.SEEDING_STRIDED)]
    assert strided and all(i % 10 == profile.STRIDED_AT for i in strided)
    assert not any(profile.is_strided(i, s) for i in range(len(nets)) for s in (profile.SEEDING_ODD,
                                                                                 profile.SEEDING_LARGE,
                                                                                 profile.SEEDING_PLAIN))
    for i in strided:
        model, description = nets[i]
        assert description.startswith("strided ")
        assert profile.context_network(7, i, profile.SEEDING_STRIDED)[0].SerializeToString() == \
            model.SerializeToString()
    types = []
    for k in range(20):
        onnx.save(strided_network(np.random.default_rng([7, k]))[0], str(tmp_path / "net.onnx"))
        types += [kernel_type(layer) for layer in import_onnx(tmp_path / "net.onnx").layers]
    assert types.count("data_strided") >= 5 and types.count("pool_strided") >= 10
    for i in (0, 1, 4, 5, 13):  # the other networks: as a profile drawn before drew them
        assert profile.context_network(7, i, profile.SEEDING_STRIDED)[0].SerializeToString() == \
            profile.context_network(7, i, profile.SEEDING_ODD)[0].SerializeToString()


def test_a_full_profile_draws_every_tenth_other_network_with_most_of_its_weights_in_a_linear_head(tmp_path,
                                                                                                   monkeypatch):
    """A layer that multiplies one row by a weight matrix (a classifier) reads its weights
    from the caches in a model of a few MB of weights and from memory in a larger one
    (`lut.WeightStream`).  A full profile draws every tenth network (not a large one) with
    2-40 MB of weights, most of them in a linear head, to place that change; the other
    networks are those a profile drawn before drew."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import streams_weights, weight_bytes
    from nasctl.hardware.measure.context import headed_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    nets = profile.context_networks(400, seed=7)
    headed = [i for i in range(len(nets)) if profile.is_headed(i, profile.SEEDING_HEADED)]
    assert headed and all(i % 10 == profile.HEADED_AT for i in headed)
    assert not any(profile.is_headed(i, s) for i in range(len(nets)) for s in (
        profile.SEEDING_STRIDED, profile.SEEDING_ODD, profile.SEEDING_LARGE, profile.SEEDING_PLAIN))
    for i in headed:
        model, description = nets[i]
        assert description.startswith("headed ")
        assert profile.context_network(7, i, profile.SEEDING_HEADED)[0].SerializeToString() == \
            model.SerializeToString()
    weights, shares = [], []
    for k in range(20):
        onnx.save(headed_network(np.random.default_rng([7, k]))[0], str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        weights.append(weight_bytes(layers))
        shares.append(sum(layer.params * layer.w_bits / 8 for layer in layers if streams_weights(layer)) / weights[-1])
    assert min(weights) < 5e6 and max(weights) > 12e6 and sum(5e6 <= w <= 20e6 for w in weights) >= 8
    assert np.median(shares) > 0.5
    for i in (0, 2, 4, 5, 7, 13):  # the other networks: as a profile drawn before drew them
        assert profile.context_network(7, i, profile.SEEDING_HEADED)[0].SerializeToString() == \
            profile.context_network(7, i, profile.SEEDING_STRIDED)[0].SerializeToString()


def test_validation_tells_the_machines_speed_by_context_networks_the_profile_measured(tmp_path, monkeypatch):
    """A few small reference networks misjudge how fast the machine runs now against its
    profile by several percent; `validate_models` times again some of the profile's own
    context networks (built again alone from the profile's seed) and takes the median
    ratio, falling back to the reference networks where none builds as it was measured."""
    import nasctl.hardware.measure.profile as profile

    nets = profile.context_networks(60, seed=3)
    for i in (0, len(nets) - 1):  # any context network builds again alone, as the profile drew it
        assert profile.context_network(3, i, profile.seeding_for(60))[0].SerializeToString() == \
            nets[i][0].SerializeToString()
    fitted = profile_machine("q", Protocol(rounds=2, repeats=1, warmup=1), kernels=60, seed=3)
    m = fitted.spec["measurement"]
    speed = m["speed_references"]
    assert m["seeding"] == profile.seeding_for(60) == profile.SEEDING_PLAIN and speed["networks"]
    assert all(ms <= profile.SPEED_REFERENCE_MAX_MS for ms in speed["ms"])
    from nasctl.hardware.fit import write_device

    write_device(tmp_path / "q", fitted)
    device = LutDevice.from_dict({"name": "q", **fitted.spec}, tmp_path / "q")
    stored = {nets[i][0].SerializeToString(): ms for i, ms in zip(speed["networks"], speed["ms"])}
    refs = {r.SerializeToString(): ms for (r, _), ms in zip(profile.reference_networks(3), m["reference_ms"])}
    # the machine now: the profile's context networks twice as slow, its reference networks 3x
    def fake(models, *args, **kwargs):
        return np.array([2 * stored[x] if x in stored else 3 * refs[x] if x in refs else 1.0 for x in models])

    monkeypatch.setattr(profile, "measure_models", fake)
    model = tiny(tmp_path, "m", 2)
    s = profile.validate_models(device, [model], rounds=2)["summary"]
    assert s["machine_vs_profile"] == pytest.approx(2.0)
    assert s["machine_vs_profile_from"] == f"{len(speed['networks'])} of the profile's context networks"
    # a network that no longer builds as it was measured is not used; with none left, the references
    device.spec.measurement["speed_references"]["descriptions"] = ["another network"] * len(speed["networks"])
    s = profile.validate_models(device, [model], rounds=2)["summary"]
    assert s["machine_vs_profile"] == pytest.approx(3.0) and s["machine_vs_profile_from"] == "3 reference networks"
    # a profile whose networks were drawn otherwise (before each had a seed of its own) names none
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    doc = fitted.files[profile.MEASUREMENTS_FILE]
    old = {k: v for k, v in doc["measurement"].items() if k != "seeding"}
    again = profile.fit_profile("q", [MeasuredNetwork.from_dict(d) for d in doc["networks"]], old, doc["chunk_of"],
                                doc["reference_ms"])
    assert "speed_references" not in again.spec["measurement"]


def test_in_context_costs_add_up_to_each_networks_end_to_end_time():
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    rng = np.random.default_rng(0)
    networks = []
    for i in range(6):  # profiled kernel times 20% above what the runs without the profiler took
        ms = rng.uniform(0.01, 0.2, 5)
        networks.append(MeasuredNetwork(f"n{i}", [layer(k) for k in range(5)], list(ms * 1.2), [1.0] * 5,
                                        float(0.01 + ms.sum())))
    costs, norm = in_context_costs(networks)
    run = norm["run_overhead_ms"]
    assert [c.sum() + run for c in costs] == pytest.approx([m.latency_ms for m in networks], rel=1e-4)
    for c, m in zip(costs, networks):  # the kernels keep their order within the network
        assert list(np.argsort(c)) == list(np.argsort(m.layer_ms))


def test_layout_reorders_are_shared_by_their_networks_kernels():
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    # Networks of the same two kernels, one of them with a layout reorder of 0.02 ms
    # besides: its kernels carry it in proportion to their times, not one of them all of it.
    nodes = [("k0:conv_0", 0.05), ("k1:conv_1", 0.01)]
    plain = [MeasuredNetwork(f"n{i}", [layer(0), layer(1)], [0.05, 0.01], [1.0, 1.0], 0.065, nodes=nodes)
             for i in range(3)]
    reordered = [("k0:conv_0", 0.05), ("ReorderOutput_token_7", 0.02), ("k1:conv_1", 0.01)]
    with_reorder = MeasuredNetwork("r", [layer(0), layer(1)], *attribute(reordered, [layer(0), layer(1)]), 0.085,
                                   nodes=reordered)
    assert with_reorder.layer_ms == pytest.approx([0.05, 0.01])
    costs, norm = in_context_costs([*plain, with_reorder], known=(0.005, 0.0))
    assert costs[0] == pytest.approx([0.05, 0.01])
    assert costs[-1] == pytest.approx([0.05 * 4 / 3, 0.01 * 4 / 3])
    # The run overhead and the profiler's cost per node are fitted over every node profiled,
    # the reorders' included: here 0.005 ms and 1 µs a node.
    free = []
    for i, (a, b, r) in enumerate([(0.05, 0.01, 0.0), (0.02, 0.03, 0.01), (0.04, 0.02, 0.02), (0.01, 0.01, 0.03),
                                   (0.03, 0.05, 0.01)]):
        reorder = [("ReorderInput", r + 0.001)] if r else []
        nodes = [("k0:conv_0", a + 0.001), *reorder, ("k1:conv_1", b + 0.001)]
        free.append(MeasuredNetwork(f"f{i}", [layer(0), layer(1)], *attribute(nodes, [layer(0), layer(1)]),
                                    0.005 + a + b + r, nodes=nodes))
    _, norm = in_context_costs(free)
    assert norm["profiler_cost_per_node_ms"] == pytest.approx(0.001, abs=1e-4)
    assert norm["run_overhead_ms"] == pytest.approx(0.005, abs=1e-4)


def test_kernels_beside_a_long_one_lean_on_the_typical_scale():
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    c0 = 0.005
    # Networks without long kernels: profiled 10% above their end-to-end times.
    plain = [MeasuredNetwork(f"n{i}", [layer(0), layer(1)], [a * 1.1, b * 1.1], [1.0, 1.0], c0 + a + b)
             for i, (a, b) in enumerate([(0.05, 0.01), (0.02, 0.03), (0.04, 0.04)])]
    # A network whose long kernel, timed alone, is 0.9 ms of its 1.0 ms; its end-to-end
    # time read 5% high leaves 0.15 ms for kernels profiled at 0.11: a scale of 1.36,
    # where the other networks' is 0.91.  The long kernel holds 86% of the time, so the
    # scale is mostly the typical one.
    long = MeasuredNetwork("long", [layer(0), layer(1)], [0.95, 0.11], [1.0, 1.0], c0 + 1.05,
                           alone={0: (c0 + 0.9, 0.0, 0)})
    costs, info = in_context_costs([*plain, long], known=(c0, 0.0))
    typical, raw = 1 / 1.1, 0.15 / 0.11
    assert costs[0] == pytest.approx([0.05, 0.01])  # the plain networks keep their own scale
    share = 1 - 0.9 / 1.05
    assert costs[-1][0] == pytest.approx(0.9)
    assert costs[-1][1] == pytest.approx(0.11 * raw ** share * typical ** (1 - share))
    assert 0.11 * typical < costs[-1][1] < 0.11 * 1.1


def test_long_kernels_are_timed_alone(tmp_path):
    b = NetBuilder(np.random.default_rng(0), (1, 64, 56, 56))
    y = b.conv(b.conv("input", 64, 1, act="relu"), 64, 3, act="relu")
    measured = measure_networks([(b.model(y), "two convs")], Protocol(rounds=2, repeats=1, warmup=1), tmp_path,
                                long_kernel_ms=0.0)
    m = measured[0]
    assert set(m.alone) == {0, 1} and all(ms > 0 for ms, _, _ in m.alone.values())
    # cut out alone, each conv runs in the blocked layout (where onnxruntime has one for this
    # CPU: its nodes named so) between a reorder of its input and one of its output:
    # neither is its own time
    blocked = any(name.endswith("_nchwc") for name, _ in m.nodes)
    assert [n for _, _, n in m.alone.values()] == ([2, 2] if blocked else [0, 0])
    costs, info = in_context_costs(measured)
    assert np.all(costs[0] > 0) and info["kernels_timed_alone"] == 2


def test_energy_is_recorded_where_the_machine_has_counters(monkeypatch, tmp_path):
    """A fake RAPL counter that rises at 2 W: each kernel's energy is its time x 2 W."""
    import time

    from nasctl.hardware.measure import runner

    counter = tmp_path / "energy_uj"
    counter.write_text("0")
    monkeypatch.setattr(runner, "energy_counters", lambda: [counter])
    monkeypatch.setattr(runner, "read_energy_uj", lambda: time.perf_counter() * 2e6)
    fitted = profile_machine("cpu-local", Protocol(rounds=2, repeats=1, warmup=1), kernels=20, seed=4)
    assert fitted.spec["models_energy"] is True and "RAPL" in fitted.spec["energy"]
    device = fitted.device()
    cost = device.estimate([layer_from_row(fitted.rows[0])]).costs[0]
    assert cost.energy_mj is not None and cost.energy_mj > 0
    assert all(r["energy_mj"] > 0 for r in fitted.rows)


def test_no_counters_means_latency_only(monkeypatch):
    from nasctl.hardware.measure import runner

    monkeypatch.setattr(runner, "energy_counters", lambda: [])
    fitted = profile_machine("cpu-local", Protocol(rounds=2, repeats=1, warmup=1), kernels=20, seed=5)
    assert fitted.spec["models_energy"] is False and fitted.spec["energy"].startswith("latency only")
    assert not fitted.device().models_energy


def _identity_biases(model):
    """The float model with each conv's bias read through an Identity, as torch's exporter
    writes a bias it shares between convs (the quantizer then puts the bias's
    DequantizeLinear before the Identity)."""
    from onnx import helper

    for n in [n for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 2]:
        model.graph.node.insert(0, helper.make_node("Identity", [n.input[2]], [f"{n.input[2]}_id"],
                                                    name=f"{n.name}_bias_id"))
        n.input[2] = f"{n.input[2]}_id"
    return model


def test_dequantized_marks_follow_onnxruntime_where_biases_pass_an_identity(tmp_path):
    rng = np.random.default_rng(0)
    b = NetBuilder(rng, (1, 3, 16, 16))
    x = b.conv(b.conv("input", 16, 3, act="relu"), 16, 3, act="relu")
    y = b.add(b.conv(b.conv(x, 32, 1, act="relu"), 16, 3, act="relu"), x)  # x has two readers
    y = b.conv(b.conv(y, 32, 1, act="relu"), 32, 3, groups=32, act="relu")
    path = tmp_path / "q.onnx"
    path.write_bytes(quantize(_identity_biases(b.model(b.conv(y, 16, 1))), rng, per_channel=True).SerializeToString())
    layers = import_onnx(path).layers
    ran_apart = ort_float_nodes(path, tmp_path)
    assert [l.name in ran_apart for l in layers] == [l.dequantized for l in layers]
    assert {l.dequantized for l in layers} == {True, False}


@pytest.mark.parametrize("kind", ["grouped", "mixconv", "ghost", "convnext"])
def test_context_blocks_of_published_families_run_and_import(tmp_path, kind):
    import onnxruntime as ort

    from nasctl.hardware.measure.context import _Blocks

    rng = np.random.default_rng(1)
    b = NetBuilder(rng, (1, 3, 32, 32))
    blocks = _Blocks(b, rng)
    x = getattr(blocks, kind)(b.conv("input", 24, 3, 2, act="relu"), 48, 2, "relu")
    x = getattr(blocks, kind)(x, 48, 1, "swish")
    model = b.model(x)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    result = import_onnx(path)
    assert not result.unsupported and all(TAG.search(l.name) for l in result.layers)
    out, = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"input": np.zeros((1, 3, 32, 32), np.float32)})
    assert out.shape == b.shapes[x]


@pytest.mark.parametrize("seed", range(4))
def test_tiny_context_networks_cover_small_inputs_and_transformers(tmp_path, seed):
    """Small networks on digits-sized inputs (what search candidates train on): valid,
    fully importable, with kernels over few tokens or pixels."""
    from nasctl.hardware.measure.context import TINY_SIZES, _tiny_net

    model, description = _tiny_net(np.random.default_rng(seed), 2e6)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    result = import_onnx(path)
    assert not result.unsupported and result.layers and "tiny" in description
    assert result.layers[0].in_hw[0] in TINY_SIZES


def _working_set_networks(seed: int, tokens: list, large_from: float = np.inf, slope: float = 0.03,
                          knee: float = np.inf):
    """Measured networks of the same six convs, some beside a transpose of `tokens` rows (4
    MB a thousand): every kernel runs `slope` slower per e-fold of the network's working set
    (its weights and activations, up to `knee` bytes) than in the median network.  Networks
    of `large_from` rows or more are described as large context networks.  (network(rows) ->
    its layers and times in the median network, the measured networks, the slowdown of a
    layer list.)"""
    from nasctl.hardware.lut import working_set_bytes
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import LARGE_PREFIX

    rng = np.random.default_rng(seed)
    shapes = [(int(rng.choice([16, 24, 32])), int(rng.choice([8, 16]))) for _ in range(6)]

    def network(rows):
        layers = [LayerSpec("conv", c, c, (hw, hw), (hw, hw), (3, 3), name=f"k{j}:conv")
                  for j, (c, hw) in enumerate(shapes)]
        base = [2e-3 + layer.macs * 1e-8 for layer in layers]
        if rows:
            layers.append(LayerSpec("data", 1024, 1024, (rows, 1), (rows, 1), fn="transpose", name="k9:t"))
            base.append(1e-4)
        return layers, base

    drawn = [int(t) for t in tokens]  # numpy integers to ints
    raw = [network(t) for t in drawn]
    ref = float(np.median([working_set_bytes(layers) for layers, _ in raw]))
    slow = lambda layers: 1 + slope * np.log(min(working_set_bytes(layers), knee) / ref)  # noqa: E731
    nets = [MeasuredNetwork(f"{LARGE_PREFIX * (t >= large_from)}net {i}", layers, [b * slow(layers) for b in base],
                            [1.0] * len(base), 0.01 + sum(base) * slow(layers))
            for i, (t, (layers, base)) in enumerate(zip(drawn, raw))]
    return network, nets, slow


def test_the_profile_fits_how_kernels_slow_down_in_large_working_sets():
    # Networks of the same convs, some beside a large tensor (a transpose writing 4-64 MB).
    # A table fitted to their in-context times prices the convs at their median, so a small
    # network high and a large one low; the fitted slope puts that right.
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(1)
    network, nets, slow = _working_set_networks(1, list(rng.choice([0, 0, 1024, 4096, 16384], 48)))
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    assert fitted.spec["overhead"]["working_set"]["slope"] == pytest.approx(0.03, abs=0.01)
    assert "knee_bytes" not in fitted.spec["overhead"]["working_set"]  # a slowdown that goes on growing
    device, without = fitted.device(), fitted.device()
    without.spec = without.spec.model_copy(update={"overhead": without.spec.overhead.model_copy(
        update={"working_set": None})})
    for tokens in (0, 65536):  # 256 MB: beyond every context network
        layers, base = network(tokens)
        true = 0.01 + sum(base) * slow(layers)
        assert device.estimate(layers).latency_ms == pytest.approx(true, rel=0.05)
    assert without.estimate(layers).latency_ms < 0.93 * true  # without the slope, the large one is priced low


def test_the_profile_fits_the_working_set_past_which_kernels_slow_down_no_further():
    # Kernels that slow down up to a 16 MB working set and no further (their tensors have
    # left the inner caches by then).  A slope through all sizes would price a 256 MB model
    # well over its time; the fitted knee prices it right, and a small one too.
    from nasctl.hardware.lut import WorkingSet
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(4)
    network, nets, slow = _working_set_networks(4, list(rng.choice([0, 0, 256, 1024, 4096, 16384], 60)),
                                                slope=0.06, knee=16e6)
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    working_set = fitted.spec["overhead"]["working_set"]
    assert 8e6 <= working_set["knee_bytes"] <= 32e6
    loss = fitted.spec["fit"]["kernel_offsets"]["loss"]
    assert loss["fitted"] < loss["without_a_knee"]
    device = fitted.device()
    for tokens in (0, 65536):
        layers, base = network(tokens)
        assert device.estimate(layers).latency_ms == pytest.approx(0.01 + sum(base) * slow(layers), rel=0.05)
    no_knee = device.spec.overhead.model_copy(update={"working_set": WorkingSet(
        ref_bytes=working_set["ref_bytes"], slope=working_set["slope"])})
    device.spec = device.spec.model_copy(update={"overhead": no_knee})
    assert device.estimate(layers).latency_ms > 1.1 * (0.01 + sum(base) * slow(layers))  # the 256 MB one


def test_a_knee_is_kept_unless_a_slope_without_one_fits_the_networks_clearly_better():
    # Noisy networks (8% a network) whose kernels stop slowing at 8 MB, four of sixty past
    # it: the knee lowers the fit's loss by less than KNEE_GAIN, and is kept all the same -
    # caches are finite - so a 256 MB model, beyond every network, is priced at the
    # knee's slowdown, not at a slope extrapolated from four networks.
    import dataclasses

    from nasctl.hardware.measure.profile import KNEE_GAIN, fit_profile

    rng = np.random.default_rng(6)
    tokens = list(rng.choice([0, 0, 0, 256, 1024, 2048, 4096], 56)) + [16384] * 4
    network, nets, slow = _working_set_networks(6, tokens, slope=0.05, knee=8e6)
    noise = np.exp(rng.normal(0, 0.08, len(nets)))
    nets = [dataclasses.replace(n, latency_ms=n.latency_ms * f, layer_ms=[t * f for t in n.layer_ms])
            for n, f in zip(nets, noise)]
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    loss = fitted.spec["fit"]["kernel_offsets"]["loss"]
    assert 0 < 1 - loss["fitted"] / loss["without_a_knee"] < KNEE_GAIN
    assert 4e6 <= fitted.spec["overhead"]["working_set"]["knee_bytes"] <= 16e6
    layers, base = network(65536)
    assert fitted.device().estimate(layers).latency_ms == pytest.approx(0.01 + sum(base) * slow(layers), rel=0.05)


def test_the_table_holds_float_kernels_at_the_reference_working_set():
    # Networks of convs of shapes of their own, small ones and large ones (beside a large
    # transpose): every kernel 0.05 slower per e-fold of the working set.  A row is a
    # kernel's time in its own network; the device prices rows at the reference working set
    # and scales them to a model's, so the table holds each float row divided by its
    # network's factor (else a small network's kernels, already fast, were scaled down
    # twice), and the small networks are priced at their times.
    from nasctl.hardware.lut import WorkingSet, layer_from_row, working_set_bytes, working_set_factor
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(6)

    def network(small):
        layers = [LayerSpec("conv", c, c, (hw, hw), (hw, hw), (3, 3), name=f"k{j}:conv")
                  for j, (c, hw) in enumerate(zip(rng.integers(8, 65, 6).tolist(), rng.integers(6, 17, 6).tolist()))]
        rows = int(rng.choice([16, 64])) if small else int(rng.choice([1024, 4096, 16384]))
        return layers + [LayerSpec("data", 1024, 1024, (rows, 1), (rows, 1), fn="transpose", name="k9:t")]

    raw = [network(i % 3 == 0) for i in range(90)]
    ref = float(np.median([working_set_bytes(layers) for layers in raw]))

    def times(layers):
        slow = 1 + 0.05 * np.log(working_set_bytes(layers) / ref)
        return [(2e-3 + layer.macs * 1e-8 if layer.op == "conv" else 1e-4) * slow for layer in layers]

    nets = [MeasuredNetwork(f"net {i}", layers, times(layers), [1.0] * len(layers), 0.01 + sum(times(layers)))
            for i, layers in enumerate(raw)]
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    scaled_by = WorkingSet(**fitted.spec["fit"]["kernel_offsets"]["float_rows_scaled_to_the_reference_working_set_by"])
    assert scaled_by.slope == pytest.approx(0.05, abs=0.015)
    table = {layer_from_row(r).shape_key(): r["latency_ms"] for r in fitted.rows}
    small = [m for m in nets if 1 + 0.05 * np.log(working_set_bytes(m.layers) / ref) < 0.9]  # 10% faster or more
    assert len(small) >= 10 and all(working_set_factor(scaled_by, m.layers) < 0.93 for m in small)
    # their convs' rows: near their time in a network of the reference working set (0.91x
    # median here; unscaled, their own networks' times: 0.82x)
    ratios = [table[layer.shape_key()] / (2e-3 + layer.macs * 1e-8) for m in small for layer in m.layers[:6]]
    assert 0.87 < float(np.median(ratios)) < 1.1
    device = fitted.device()
    errors = [device.estimate(m.layers).latency_ms / m.latency_ms - 1 for m in small]
    assert abs(float(np.median(errors))) < 0.04, errors


def test_large_context_networks_fit_the_slope_but_stay_out_of_the_table():
    # A large network's kernels ran slower than in a small model (its tensors left the
    # caches): its kernels must not price a small model's, but its end-to-end time is what
    # tells the working-set slope.
    from nasctl.hardware.measure.profile import LARGE_PREFIX, fit_profile

    rng = np.random.default_rng(2)
    tokens = list(rng.choice([0, 0, 1024, 4096], 40)) + [65536] * 8
    network, nets, slow = _working_set_networks(2, tokens, large_from=65536)
    assert sum(n.description.startswith(LARGE_PREFIX) for n in nets) == 8
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    assert not any(int(r["in_h"]) == 65536 for r in fitted.rows)  # the large networks' transposes: no row
    assert fitted.spec["overhead"]["working_set"]["slope"] == pytest.approx(0.03, abs=0.01)
    layers, base = network(65536)
    assert fitted.device().estimate(layers).latency_ms == pytest.approx(0.01 + sum(base) * slow(layers), rel=0.06)


def test_the_profile_fits_where_a_classifier_reads_its_weights_from_memory():
    # Networks of two convs, a classifier of 1-5 MB and, in some, a large conv: the
    # classifier reads its weights at 0.02 ms/MB where the network's weights (all of them)
    # are under 10 MB, at 0.045 ms/MB beyond.  The fitted device prices a classifier right
    # in a small model and in a large one.
    from nasctl.hardware.lut import weight_bytes
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(3)

    def network(classes, extra_channels):
        layers = [LayerSpec("conv", 16, 16, (16, 16), (16, 16), (3, 3), name="k0:conv"),
                  LayerSpec("conv", 256, 256, (4, 4), (4, 4), (3, 3), name="k1:conv")]  # 2.4 MB
        if extra_channels:
            layers.append(LayerSpec("conv", extra_channels, extra_channels, (4, 4), (4, 4), (3, 3), name="k2:conv"))
        layers.append(LayerSpec("linear", 1024, classes, (1, 1), (1, 1), bias=True, name="k3:gemm"))
        rate = 0.02 if weight_bytes(layers) < 10e6 else 0.045
        ms = [2e-3 + layer.macs * 1e-8 for layer in layers[:-1]] + [3e-3 + layers[-1].params * 4e-6 * rate]
        return layers, ms

    nets = []
    for i in range(60):
        layers, ms = network(int(rng.choice([250, 500, 1000, 1250])), int(rng.choice([0, 1024])))
        nets.append(MeasuredNetwork(f"net {i}", layers, ms, [1.0] * len(ms), 0.01 + sum(ms)))
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    stream = fitted.spec["overhead"]["weight_stream"]
    assert 7.5e6 < stream["cache_bytes"] < 40e6  # between the small networks and the large ones
    assert stream["resident_ms_per_mb"] == pytest.approx(0.02 + 3e-3 / 5, rel=0.3)
    assert stream["streamed_ms_per_mb"] == pytest.approx(0.045 + 3e-3 / 5, rel=0.3)
    assert stream["convs"] is True  # a fit of this version counts 1x1 convs on 1x1 maps (`lut.streams_weights`)
    device, without = fitted.device(), fitted.device()
    without.spec = without.spec.model_copy(update={"overhead": without.spec.overhead.model_copy(
        update={"weight_stream": None})})
    for extra in (0, 1024):  # 6.5 MB and 44 MB of weights
        layers, ms = network(1000, extra)
        assert device.estimate(layers).costs[-1].latency_ms == pytest.approx(ms[-1], rel=0.12)
    small, large = network(1000, 0), network(1000, 1024)
    # the table holds the resident time: without the reading from memory, a large model's is priced at half
    assert without.estimate(small[0]).costs[-1].latency_ms == pytest.approx(small[1][-1], rel=0.1)
    assert without.estimate(large[0]).costs[-1].latency_ms < 0.6 * large[1][-1]


def test_some_context_networks_are_tiny():
    descriptions = [random_network(np.random.default_rng(k))[1] for k in range(60)]
    assert 2 <= sum("tiny" in d for d in descriptions) <= 20


def test_some_context_networks_are_regnets_of_grouped_convs_of_one_small_group_width(tmp_path):
    """Grouped convs of tens to hundreds of groups of 8-24 channels (RegNet), float and int8,
    are among the context networks: other blocks seldom reach so many groups."""
    drawn = [random_network(np.random.default_rng(k)) for k in range(80)]
    regnets = [(m, d) for m, d in drawn if "regnet gw" in d]
    assert 3 <= len(regnets) <= 20 and any(d.startswith("int8") for _, d in regnets)
    most, with_blocks = 0, 0
    for model, description in regnets:
        group_width = int(description.split("regnet gw")[1].split()[0])
        assert group_width in (8, 16, 24)
        path = tmp_path / "net.onnx"
        path.write_bytes(model.SerializeToString())
        grouped = [layer for layer in import_onnx(path).layers if layer.op == "conv" and 1 < layer.groups < layer.in_ch]
        # (a network whose budget its stem already spends has no blocks)
        assert all(layer.in_ch // layer.groups == group_width for layer in grouped), description
        with_blocks += bool(grouped)
        most = max([most] + [layer.groups for layer in grouped])
    assert with_blocks >= len(regnets) - 2 and most >= 16


def test_kernel_offsets_give_each_layer_what_its_profile_left_out():
    # Networks of small linear kernels (1 µs + 0.1 ns per MAC) and reshapes; each reshape also
    # costs the executor 3 µs the profiler does not see.  Scaling a network's profiled
    # times to its end-to-end time hands that cost to the linears, by their time; the
    # fitted offsets give it back to the reshapes, so a network of many reshapes and small
    # linears - which the scaled kernels price low - is priced right.
    from dataclasses import replace

    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(0)

    def network(i, reshapes, sizes):
        layers, ms = [], []
        for j, (c, t) in enumerate(sizes):
            lin = LayerSpec("linear", c, c, (t, 1), (t, 1), name=f"k{2 * j}:mm")
            layers.append(lin)
            ms.append(1e-3 + lin.macs * 1e-7)
            if j < reshapes:
                layers.append(LayerSpec("data", 1, c, (t, 1), (t, 1), fn="transpose", name=f"k{2 * j + 1}:reshape"))
                ms.append(1e-4)
        true = 0.01 + sum(ms) + 0.003 * reshapes
        return MeasuredNetwork(f"net {i}", layers, ms, [1.0] * len(ms), true)

    nets = []
    for i in range(40):
        sizes = [(int(rng.choice([16, 24, 32, 48])), int(rng.choice([4, 9, 16]))) for _ in range(8)]
        nets.append(network(i, int(rng.integers(0, 9)), sizes))
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    offsets = fitted.spec["overhead"]["per_kernel_ms"]
    assert offsets["data"] == pytest.approx(0.003, rel=0.3)
    assert fitted.spec["fit"]["kernel_offsets"]["networks"] == 40

    new = network(99, 8, [(32, 4)] * 8)  # small linears, a reshape after each
    priced = fitted.device().estimate(new.layers).latency_ms
    without = replace(fitted, spec={**fitted.spec, "overhead": {**fitted.spec["overhead"], "per_kernel_ms": {}}})
    without = without.device().estimate(new.layers).latency_ms
    assert priced == pytest.approx(new.latency_ms, rel=0.10)
    assert without < 0.85 * new.latency_ms


def test_a_refit_reads_the_context_networks_layers_again_as_the_importer_labels_them_now(tmp_path):
    """A profile measured before the importer told residual sums apart fits again with them
    told apart, from the same times; a network that no longer builds as it was measured
    keeps the layers it was measured with."""
    from dataclasses import replace

    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import SEEDING_PLAIN, context_network, layers_digest, read_again
    from nasctl.hardware.onnx_import import import_onnx

    measured, now = [], []
    for index in range(10):  # a profile's networks, in order: the 9th holds a residual sum
        model, description = context_network(0, index, SEEDING_PLAIN)
        path = tmp_path / "n.onnx"
        path.write_bytes(model.SerializeToString())
        now.append(import_onnx(path).layers)
        then = [replace(l, fn="") if l.fn == "sum" else l for l in now[-1]]  # as read before
        measured.append(MeasuredNetwork(description, then, [0.01] * len(then), [1.0] * len(then), 1.0))
    assert [i for i, layers in enumerate(now) if any(l.fn == "sum" for l in layers)] == [8]
    again = read_again(measured, {"seed": 0, "seeding": SEEDING_PLAIN})
    assert [m.layers for m in again] == now and [m.layers for m in measured] != now
    assert [m.layer_ms for m in again] == [m.layer_ms for m in measured]
    assert layers_digest(again[8].layers) == layers_digest(measured[8].layers)  # the same network to speed references
    old = measured[8].layers
    # networks that do not build again as measured (another seed's) keep their layers
    assert read_again(measured, {"seed": 1, "seeding": SEEDING_PLAIN})[8].layers == old
    assert read_again(measured, {"seed": 0})[8].layers == old  # a profile whose networks cannot be built again


def test_int8_max_pools_are_told_apart_by_the_kernel_onnxruntime_runs_them_in(tmp_path):
    # After a conv (channels-last integer kernels) onnxruntime runs an 8-bit max pool as
    # NhwcMaxPool; after a concat, in its plain channels-first uint8 MaxPool (about 30x
    # the time per element); where the pool's output has two readers, on float values between
    # DequantizeLinear and QuantizeLinear.  Three kernels, three labels.
    import onnxruntime as ort

    from nasctl.hardware.layers import MAX_NCHW

    rng = np.random.default_rng(0)
    b = NetBuilder(rng, (1, 8, 32, 32))
    after_conv = b.pool(b.conv("input", 16, 3, act="relu"), "max")
    y = b.conv(after_conv, 16, 3, act="relu")
    after_concat = b.pool(b.concat([b.conv(y, 16, 1, act="relu"), b.conv(y, 16, 3, act="relu")]), "max")
    two_readers = b.pool(b.conv(after_concat, 32, 1, act="relu"), "max")
    out = b.add(b.conv(two_readers, 32, 3, act="relu"), two_readers)
    path = tmp_path / "q.onnx"
    path.write_bytes(quantize(b.model(b.conv(out, 16, 1)), rng).SerializeToString())
    pools = [l for l in import_onnx(path).layers if l.op == "pool"]
    assert [(l.fn, l.dequantized) for l in pools] == [("max", False), (MAX_NCHW, False), ("max", True)]
    assert [kernel_type(l) for l in pools] == ["pool_w8a8", "pool_nchw_w8a8", "pool_w8a8_dq"]
    # what onnxruntime runs, fully optimized: one NhwcMaxPool, one uint8 MaxPool, one float one
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "all.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath).graph.node
    made_by = {o: n.op_type for n in optimized for o in n.output}
    ran = sorted((n.op_type, n.domain, made_by[n.input[0]]) for n in optimized if "MaxPool" in n.op_type)
    assert ran == [("MaxPool", "", "QLinearConcat"), ("MaxPool", "com.microsoft.nchwc", "ReorderInput"),
                   ("NhwcMaxPool", "com.microsoft", "QLinearConv")]


def test_a_profiled_device_prices_its_own_kernels_by_their_regressor_not_one_noisy_row():
    # Each row of a profile is one network's in-context time of a kernel, off by that
    # network's noise. A kernel measured once, in a network that ran 40% slow, is priced
    # from the trend of all the rows (the profiled device's `exact_rows: false`), not as its
    # one row says; a device whose spec trusts exact rows would price it 40% high.
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import fit_profile

    rng = np.random.default_rng(4)
    pool = [LayerSpec("conv", c, 2 * c, (hw, hw), (hw, hw), (3, 3), name="k:conv")
            for c in (8, 16, 24, 32, 48, 64) for hw in (8, 12, 16, 24)]
    true = lambda layer: 2e-3 + layer.macs * 1e-8  # noqa: E731
    odd = LayerSpec("conv", 40, 80, (20, 20), (20, 20), (3, 3), name="k:conv")
    nets = []
    for i in range(60):
        layers = [replace(pool[j], name=f"k{n}:conv") for n, j in enumerate(rng.choice(len(pool), 3, replace=False))]
        noise = 1.4 if i == 0 else float(np.exp(rng.normal(0, 0.05)))
        if i == 0:
            layers.append(replace(odd, name="k3:conv"))
        ms = [true(layer) * noise for layer in layers]
        nets.append(MeasuredNetwork(f"net {i}", layers, ms, [1.0] * len(ms), 0.01 + sum(ms)))
    fitted = fit_profile("cpu-local", nets, {}, [0] * len(nets), [[1.0]])
    assert fitted.spec["exact_rows"] is False
    device = fitted.device()
    run = device.spec.overhead.per_model_ms
    assert device.estimate([odd]).latency_ms - run == pytest.approx(true(odd), rel=0.12)
    exact = fitted.device()
    exact.spec = exact.spec.model_copy(update={"exact_rows": True})
    assert exact.estimate([odd]).latency_ms - run > 1.25 * true(odd)


def test_int8_transformers_write_some_gelus_as_torch_exports_them_and_onnxruntime_runs_the_erf(tmp_path):
    """A published int8 transformer exported before opset 20 holds its GELUs as Div, Erf,
    Add, Mul, Mul, each quantized: onnxruntime runs them one by one, the Erf in float. A
    full profile's int8 transformers write half their GELUs so (SEEDING_ERF), the importer
    reads the Erf as an `act` of its own (fn `erf`, a feature the regressors tell apart),
    and profiles drawn before build their networks as they were."""
    import onnxruntime as ort

    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import FEATURES, features

    model, description = random_network(np.random.default_rng([7, 37]), erf_gelu=True)
    plain, plain_description = random_network(np.random.default_rng([7, 37]))
    assert description.endswith("erf-gelu") and description.startswith("int8")
    assert "Erf" in {n.op_type for n in model.graph.node} and "Erf" not in {n.op_type for n in plain.graph.node}
    assert "erf" not in plain_description
    onnx.save(model, str(tmp_path / "net.onnx"))
    layers = import_onnx(tmp_path / "net.onnx").layers
    erfs = [layer for layer in layers if layer.op == "act" and layer.fn == "erf"]
    assert erfs and all(TAG.search(layer.name) for layer in erfs)
    assert features(erfs)[:, FEATURES.index("fn_erf")].all()
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "net.onnx"), so, providers=["CPUExecutionProvider"])
    assert "Erf" in {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
    # a profile drawn before builds its networks as it drew them; the others are the same
    erf = profile.context_network(7, 30, profile.SEEDING_ERF)
    before = profile.context_network(7, 30, profile.SEEDING_HEADED)
    assert "erf-gelu" in erf[1] and "erf" not in before[1]
    for i in (0, 1, 2, 3):
        assert profile.context_network(7, i, profile.SEEDING_ERF)[0].SerializeToString() == \
            profile.context_network(7, i, profile.SEEDING_HEADED)[0].SerializeToString()


def test_a_full_profile_draws_every_tenth_network_of_depthwise_convs_with_a_channel_multiplier(tmp_path,
                                                                                                monkeypatch):
    """onnxruntime runs a depthwise conv with a channel multiplier (FastViT's downsampling,
    48 -> 96 channels in 48 groups) group by group, at a third of a depthwise conv's speed
    per MAC; random networks hold none.  A full profile draws every tenth network
    (SEEDING_MULTIPLIER, at MULTIPLIER_AT) with such convs, a kernel type of their own
    (`conv_mult`), at several multipliers, kernels and strides, float and int8; the other
    networks, and every network of a profile drawn before, are as they were drawn."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import multiplier_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    assert profile.seeding_for(100) == profile.SEEDING_GROUPED  # which keeps SEEDING_MULTIPLIER's networks
    nets = profile.context_networks(500, seed=7)
    drawn = [i for i in range(len(nets)) if profile.is_multiplier(i, profile.SEEDING_NARROW)]
    assert drawn and all(i % 10 == profile.MULTIPLIER_AT for i in drawn)
    assert not any(profile.is_multiplier(i, profile.SEEDING_ERF) for i in range(len(nets)))
    for i in drawn:
        model, description = nets[i]
        assert description.startswith(("multiplier ", "int8 multiplier ", "int8 per-channel multiplier "))
        assert profile.context_network(7, i, profile.SEEDING_MULTIPLIER)[0].SerializeToString() == \
            model.SerializeToString()
    convs = []
    for k in range(12):
        onnx.save(multiplier_network(np.random.default_rng([7, k]))[0], str(tmp_path / "net.onnx"))
        convs += [layer for layer in import_onnx(tmp_path / "net.onnx").layers
                  if layer.op == "conv" and layer.groups == layer.in_ch > 1 and layer.out_ch != layer.in_ch]
    assert len(convs) >= 10 and {kernel_type(layer).split("_w")[0] for layer in convs} == {"conv_mult"}
    assert any(layer.w_bits == 8 for layer in convs) and any(layer.w_bits == 32 for layer in convs)
    assert len({layer.out_ch // layer.in_ch for layer in convs}) >= 2 and {layer.stride for layer in convs} == {1, 2}
    assert len({layer.kernel for layer in convs}) >= 2
    for i in (0, 1, 3, 12, drawn[0]):  # the other networks, and a profile drawn before: as they were drawn
        before = profile.context_network(7, i, profile.SEEDING_ERF)[0].SerializeToString()
        assert (profile.context_network(7, i, profile.SEEDING_MULTIPLIER)[0].SerializeToString() == before) == \
            (i not in drawn)


def test_a_full_profile_draws_every_tenth_network_with_a_narrow_stem(tmp_path, monkeypatch):
    """Small width multipliers start with an 8-channel conv and depthwise conv at 112x112
    or more (LCNet-0.5, MobileNetV3-small-0.5), which onnxruntime runs padded to a whole
    vector block; random networks start at 12 channels or more.  A full profile draws every
    tenth network (SEEDING_NARROW, at NARROW_AT) with such a stem; the other networks, and
    every network of a profile drawn before, are as they were drawn."""
    import nasctl.hardware.measure.profile as profile

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    nets = profile.context_networks(300, seed=7)
    drawn = [i for i in range(len(nets)) if profile.is_narrow(i, profile.SEEDING_NARROW)]
    assert drawn and all(i % 10 == profile.NARROW_AT for i in drawn)
    assert not any(profile.is_narrow(i, profile.SEEDING_MULTIPLIER) for i in range(len(nets)))
    stems = []
    for i in drawn:
        model, description = nets[i]
        assert description.startswith("narrow ")
        assert profile.context_network(7, i, profile.SEEDING_NARROW)[0].SerializeToString() == model.SerializeToString()
        onnx.save(model, str(tmp_path / "net.onnx"))
        stem, depthwise = import_onnx(tmp_path / "net.onnx").layers[:2]
        assert stem.op == "conv" and stem.in_ch == 3 and stem.out_hw[0] >= 64
        assert depthwise.op == "conv" and depthwise.groups == depthwise.in_ch == stem.out_ch
        stems.append(stem.out_ch)
    assert set(stems) <= {8, 12} and stems.count(8) >= len(stems) / 2
    for i in (0, 1, 3, 12, drawn[0]):  # the other networks, and a profile drawn before: as they were drawn
        before = profile.context_network(7, i, profile.SEEDING_MULTIPLIER)[0].SerializeToString()
        assert (profile.context_network(7, i, profile.SEEDING_NARROW)[0].SerializeToString() == before) == \
            (i not in drawn)


def test_a_full_profile_draws_every_twentieth_network_a_mobile_one_with_a_first_block_of_stride_one(
        tmp_path, monkeypatch):
    """Published mobile nets run their first block at the stem's resolution with stride 1
    (MobileNetV2's depthwise conv of 32 channels at 112x112); random networks' first blocks
    have stride 2, and int8 MobileNetV2's unfused depthwise convs (`conv_dw_w8a8_dq`) were
    priced from strided ones at about twice their time.  A full profile draws every twentieth
    network (SEEDING_MOBILE, at MOBILE_AT) a mobile one, float and int8, whose int8 ones
    hold depthwise convs of stride 1 at 56 px or more that onnxruntime runs dequantized, and
    hardswishes and swishes, which it runs apart from their convs; the other networks, and
    every network of a profile drawn before, are as they were drawn."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import mobile_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    assert profile.seeding_for(100) == profile.SEEDING_GROUPED
    nets = profile.context_networks(300, seed=7)
    drawn = [i for i in range(len(nets)) if profile.is_mobile(i, profile.SEEDING_MOBILE)]
    assert drawn and all(i % 20 == profile.MOBILE_AT for i in drawn)
    assert not any(profile.is_mobile(i, profile.SEEDING_NARROW) for i in range(len(nets)))
    for i in drawn:
        model, description = nets[i]
        assert description.startswith(("mobile ", "int8 mobile ", "int8 per-channel mobile "))
    for i in (0, 1, 3, 5, 18, drawn[0]):  # the other networks, and a profile drawn before: as they were drawn
        before = profile.context_network(7, i, profile.SEEDING_NARROW)[0].SerializeToString()
        assert (profile.context_network(7, i, profile.SEEDING_MOBILE)[0].SerializeToString() == before) == \
            (i not in drawn)
    firsts, dequantized, bits, int8_fns = [], [], set(), set()
    for k in range(12):
        onnx.save(mobile_network(np.random.default_rng([7, k]))[0], str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        stem = layers[0]
        depthwise = [layer for layer in layers if layer.op == "conv" and layer.groups == layer.in_ch > 1]
        assert stem.op == "conv" and stem.in_ch == 3 and stem.stride == 2
        firsts.append(depthwise[0].stride == 1 and depthwise[0].in_hw == stem.out_hw)
        bits.add(stem.w_bits)
        dequantized += [layer for layer in depthwise if kernel_type(layer) == "conv_dw_w8a8_dq" and
                        layer.stride == 1 and layer.in_hw[0] >= 56]
        int8_fns |= {layer.fn for layer in layers if layer.w_bits == 8}
    assert all(firsts) and bits == {8, 32} and dequantized
    assert {"hardswish", "sigmoid"} <= int8_fns  # int8 hardswishes, and swishes' sigmoids, as published nets hold


def _drawn_in_place(profile, is_kind, seeding: str, before: str, every: int, at: int, prefixes: tuple,
                    others: tuple, count: int = 120) -> list[int]:
    """The indices of a seeding's own context networks (`is_kind`) among the first `count`,
    checked: at `at` of every `every`, none in the seeding `before` it, their descriptions
    starting with one of `prefixes`; the networks at `others` are as `before` drew them, the
    seeding's own ones not (seed 7)."""
    drawn = [i for i in range(count) if is_kind(i, seeding)]
    assert drawn and all(i % every == at for i in drawn)
    assert not any(is_kind(i, before) for i in range(count))
    for i in drawn:
        assert profile.context_network(7, i, seeding)[1].startswith(prefixes)
    for i in (*others, drawn[0]):
        same = profile.context_network(7, i, before)[0].SerializeToString() == \
            profile.context_network(7, i, seeding)[0].SerializeToString()
        assert same == (i not in drawn)
    return drawn


def test_a_full_profile_draws_every_twentieth_network_of_wide_dense_convs_most_of_them_int8(tmp_path):
    """onnxruntime runs some int8 dense convs unfused, in its plain channels-first float
    conv between dequantize and quantize nodes (`conv_w8a8_dq`), at 1.2-1.4x the blocked
    float conv's time on ResNet-18's maps and 1.3-2.0x for narrow convs or small maps; random
    networks' int8 dense 3x3 convs have 72 channels or fewer but for a few, and int8
    ResNets' were priced from them at 1.3-1.7x the float price.  A full profile draws every twentieth network (SEEDING_WIDE, at WIDE_AT) a wide
    residual one, whose int8 ones hold such convs of 128 channels or more, both unfused and
    fused (QLinearConv), and small enough (under 2e8 MACs) that their kernels are rows of
    the table; the other networks, and every network of a profile drawn before, are as
    they were drawn."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import wide_network

    _drawn_in_place(profile, profile.is_wide, profile.SEEDING_WIDE, profile.SEEDING_MOBILE, 20, profile.WIDE_AT,
                    ("wide ", "int8 wide ", "int8 per-channel wide "), others=(0, 1, 8, 17, 19))
    int8, types = 0, set()
    for k in range(10):
        model, description = wide_network(np.random.default_rng([7, k]))
        onnx.save(model, str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        assert sum(layer.macs for layer in layers) < 2e8
        int8 += description.startswith("int8")
        types |= {(kernel_type(layer), layer.kernel[0]) for layer in layers
                  if layer.op == "conv" and layer.groups == 1 and layer.out_ch >= 128}
    assert 5 <= int8 <= 9
    assert {("conv_w8a8_dq", 3), ("conv_w8a8", 3), ("conv_w8a8_dq", 1), ("conv", 3)} <= types


def test_a_full_profile_draws_every_twentieth_network_int8_with_max_pools_on_joins(tmp_path, monkeypatch):
    """onnxruntime runs an 8-bit max pool whose input a QLinearConcat or a QLinearAdd
    writes in its plain channels-first kernel (`pool_nchw_w8a8`), about 30x its
    channels-last pool's time; random networks hold few, one full profile none, and the
    int8 SqueezeNet's were priced at a fortieth of their time.  A full profile draws every
    twentieth network (SEEDING_JOINED, at JOINED_AT) an int8 one whose stages end in a max
    pool on a join, which holds such pools at several sizes; the other networks, and every
    network of a profile drawn before, are as they were drawn."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import joined_network

    monkeypatch.setattr(profile, "LARGE_FROM", 100)
    assert profile.seeding_for(100) == profile.SEEDING_GROUPED
    _drawn_in_place(profile, profile.is_joined, profile.SEEDING_JOINED, profile.SEEDING_WIDE, 20, profile.JOINED_AT,
                    ("int8 joined ", "int8 per-channel joined "), others=(0, 3, 6, 15, 17, 18))
    plain = []
    for k in range(12):
        model, description = joined_network(np.random.default_rng([7, k]))
        onnx.save(model, str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        assert sum(layer.macs for layer in layers) < 2e8
        plain += [(layer.in_ch, layer.in_hw[0]) for layer in layers if kernel_type(layer) == "pool_nchw_w8a8"]
    assert len(plain) >= 10
    assert min(hw for _, hw in plain) <= 16 and max(hw for _, hw in plain) >= 27  # late and early stages
    assert max(c for c, _ in plain) >= 128


def test_a_full_profile_draws_every_fortieth_network_an_int8_regnet(tmp_path):
    """onnxruntime runs int8 grouped convs mostly unfused, group by group in its plain float
    conv (`conv_g_w8a8_dq`); random networks hold few, of few groups.  A full profile draws
    every fortieth network (SEEDING_GROUPED, at GROUPED_AT) an int8 RegNet, which holds
    such convs of tens of groups, both unfused and fused; the other networks, and every
    network of a profile drawn before, are as they were drawn."""
    import nasctl.hardware.measure.profile as profile
    from nasctl.hardware.lut import kernel_type
    from nasctl.hardware.measure.context import grouped_network

    drawn = _drawn_in_place(profile, profile.is_grouped, profile.SEEDING_GROUPED, profile.SEEDING_JOINED, 40,
                            profile.GROUPED_AT, ("int8 grouped ", "int8 per-channel grouped "), others=(0, 3, 16, 18, 26))
    assert drawn == [6, 46, 86]
    types = Counter()
    for k in range(8):
        model, _ = grouped_network(np.random.default_rng([7, k]))
        onnx.save(model, str(tmp_path / "net.onnx"))
        layers = import_onnx(tmp_path / "net.onnx").layers
        assert sum(layer.macs for layer in layers) < 2e8
        types.update((kernel_type(layer), layer.groups >= 16) for layer in layers
                     if layer.op == "conv" and 1 < layer.groups < layer.in_ch)
    assert types[("conv_g_w8a8_dq", True)] >= 3 and types[("conv_g_w8a8", True)] >= 3


def test_where_a_classifier_starts_reading_from_memory_does_not_jump_between_two_profiles():
    """Two profiles of the same networks, their times off by each profile's noise (15% a
    layer): the middle of the change `weight_stream` fits lands within 25% of the same
    weight bytes in both, and of the middle the times were drawn from (on this machine a
    split at the step of least deviation from each side's median put it at 9, 12 and 22 MB
    in three profiles of the same networks)."""
    from nasctl.hardware.lut import WeightStream, weight_bytes
    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import weight_stream

    truth = WeightStream(cache_bytes=12e6, width=0.2, resident_ms_per_mb=0.016, streamed_ms_per_mb=0.04)
    draw = np.random.default_rng(2)
    nets = []
    for i in range(120):
        conv_ch = int(draw.integers(64, 1400))
        layers = [LayerSpec("conv", conv_ch, conv_ch, (4, 4), (4, 4), (3, 3), name="k0:conv"),
                  LayerSpec("linear", 1024, int(draw.integers(250, 1000)), (1, 1), (1, 1), name="k1:gemm")]
        nets.append(layers)
    middles = []
    for profile in range(2):
        noise = np.random.default_rng([5, profile])
        measured, costs = [], []
        for i, layers in enumerate(nets):
            w = weight_bytes(layers)
            ms = np.array([1e-3 + layers[0].macs * 1e-8,
                           layers[1].params * 4e-6 * truth.rate(w)]) * np.exp(noise.normal(0, 0.15, 2))
            measured.append(MeasuredNetwork(f"net {i}", layers, list(ms), [1.0, 1.0], float(ms.sum())))
            costs.append(ms)
        fitted, how = weight_stream(measured, costs)
        assert fitted is not None, how
        assert fitted["resident_ms_per_mb"] < 0.022 and fitted["streamed_ms_per_mb"] > 0.032
        middles.append(fitted["cache_bytes"])
    assert max(middles) / min(middles) < 1.25, middles
    assert all(abs(np.log(m / 12e6)) < np.log(1.25) for m in middles), middles


def _rereading(name, layers, resident, first_alone, truth, noise, run_ms, per_node):
    """A measured network whose layers took `resident` ms with their weights in the caches
    and `truth`'s excess besides in place (its rate whole; profiled with 3% noise), each
    from `first_alone` on timed alone at its resident time."""
    from nasctl.hardware.lut import weight_bytes
    from nasctl.hardware.measure.attribution import MeasuredNetwork

    w, curves = weight_bytes(layers), truth if isinstance(truth, list) else [truth]
    excess = [sum(t.extra_ms(layer, w) + t.resident_ms(layer) for t in curves) for layer in layers]
    profiled = [(r + e) * float(np.exp(noise.normal(0, 0.03))) + per_node for r, e in zip(resident, excess)]
    alone = {j: (resident[j] + run_ms, 0.0, 0) for j in range(first_alone, len(layers))}
    return MeasuredNetwork(name, layers, profiled, [1.0] * len(layers), run_ms + sum(resident) + sum(excess), alone)


def test_what_layers_of_a_few_rows_pay_for_reading_their_weights_is_fitted_from_their_alone_times():
    """`weight_reread`: a long kernel timed alone keeps its weights in the caches; profiled
    in its network it pays their reading from memory, more where the network's weights do
    not stay there, and a spatial conv (which reads them again for each output row) more
    than a pointwise layer.  From that excess per MB, over networks of 5-600 MB, the fit
    recovers each kind's curve the times were drawn from (the pointwise middle within 30%,
    the rates within 15-20%), and `in_context_costs` given them neither loads the excess on
    the network's other kernels nor leaves what it pays beyond the resident rate in a
    profiled layer's cost, and gives a long layer what it pays at that rate."""
    from nasctl.hardware.lut import WeightStream, reread_kind, weight_bytes
    from nasctl.hardware.measure.profile import weight_reread

    curve = {"width": 0.5, "convs": True, "max_rows": 64}
    truth = [WeightStream(cache_bytes=120e6, resident_ms_per_mb=0.0, streamed_ms_per_mb=0.03, kernels="pointwise",
                          **curve),
             WeightStream(cache_bytes=40e6, resident_ms_per_mb=0.02, streamed_ms_per_mb=0.06, kernels="spatial",
                          **curve)]
    draw, noise = np.random.default_rng(3), np.random.default_rng(4)
    run_ms, per_node = 0.005, 0.001
    measured = []
    for i in range(60):
        dim = int(draw.integers(512, 1536))
        depth = int(np.exp(draw.uniform(np.log(1), np.log(60))))
        layers = [LayerSpec("conv", 3, 64, (64, 64), (32, 32), (3, 3), stride=2, name="k0:conv"),
                  LayerSpec("linear", 1024, 1024, (16, 1), (16, 1), name="k1:short")]  # profiled, not alone
        layers += [LayerSpec("linear", dim, dim * 4, (37, 1), (37, 1), name=f"k{j + 2}:mm") for j in range(depth)]
        layers += [LayerSpec("conv", int(c), int(c), (4, 4), (4, 4), (3, 3), name=f"k{depth + 2 + j}:conv")
                   for j, c in enumerate(draw.integers(192, 512, size=2))]
        resident = [0.05, 0.2] + [layer.macs * 1.2e-8 for layer in layers[2:]]
        measured.append(_rereading(f"net {i}", layers, resident, 2, truth, noise, run_ms, per_node))
    fitted, how = weight_reread(measured, per_node, run_ms)
    assert fitted is not None, how
    found = {f["kernels"]: f for f in fitted}
    pointwise, spatial = found["pointwise"], found["spatial"]
    # (a layer holding more than four fifths of its network's weights is left out)
    assert all(f["max_rows"] == 64 and f["min_bytes"] == 0.8e6 for f in fitted)
    for kind in ("pointwise", "spatial"):
        assert how[kind]["layers"] == sum(m.layers[j].params * 4 <= 0.8 * weight_bytes(m.layers)
                                          and reread_kind(m.layers[j]) == kind for m in measured for j in m.alone)
    assert how["pointwise"]["layers"] > 600 and how["spatial"]["layers"] > 100
    assert abs(np.log(pointwise["cache_bytes"] / 120e6)) < np.log(1.3), pointwise
    assert pointwise["resident_ms_per_mb"] < 0.003 and abs(pointwise["streamed_ms_per_mb"] / 0.03 - 1) < 0.15
    assert abs(spatial["resident_ms_per_mb"] / 0.02 - 1) < 0.2 and abs(spatial["streamed_ms_per_mb"] / 0.06 - 1) < 0.15
    plain, _ = in_context_costs(measured, known=(run_ms, per_node))
    costs, _ = in_context_costs(measured, known=(run_ms, per_node), reread=[t.model_dump() for t in truth])
    big = max(range(len(measured)), key=lambda i: weight_bytes(measured[i].layers))
    excess_of = lambda i: truth[0].extra_ms(measured[i].layers[1], weight_bytes(measured[i].layers))  # noqa: E731
    assert weight_bytes(measured[big].layers) > 300e6
    # the conv's profiled time, scaled to the network's: with the excess counted, what it took
    assert costs[big][0] == pytest.approx(0.05, rel=0.1) and plain[big][0] > 1.1 * costs[big][0]
    # a profiled layer of a few rows: its cost without what reading its weights took there
    assert excess_of(big) > 0.05 and costs[big][1] == pytest.approx(0.2, rel=0.1) and plain[big][1] > 0.24
    # a long layer's cost is its alone time and, given the curves, what it pays at the resident rate
    layers = measured[big].layers
    assert costs[big][2:] == pytest.approx(plain[big][2:] + [sum(t.resident_ms(x) for t in truth) for x in layers[2:]])
    assert any(truth[1].resident_ms(x) > 0.02 for x in layers[2:])


def test_layers_too_large_for_the_caches_alone_are_left_out_of_the_rereading_they_do_not_show():
    """`weight_reread`: a layer whose weights do not stay in the caches even when it runs
    alone reads them from memory there too, so its time in its network is its alone time.
    Among networks of up to a gigabyte with layers of 1-67 MB that pay the excess up to 12 MB, the
    fit prices layers up to about 12 MB (`max_bytes`) and recovers the curve."""
    from nasctl.hardware.lut import WeightStream
    from nasctl.hardware.measure.profile import weight_reread

    truth = WeightStream(cache_bytes=30e6, width=0.5, resident_ms_per_mb=0.0, streamed_ms_per_mb=0.03,
                         convs=True, max_rows=64, max_bytes=12e6)
    draw, noise = np.random.default_rng(5), np.random.default_rng(6)
    run_ms, per_node = 0.005, 0.001
    measured = []
    for i in range(40):
        depth = int(np.exp(draw.uniform(np.log(2), np.log(20))))
        dims = draw.integers(256, 2048, size=depth)
        layers = [LayerSpec("conv", 3, 64, (64, 64), (32, 32), (3, 3), stride=2, name="k0:conv")]
        layers += [LayerSpec("linear", int(d), int(d) * 4, (37, 1), (37, 1), name=f"k{j + 1}:mm")
                   for j, d in enumerate(dims)]
        resident = [0.05] + [layer.macs * 1.2e-8 for layer in layers[1:]]
        measured.append(_rereading(f"net {i}", layers, resident, 1, truth, noise, run_ms, per_node))
    fits, how = weight_reread(measured, per_node, run_ms)
    assert fits is not None and [f["kernels"] for f in fits] == ["pointwise"], how
    fitted = fits[0]
    # (the sizes it tries up to are REREAD_CAPS of those drawn, about 20% apart)
    assert 12e6 * 0.8 <= fitted["max_bytes"] < 12e6 * 1.25 and how["pointwise"]["layers_over_it"] > 50, (fitted, how)
    assert abs(np.log(fitted["cache_bytes"] / 30e6)) < np.log(1.3), fitted
    assert fitted["resident_ms_per_mb"] < 0.003 and abs(fitted["streamed_ms_per_mb"] / 0.03 - 1) < 0.15, fitted
    # a layer over the cap pays nothing beyond its table row; one under it does
    model, big_net = WeightStream(**fitted), 400e6
    assert model.extra_ms(LayerSpec("linear", 1024, 4096, (37, 1), (37, 1)), big_net) == 0.0  # 16.8 MB
    assert model.extra_ms(LayerSpec("linear", 512, 2048, (37, 1), (37, 1)), big_net) > 0.1  # 4.2 MB


def test_a_weight_streaming_fit_the_solver_gives_up_on_leaves_the_profile_without_it(monkeypatch):
    """The measurements of a profile are not lost to the rates' linear program: where it
    finds no solution, `weight_stream` returns no fit (the device is then fitted without
    one) and says why, instead of raising."""
    import scipy.optimize

    from nasctl.hardware.measure.attribution import MeasuredNetwork
    from nasctl.hardware.measure.profile import weight_stream

    monkeypatch.setattr(scipy.optimize, "linprog", lambda *a, **k: type("R", (), {"success": False})())
    measured, costs = [], []
    for i in range(20):
        layers = [LayerSpec("conv", 64 + 40 * i, 64 + 40 * i, (4, 4), (4, 4), (3, 3), name="k0:conv"),
                  LayerSpec("linear", 1024, 500, (1, 1), (1, 1), name="k1:gemm")]
        ms = np.array([0.01, 0.05 + 0.002 * i])
        measured.append(MeasuredNetwork(f"net {i}", layers, list(ms), [1.0, 1.0], float(ms.sum())))
        costs.append(ms)
    fitted, how = weight_stream(measured, costs)
    assert fitted is None and how["note"] == "not fitted: the solver found no rates"
