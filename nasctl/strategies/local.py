"""Local search: mutation hill-climbing on the non-dominated set.

It starts from random architectures; then each round proposes one new neighbour (the
space's `mutate` with one knob changed) of every member of the current front (the
non-dominated feasible architectures, or the least infeasible while none is feasible).  A member none of whose mutants
is new any more is set aside; when the whole front is set aside it samples at random
again.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch, arch_key
from .base import Strategy


class LocalStrategy(Strategy):
    """Random start: budget // 10 architectures, clamped to [10, 40]."""

    def _setup(self) -> None:
        self.n_start = int(np.clip(self.budget // 10, 10, 40))
        self._exhausted: set[str] = set()

    def _ask(self, n: int) -> list[dict]:
        out: list[dict] = []
        if len(self.proposed) >= self.n_start:
            front = [a for a in self.front() if arch_key(a) not in self._exhausted]
            for i in self.rng.permutation(len(front)):
                if len(out) == n:
                    break
                arch = self.fresh(lambda: self.space.mutate(front[i], self.rng, rate=0.0))
                if arch is None:
                    self._exhausted.add(arch_key(front[i]))
                else:
                    out.append(arch)
            if out:
                return out
        while len(out) < min(n, self.n_start) and (arch := self.fresh(lambda: self.space.sample(self.rng))):
            out.append(arch)
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        pass
