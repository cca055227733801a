import numpy as np
import pytest

from nasctl.predictors.encodings import encode
from nasctl.spaces.loader import load_space


def _toy_data(space, n, seed=0, targets=1):
    """Architectures and a smooth synthetic target of their one-hot encoding."""
    rng = np.random.default_rng(seed)
    archs = [space.sample(rng) for _ in range(n)]
    X = encode(space, archs, "onehot")
    W = np.random.default_rng(99).normal(size=(X.shape[1], targets))
    Y = X @ W + 0.05 * rng.normal(size=(n, targets))
    return archs, (Y[:, 0] if targets == 1 else Y)


@pytest.fixture(scope="session")
def toy_data():
    return _toy_data


@pytest.fixture(scope="session")
def nb201():
    return load_space("nb201")


@pytest.fixture(scope="session")
def mbv2():
    return load_space("ee-mbv2")
