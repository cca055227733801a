"""Trainable accuracy predictors: models, encodings, saving and loading, metrics.

    p = make_predictor("gp", space, seed=0).fit(archs, y)
    mean, std = p.predict(archs)            # std is None for models without a spread
    p.save(folder, {"name": ...})
    p = load_predictor("NAME", space=space)  # a workspace name or a folder
"""

from __future__ import annotations

from .kinds import PREDICTORS


def make_predictor(kind: str, space, **options):
    """An unfitted predictor of model `kind` for `space`; options: seed, encoding,
    zero_cost, input_shape, classes, and the model's own settings."""
    return PREDICTORS.get(kind)(space, **options)


def load_predictor(name_or_folder, space=None):
    """A saved predictor from a workspace name or a folder; checks it fits `space`."""
    from .store import load

    return load(str(name_or_folder), space)
