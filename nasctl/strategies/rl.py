"""Reinforcement learning: a policy-gradient controller over the knobs (torch).

The policy is factorised over the knobs (one categorical distribution per knob) and
conditioned on a preference, a weight vector w over the objectives: each knob's
logits are a linear function of w.  Each batch draws a fresh w (uniform on the
simplex) and samples architectures from the policy at w.  An architecture's reward
is its negative weighted Chebyshev distance to the ideal point,
-max_i w_i r_i, where r_i is the rank of its i-th objective among everything
evaluated so far (a fraction in [0, 1]: rewards do not depend on the objectives'
scales or on outliers); a constraint violation scores below every feasible
architecture.  The update is a policy gradient with PPO's clipped objective, a few
passes over each batch, the advantage being the reward minus a moving-average
baseline, plus an entropy bonus; so one policy covers the whole front as w varies.
The policy starts uniform (zero weights) and every random draw comes from the
strategy's seeded generator.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch, arch_key
from .base import Strategy, one_thread, violation


class RLStrategy(Strategy):
    batch = 10           # architectures per policy update
    lr = 0.1             # Adam learning rate
    epochs = 4           # passes over each batch
    clip = 0.2           # PPO ratio clipping
    entropy = 0.01       # weight of the entropy bonus
    baseline_decay = 0.8

    def _setup(self) -> None:
        import torch

        self._sizes = [len(v.choices) for v in self.space.variables()]
        self._offsets = np.cumsum([0, *self._sizes])
        self._policy = torch.nn.Linear(self.n_obj, int(self._offsets[-1]), dtype=torch.float64)
        torch.nn.init.zeros_(self._policy.weight)
        torch.nn.init.zeros_(self._policy.bias)
        self._optimizer = torch.optim.Adam(self._policy.parameters(), lr=self.lr)
        self._sampled: dict[str, np.ndarray] = {}   # proposed key -> the preference it was sampled at
        self._baseline: float | None = None

    @one_thread
    def _ask(self, n: int) -> list[dict]:
        import torch

        w = self.rng.dirichlet(np.ones(self.n_obj))
        with torch.no_grad():
            logits = self._policy(torch.as_tensor(w)).numpy()
        probs = [np.exp(x - x.max()) / np.exp(x - x.max()).sum()
                 for x in np.split(logits, self._offsets[1:-1])]

        def draw() -> dict:
            return self.space.from_indices([self.rng.choice(len(p), p=p) for p in probs])

        out = []
        while len(out) < min(n, self.batch) and (arch := self.fresh(draw)) is not None:
            out.append(arch)
            self._sampled[arch_key(arch)] = w
        if not out and (arch := self.fresh(lambda: self.space.sample(self.rng))) is not None:
            out.append(arch)  # the policy only draws architectures proposed before
        return out

    @one_thread
    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        import torch

        mine = [i for i, a in enumerate(archs) if arch_key(a) in self._sampled]
        if not mine:
            return
        W = torch.as_tensor(np.array([self._sampled.pop(arch_key(archs[i])) for i in mine]))
        reward = self._rewards(F[mine], G[mine], W.numpy())
        base = reward.mean() if self._baseline is None else self._baseline
        self._baseline = self.baseline_decay * base + (1 - self.baseline_decay) * reward.mean()
        advantage = torch.as_tensor(reward - base)
        idx = torch.as_tensor(np.array([self.space.to_indices(archs[i]) for i in mine]))
        rows = torch.arange(len(mine))
        old = None
        for _ in range(self.epochs):
            log_prob = torch.zeros(len(mine), dtype=torch.float64)
            entropy = torch.zeros((), dtype=torch.float64)
            for k, logits in enumerate(torch.tensor_split(self._policy(W), self._offsets[1:-1].tolist(), dim=1)):
                logp = torch.log_softmax(logits, dim=1)
                log_prob = log_prob + logp[rows, idx[:, k]]
                entropy = entropy - (logp.exp() * logp).sum(dim=1).mean()
            old = log_prob.detach() if old is None else old
            ratio = torch.exp(log_prob - old)
            gain = torch.minimum(ratio * advantage, ratio.clamp(1 - self.clip, 1 + self.clip) * advantage)
            loss = -gain.mean() - self.entropy * entropy
            self._optimizer.zero_grad()
            loss.backward()
            self._optimizer.step()

    def _rewards(self, F: np.ndarray, G: np.ndarray, W: np.ndarray) -> np.ndarray:
        """Negative weighted Chebyshev distance to the ideal point over the objectives'
        ranks among everything told so far; infeasible rows score below every feasible one."""
        told = np.array([f for _, f, _ in self.archive.values()])
        ranks = np.column_stack([np.searchsorted(np.sort(told[:, i]), F[:, i]) for i in range(self.n_obj)])
        reward = -(W * ranks / len(told)).max(axis=1)
        v = violation(G)
        return np.where(v > 0, -1.0 - v, reward)
