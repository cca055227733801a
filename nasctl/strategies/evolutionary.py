"""Evolutionary strategies from pymoo (NSGA-II, NSGA-III, AGE-MOEA), driven through its
ask/tell interface.

Each knob is searched as the index of its choice: integer sampling, then simulated
binary crossover and polynomial mutation followed by rounding repair, so every
proposal is a valid choice for every knob.  (On NAS-Bench-201, whose op knobs are
unordered names, this did as well as uniform crossover with random-reset mutation:
see benchmarks/README.md.)  Offspring that repeat an architecture proposed before are
dropped and bred again, so every generation is new.
"""

from __future__ import annotations

import importlib.util
from abc import abstractmethod
from math import comb
from typing import Sequence

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.algorithms.moo.nsga3 import NSGA3
from pymoo.config import Config
from pymoo.core.duplicate import DefaultDuplicateElimination
from pymoo.core.evaluator import Evaluator
from pymoo.core.problem import Problem
from pymoo.core.termination import NoTermination
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.operators.sampling.rnd import IntegerRandomSampling
from pymoo.problems.static import StaticProblem
from pymoo.util.ref_dirs import get_reference_directions

from ..errors import UsageError
from ..spaces.base import Arch, arch_key
from .base import Strategy

Config.warnings["not_compiled"] = False


class _PymooStrategy(Strategy):
    """A pymoo genetic algorithm; subclasses name it in `_algorithm`.

    Population: budget // 20, clamped to [10, 40]: many short generations find a front
    in fewer evaluations than a few long ones."""

    @abstractmethod
    def _algorithm(self, pop_size: int, **operators):
        """The pymoo algorithm with these operators."""

    def _setup(self) -> None:
        upper = np.array([len(v.choices) - 1 for v in self.space.variables()], dtype=float)
        self._problem = Problem(n_var=len(upper), n_obj=self.n_obj, n_ieq_constr=self.n_constr,
                                xl=np.zeros(len(upper)), xu=upper, vtype=int)
        self.pop_size = int(np.clip(self.budget // 20, 10, 40))
        self._algorithm_ = self._algorithm(
            self.pop_size,
            sampling=IntegerRandomSampling(),
            crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
            mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
            eliminate_duplicates=Unproposed(self),
        )
        self._algorithm_.setup(self._problem, termination=NoTermination(), seed=self.seed)
        self._pending = None      # the pymoo population being evaluated
        self._queue: list[dict] = []

    def _ask(self, n: int) -> list[dict]:
        if not self._queue and self._pending is None:
            pop = self._algorithm_.ask()
            if pop is None or not len(pop):
                return []
            self._pending = pop
            self._queue = [self.space.from_indices(x) for x in pop.get("X")]
        out, self._queue = self._queue[:n], self._queue[n:]
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        if self._pending is None or self._queue:
            return
        keys = [arch_key(self.space.from_indices(x)) for x in self._pending.get("X")]
        if not all(k in self.archive for k in keys):
            return
        F_all = np.array([self.archive[k][1] for k in keys])
        G_all = np.array([self.archive[k][2] for k in keys]).reshape(len(keys), self.n_constr)
        kwargs = {"F": F_all, "G": G_all} if self.n_constr else {"F": F_all}
        Evaluator().eval(StaticProblem(self._problem, **kwargs), self._pending)
        self._algorithm_.tell(infills=self._pending)
        self._pending = None


class NSGA2Strategy(_PymooStrategy):
    """NSGA-II: non-dominated sorting with crowding distance."""

    def _algorithm(self, pop_size: int, **operators):
        return NSGA2(pop_size=pop_size, **operators)


class NSGA3Strategy(_PymooStrategy):
    """NSGA-III: non-dominated sorting with Das-Dennis reference directions, as many as
    fit in the population."""

    def _algorithm(self, pop_size: int, **operators):
        m, partitions = self.n_obj, 1
        while comb(partitions + m, m - 1) <= pop_size:  # directions with one more partition
            partitions += 1
        ref_dirs = get_reference_directions("das-dennis", m, n_partitions=partitions)
        return NSGA3(ref_dirs=ref_dirs, pop_size=max(pop_size, len(ref_dirs)), **operators)


class AGEMOEAStrategy(_PymooStrategy):
    """AGE-MOEA: survival by the front's estimated geometry (convex, linear, concave)."""

    def _algorithm(self, pop_size: int, **operators):
        if importlib.util.find_spec("numba") is None:  # pymoo compiles AGE-MOEA's survival with numba
            raise UsageError("strategy 'agemoea' needs numba; install it with: pip install 'nasctl[agemoea]'")
        from pymoo.algorithms.moo.age import AGEMOEA

        return AGEMOEA(pop_size=pop_size, **operators)


class Unproposed(DefaultDuplicateElimination):
    """pymoo's duplicate elimination that also drops what the strategy proposed before."""

    def __init__(self, strategy: Strategy):
        super().__init__()
        self.strategy = strategy

    def _do(self, pop, other, is_duplicate):
        if other is None:
            space, proposed = self.strategy.space, self.strategy.proposed
            is_duplicate |= np.array([arch_key(space.from_indices(x)) in proposed for x in pop.get("X")],
                                     dtype=bool)
        return super()._do(pop, other, is_duplicate)
