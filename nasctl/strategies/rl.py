"""Reinforcement learning: a policy-gradient controller over the knobs (torch).

The policy proposes a child of a parent.  Its state is a parent taken from the current
front (the non-dominated feasible architectures told so far, in turn, each once before
any twice) and the parent's position on that front, the ranks of its objective values
among everything evaluated (fractions in [0, 1], so that the policy knows whether it is
asked for a cheap or an accurate child).  Its action is the child: one categorical
distribution per knob, factorised, whose logits are

    s_k * [choice = the parent's choice of knob k] + b + A @ ranks(parent),

a learned copy strength per knob, a bias per choice and a linear function of the
parent's position.  At the start the copy strengths (4.0) make it a mutation operator:
about one knob in fifteen changes, to a uniform choice; learning then shifts which knobs
change, and to what, wherever on the front the parent lies.  Architectures drawn before
are redrawn, at a higher temperature when the policy keeps repeating itself.

A child's reward is how far it stands out of the front of everything else told, in rank
space: minus the largest amount by which some other evaluated architecture beats it in
every objective (negative while it is dominated, positive when it moves the front);
ranks make rewards independent of the objectives' scales, outliers and monotone
transforms.  A child that violates a constraint scores below every feasible one, and a
failed child (told the worst values, see `strategies.base.FAILED_PENALTY`) below those; failed
candidates are left out of the ranks, so they do not compress everyone else's.

The update is PPO's clipped policy gradient, a few passes after every batch over every
child proposed so far, rewards recomputed against the current front (a child that was
on the front and has since been overtaken now scores below zero) and normalised to zero
mean and unit spread, each child's probability ratio taken against the policy that drew
it.  The first budget/10 proposals (10 to 40) are uniform draws, to have a front to start
from.  Every random draw comes from the strategy's seeded generator; the policy's
parameters start from fixed values, so a seed fixes the run.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..objectives import pareto_mask
from ..spaces.base import Arch, arch_key
from .base import FAILED_PENALTY, Strategy, one_thread, violation

# Temperatures a proposal is drawn at, in turn, while the draws repeat earlier proposals.
TEMPERATURES = (1.0, 2.0, 4.0, 1e9)


class RLStrategy(Strategy):
    batch = 5            # children per policy update
    lr = 0.03            # Adam learning rate
    epochs = 4           # passes over the proposals after each batch
    clip = 0.2           # PPO ratio clipping
    copy_init = 4.0      # starting copy strength: P(a knob keeps the parent's choice) ~ 0.93 at 5 choices
    tries = 25           # draws per temperature before the next

    def _setup(self) -> None:
        import torch

        self._sizes = [len(v.choices) for v in self.space.variables()]
        self._offsets = np.cumsum([0, *self._sizes])
        width = int(self._offsets[-1])
        self._A = torch.zeros((width, self.n_obj), dtype=torch.float64, requires_grad=True)
        self._b = torch.zeros(width, dtype=torch.float64, requires_grad=True)
        self._s = torch.full((len(self._sizes),), self.copy_init, dtype=torch.float64, requires_grad=True)
        self._knob = torch.as_tensor(np.repeat(np.arange(len(self._sizes)), self._sizes))
        self._optimizer = torch.optim.Adam([self._A, self._b, self._s], lr=self.lr)
        self._n_start = int(np.clip(self.budget // 10, 10, 40))
        self._queue: list[str] = []   # parents still to be used this turn over the front
        # proposed, not told yet: key -> (parent's ranks, parent one-hot, log-probability drawn at)
        self._pending: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        self._memory: list[tuple[str, np.ndarray, np.ndarray, float]] = []  # told children, in order

    # -- the archive in rank space -----------------------------------------------------
    def _evaluated(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Keys, objective values and violations of the told architectures that did not fail."""
        rows = [(k, f, violation(g[None])[0]) for k, (_, f, g) in self.archive.items()
                if np.all(f < FAILED_PENALTY)]
        keys = [k for k, _, _ in rows]
        return (keys, np.array([f for _, f, _ in rows]).reshape(-1, self.n_obj),
                np.array([v for _, _, v in rows]))

    @staticmethod
    def _ranks(F: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Per objective, the share of `ref` strictly better than each row of F."""
        return np.column_stack([np.searchsorted(np.sort(ref[:, i]), F[:, i]) for i in range(F.shape[1])]) / len(ref)

    def _logits(self, X, P):
        """Logits over every knob's choices for parents P (one-hot rows) at positions X."""
        return P * self._s[self._knob] + self._b + X @ self._A.T

    # -- ask ---------------------------------------------------------------------------
    @one_thread
    def _ask(self, n: int) -> list[dict]:
        import torch

        m = min(n, self.batch)
        keys, F, v = self._evaluated()
        if len(self.proposed) < self._n_start or not keys:
            return self._uniform(m)
        R = self._ranks(F, F)
        feasible = v == 0
        if feasible.any():
            front = np.flatnonzero(feasible)[pareto_mask(R[feasible])]
        else:
            front = np.flatnonzero(v == v.min())
        members = {keys[i]: i for i in front}
        out: list[dict] = []
        for _ in range(m):
            self._queue = [k for k in self._queue if k in members]
            if not self._queue:
                self._queue = [keys[i] for i in self.rng.permutation(front)]
            i = members[self._queue.pop()]
            x = R[i]
            p = np.zeros(int(self._offsets[-1]))
            p[self._offsets[:-1] + self.space.to_indices(self.archive[keys[i]][0])] = 1
            with torch.no_grad():
                logits = self._logits(torch.as_tensor(x[None]), torch.as_tensor(p[None])).numpy()[0]
            parts = np.split(logits, self._offsets[1:-1])
            for t in TEMPERATURES:
                probs = [np.exp((z - z.max()) / t) / np.exp((z - z.max()) / t).sum() for z in parts]
                arch = self.fresh(lambda: self.space.from_indices([self.rng.choice(len(q), p=q) for q in probs]),
                                  tries=self.tries)
                if arch is not None:
                    idx = self.space.to_indices(arch)
                    self._pending[arch_key(arch)] = (x, p, float(sum(np.log(q[j]) for q, j in zip(probs, idx))))
                    out.append(arch)
                    break
        return out or self._uniform(m)

    def _uniform(self, m: int) -> list[dict]:
        out = []
        while len(out) < m and (arch := self.fresh(lambda: self.space.sample(self.rng))) is not None:
            out.append(arch)
        return out

    # -- tell --------------------------------------------------------------------------
    @one_thread
    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        import torch

        told = [k for k in map(arch_key, archs) if k in self._pending]
        if not told:
            return
        self._memory += [(k, *self._pending.pop(k)) for k in told]
        keys = [k for k, *_ in self._memory]
        reward = self._rewards(keys)
        advantage = reward - reward.mean()
        if advantage.std() > 0:
            advantage /= advantage.std()
        advantage = torch.as_tensor(advantage)
        X = torch.as_tensor(np.array([x for _, x, _, _ in self._memory]))
        P = torch.as_tensor(np.array([p for _, _, p, _ in self._memory]))
        drawn = torch.as_tensor(np.array([lp for *_, lp in self._memory]))
        idx = torch.as_tensor(np.array([self.space.to_indices(self.archive[k][0]) for k in keys]))
        rows = torch.arange(len(keys))
        for _ in range(self.epochs):
            log_prob = torch.zeros(len(keys), dtype=torch.float64)
            for k, logits in enumerate(torch.tensor_split(self._logits(X, P), self._offsets[1:-1].tolist(), dim=1)):
                log_prob = log_prob + torch.log_softmax(logits, dim=1)[rows, idx[:, k]]
            ratio = torch.exp(log_prob - drawn)
            gain = torch.minimum(ratio * advantage, ratio.clamp(1 - self.clip, 1 + self.clip) * advantage)
            self._optimizer.zero_grad()
            (-gain.mean()).backward()
            self._optimizer.step()

    def _rewards(self, children: list[str]) -> np.ndarray:
        """Per child: minus the largest margin by which another feasible evaluated architecture
        beats it in every objective's rank; -1 - violation where infeasible, -2 - violation
        where it failed."""
        keys, F, v = self._evaluated()
        where = {k: i for i, k in enumerate(keys)}
        reward = np.empty(len(children))
        ok = np.array([k in where for k in children])
        G = np.array([self.archive[k][2] for k in children]).reshape(len(children), -1)
        reward[~ok] = -2.0 - violation(G[~ok])
        if ok.any():
            rows = np.array([where[k] for k in np.array(children)[ok]])
            R = self._ranks(F, F) if len(F) else np.zeros((0, self.n_obj))
            ref = np.flatnonzero(v == 0)
            if len(ref):
                margin = (R[rows][:, None, :] - R[ref][None]).min(axis=2)   # > 0: that one beats it everywhere
                margin[rows[:, None] == ref[None]] = -np.inf                  # not against itself
                stand_out = -margin.max(axis=1)
                stand_out[~np.isfinite(stand_out)] = 0.0                      # the only feasible one
            else:
                stand_out = np.zeros(len(rows))
            reward[ok] = np.where(v[rows] > 0, -1.0 - v[rows], stand_out)
        return reward
