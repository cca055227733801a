import numpy as np
import pytest
import yaml

from nasctl.errors import ConfigError, UsageError
from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space


@pytest.fixture
def space():
    return load_space("ee-mbv2")


def test_knobs_cover_stages_exits_and_bits(space):
    names = [v.name for v in space.variables()]
    for i in (1, 2, 3):
        for knob in ("depth", "channels", "expand", "kernel"):
            assert f"s{i}_{knob}" in names
    assert {"exit_s1", "exit_s1_width", "exit_s2", "exit_s2_width"} <= set(names)
    bits = {v.name: v.choices for v in space.variables()}
    assert set(bits["backbone_bits"]) == {32, 8, 4} and set(bits["exit_bits"]) == {32, 8, 4}


def test_sampling_is_valid_and_seeded(space):
    a = [space.sample(np.random.default_rng(3)) for _ in range(2)]
    assert a[0] == a[1]
    archs = [space.sample(np.random.default_rng(s)) for s in range(50)]
    for arch in archs:
        assert space.validate(arch) == arch
    assert len({arch_key(a) for a in archs}) > 40


def test_mutation_changes_something_and_stays_valid(space):
    rng = np.random.default_rng(0)
    arch = space.sample(rng)
    for _ in range(50):
        child = space.mutate(arch, rng)
        assert child != arch
        space.validate(child)


def test_encodings(space):
    arch = space.sample(np.random.default_rng(1))
    x = space.encode(arch)
    assert x.shape == (len(space.variables()),) and x.min() >= 0 and x.max() <= 1
    oh = space.encode(arch, "onehot")
    assert oh.sum() == len(space.variables())
    assert space.from_indices(space.to_indices(arch)) == arch


def test_invalid_arch_names_knob_and_choices(space):
    arch = space.sample(np.random.default_rng(1))
    with pytest.raises(UsageError, match="backbone_bits.*16.*32, 8, 4"):
        space.validate({**arch, "backbone_bits": 16})
    with pytest.raises(UsageError, match="unknown knob"):
        space.validate({**arch, "bogus": 1})


def _arch(space, **over):
    arch = space.sample(np.random.default_rng(0))
    arch.update(over)
    return space.validate(arch)


def test_layers_chain_shapes_and_tag_exits(space):
    arch = _arch(space, exit_s1=1, exit_s2=1, s2_depth=2, backbone_bits=8, exit_bits=4)
    layers = space.to_layers(arch, (1, 8, 8), 10)
    backbone_convs = [lay for lay in layers if lay.role == "backbone" and lay.op == "conv"]
    for a, b in zip(backbone_convs, backbone_convs[1:]):
        assert a.out_hw == b.in_hw and a.out_ch == b.in_ch
    assert backbone_convs[0].in_ch == 1 and backbone_convs[0].w_bits == 8
    exits = [lay for lay in layers if lay.role == "exit"]
    assert {lay.segment for lay in exits} == {0, 1} and all(lay.w_bits == 4 for lay in exits)
    assert layers[-1].op == "linear" and layers[-1].out_ch == 10 and layers[-1].segment == 2
    assert [lay.segment for lay in layers] == sorted(lay.segment for lay in layers)
    assert space.active_exits(arch) == ["s1", "s2", "final"]


def test_disabled_exits_add_no_layers(space):
    arch = _arch(space, exit_s1=0, exit_s2=0)
    layers = space.to_layers(arch, (3, 32, 32), 10)
    assert all(lay.role == "backbone" and lay.segment == 0 for lay in layers)
    assert space.active_exits(arch) == ["final"]


def test_deeper_stage_adds_macs(space):
    small = space.to_layers(_arch(space, s3_depth=1), (1, 8, 8), 10)
    large = space.to_layers(_arch(space, s3_depth=3), (1, 8, 8), 10)
    assert sum(lay.macs for lay in large) > sum(lay.macs for lay in small)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["stages"][0].pop("channels"), r"stages\.0\.channels: Field required"),
    (lambda d: d["stages"][1].update(depth=[0, 1]), r"stages\.1\.depth"),
    (lambda d: d["quantization"].update(backbone_bits=[8, 3]), r"quantization\.backbone_bits"),
    (lambda d: d.update(colour="red"), r"colour: unknown key"),
    (lambda d: d["exits"].update(after_stages=[3]), r"after_stages"),
    (lambda d: d.update(kind="nope"), r"kind: 'nope' is not a search-space kind; allowed: mbv2"),
    # a choice listed twice would be sampled twice as often; `true` and "16" are not numbers
    (lambda d: d["stages"][0].update(channels=[16, 16]), r"stages\.0\.channels: lists 16 more than once"),
    (lambda d: d["quantization"].update(exit_bits=[8, 8]), r"quantization\.exit_bits: lists 8 more than once"),
    (lambda d: d["exits"].update(tolerance=[1, 1.0]), r"exits\.tolerance: lists 1\.0 more than once"),
    (lambda d: d["stages"][1].update(depth=[1, True]), r"stages\.1\.depth\.1: Input should be a valid integer "
                                                        r"\(got True\)$"),
    (lambda d: d["head"].update(channels="16"), r"head\.channels: Input should be a valid integer \(got '16'\)"),
])
def test_malformed_spec_names_key_path(root, tmp_path, edit, message):
    data = yaml.safe_load((root / "search_spaces" / "ee-mbv2.yaml").read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_space(str(path))


def test_broken_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nstages: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml: line 3 is not valid YAML"):
        load_space(str(path))


def test_unknown_space_lists_known():
    with pytest.raises(UsageError, match="unknown search space 'nope'; known: .*ee-mbv2"):
        load_space("nope")


@pytest.mark.parametrize("input_shape", [(1, 8, 8), (3, 32, 32)])
def test_vectorised_path_costs_match_layer_by_layer_pricing(space, input_shape):
    from nasctl.hardware.loader import load_device
    from nasctl.spaces.base import SearchSpace

    device = load_device("edge-quad")
    archs = [space.sample(np.random.default_rng(s)) for s in range(300)]
    lat, en = space.path_costs(device, archs, input_shape, 10)
    ref_lat, ref_en = SearchSpace.path_costs(space, device, archs, input_shape, 10)
    assert lat.shape == (300, 3)
    np.testing.assert_allclose(lat, ref_lat, rtol=1e-9)
    np.testing.assert_allclose(en, ref_en, rtol=1e-9)
    assert np.isnan(lat[:, 0]).any() and not np.isnan(lat[:, -1]).any()
    # the same from a matrix of knob indices
    X = np.array([space.to_indices(a) for a in archs])
    np.testing.assert_allclose(space.path_costs(device, X, input_shape, 10)[0], lat)
    # the final exit costs the whole network
    report = device.estimate(space.to_layers(archs[0], input_shape, 10))
    assert lat[0, -1] == pytest.approx(report.latency_ms)


def test_vectorised_path_costs_match_a_device_that_prices_the_model_as_a_whole(space):
    # A profiled CPU adds its run overhead once per model and scales kernels by the model's
    # working set: priced stage by stage and added, a candidate would pay the overhead once
    # per stage and its stages' working sets instead of its own (up to 84% off on a
    # profile of this machine).
    from nasctl.hardware.lut import LutDevice, LutSpec, row_from_layer
    from nasctl.spaces.base import SearchSpace

    archs = [space.sample(np.random.default_rng(s)) for s in range(40)]
    layers = [layer for a in archs for layer in space.to_layers(a, (1, 8, 8), 10)]
    rows = list({layer.shape_key(): row_from_layer(layer, 1e-3 + layer.macs * 1e-8) for layer in layers}.values())
    whole = LutDevice(LutSpec.model_validate({"name": "t", "kind": "lut", "overhead": {
        "per_model_ms": 0.01, "working_set": {"ref_bytes": 1e5, "slope": 0.05}}}), rows)
    plain = LutDevice(LutSpec.model_validate({"name": "t", "kind": "lut"}), rows)
    assert not whole.additive and plain.additive
    for device in (whole, plain):
        lat, _ = space.path_costs(device, archs, (1, 8, 8), 10)
        ref, _ = SearchSpace.path_costs(space, device, archs, (1, 8, 8), 10)
        np.testing.assert_allclose(lat, ref, rtol=1e-9)
        X = np.array([space.to_indices(a) for a in archs])
        np.testing.assert_allclose(space.path_costs(device, X, (1, 8, 8), 10)[0], ref, rtol=1e-9)
    assert lat[0, -1] == pytest.approx(plain.estimate(space.to_layers(archs[0], (1, 8, 8), 10)).latency_ms)


def test_layer_names_do_not_change_prices(space):
    layers = space.to_layers(space.sample(np.random.default_rng(0)), (1, 8, 8), 10)
    assert layers[0].name == "stem" and all(lay.fn == "" for lay in layers)
    assert len({lay.shape_key() for lay in layers}) < len(layers)  # repeated blocks share their key


def test_per_stage_bits_and_tolerance_knob(root):
    from nasctl.hardware.loader import load_device
    from nasctl.spaces.base import SearchSpace
    from nasctl.spaces.mbv2 import Mbv2Space

    data = yaml.safe_load((root / "search_spaces" / "ee-mbv2.yaml").read_text())
    data["quantization"]["per_stage"] = True
    space = Mbv2Space.from_dict(data)
    knobs = {v.name: v.choices for v in space.variables()}
    assert "backbone_bits" not in knobs and knobs["s1_bits"] == knobs["s3_bits"] == (32, 8, 4)
    assert knobs["exit_tolerance"] == (0.5, 1.0, 2.0)
    arch = {**space.sample(np.random.default_rng(0)), "s1_bits": 4, "s2_bits": 8, "s3_bits": 32}
    bits = {(b["type"], b["bits"]) for b in space.plan(arch) if b["type"] != "exit"}
    assert ("stem", 4) in bits and ("head", 32) in bits
    assert {b["bits"] for b in space.plan(arch) if b["type"] == "mbconv"} == {4, 8, 32}
    device = load_device("edge-quad")
    archs = [space.sample(np.random.default_rng(s)) for s in range(100)]
    lat, en = space.path_costs(device, archs, (1, 8, 8), 10)
    ref_lat, ref_en = SearchSpace.path_costs(space, device, archs, (1, 8, 8), 10)
    np.testing.assert_allclose(lat, ref_lat, rtol=1e-9)
    np.testing.assert_allclose(en, ref_en, rtol=1e-9)


def test_pinned_space_narrows_knobs_and_prices_alike(space):
    from nasctl.hardware.loader import load_device
    from nasctl.spaces.pinned import pin_knobs

    pinned = pin_knobs(space, {"exit_s1": 0, "exit_s2": 0, "backbone_bits": 8})
    knobs = {v.name: v.choices for v in pinned.variables()}
    assert knobs["backbone_bits"] == (8,) and knobs["exit_s1"] == (0,) and knobs["s1_depth"] == (1, 2)
    archs = [pinned.sample(np.random.default_rng(s)) for s in range(20)]
    assert all(a["backbone_bits"] == 8 and pinned.active_exits(a) == ["final"] for a in archs)
    device = load_device("edge-quad")
    X = np.array([pinned.to_indices(a) for a in archs])
    np.testing.assert_allclose(pinned.path_costs(device, X, (1, 8, 8), 10)[0],
                               space.path_costs(device, archs, (1, 8, 8), 10)[0])
    assert pin_knobs(space, {}) is space
    with pytest.raises(UsageError, match="pin: 'bits' is not a knob of space 'ee-mbv2'"):
        pin_knobs(space, {"bits": 8})


GIB = 2**30


def _spec_file(root, tmp_path, edit):
    data = yaml.safe_load((root / "search_spaces" / "ee-mbv2.yaml").read_text())
    edit(data)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_space_too_large_to_train_here_is_refused_at_load(root, tmp_path, monkeypatch):
    import nasctl.spaces.mbv2 as mbv2

    monkeypatch.setattr(mbv2, "machine_memory", lambda: 16 * GIB)
    path = _spec_file(root, tmp_path, lambda d: d["stages"][2].update(channels=[48, 100000]))
    with pytest.raises(ConfigError) as info:
        load_space(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: stages.2.channels: 100000 makes the largest architecture 240,074,432,030 "
                              "parameters, 3,577 GiB to train")
    assert "more than this machine's 16 GiB of memory; allowed on this machine: up to " in message
    allowed = int(message.split("up to ")[1].split()[0])
    # the bound it gives is the largest that loads
    fits = _spec_file(root, tmp_path, lambda d: d["stages"][2].update(channels=[48, allowed]))
    assert load_space(str(fits))
    too_big = _spec_file(root, tmp_path, lambda d: d["stages"][2].update(channels=[48, allowed + 1]))
    with pytest.raises(ConfigError, match="stages.2.channels"):
        load_space(str(too_big))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["stem"].update(channels=10**6), "stem.channels: 1000000 makes the largest architecture"),
    (lambda d: d["stages"][0].update(expand=[1, 10**6]), "stages.0.expand: 1000000 makes"),
    (lambda d: d["stages"][1].update(depth=[1, 100]), "stages.1.depth: 100 is too large; allowed: 1 … 64"),
    (lambda d: d["stages"][1].update(kernel=[3, 33]), "stages.1.kernel: 33 is too large; allowed: 1 … 31"),
    (lambda d: d["stages"][1].update(stride=16), "stages.1.stride: Input should be less than or equal to 8"),
])
def test_oversized_knobs_name_their_key(root, tmp_path, monkeypatch, edit, message):
    import nasctl.spaces.mbv2 as mbv2

    monkeypatch.setattr(mbv2, "machine_memory", lambda: 16 * GIB)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_space(str(_spec_file(root, tmp_path, edit)))


def test_activations_of_the_largest_architecture_must_fit_at_the_dataset_input(space):
    space.check_fits((1, 8, 8), 10, 64, memory=1 * GIB)
    space.check_fits((3, 32, 32), 10, 64, memory=2 * GIB)
    with pytest.raises(ConfigError) as info:
        space.check_fits((3, 1024, 1024), 10, 64, memory=16 * GIB)
    message = str(info.value)
    assert message.startswith("search space 'ee-mbv2': its largest architecture needs ")
    assert "of activations for a batch of 64 at input 3x1024x1024" in message
    assert "more than this machine's 16 GiB of memory; most of them in stages.0 (s1: channels up to 24, " \
           "expand up to 6): lower those, or the batch size" in message


def test_a_pin_given_as_a_float_is_the_knob_s_own_choice(space):
    from nasctl.spaces.pinned import pin_knobs

    pinned = pin_knobs(space, {"s1_depth": 1.0})
    value = pinned.sample(np.random.default_rng(0))["s1_depth"]
    assert value == 1 and type(value) is int  # the network is built with it: range(1.0) fails
    pinned.to_layers(pinned.sample(np.random.default_rng(1)), (1, 8, 8), 10)
