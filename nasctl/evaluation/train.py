"""Proxy training of one candidate, exit-threshold calibration and early-exit evaluation.

`evaluate(space, arch, dataset, settings, seed)`:
 1. builds the network (weights initialised from `seed`) and trains every exit jointly on
    the training split, minimising  L = Σ_k w_k · CE_k  with w_k = 1 for the final
    classifier and `settings.exit_weight` for each early exit, using AdamW with a cosine
    learning-rate decay to zero over all steps and mini-batches shuffled from `seed`.
    Layers below 16 bits train quantization-aware (their fake quantizers are in the
    network itself);
 2. calibrates one confidence threshold per early exit on the validation split, either
    to a target accuracy drop (`calibrate_thresholds`; the architecture's own
    `exit_tolerance` knob, where its space has one, overrides `settings.exit_tolerance`)
    or to target exit rates (`rate_thresholds`), confidence being the exit policy's
    measure (`confidence`: the maximum softmax probability, or one minus the normalised
    entropy of the softmax);
 3. routes each test input to the first exit whose confidence reaches its threshold
    (the final classifier takes the rest) and reports the accuracy of those decisions
    and the share of inputs leaving at each exit.
Every random choice flows from `seed`: on the CPU the same (arch, dataset, settings, seed)
gives the same result, bit for bit, in any process on the same machine with the same
thread count (`settings.threads`); the global torch random state is left as found.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..config import EXIT_POLICIES
from ..errors import UsageError
from .datasets import Dataset

DEVICES = ("auto", "cpu", "cuda")
NO_EXIT = 2.0  # threshold of an exit that takes no inputs: above any confidence, still valid JSON
EVAL_BATCH = 1024


@dataclass
class TrainSettings:
    """Proxy-training settings; the defaults suit the built-in `digits` data set."""

    epochs: int = 5
    batch_size: int = 64
    lr: float = 5e-3
    weight_decay: float = 0.01
    exit_weight: float = 1.0      # loss weight of each early exit (the final classifier's is 1)
    exit_tolerance: float = 1.0   # accuracy points the exits may cost against the final classifier alone
    exit_policy: str = "max-softmax"  # one of EXIT_POLICIES
    exit_rates: dict[str, float] | None = None  # target share of inputs per early exit (by name), instead
                                                # of calibrating to exit_tolerance
    device: str = "cpu"           # "cpu" or "cuda"; see resolve_train_device
    threads: int | None = None    # CPU threads for torch; None keeps torch's default (one per core)


@dataclass
class EvalResult:
    """Accuracies are percentages on the test split unless named otherwise.

    accuracy         accuracy of the early-exit decisions (each input answered by the exit it left at)
    exit_rates       share of test inputs leaving at each active exit, final classifier last (sums to 1)
    exit_accuracies  accuracy of each exit's own predictions on every test input
    thresholds       confidence threshold of each early exit (NO_EXIT = takes no inputs)
    val_accuracy     accuracy of the early-exit decisions on the validation split
    val_exit_accuracies  accuracy of each exit's own predictions on every validation input
    train_seconds    wall time of the training loop
    """

    accuracy: float
    exit_rates: list[float]
    exit_accuracies: list[float]
    thresholds: list[float]
    val_accuracy: float
    val_exit_accuracies: list[float]
    train_seconds: float


def resolve_train_device(choice: str) -> str:
    """'auto' → 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' requires one."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("training device 'cuda' requested but torch sees no CUDA GPU; allowed here: auto, cpu")
    if choice not in DEVICES:
        raise UsageError(f"training device '{choice}' is not one of: {', '.join(DEVICES)}")
    return choice


def confidence(probs: torch.Tensor, policy: str) -> torch.Tensor:
    """How sure each prediction is, from softmax probabilities (classes on the last axis):
    'max-softmax' is the largest probability; 'entropy' is 1 - H(p) / log(C), with H the
    entropy in nats and C the class count (1 for a one-hot p, 0 for a uniform one)."""
    if policy == "max-softmax":
        return probs.max(dim=-1).values
    if policy == "entropy":
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
        return 1.0 - entropy / np.log(probs.shape[-1])
    raise UsageError(f"exit policy '{policy}' is not one of: {', '.join(EXIT_POLICIES)}")


def calibrate_thresholds(confidence: np.ndarray, correct: np.ndarray, tolerance: float) -> list[float]:
    """One threshold per early exit from validation confidences, so that the early-exit
    network loses at most `tolerance` accuracy points against its final classifier alone.

    confidence, correct: arrays K×N over K exits (final classifier last) and N validation
    inputs; confidence[k, i] is exit k's confidence on input i, correct[k, i] whether its
    prediction is right.  Target accuracy, as a share: A* = mean(correct[K-1]) - tolerance/100.
    For k = 0 … K-2 in order, with the earlier exits at their thresholds and the final
    classifier answering every input no exit up to k takes, the threshold t_k is the lowest t
    keeping the accuracy of those decisions ≥ A*; when no t does, t_k = NO_EXIT and the exit
    takes no inputs.  Each step keeps the decisions at ≥ A* (taking nothing keeps the previous
    step's accuracy), so the calibrated network meets A* on these inputs.
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    n = confidence.shape[1]
    need = (correct[-1].mean() - tolerance / 100.0) * n - 1e-9  # right decisions needed
    in_flight = np.ones(n, dtype=bool)
    right_so_far = 0  # right decisions of the earlier exits
    thresholds = []
    for conf_k, ok_k in zip(confidence[:-1], correct[:-1]):
        t = NO_EXIT
        order = np.argsort(-conf_k[in_flight], kind="stable")
        conf, ok, final_ok = conf_k[in_flight][order], ok_k[in_flight][order], correct[-1][in_flight][order]
        if conf.size:
            # exit k takes the m most confident inputs in flight, the final classifier the rest
            right = right_so_far + np.cumsum(ok) + (final_ok.sum() - np.cumsum(final_ok))
            # a threshold takes every input tied with it: candidates end a run of equal confidences
            ends_tie = np.append(conf[1:] < conf[:-1], True)
            good = np.flatnonzero(ends_tie & (right >= need))
            if good.size:
                t = float(conf[good[-1]])
                right_so_far += int(ok[:good[-1] + 1].sum())
        thresholds.append(t)
        in_flight &= conf_k < t
    return thresholds


def rate_thresholds(confidence: np.ndarray, rates: list[float]) -> list[float]:
    """One threshold per early exit so that exit k takes about `rates[k]` of all N inputs:
    over the inputs no earlier exit took, t_k is the round(rates[k] · N)-th highest
    confidence (inputs tied with it leave too); NO_EXIT for a rate of 0 or when no input
    is left."""
    confidence = np.asarray(confidence, dtype=np.float64)
    n = confidence.shape[1]
    in_flight = np.ones(n, dtype=bool)
    thresholds = []
    for conf_k, rate in zip(confidence[:-1], rates):
        conf = np.sort(conf_k[in_flight])[::-1]
        m = min(int(round(rate * n)), conf.size)
        t = float(conf[m - 1]) if m > 0 else NO_EXIT
        thresholds.append(t)
        in_flight &= conf_k < t
    return thresholds


def route(confidence: np.ndarray, thresholds: list[float]) -> np.ndarray:
    """Index of the exit each input leaves at: the first k with confidence[k] ≥ thresholds[k],
    else the final classifier (K-1)."""
    confidence = np.asarray(confidence)
    exit_at = np.full(confidence.shape[1], confidence.shape[0] - 1)
    for k in reversed(range(len(thresholds))):
        exit_at[confidence[k] >= thresholds[k]] = k
    return exit_at


def evaluate(space, arch, dataset: Dataset, settings: TrainSettings, seed: int, keep=None) -> EvalResult:
    """Train `arch` of `space` on `dataset` and measure it with calibrated early exits.
    `keep(model, result)`, where given, is called with the trained network (in eval mode)
    and its result: e.g. to save it (`nasctl.evaluation.kept`)."""
    device = torch.device(settings.device)
    with _threads(settings.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = space.build(arch, dataset.input_shape, dataset.classes)
        # channels-last makes depthwise convolutions train ~1.5x faster on the CPU
        model = model.to(device, memory_format=torch.channels_last)
        start = time.perf_counter()
        train_network(model, dataset, settings, seed, device)
        seconds = time.perf_counter() - start
    result = measure(model, space, arch, dataset, settings, seconds)
    if keep is not None:
        keep(model, result)
    return result


def measure(model: torch.nn.Module, space, arch, dataset: Dataset, settings: TrainSettings,
            seconds: float = 0.0, fold_batch_norm: bool = False) -> EvalResult:
    """A trained network's figures (steps 2 and 3 above): thresholds calibrated on the
    validation split, the early-exit decisions measured on the test split.  `seconds`:
    the training time to report.  The network runs frozen for inference
    (`quant.frozen_for_inference`): exactly its eval-mode outputs, or with
    `fold_batch_norm` those up to float rounding, faster."""
    device = next(model.parameters()).device
    with _threads(settings.threads):
        (val_conf, val_ok), (test_conf, test_ok) = _predict(
            model, [(dataset.x_val, dataset.y_val), (dataset.x_test, dataset.y_test)], device, settings.exit_policy,
            fold_batch_norm)
    if settings.exit_rates is not None:
        thresholds = rate_thresholds(val_conf, [settings.exit_rates[e] for e in space.active_exits(arch)[:-1]])
    else:
        thresholds = calibrate_thresholds(val_conf, val_ok, arch.get("exit_tolerance", settings.exit_tolerance))
    val_exit, test_exit = route(val_conf, thresholds), route(test_conf, thresholds)
    n = test_ok.shape[1]
    result = EvalResult(
        accuracy=100.0 * float(test_ok[test_exit, np.arange(n)].mean()),
        exit_rates=(np.bincount(test_exit, minlength=len(test_ok)) / n).tolist(),
        exit_accuracies=(100.0 * test_ok.mean(axis=1)).tolist(),
        thresholds=thresholds,
        val_accuracy=100.0 * float(val_ok[val_exit, np.arange(val_ok.shape[1])].mean()),
        val_exit_accuracies=(100.0 * val_ok.mean(axis=1)).tolist(),
        train_seconds=seconds,
    )
    return result


def train_network(model: torch.nn.Module, data: Dataset, s: TrainSettings, seed: int, device: torch.device) -> None:
    """Step 1 above: train every exit of `model` jointly on the training split."""
    x = torch.from_numpy(data.x_train).to(device, memory_format=torch.channels_last)
    y = torch.from_numpy(data.y_train).to(device)
    n = len(y)
    batch = min(s.batch_size, n)
    steps_per_epoch = n // batch  # the incomplete last batch is dropped; shuffling varies it
    order = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, s.epochs * steps_per_epoch))
    model.train()
    for _ in range(s.epochs):
        perm = torch.randperm(n, generator=order).to(device)
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            outputs = model(x[idx])
            target = y[idx]
            loss = F.cross_entropy(outputs[-1], target)
            for out in outputs[:-1]:
                loss = loss + s.exit_weight * F.cross_entropy(out, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()


@torch.no_grad()
def _predict(model: torch.nn.Module, splits: list[tuple[np.ndarray, np.ndarray]], device: torch.device,
             policy: str, fold_batch_norm: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per (x, y) split: (confidence, correct), each K×N - every exit's confidence under
    `policy` and hit.  The splits run as one stream of batches of EVAL_BATCH inputs
    (small splits share a batch), through the network frozen for inference
    (`quant.frozen_for_inference`)."""
    from .quant import frozen_for_inference

    model.eval()
    xs, ys = [x for x, _ in splits], [y for _, y in splits]
    bounds = np.cumsum([0] + [len(x) for x in xs])
    conf, hit = [], []
    with frozen_for_inference(model, fold_batch_norm):
        for i in range(0, int(bounds[-1]), EVAL_BATCH):
            j = min(i + EVAL_BATCH, int(bounds[-1]))
            parts = [(k, max(i, bounds[k]) - bounds[k], min(j, bounds[k + 1]) - bounds[k])
                     for k in range(len(xs)) if bounds[k] < j and bounds[k + 1] > i]
            xb = torch.from_numpy(np.concatenate([xs[k][a:b] for k, a, b in parts]))
            yb = torch.from_numpy(np.concatenate([ys[k][a:b] for k, a, b in parts])).to(device)
            xb = xb.to(device, memory_format=torch.channels_last)
            probs = torch.stack([F.softmax(out.float(), dim=1) for out in model(xb)])
            conf.append(confidence(probs, policy).cpu())
            hit.append((probs.argmax(dim=2) == yb).cpu())
    conf_all, hit_all = torch.cat(conf, dim=1).numpy(), torch.cat(hit, dim=1).numpy()
    return [(conf_all[:, bounds[k]:bounds[k + 1]], hit_all[:, bounds[k]:bounds[k + 1]]) for k in range(len(xs))]


@contextmanager
def _threads(n: int | None):
    """Run with `n` torch CPU threads (None: unchanged), restoring the count afterwards."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
