"""Reinforcement learning: a policy-gradient controller over the knobs (torch).

The policy is factorised over the knobs (one categorical distribution per knob) and
conditioned on a preference: a weight vector w over the objectives, whose logits are
a linear function of w.  Each batch draws a fresh w (uniform on the simplex), samples
architectures from the policy at w, and rewards each with the negative weighted
Chebyshev distance to the ideal point, max_i w_i (f_i - min_i) / (max_i - min_i), over
the objectives normalised to the range evaluated so far; a constraint violation costs
more than any feasible architecture.  REINFORCE updates the policy with the reward
minus a moving-average baseline, plus an entropy bonus, so that the one policy covers
the whole front as w varies.  Starts uniform; every random draw comes from the
strategy's seeded generator.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch, arch_key
from .base import Strategy, violation


class RLStrategy(Strategy):
    batch = 10          # architectures per policy update
    lr = 0.1            # Adam learning rate
    entropy = 0.01      # weight of the entropy bonus
    baseline_decay = 0.8

    def _setup(self) -> None:
        import torch

        self._sizes = [len(v.choices) for v in self.space.variables()]
        self._offsets = np.cumsum([0, *self._sizes])
        self._policy = torch.nn.Linear(self.n_obj, int(self._offsets[-1]), dtype=torch.float64)
        torch.nn.init.zeros_(self._policy.weight)
        torch.nn.init.zeros_(self._policy.bias)
        self._optimizer = torch.optim.Adam(self._policy.parameters(), lr=self.lr)
        self._batches: dict[str, np.ndarray] = {}   # proposed key -> the preference it was sampled at
        self._baseline: float | None = None

    def _probabilities(self, w: np.ndarray) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            logits = self._policy(torch.as_tensor(w)).numpy()
        return [_softmax(logits[a:b]) for a, b in zip(self._offsets[:-1], self._offsets[1:])]

    def _ask(self, n: int) -> list[dict]:
        w = self.rng.dirichlet(np.ones(self.n_obj))
        probs = self._probabilities(w)

        def draw() -> dict:
            return self.space.from_indices([self.rng.choice(len(p), p=p) for p in probs])

        out = []
        while len(out) < min(n, self.batch) and (arch := self.fresh(draw)) is not None:
            out.append(arch)
            self._batches[arch_key(arch)] = w
        if not out and (arch := self.fresh(lambda: self.space.sample(self.rng))) is not None:
            out.append(arch)  # the policy has collapsed onto architectures seen already
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        import torch

        mine = [i for i, a in enumerate(archs) if arch_key(a) in self._batches]
        if not mine:
            return
        W = np.array([self._batches.pop(arch_key(archs[i])) for i in mine])
        reward = self._rewards(F[mine], G[mine], W)
        base = reward.mean() if self._baseline is None else self._baseline
        self._baseline = self.baseline_decay * base + (1 - self.baseline_decay) * reward.mean()
        advantage = torch.as_tensor(reward - base)
        idx = torch.as_tensor(np.array([self.space.to_indices(archs[i]) for i in mine]))
        logits = self._policy(torch.as_tensor(W))
        log_prob = torch.zeros(len(mine), dtype=torch.float64)
        entropy = torch.zeros((), dtype=torch.float64)
        for k, (a, b) in enumerate(zip(self._offsets[:-1], self._offsets[1:])):
            logp = torch.log_softmax(logits[:, a:b], dim=1)
            log_prob = log_prob + logp[torch.arange(len(mine)), idx[:, k]]
            entropy = entropy - (logp.exp() * logp).sum(dim=1).mean()
        loss = -(advantage * log_prob).mean() - self.entropy * entropy
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()

    def _rewards(self, F: np.ndarray, G: np.ndarray, W: np.ndarray) -> np.ndarray:
        """Negative weighted Chebyshev distance of each row of F to the ideal point, the
        objectives scaled to the range of the front found so far (0 at its best, 1 at its
        worst value, clipped at 2); infeasible rows score below every feasible one."""
        front = np.array([self.archive[arch_key(a)][1] for a in self.front()])
        lo, hi = front.min(axis=0), front.max(axis=0)
        scaled = np.clip((F - lo) / np.where(hi > lo, hi - lo, 1.0), 0, 2)
        reward = -(W * scaled).max(axis=1)
        v = violation(G)
        return np.where(v > 0, -2.0 - v, reward)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
