"""Random search: the baseline every strategy must beat."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spaces.base import Arch
from .base import Strategy


class RandomStrategy(Strategy):
    def ask(self, n: int) -> list[dict]:
        return [self.space.sample(self.rng) for _ in range(n)]

    def tell(self, archs: Sequence[Arch], F: np.ndarray, G: np.ndarray) -> None:
        pass
