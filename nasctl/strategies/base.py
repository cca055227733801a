"""The ask/tell contract every strategy follows, and helpers strategies share."""

from __future__ import annotations

import functools
import sys
from abc import ABC, abstractmethod
from typing import Callable, Sequence

import numpy as np

from ..objectives import pareto_mask
from ..spaces.base import Arch, SearchSpace, arch_key

# How many draws a strategy spends looking for an architecture it has not proposed yet.
FRESH_TRIES = 100
# Objective values a strategy is told for a candidate that failed or could not be priced
# (nasctl.loop): worse than any real value.
FAILED_PENALTY = 1e12


class Strategy(ABC):
    """Proposes architectures; never evaluates them.

    `tell` receives, per architecture, its objective values in minimisation form
    (F, shape n x n_obj) and its constraint values (G, shape n x n_constr, feasible
    where every entry <= 0).  `ask(n)` returns at most `n` architectures: the
    strategy's natural batch (a generation, a few Bayesian proposals), each a valid
    choice for every knob, none proposed before where the strategy can avoid it.
    With `pool` set (a surrogate screens the proposals), strategies that otherwise
    propose one architecture at a time return as many as asked for, drawn from the
    same state of their model.  Subclasses implement `_setup`, `_ask` and `_tell`.
    """

    def setup(self, space: SearchSpace, n_obj: int, n_constr: int, *, seed: int, budget: int,
              pool: bool = False) -> None:
        self.space = space
        self.pool = pool
        self.n_obj = n_obj
        self.n_constr = n_constr
        self.seed = seed
        self.budget = budget
        self.rng = np.random.default_rng(seed)
        self.proposed: set[str] = set()
        # every told result: key -> (architecture, objective values, constraint values)
        self.archive: dict[str, tuple[dict, np.ndarray, np.ndarray]] = {}
        self._setup()

    def _setup(self) -> None:
        """Strategy-specific set-up, after the common attributes are set."""

    def ask(self, n: int) -> list[dict]:
        """Up to `n` architectures to evaluate next (none once the strategy has nothing new)."""
        if n < 1:
            return []
        archs = self._ask(n)
        assert len(archs) <= n, f"{type(self).__name__} proposed {len(archs)} architectures, asked for {n}"
        self.proposed.update(arch_key(a) for a in archs)
        return archs

    def tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        """Results of evaluated architectures."""
        F = np.asarray(F, dtype=float).reshape(len(archs), self.n_obj)
        G = np.asarray(G, dtype=float).reshape(len(archs), self.n_constr)
        for arch, f, g in zip(archs, F, G):
            self.archive[arch_key(arch)] = (dict(arch), f, g)
        self._tell(archs, F, G)

    @abstractmethod
    def _ask(self, n: int) -> list[dict]: ...

    @abstractmethod
    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None: ...

    # -- helpers ---------------------------------------------------------------------
    def fresh(self, draw: Callable[[], dict], tries: int = FRESH_TRIES) -> dict | None:
        """The first of up to `tries` draws not proposed before (it then counts as
        proposed), or None."""
        for _ in range(tries):
            arch = draw()
            key = arch_key(arch)
            if key not in self.proposed:
                self.proposed.add(key)
                return arch
        return None

    def front(self) -> list[dict]:
        """The told architectures no other dominates under constrained domination:
        the non-dominated feasible ones, or, while none is feasible, those of least
        total violation."""
        if not self.archive:
            return []
        archs, F, G = zip(*self.archive.values())
        F, v = np.array(F), violation(np.array(G))
        keep = v == v.min()
        idx = np.flatnonzero(keep)[pareto_mask(F[keep])] if v.min() == 0 else np.flatnonzero(keep)
        return [archs[i] for i in idx]


def violation(G: np.ndarray) -> np.ndarray:
    """Total constraint violation per row of G (0 where feasible)."""
    G = np.asarray(G, dtype=float)
    return np.clip(G, 0, None).sum(axis=1) if G.size else np.zeros(len(G))


def ordered_knobs(space: SearchSpace) -> np.ndarray:
    """Per knob: True where every choice is a number, so the order of the choices means
    something (depths, widths, bit-widths); False for unordered choices such as op names."""
    return np.array([all(isinstance(c, (int, float)) for c in v.choices) for v in space.variables()])


def one_thread(method):
    """Run a strategy method with one thread in each native thread pool (OpenMP, BLAS, and
    torch's own intra-op pool where torch is loaded).  Strategies that compute with torch on
    tiny tensors (the GP sampler, the RL policy) otherwise run many times slower wherever
    the cores are busy: the pools' threads spin against each other and against other work."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        from threadpoolctl import threadpool_limits

        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch else None
        if torch:
            torch.set_num_threads(1)
        try:
            with threadpool_limits(1):
                return method(*args, **kwargs)
        finally:
            if torch:
                torch.set_num_threads(threads)

    return wrapper
