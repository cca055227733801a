"""The ask/tell contract every strategy follows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from ..spaces.base import Arch, SearchSpace


class Strategy(ABC):
    """Proposes architectures; never evaluates them.

    `tell` receives, per architecture, its objective values in minimisation form
    (F, shape n x n_obj) and its constraint values (G, shape n x n_constr, feasible
    where every entry <= 0).
    """

    def setup(self, space: SearchSpace, n_obj: int, n_constr: int, *, seed: int, budget: int) -> None:
        self.space = space
        self.n_obj = n_obj
        self.n_constr = n_constr
        self.seed = seed
        self.budget = budget
        self.rng = np.random.default_rng(seed)
        self._setup()

    def _setup(self) -> None:
        """Strategy-specific set-up, after the common attributes are set."""

    @abstractmethod
    def ask(self, n: int) -> list[dict]:
        """Up to `n` architectures to evaluate next."""

    @abstractmethod
    def tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        """Results of evaluated architectures."""
