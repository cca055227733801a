"""Evolutionary strategies from pymoo, driven through its ask/tell interface.

Each knob is searched as the index of its choice: integer sampling, then simulated
binary crossover and polynomial mutation followed by rounding repair, so every
proposal is a valid choice for every knob.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch, arch_key
from .base import Strategy


class NSGA2Strategy(Strategy):
    """pymoo's NSGA-II. Population size: budget // 3, clamped to [4, 40]."""

    def _setup(self) -> None:
        from pymoo.algorithms.moo.nsga2 import NSGA2
        from pymoo.config import Config
        from pymoo.core.problem import Problem
        from pymoo.core.termination import NoTermination
        from pymoo.operators.crossover.sbx import SBX
        from pymoo.operators.mutation.pm import PM
        from pymoo.operators.repair.rounding import RoundingRepair
        from pymoo.operators.sampling.rnd import IntegerRandomSampling

        Config.warnings["not_compiled"] = False
        upper = [len(v.choices) - 1 for v in self.space.variables()]
        self._problem = Problem(n_var=len(upper), n_obj=self.n_obj, n_ieq_constr=self.n_constr,
                                xl=np.zeros(len(upper)), xu=np.array(upper, dtype=float), vtype=int)
        self.pop_size = int(np.clip(self.budget // 3, 4, 40))
        self._algorithm = NSGA2(
            pop_size=self.pop_size,
            sampling=IntegerRandomSampling(),
            crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
            mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
            eliminate_duplicates=True,
            seed=self.seed,
        )
        self._algorithm.setup(self._problem, termination=NoTermination())
        self._pending = None      # the pymoo population being evaluated
        self._queue: list[dict] = []
        self._results: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def ask(self, n: int) -> list[dict]:
        if not self._queue and self._pending is None:
            self._pending = self._algorithm.ask()
            self._queue = [self.space.from_indices(x) for x in self._pending.get("X")]
        out, self._queue = self._queue[:n], self._queue[n:]
        return out

    def tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        from pymoo.core.evaluator import Evaluator
        from pymoo.problems.static import StaticProblem

        for arch, f, g in zip(archs, F, G):
            self._results[arch_key(arch)] = (np.asarray(f, float), np.asarray(g, float))
        if self._pending is None or self._queue:
            return
        keys = [arch_key(self.space.from_indices(x)) for x in self._pending.get("X")]
        if not all(k in self._results for k in keys):
            return
        F_all = np.array([self._results[k][0] for k in keys])
        G_all = np.array([self._results[k][1] for k in keys]).reshape(len(keys), self.n_constr)
        kwargs = {"F": F_all, "G": G_all} if self.n_constr else {"F": F_all}
        Evaluator().eval(StaticProblem(self._problem, **kwargs), self._pending)
        self._algorithm.tell(infills=self._pending)
        self._pending = None
