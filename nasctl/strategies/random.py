"""Random search: the baseline every strategy must beat."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch
from .base import Strategy


class RandomStrategy(Strategy):
    """Uniform samples of the space, none proposed twice."""

    def _ask(self, n: int) -> list[dict]:
        out = []
        while len(out) < n and (arch := self.fresh(lambda: self.space.sample(self.rng))) is not None:
            out.append(arch)
        return out

    def _tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        pass
