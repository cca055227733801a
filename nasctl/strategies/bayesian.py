"""Bayesian strategies from optuna: multi-objective TPE and Gaussian-process samplers.

An in-memory optuna study holds the search: each proposal is `study.ask` with the
space's knobs as fixed distributions (unordered knobs as categorical choices, ordered
ones as the integer index of their choice), each result `study.tell` with its
objective values, its constraint values set on the trial first (the samplers read
them: feasible where every value <= 0).  Where the sampler proposes an architecture
proposed before, that trial is told as failed (the samplers skip failed trials) and
a new neighbour of it (the space's `mutate`), else a new random architecture, is
enqueued and asked instead.  One proposal per ask; with a surrogate screening them
(`pool`), as many as asked for, each drawn from the sampler's model of the trials
told so far.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Sequence

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from ..spaces.base import Arch, arch_key
from .base import Strategy, one_thread, ordered_knobs


class _OptunaStrategy(Strategy):
    @abstractmethod
    def _sampler(self) -> optuna.samplers.BaseSampler:
        """The optuna sampler, seeded from `self.seed`."""

    def _setup(self) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._ordered = ordered_knobs(self.space)
        self._distributions = {
            v.name: IntDistribution(0, len(v.choices) - 1) if ordered else CategoricalDistribution(v.choices)
            for v, ordered in zip(self.space.variables(), self._ordered)}
        self._study = optuna.create_study(directions=["minimize"] * self.n_obj, sampler=self._sampler())
        self._running: dict[str, optuna.trial.Trial] = {}

    def _arch(self, params: dict) -> dict:
        return {v.name: v.choices[params[v.name]] if ordered else params[v.name]
                for v, ordered in zip(self.space.variables(), self._ordered)}

    def _params(self, arch: Arch) -> dict:
        return {v.name: v.index(arch[v.name]) if ordered else arch[v.name]
                for v, ordered in zip(self.space.variables(), self._ordered)}

    @one_thread
    def _ask(self, n: int) -> list[dict]:
        out = []
        for _ in range(n if self.pool else 1):
            trial = self._study.ask(self._distributions)
            arch = self._arch(trial.params)
            if arch_key(arch) in self.proposed:
                self._study.tell(trial, state=TrialState.FAIL)
                seen = arch
                arch = self.fresh(lambda: self.space.mutate(seen, self.rng)) \
                    or self.fresh(lambda: self.space.sample(self.rng))
                if arch is None:
                    break
                self._study.enqueue_trial(self._params(arch))
                trial = self._study.ask(self._distributions)
            self.proposed.add(arch_key(arch))  # before the next draw of this batch
            self._running[arch_key(arch)] = trial
            out.append(arch)
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        for arch, f, g in zip(archs, F, G):
            trial = self._running.pop(arch_key(arch), None)
            if trial is None:  # told before
                continue
            for i, value in enumerate(g):
                trial.set_constraint(f"constraint_{i}", float(value))
            self._study.tell(trial, [float(v) for v in f])


class TPEStrategy(_OptunaStrategy):
    """optuna's multi-objective TPE, multivariate (one joint density over the knobs: on
    NAS-Bench-201 it beat per-knob densities), 10 random trials first."""

    def _sampler(self):
        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True)


class GPStrategy(_OptunaStrategy):
    """optuna's Gaussian-process sampler (log expected hypervolume improvement, with
    constraints modelled), 10 random trials first."""

    def _sampler(self):
        return optuna.samplers.GPSampler(seed=self.seed)
