"""Measuring one architecture with the weights it inherits from a supernet.

`score(net, arch, data, settings, calibration)`:
 1. takes the sub-network's weights from the supernet (`Supernet.network`);
 2. recalibrates its batch-norm statistics and activation-quantizer ranges, at its own bit
    widths, on `calibration` (a fixed set of training inputs, one batch);
 3. optionally fine-tunes it for `finetune_epochs` as proxy training would (then
    recalibrates again);
 4. calibrates its exit thresholds on the validation split and measures it on the test
    split as proxy training does (`nasctl.evaluation.train.measure`, with batch norm folded
    into the convs: equal up to float rounding): accuracy, exit rates and exit accuracies.

`score_members` does this with each member of a supernet trained with `--members K` and
gives the means of their figures, as `nasctl search --repeats` averages trainings: one
network's accuracy on a small test split moves by about as much as candidates differ
(benchmarks/README.md, `supernet.py`), and the mean over members ranks them more steadily.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from ..evaluation.train import EvalResult, TrainSettings, _threads, measure, train_network
from .elastic import Supernet, recalibrate

CALIBRATION_SAMPLES = 128  # training inputs the batch-norm statistics are recalibrated on


def calibration_inputs(data, seed: int, samples: int = CALIBRATION_SAMPLES) -> torch.Tensor:
    """The training inputs every candidate recalibrates on: `samples` of them drawn by `seed`."""
    idx = np.sort(np.random.default_rng(seed).permutation(len(data.y_train))[:samples])
    x = torch.from_numpy(np.ascontiguousarray(data.x_train[idx]))
    return x.to(memory_format=torch.channels_last) if x.dim() == 4 else x  # as networks train and measure


def score(net: Supernet, arch: dict, data, settings: TrainSettings, calibration: torch.Tensor, *,
          finetune_epochs: int = 0, seed: int = 0, extract: bool = False) -> tuple[EvalResult, torch.nn.Module]:
    """(its figures, the measured network).  `extract`: the network is a fresh `space.build`
    module of its own (to keep or export) rather than one assembled from reused blocks."""
    t0 = time.perf_counter()
    with _threads(settings.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = net.extract(arch) if extract or finetune_epochs else net.network(arch)
        recalibrate(model, calibration, len(calibration))
        if finetune_epochs:
            tune = replace(settings, epochs=finetune_epochs)
            train_network(model, data, tune, seed, torch.device("cpu"))
            recalibrate(model, calibration, len(calibration))
    # batch norm folded into the convs: about 15% faster, the same accuracy as eval mode on 29
    # of 30 candidates (one test input apart on the other)
    result = measure(model, net.space, arch, data, settings, time.perf_counter() - t0, fold_batch_norm=True)
    return result, model


def score_members(nets: list, arch: dict, data, settings: TrainSettings, calibration: torch.Tensor, *,
                  finetune_epochs: int = 0, seed: int = 0, extract: bool = False
                  ) -> tuple[EvalResult, torch.nn.Module, EvalResult]:
    """`score` with each member of a supernet: (the mean of their accuracies, exit rates
    and exit accuracies - thresholds those of the first member, seconds their sum -, the
    first member's network, the first member's own figures)."""
    first, model = score(nets[0], arch, data, settings, calibration, finetune_epochs=finetune_epochs, seed=seed,
                         extract=extract)
    if len(nets) == 1:
        return first, model, first
    results = [first] + [score(net, arch, data, settings, calibration, finetune_epochs=finetune_epochs,
                               seed=seed)[0] for net in nets[1:]]
    mean = replace(first,
                   accuracy=float(np.mean([r.accuracy for r in results])),
                   exit_rates=np.mean([r.exit_rates for r in results], axis=0).tolist(),
                   exit_accuracies=np.mean([r.exit_accuracies for r in results], axis=0).tolist(),
                   val_accuracy=float(np.mean([r.val_accuracy for r in results])),
                   val_exit_accuracies=np.mean([r.val_exit_accuracies for r in results], axis=0).tolist(),
                   train_seconds=float(sum(r.train_seconds for r in results)))
    return mean, model, first
