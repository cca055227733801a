"""Training a supernet once, so that thousands of its sub-networks can be measured.

Each step, on one mini-batch of the training split (the sandwich rule, BigNAS/OFA):
  - the largest sub-network (every knob at its largest choice, every exit on, the widest
    bit width) learns from the labels: L = CE(final) + w · Σ CE(exit_k);
  - the smallest one (every knob at its smallest choice, the narrowest bits, exits on)
    and `random_subnets` sampled from the space learn from the labels and, by in-place
    distillation, from the largest one's final softmax (detached) in the same step:
    L = Σ_heads (1 - α) · CE(head) + α · KL(largest ‖ head) at temperature 1,
    each head weighted as above;
gradients of all of them are summed before one AdamW step, the learning rate following a
cosine decay to zero over all steps after a linear warm-up of `warmup_epochs`, in which
only the largest sub-network trains (progressive shrinking in its simplest form).
Every searchable bit width trains quantization-aware through the sub-networks sampled at
it (their fake quantizers over the shared weights); batch-norm statistics and activation
ranges are recalibrated per sub-network before it is measured (`nasctl.supernet.score`).

Every random choice flows from `seed`: the initial weights, and per epoch e the batch
order and the sampled sub-networks (seeded from (seed, e)), so a run resumed from its
checkpoint after epoch e ends with the same weights as one never stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..evaluation.datasets import Dataset
from ..evaluation.train import TrainSettings
from .elastic import Supernet


@dataclass
class SupernetSettings(TrainSettings):
    """Proxy training's settings (batch size, learning rate, weight decay, exit weight, ...)
    and the supernet's own."""

    epochs: int = 10
    threads: Optional[int] = 1
    random_subnets: int = 2      # sampled sub-networks per step besides the largest and smallest
    distill: float = 0.5         # α: the share of a smaller sub-network's loss from the largest one
    warmup_epochs: int = 2       # epochs training only the largest sub-network

    def as_dict(self) -> dict:
        return asdict(self)


def _head_loss(outputs, target, soft, s: SupernetSettings) -> torch.Tensor:
    loss = 0.0
    for k, out in enumerate(outputs):
        w = 1.0 if k == len(outputs) - 1 else s.exit_weight
        term = F.cross_entropy(out, target)
        if soft is not None and s.distill > 0:
            kd = F.kl_div(F.log_softmax(out, dim=1), soft, reduction="batchmean")
            term = (1 - s.distill) * term + s.distill * kd
        loss = loss + w * term
    return loss


def train_supernet(net: Supernet, data: Dataset, s: SupernetSettings, seed: int, *, start_epoch: int = 0,
                   optimizer_state: Optional[dict] = None,
                   on_epoch: Optional[Callable[[int, float, torch.optim.Optimizer], None]] = None) -> float:
    """Train `net` from epoch `start_epoch` (its weights and `optimizer_state` those
    saved after that many epochs) to `s.epochs`; `on_epoch(done, mean_loss, opt)` after
    each epoch (e.g. to write a checkpoint).  The wall time in seconds."""
    before = torch.get_num_threads()
    if s.threads is not None:
        torch.set_num_threads(s.threads)
    t0 = time.perf_counter()
    try:
        x = torch.from_numpy(data.x_train)
        y = torch.from_numpy(data.y_train)
        n = len(y)
        batch = min(s.batch_size, n)
        per_epoch = n // batch
        total = max(1, s.epochs * per_epoch)
        warm = min(s.warmup_epochs, s.epochs - 1) * per_epoch if s.epochs > 1 else 0
        opt = torch.optim.AdamW(net.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        if optimizer_state is not None:  # {parameter index: its AdamW state}
            opt.load_state_dict({**opt.state_dict(), "state": optimizer_state})
        largest, smallest = net.largest(), net.smallest()
        net.train()
        for epoch in range(start_epoch, s.epochs):
            order = torch.Generator().manual_seed(_mix(seed, epoch))
            rng = np.random.default_rng([seed, epoch])
            perm = torch.randperm(n, generator=order)
            losses = []
            for i in range(per_epoch):
                step = epoch * per_epoch + i
                lr = s.lr * min(1.0, (step + 1) / warm) if step < warm else \
                    s.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
                for group in opt.param_groups:
                    group["lr"] = lr
                idx = perm[i * batch:(i + 1) * batch]
                xb, target = x[idx], y[idx]
                opt.zero_grad(set_to_none=True)
                outputs = net(xb, largest)
                loss = _head_loss(outputs, target, None, s)
                loss.backward()
                losses.append(float(loss.detach()))
                if step >= warm:
                    soft = F.softmax(outputs[-1].detach(), dim=1)
                    for arch in [smallest] + [net.sample(rng) for _ in range(s.random_subnets)]:
                        _head_loss(net(xb, arch), target, soft, s).backward()
                opt.step()
            if on_epoch is not None:
                on_epoch(epoch + 1, float(np.mean(losses)) if losses else float("nan"), opt)
    finally:
        torch.set_num_threads(before)
    return time.perf_counter() - t0


def _mix(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0] & (2**63 - 1))
