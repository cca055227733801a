"""Random search: the baseline every strategy must beat."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch
from .base import Strategy

# Spaces of at most this many architectures are drawn as a shuffled list of all of them
# (each proposed once, none left out); larger ones by repeated uniform draws.
ENUMERATED = 1_000_000


class RandomStrategy(Strategy):
    """Uniform samples of the space, none proposed twice."""

    def _setup(self) -> None:
        size = self.space.size()
        self._order = self.rng.permutation(size) if size <= ENUMERATED else None
        self._next = 0

    def _ask(self, n: int) -> list[dict]:
        if self._order is not None:  # the next `n` of the shuffled list
            codes = self._order[self._next:self._next + n]
            self._next += len(codes)
            sizes = [len(v.choices) for v in self.space.variables()]
            return [self.space.from_indices(idx) for idx in zip(*np.unravel_index(codes, sizes))]
        out = []
        while len(out) < n and (arch := self.fresh(lambda: self.space.sample(self.rng))) is not None:
            out.append(arch)
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        pass
