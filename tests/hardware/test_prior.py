import json

import numpy as np
import pytest
import yaml

from nasctl.errors import UsageError
from nasctl.hardware.base import CostModel, LayerCost
from nasctl.hardware.fit import FittedDevice, _spec, fit_from_models, write_device
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import LutDevice, row_from_layer
from nasctl.hardware.prior import MARGIN, fit_with_prior
from tests.cli.cli_helpers import invoke, one_line_error


def conv(cin, cout, hw, k=3, stride=1, groups=1, fn="relu"):
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return LayerSpec("conv", cin, cout, (hw, hw), (out, out), (k, k), stride, groups, fn=fn)


POOL = [conv(16, 16, 32), conv(16, 32, 32, stride=2), conv(32, 32, 16), conv(32, 32, 16, groups=32, fn=""),
        conv(32, 64, 16, k=1), conv(64, 64, 8), LayerSpec("add", 32, 32, (16, 16), (16, 16)),
        LayerSpec("pool", 64, 64, (16, 16), (1, 1), (16, 16), fn="avg"), LayerSpec("linear", 64, 10, (1, 1), (1, 1))]
UNSEEN = conv(64, 128, 8)  # in the prior tables, in none of the measured models
RNG = np.random.default_rng(7)
COST_A = RNG.uniform(0.005, 0.08, len(POOL) + 1)  # prior device A's kernel costs (ms), UNSEEN last
COST_B = RNG.uniform(0.005, 0.08, len(POOL) + 1)
MIX = (0.6, 1.5)  # the new device: 0.6 A + 1.5 B, and its own overhead
OVERHEAD = 0.02


def table_device(folder, name, costs, kernels=(*POOL, UNSEEN), per_model=0.0):
    """A lut device written to `folder` and loaded back, as `hw fit` leaves one."""
    spec = _spec(name, "test", per_model_ms=per_model)
    write_device(folder / name, FittedDevice(name, spec, [row_from_layer(k, float(c)) for k, c in
                                                          zip(kernels, costs)]))
    return load(folder / name / "spec.yaml")


def load(spec_path):
    return LutDevice.from_spec_file({"name": spec_path.parent.name, **yaml.safe_load(spec_path.read_text())},
                                    spec_path)


def models(n, seed, cost, noise=0.0):
    """Models of 1-3 copies of random POOL kernels; latency = Σ cost + overhead, times a
    lognormal measurement noise."""
    rng = np.random.default_rng(seed)
    layer_lists, latency = [], []
    for _ in range(n):
        counts = rng.integers(0, 3, len(POOL))
        counts[rng.integers(len(POOL))] += 1
        layer_lists.append([k for k, c in zip(POOL, counts) for _ in range(c)])
        latency.append((float(counts @ cost[:len(POOL)]) + OVERHEAD) * float(np.exp(rng.normal(0, noise))))
    return layer_lists, latency


def rel_error(device, layer_lists, latency):
    return float(np.sqrt(np.mean([(device.estimate(m).latency_ms / t - 1) ** 2 for m, t in zip(layer_lists,
                                                                                              latency)])))


@pytest.fixture
def priors(tmp_path):
    return [table_device(tmp_path, "dev-a", COST_A, per_model=0.05), table_device(tmp_path, "dev-b", COST_B)]


def test_a_mix_of_prior_devices_is_recovered_from_few_models(priors):
    truth = MIX[0] * COST_A + MIX[1] * COST_B
    train, test = models(6, 0, truth, noise=0.02), models(40, 1, truth)
    with pytest.raises(UsageError, match="too few"):  # from scratch, six models cannot be fitted
        fit_from_models("new", *train)
    fitted = fit_with_prior("new", *train, priors)
    prior = fitted.spec["fit"]["prior"]
    assert prior["devices"] == ["dev-a", "dev-b"] and prior["trust"].startswith("prior")
    assert prior["weights"]["dev-a"] == pytest.approx(MIX[0], rel=0.15)
    assert prior["weights"]["dev-b"] == pytest.approx(MIX[1], rel=0.15)
    device = fitted.device()
    assert rel_error(device, *test) < 0.05
    # a kernel only the prior tables hold is priced as the prior mix
    assert device.estimate([UNSEEN, UNSEEN]).costs[1].latency_ms == pytest.approx(truth[-1], rel=0.15)


def test_with_enough_models_the_prior_still_beats_fitting_from_scratch(priors):
    truth = MIX[0] * COST_A + MIX[1] * COST_B
    train, test = models(12, 2, truth, noise=0.02), models(40, 3, truth)
    without = rel_error(fit_from_models("new", *train).device(), *test)
    with_prior = rel_error(fit_with_prior("new", *train, priors).device(), *test)
    assert with_prior < 0.5 * without


def test_unrelated_priors_are_not_trusted(tmp_path):
    """A device whose costs are linear in each type's work, priors with costs unrelated to
    it: cross-validation keeps the prior out, and the fit is as good as without it."""
    work = np.array([k.macs if k.op in ("conv", "linear") else k.in_elems + k.out_elems for k in POOL], float)
    truth = np.r_[2e-7 * work + 0.004, 0.0]
    unrelated = [table_device(tmp_path, f"noise-{i}", np.random.default_rng(50 + i).uniform(0.001, 0.1, len(POOL) + 1))
                 for i in range(2)]
    train, test = models(20, 4, truth, noise=0.02), models(40, 5, truth)
    fitted = fit_with_prior("new", *train, unrelated)
    without = rel_error(fit_from_models("new", *train).device(), *test)
    assert rel_error(fitted.device(), *test) <= 1.1 * without + 0.005
    prior = fitted.spec["fit"]["prior"]
    assert prior["trust"].startswith("none") or max(prior["weights"].values()) < 0.1, prior


def test_the_prior_is_kept_only_where_it_halves_the_error_of_fitting_without_it(priors, tmp_path):
    """Where the models are enough to fit from scratch, a prior candidate wins only with at
    most 1/MARGIN of the best no-prior CV error; otherwise the fit is `fit_from_models`'s own."""
    truth = MIX[0] * COST_A + MIX[1] * COST_B
    unrelated = [table_device(tmp_path, "noise-0", np.random.default_rng(50).uniform(0.001, 0.1, len(POOL) + 1))]
    trusts = []
    for devices, noise in ((priors, 0.0), (priors, 0.05), (unrelated, 0.02)):
        train = models(20, 9, truth, noise=noise)
        fit = fit_with_prior("new", *train, devices).spec["fit"]
        record, errors = fit["prior"], fit["prior"]["cv_rms_error_pct"]
        with_prior = min(e for label, e in errors.items() if not label.startswith("none"))
        without = min(e for label, e in errors.items() if label.startswith("none"))
        if record["trust"].startswith("none"):
            assert without < MARGIN * with_prior and record["trust"] in errors, record
            assert fit["grouping"] == fit_from_models("new", *train).spec["fit"]["grouping"] == record["trust"][5:]
        else:
            assert errors[record["trust"]] == with_prior and without >= MARGIN * with_prior, record
        trusts.append(record["trust"].split("+")[0].split("@")[0])
    assert trusts[0] == "prior"  # an exact mix of the priors: the prior is far better than fitting from scratch


def test_the_written_device_loads_and_records_the_prior(priors, tmp_path):
    truth = MIX[0] * COST_A + MIX[1] * COST_B
    train = models(8, 6, truth, noise=0.02)
    fitted = fit_with_prior("new", *train, priors)
    spec_path = write_device(tmp_path / "new", fitted)
    loaded = load(spec_path)
    for m in train[0]:
        assert loaded.estimate(m).latency_ms == pytest.approx(fitted.device().estimate(m).latency_ms, rel=1e-6)
    record = loaded.describe()["fit"]["prior"]
    assert set(record) >= {"devices", "weights", "trust", "cv", "cv_rms_error_pct"}
    assert record["trust"] in record["cv_rms_error_pct"]
    json.dumps(fitted.spec)


class _Broken(CostModel):
    models_energy = False

    def __init__(self, name, how):
        self.name, self.how = name, how

    def _layer_cost(self, layer):
        if self.how == "raises":
            raise NotImplementedError("no such kernels here")
        return LayerCost(float("nan"), None)


@pytest.mark.parametrize("how", ["raises", "nan"])
def test_a_prior_that_cannot_price_the_kernels_is_named(priors, how):
    train = models(8, 7, COST_A)
    with pytest.raises(UsageError, match="prior device 'odd' cannot price"):
        fit_with_prior("new", *train, [priors[0], _Broken("odd", how)])


def test_two_models_are_too_few_even_with_a_prior(priors):
    with pytest.raises(UsageError, match="2 measured models are too few"):
        fit_with_prior("new", *models(2, 9, COST_A), priors)


def test_one_model_measured_many_times_is_one_model(priors):
    layers, latency = models(1, 9, COST_A)
    with pytest.raises(UsageError, match="1 measured models are too few .*; 8 rows, some of the same model"):
        fit_with_prior("new", layers * 8, latency * 8, priors)


def test_a_model_measured_twice_is_held_out_with_its_twin(priors):
    """Leave one model out holds a model's repeated rows out together: listing every model
    twice leaves each candidate's CV error and the trust chosen as they were (a twin left in
    training would price its own model and make a candidate look better than it is)."""
    layers, latency = models(20, 4, 0.6 * COST_A + 1.5 * COST_B, noise=0.05)  # every grouping feasible either way
    once = fit_with_prior("new", layers, latency, priors).spec["fit"]["prior"]
    twice = fit_with_prior("new", layers + layers[::-1], latency + latency[::-1], priors).spec["fit"]["prior"]
    assert twice["cv"] == once["cv"] == "leave one model out"
    shared = set(once["cv_rms_error_pct"]) & set(twice["cv_rms_error_pct"])
    assert any(k.startswith("prior+") for k in shared)
    assert {k: twice["cv_rms_error_pct"][k] for k in shared} == pytest.approx(
        {k: once["cv_rms_error_pct"][k] for k in shared}, abs=2e-3)
    assert twice["trust"] == once["trust"]


def test_a_prior_table_without_the_models_kernel_types_is_named(tmp_path):
    only_linear = table_device(tmp_path, "linear-only", [0.01], kernels=[POOL[-1]])
    with pytest.raises(UsageError, match="prior device 'linear-only' cannot price.*conv"):
        fit_with_prior("new", *models(8, 8, COST_A), [only_linear])


# --- nasctl hw fit --prior --------------------------------------------------------------

@pytest.fixture
def nb201_models(tmp_path):
    """Eight NB201 cells timed on a board that runs them like 1.7 x edge-quad + 0.3 x
    eyeriss-like, plus 0.05 ms."""
    import csv

    from nasctl.hardware.loader import load_device
    from nasctl.spaces.loader import load_space

    space = load_space("nb201")
    rng = np.random.default_rng(0)
    quad, eyeriss = load_device("edge-quad"), load_device("eyeriss-like")
    path = tmp_path / "measured.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arch", "latency_ms"])
        for _ in range(8):
            arch = space.sample(rng)
            layers = space.to_layers(arch, tuple(space.spec.input_shape), space.spec.classes)
            writer.writerow([json.dumps(arch), 1.7 * quad.estimate(layers).latency_ms
                             + 0.3 * eyeriss.estimate(layers).latency_ms + 0.05])
    return path


def test_hw_fit_with_a_prior_writes_a_loadable_device_that_records_it(tmp_path, nb201_models):
    ws = tmp_path / "ws"
    ws.mkdir()
    result = invoke("--workspace", ws, "hw", "fit", "--device", "board", "--models", nb201_models, "--space", "nb201",
                    "--prior", "edge-quad,eyeriss-like", "--json")
    assert result.exit_code == 0, result.output
    prior = json.loads(result.stdout)["fit"]["prior"]
    assert prior["devices"] == ["edge-quad", "eyeriss-like"] and prior["trust"].startswith("prior")
    assert prior["weights"]["edge-quad"] == pytest.approx(1.7, rel=0.1)
    shown = json.loads(invoke("--workspace", ws, "hw", "show", "board", "--json").stdout)
    assert shown["kind"] == "lut" and shown["fit"]["prior"]["weights"] == prior["weights"]
    text = invoke("--workspace", ws, "hw", "fit", "--device", "board2", "--models", nb201_models, "--space", "nb201",
                  "--prior", "edge-quad")
    assert text.exit_code == 0 and "Prior edge-quad: chose" in text.stdout, text.output


def test_hw_fit_prior_bad_input_is_one_line(tmp_path, nb201_models):
    ws = tmp_path / "ws"
    ws.mkdir()
    fit = ("--workspace", ws, "hw", "fit", "--device", "board", "--models", nb201_models, "--space", "nb201")
    one_line_error(invoke(*fit, "--prior", "edge-quad,nosuch"), 2, "nosuch")
    one_line_error(invoke(*fit, "--prior", "edge-quad,"), 2, "--prior 'edge-quad,'")
    convs = tmp_path / "convs.csv"  # a table of convolutions only: it cannot price NB201's pooling or adds
    convs.write_text("op,in_ch,out_ch,in_h,in_w,out_h,out_w,kernel_h,kernel_w,stride,groups,w_bits,a_bits,fn,"
                     "latency_ms\n" + "".join(f"conv,16,16,{hw},{hw},{hw},{hw},3,3,1,1,32,32,relu,{hw * 1e-3}\n"
                                              for hw in (8, 16, 32)))
    assert invoke("--workspace", ws, "hw", "fit", "--device", "convs", "--lut", convs).exit_code == 0
    one_line_error(invoke(*fit, "--prior", "convs"), 2, "prior device 'convs' cannot price")
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "b", "--lut", convs, "--prior", "edge-quad"),
                   2, "--prior")
    one_line_error(invoke(*fit, "--prior", "edge-quad, edge-quad"), 2, "names edge-quad twice")
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "edge-quad", "--models", nb201_models,
                          "--space", "nb201", "--prior", "edge-quad"), 2, "also a prior device")
    one_line_error(invoke("--workspace", ws, "hw", "fit", "--device", "b", "--prior", "edge-quad"), 2,
                   "--prior DEV1,DEV2 needs --models FILE")
    assert not (ws / "hardware" / "board").exists() and not (ws / "hardware" / "edge-quad").exists()
