import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from nasctl.errors import UsageError
from nasctl.evaluation.datasets import load_dataset
from nasctl.evaluation.quant import ActQuant, QConv2d, fake_quant_weight
from nasctl.evaluation.train import (NO_EXIT, TrainSettings, calibrate_thresholds, confidence, evaluate,
                                     rate_thresholds, resolve_train_device, route)
from nasctl.spaces.mbv2 import Mbv2Space

TINY = {"name": "tiny", "kind": "mbv2",
        "stem": {"channels": 8},
        "stages": [{"depth": 1, "channels": 8, "expand": 1},
                   {"depth": 1, "channels": 16, "expand": 2, "stride": 2}],
        "head": {"channels": 16},
        "exits": {"after_stages": [1], "width": 8},
        "quantization": {"backbone_bits": [32, 4], "exit_bits": [32, 4]}}
ARCH = {"s1_depth": 1, "s1_channels": 8, "s1_expand": 1, "s1_kernel": 3,
        "s2_depth": 1, "s2_channels": 16, "s2_expand": 2, "s2_kernel": 3,
        "exit_s1": 1, "exit_s1_width": 8, "backbone_bits": 32, "exit_bits": 32}
QUICK = TrainSettings(epochs=3, lr=0.02, threads=1)  # a second's training of a tiny network (one thread: the
# fastest for 8x8 inputs, and unharmed by other work on the machine)


@pytest.fixture(scope="module")
def space():
    return Mbv2Space.from_dict(TINY)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", 0)


# -- calibration and routing ------------------------------------------------------------
def test_threshold_is_the_lowest_meeting_the_target():
    conf = np.array([[0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3],
                     [0.5] * 10])
    ok = np.array([[1, 1, 1, 1, 0, 1, 1, 1, 0, 0],
                   [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]], dtype=bool)   # final classifier: 90 %
    # the exit takes the top 4 (all right) and the final classifier gets 5 of the other 6: 90 %
    assert calibrate_thresholds(conf, ok, tolerance=0.0) == [0.85]
    # the exit taking the top 5 would leave 8 of 10 right: 80 % misses 85 %
    assert calibrate_thresholds(conf, ok, tolerance=5.0) == [0.85]
    # 10 points of tolerance (80 %): the top 8 (7 right) plus the final classifier's 1 of 2
    assert calibrate_thresholds(conf, ok, tolerance=10.0) == [0.5]


def test_ties_leave_together_and_unqualified_exits_take_nothing():
    conf = np.array([[0.9, 0.8, 0.8, 0.5], [0.5] * 4])
    ok = np.array([[1, 1, 0, 1], [1, 1, 1, 1]], dtype=bool)
    assert calibrate_thresholds(conf, ok, 0.0) == [pytest.approx(0.9)]
    ok[0] = False
    assert calibrate_thresholds(conf, ok, 0.0) == [NO_EXIT]
    assert route(conf, [NO_EXIT]).tolist() == [1, 1, 1, 1]


def test_later_exits_are_calibrated_on_inputs_still_in_flight():
    conf = np.array([[0.95, 0.9, 0.2, 0.2, 0.2, 0.2],
                     [0.99, 0.99, 0.9, 0.8, 0.7, 0.6],
                     [0.5] * 6])
    ok = np.array([[1, 1, 0, 0, 0, 0],
                   [0, 0, 1, 1, 1, 0],
                   [1, 1, 1, 1, 1, 1]], dtype=bool)
    thresholds = calibrate_thresholds(conf, ok, 0.0)
    assert thresholds == [pytest.approx(0.9), pytest.approx(0.7)]
    assert route(conf, thresholds).tolist() == [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_thresholds_calibrated_to_a_drop_meet_it_on_validation(seed):
    rng = np.random.default_rng(seed)
    conf = rng.random((3, 500))
    ok = rng.random((3, 500)) < 0.4 + 0.6 * conf          # confident predictions are right more often
    ok[-1] = rng.random(500) < 0.8
    n = conf.shape[1]
    for tolerance in (0.0, 1.0, 5.0, 20.0):
        thresholds = calibrate_thresholds(conf, ok, tolerance)
        exit_at = route(conf, thresholds)
        accuracy = 100 * ok[exit_at, np.arange(n)].mean()
        assert accuracy >= 100 * ok[-1].mean() - tolerance - 1e-9
        for k in range(2):
            assert thresholds[k] != NO_EXIT or not (exit_at == k).any()
        rates = np.bincount(exit_at, minlength=3) / n
        assert rates.sum() == pytest.approx(1.0)
        if tolerance >= 5:
            assert rates[0] > 0


def test_thresholds_calibrated_to_exit_rates():
    rng = np.random.default_rng(0)
    conf = rng.random((3, 1000))
    thresholds = rate_thresholds(conf, [0.3, 0.5])
    rates = np.bincount(route(conf, thresholds), minlength=3) / 1000
    assert rates.tolist() == pytest.approx([0.3, 0.5, 0.2])
    assert rate_thresholds(conf, [0.0, 1.0])[0] == NO_EXIT
    assert (route(conf, rate_thresholds(conf, [0.0, 1.0])) == 1).all()


def test_entropy_confidence():
    probs = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    # normalised entropy: 0, 1 and log 2 / log 4 = 1/2
    assert confidence(probs, "entropy").tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert confidence(probs, "max-softmax").tolist() == pytest.approx([1.0, 0.25, 0.5])
    with pytest.raises(UsageError, match="exit policy 'margin' is not one of: max-softmax, entropy"):
        confidence(probs, "margin")


# -- training and evaluation ------------------------------------------------------------
def test_quick_training_beats_chance_and_rates_sum_to_one(space, digits):
    res = evaluate(space, ARCH, digits, QUICK, seed=0)
    assert res.accuracy > 50 and res.val_accuracy > 50          # chance is 10 %
    assert len(res.exit_rates) == len(res.exit_accuracies) == 2 and len(res.thresholds) == 1
    assert sum(res.exit_rates) == pytest.approx(1.0)
    # calibrated to lose at most 1 point against the final classifier on validation: it does
    assert res.val_accuracy >= res.val_exit_accuracies[-1] - QUICK.exit_tolerance - 1e-9


def test_entropy_policy_and_rate_targets_in_training(space, digits):
    res = evaluate(space, ARCH, digits, dataclasses.replace(QUICK, exit_policy="entropy",
                                                              exit_rates={"s1": 0.4}), seed=0)
    assert res.exit_rates[0] == pytest.approx(0.4, abs=0.08)    # calibrated on validation, measured on test
    assert res.accuracy > 50


def test_int4_training_still_learns(space, digits):
    res = evaluate(space, dict(ARCH, backbone_bits=4, exit_bits=4), digits, QUICK, seed=0)
    assert res.exit_accuracies[-1] > 30


MIXED = dict(ARCH, backbone_bits=4)  # quantization-aware backbone, float exit head


def _result(space, digits, seed):
    res = dataclasses.asdict(evaluate(space, MIXED, digits, QUICK, seed=seed))
    del res["train_seconds"]
    return res


def test_same_seed_same_result_in_process_and_in_a_fresh_one(space, digits):
    before = torch.get_rng_state()
    first = _result(space, digits, 3)
    assert torch.equal(torch.get_rng_state(), before)           # the global random state is untouched
    assert _result(space, digits, 3) == first
    assert _result(space, digits, 4) != first
    script = "\n".join([
        "import dataclasses, json",
        "from nasctl.evaluation.datasets import load_dataset",
        "from nasctl.evaluation.train import TrainSettings, evaluate",
        "from nasctl.spaces.mbv2 import Mbv2Space",
        f"res = evaluate(Mbv2Space.from_dict({TINY!r}), {MIXED!r}, load_dataset('digits', 0), {QUICK!r}, seed=3)",
        "res = dataclasses.asdict(res)",
        "del res['train_seconds']",
        "print(json.dumps(res))"])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(first))


# -- quantization -----------------------------------------------------------------------
def test_int4_weights_take_at_most_16_values_per_channel():
    conv = QConv2d(8, 16, 3, bits=4)
    w = fake_quant_weight(conv.weight, conv.bits)
    assert all(torch.unique(w[c]).numel() <= 16 for c in range(16))
    assert not torch.equal(w, conv.weight)
    assert fake_quant_weight(conv.weight, 32) is conv.weight
    w8 = fake_quant_weight(conv.weight, 8)
    assert (w8 - conv.weight).abs().max() <= conv.weight.abs().max() / 127 / 2 + 1e-6


def test_activation_quantizer_tracks_a_range_and_passes_gradients():
    q = ActQuant(4)
    x = torch.linspace(-1, 3, 1000, requires_grad=True)
    q.train()
    q(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))              # straight-through inside the range
    assert q.lo.item() == pytest.approx(-1) and q.hi.item() == pytest.approx(3)
    q.eval()
    assert torch.unique(q(x.detach() * 2)).numel() <= 16        # frozen range, 16 levels
    assert ActQuant(32)(x) is x


def test_resolve_train_device():
    assert resolve_train_device("cpu") == "cpu"
    assert resolve_train_device("auto") in ("cpu", "cuda")
    with pytest.raises(UsageError, match="'tpu' is not one of: auto, cpu, cuda"):
        resolve_train_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="'cuda'.*no CUDA"):
            resolve_train_device("cuda")
