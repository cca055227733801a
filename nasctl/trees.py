"""Gradient-boosted regression trees kept as plain arrays and predicted with numpy.

`export` turns a fitted scikit-learn `GradientBoostingRegressor` into JSON-ready data -
its initial value, learning rate and every tree's children, split features, thresholds
and leaf values - and `Ensemble` predicts from that data without scikit-learn: saved
models are JSON (`pack`: each field as base64 binary), never pickles, and load in
milliseconds."""

from __future__ import annotations

import base64

import numpy as np

def export(model) -> dict:
    """The data of a fitted GradientBoostingRegressor (one output)."""
    trees = [{"left": e.tree_.children_left.tolist(), "right": e.tree_.children_right.tolist(),
              "feature": e.tree_.feature.tolist(), "threshold": e.tree_.threshold.tolist(),
              "value": e.tree_.value[:, 0, 0].tolist()} for e in model.estimators_[:, 0]]
    return {"init": float(np.ravel(model.init_.constant_)[0]), "learning_rate": float(model.learning_rate),
            "trees": trees}


def fit_lad(X: np.ndarray, y: np.ndarray, *, n_estimators: int, learning_rate: float, max_depth: int,
            min_samples_leaf: int, seed: int = 0) -> dict:
    """`export`'s data of GradientBoostingRegressor(loss="absolute_error", ...) fitted to
    X, y - the same trees, split for split and leaf for leaf (tested) - in a third of the
    time on the few hundred rows of most kernel types (four fifths on 2,900 rows of dense
    convs).  scikit-learn sets each leaf to the median of its rows' residuals in a Python
    call per leaf (70% of a device's fit); here the leaves of a tree are set together,
    from one sort of the residuals by leaf.
    Each tree is scikit-learn's regression tree on the signs of the residuals, drawing from
    one random state seeded by `seed`, as the ensemble draws.  The trees are grown without
    scikit-learn's checks of parameters and weights (unit weights are its default), which
    took a third of the time: the inputs are this function's own."""
    from sklearn import config_context
    from sklearn.tree import DecisionTreeRegressor

    X, y = np.asarray(X, dtype=np.float32), np.asarray(y, dtype=float)
    n = len(y)
    init = float(np.percentile(y, 50))
    raw = np.full(n, init)
    random_state = np.random.RandomState(seed)
    trees = []
    with config_context(skip_parameter_validation=True):
        for _ in range(n_estimators):
            sign = np.where(raw > y, -1.0, 1.0)  # the negative gradient of |y - raw|
            tree = DecisionTreeRegressor(criterion="squared_error", max_depth=max_depth,
                                         min_samples_leaf=min_samples_leaf, random_state=random_state)
            tree.fit(X, sign, check_input=False)
            t = tree.tree_
            leaf = t.apply(X)
            residual = y - raw
            order = np.lexsort((residual, leaf))
            by_leaf = leaf[order]
            starts = np.flatnonzero(np.r_[True, by_leaf[1:] != by_leaf[:-1]])
            counts = np.diff(np.r_[starts, n])
            value = t.value[:, 0, 0].copy()
            # the weighted median scikit-learn takes: of an even count, the lower middle
            value[by_leaf[starts]] = residual[order][starts + (counts + 1) // 2 - 1]
            raw += learning_rate * value[leaf]
            trees.append({"left": t.children_left.tolist(), "right": t.children_right.tolist(),
                          "feature": t.feature.tolist(), "threshold": t.threshold.tolist(), "value": value.tolist()})
    return {"init": init, "learning_rate": float(learning_rate), "trees": trees}


def average(models: list[dict]) -> dict:
    """One model of `export`'s data predicting the mean of several of one learning rate:
    their initial values averaged, every tree kept, the learning rate divided by their
    number."""
    rates = {m["learning_rate"] for m in models}
    if len(rates) != 1:
        raise ValueError(f"models of learning rates {sorted(rates)} cannot be averaged as one")
    return {"init": float(np.mean([m["init"] for m in models])), "learning_rate": rates.pop() / len(models),
            "trees": [tree for m in models for tree in m["trees"]]}


# The fields of a tree, as packed (`pack`): little-endian binary, base64 in JSON.
_PACKED = {"left": "<i4", "right": "<i4", "feature": "<i4", "threshold": "<f8", "value": "<f8"}


def pack(data: dict) -> dict:
    """`export`'s data with each field of all its trees as one base64 string of
    little-endian binary and the trees' node counts: the same model, read back exactly and
    about seven times faster than lists of numbers (the 18 boosted types of a profile,
    parsed and built: 0.075 s against 0.50 s; a device's regressors are read each time
    `nasctl predict` runs)."""
    trees = data["trees"]
    out = {k: v for k, v in data.items() if k != "trees"}
    out["sizes"] = [len(tree["left"]) for tree in trees]
    for field, dtype in _PACKED.items():
        values = np.concatenate([np.asarray(tree[field], dtype=dtype) for tree in trees]) if trees else \
            np.zeros(0, dtype=dtype)
        out[field] = base64.b64encode(values.tobytes()).decode("ascii")
    return out


class Ensemble:
    """Predictions of exported trees: init + learning rate x the sum of the leaf values.
    The trees are held as one set of flat arrays and walked together, a level at a time.
    `data` is `export`'s or `pack`'s."""

    def __init__(self, data: dict):
        self.init, self.rate = data["init"], data["learning_rate"]
        if "sizes" in data:  # packed
            sizes = list(data["sizes"])

            def flat(field: str, dtype) -> np.ndarray:
                return np.frombuffer(base64.b64decode(data[field]), dtype=_PACKED[field]).astype(dtype)
        else:
            trees = data["trees"]
            sizes = [len(tree["left"]) for tree in trees]

            def flat(field: str, dtype) -> np.ndarray:
                return np.concatenate([np.asarray(tree[field], dtype=dtype) for tree in trees])

        self.roots = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
        offset = np.repeat(self.roots, sizes)  # child indices of each tree, into the flat arrays
        left, right = flat("left", np.int64), flat("right", np.int64)
        self.left, self.right = np.where(left >= 0, left + offset, -1), np.where(right >= 0, right + offset, -1)
        self.feature, self.threshold, self.value = flat("feature", np.int64), flat("threshold", float), \
            flat("value", float)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """A feature <= threshold goes left, as in scikit-learn, on float32 features as it
        splits them."""
        X32 = np.asarray(X).astype(np.float32)
        rows = np.arange(len(X32))[None, :]
        node = np.repeat(self.roots[:, None], len(X32), axis=1)  # trees x rows
        while True:
            left = self.left[node]
            inner = left >= 0
            if not inner.any():
                return self.init + self.rate * self.value[node].sum(axis=0)
            feature = np.where(inner, self.feature[node], 0)
            go_left = X32[rows, feature] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, left, self.right[node]), node)
