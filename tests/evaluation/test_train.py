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
from nasctl.evaluation.train import (NO_EXIT, TrainSettings, calibrate_thresholds, evaluate,
                                     resolve_train_device, route)
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
QUICK = TrainSettings(epochs=3, lr=0.02)  # a few seconds' training of a tiny network


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
    assert calibrate_thresholds(conf, ok, tolerance=0.0) == [0.85]    # top 4 at 100 %, top 5 at 80 %
    # 5 points of tolerance (target 85 %): the top 8 reach 7/8 = 87.5 % although the top 5 and 6 miss
    assert calibrate_thresholds(conf, ok, tolerance=5.0) == [0.5]


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


def test_calibration_meets_its_target_on_validation():
    rng = np.random.default_rng(0)
    conf = rng.random((3, 500))
    ok = rng.random((3, 500)) < 0.4 + 0.6 * conf          # confident predictions are right more often
    ok[-1] = rng.random(500) < 0.8
    for tolerance in (0.0, 1.0, 5.0):
        thresholds = calibrate_thresholds(conf, ok, tolerance)
        exit_at = route(conf, thresholds)
        target = 100 * ok[-1].mean() - tolerance
        for k in range(2):
            leaving = exit_at == k
            if thresholds[k] == NO_EXIT:
                assert not leaving.any()
            else:
                assert 100 * ok[k, leaving].mean() >= target
        rates = np.bincount(exit_at, minlength=3) / 500
        assert rates.sum() == pytest.approx(1.0) and rates[0] > 0


# -- training and evaluation ------------------------------------------------------------
def test_quick_training_beats_chance_and_rates_sum_to_one(space, digits):
    res = evaluate(space, ARCH, digits, QUICK, seed=0)
    assert res.accuracy > 50 and res.val_accuracy > 50          # chance is 10 %
    assert len(res.exit_rates) == len(res.exit_accuracies) == 2 and len(res.thresholds) == 1
    assert sum(res.exit_rates) == pytest.approx(1.0)


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
