"""The predictor API: fit, predict, save and load, encodings, errors."""

import numpy as np
import pytest
import yaml

from nasctl.errors import ConfigError, UsageError
from nasctl.predictors import PREDICTORS, load_predictor, make_predictor
from nasctl.predictors.encodings import cell_graph
from nasctl.predictors.zero_cost import PROXIES, scores
from nasctl.predictors.metrics import kendall_tau, spearman, top_precision
from nasctl.spaces.loader import load_space


def test_registry_lists_every_model_kind():
    assert PREDICTORS.names() == ["gbt", "gcn", "gp", "mlp", "ridge"]


@pytest.mark.parametrize("encoding", ["onehot", "ordinal", "adjacency", "path", "wl"])
def test_ridge_learns_a_linear_target(nb201, encoding, toy_data):
    archs, y = toy_data(nb201, 200)
    p = make_predictor("ridge", nb201, encoding=encoding).fit(archs[:150], y[:150])
    mean, std = p.predict(archs[150:])
    assert mean.shape == (50,) and std is None
    assert spearman(y[150:], mean) > (0.95 if encoding in ("onehot", "adjacency") else 0.2)  # a one-hot-linear target


def test_save_load_predicts_identically_and_checks_the_space(nb201, mbv2, tmp_path, toy_data):
    archs, y = toy_data(nb201, 60)
    p = make_predictor("ridge", nb201, seed=3).fit(archs, y)
    card = yaml.safe_load(p.save(tmp_path / "p", {"target": ["acc"]}).read_text())
    assert card["model"] == "ridge" and card["space"] == "nb201" and card["format"] == 1
    assert card["encoding"] == "wl" and "numpy" in card["versions"] and card["target"] == ["acc"]
    q = load_predictor(tmp_path / "p")
    assert np.array_equal(q.predict(archs)[0], p.predict(archs)[0])
    with pytest.raises(UsageError, match="trained for space 'nb201', not 'ee-mbv2'"):
        load_predictor(tmp_path / "p", space=mbv2)


def test_loading_refuses_a_newer_format_and_changed_weights(nb201, tmp_path, toy_data):
    archs, y = toy_data(nb201, 30)
    make_predictor("ridge", nb201).fit(archs, y).save(tmp_path / "p")
    card_path = tmp_path / "p" / "card.yaml"
    card = yaml.safe_load(card_path.read_text())
    card_path.write_text(yaml.safe_dump({**card, "format": 99}))
    with pytest.raises(ConfigError, match="format 99 was written by a newer nasctl"):
        load_predictor(tmp_path / "p")
    card_path.write_text(yaml.safe_dump(card))
    (tmp_path / "p" / "model.json").write_text("{}")
    with pytest.raises(ConfigError, match="changed since the predictor was saved"):
        load_predictor(tmp_path / "p")


def test_multi_target_fits_and_predicts_every_column(mbv2, toy_data):
    archs, Y = toy_data(mbv2, 80, targets=3)
    mean, std = make_predictor("ridge", mbv2).fit(archs[:60], Y[:60]).predict(archs[60:])
    assert mean.shape == (20, 3)
    assert all(spearman(Y[60:, t], mean[:, t]) > 0.9 for t in range(3))


def test_bad_inputs_are_one_line_usage_errors(nb201, mbv2, toy_data):
    archs, y = toy_data(nb201, 10)
    with pytest.raises(UsageError, match="needs at least 5 training rows; got 3"):
        make_predictor("ridge", nb201).fit(archs[:3], y[:3])
    with pytest.raises(UsageError, match="empty or non-numeric"):
        make_predictor("ridge", nb201).fit(archs, np.where(np.arange(10) == 2, np.nan, y))
    with pytest.raises(UsageError, match="encoding 'path' is not available .* allowed: onehot, ordinal"):
        make_predictor("ridge", mbv2, encoding="path")
    with pytest.raises(UsageError, match="unknown predictor model 'forest'"):
        make_predictor("forest", nb201)
    with pytest.raises(UsageError, match="has no setting depth"):
        make_predictor("ridge", nb201, depth=3)


def test_cell_encodings_of_nb201(nb201):
    cell = cell_graph(nb201)
    arch = nb201.parse_arch("|nor_conv_3x3~0|+|none~0|skip_connect~1|+|avg_pool_3x3~0|none~1|nor_conv_1x1~2|")
    path = cell.path(arch)
    assert path.shape == (84,) and path.sum() == 2  # 0→3 (pool) and 0→1→2→3 (conv3, skip, conv1)
    adjacency, labels = cell.graph(arch)
    assert adjacency.shape == (8, 8) and labels.tolist() == [0, 4, -1, 2, 5, -1, 3, 1]
    assert adjacency[0, 1] == 1 and adjacency[1, 3] == 1 and adjacency[3, 6] == 1 and adjacency[6, 7] == 1
    assert adjacency[:, 2].sum() == 0 and adjacency[5].sum() == 0  # `none` edges connect nothing
    assert cell_graph(load_space("ee-mbv2")) is None


def test_wl_features_see_the_function_a_cell_computes(nb201):
    """Ops that feed only `none` edges are dead: a cell encodes as the cell without them."""
    cell = cell_graph(nb201)
    pool = nb201.parse_arch("|none~0|+|none~0|none~1|+|avg_pool_3x3~0|none~1|none~2|")
    dead_conv = nb201.parse_arch("|nor_conv_3x3~0|+|none~0|none~1|+|avg_pool_3x3~0|none~1|none~2|")
    live_conv = nb201.parse_arch("|nor_conv_3x3~0|+|none~0|none~1|+|avg_pool_3x3~0|nor_conv_3x3~1|none~2|")
    wl = [cell.wl(a) for a in (pool, dead_conv, live_conv)]
    assert wl[0].shape == (254,) and wl[0].sum() == 6  # input, pool, output; each with its neighbours
    assert np.array_equal(wl[0], wl[1]) and wl[2].sum() == 10 and not np.array_equal(wl[0], wl[2])
    assert sorted(cell.wl_labels(pool)) == [(0,), (0, (), (5,)), (1,), (1, (5,), ()), (5,), (5, (0,), (1,))]
    degenerate = nb201.parse_arch("|nor_conv_3x3~0|+|none~0|none~1|+|none~0|none~1|none~2|")
    assert not cell.wl(degenerate).any()


def test_metrics():
    y = np.arange(20.0)
    assert kendall_tau(y, y) == pytest.approx(1) and spearman(y, -y) == pytest.approx(-1)
    assert top_precision(y, y) == 1 and top_precision(y, -y) == 0


def test_zero_cost_proxies_are_features_that_survive_save_and_load(mbv2, tmp_path, toy_data):
    archs, y = toy_data(mbv2, 6)
    with pytest.raises(UsageError, match="need the input shape and class count"):
        make_predictor("ridge", mbv2, zero_cost=["synflow"])
    with pytest.raises(UsageError, match="unknown zero-cost proxy 'snip'"):
        make_predictor("ridge", mbv2, zero_cost=["snip"], input_shape=(1, 8, 8), classes=10)
    proxies = scores(mbv2, archs[:1], PROXIES, (1, 8, 8), 10, seed=0)
    assert proxies.shape == (1, 3) and np.isfinite(proxies).all()
    p = make_predictor("ridge", mbv2, zero_cost=["naswot"], input_shape=(1, 8, 8), classes=10).fit(archs[:5], y[:5])
    p.save(tmp_path / "zc")
    assert np.array_equal(load_predictor(tmp_path / "zc").predict(archs[5:])[0], p.predict(archs[5:])[0])


def test_rank_target_map_round_trips_and_extends_beyond_the_training_range():
    from nasctl.predictors.base import TargetMap

    Y = np.array([[1.0, 5.0], [2.0, 5.0], [4.0, 7.0], [10.0, 9.0]])
    for kind in ("rank", "standard"):
        m = TargetMap.fit(kind, Y)
        assert np.allclose(m.inverse(m.forward(Y)), Y)
        z = m.forward(Y)
        beyond = m.inverse(np.array([[z[:, 0].max() + 1, z[:, 1].max() + 1], [z[:, 0].min() - 1, z[:, 1].min() - 1]]))
        assert (beyond[0] > Y.max(axis=0)).all() and (beyond[1] < Y.min(axis=0)).all()


def test_synflow_stays_finite_where_the_score_passes_float32s_range(nb201):
    # A deep NB201 cell: with positive weights its output reaches ~1e42, beyond float32.
    arch = nb201.parse_arch("|nor_conv_1x1~0|+|none~0|nor_conv_3x3~1|+|skip_connect~0|none~1|nor_conv_3x3~2|")
    score = scores(nb201, [arch], ["synflow"], (3, 32, 32), 10, seed=0)[0, 0]
    assert np.isfinite(score) and score > np.log(np.finfo(np.float32).max)
