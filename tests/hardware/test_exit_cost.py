import pytest

from nasctl.hardware.base import CostModel, LayerCost, expected_cost
from nasctl.hardware.layers import LayerSpec


class PerLayerTable(CostModel):
    """Prices each layer by its name: latency in ms and energy in mJ."""

    name = "table"

    def __init__(self, table):
        self.table = table

    def _layer_cost(self, layer):
        if layer.name not in self.table:
            return None
        lat, en = self.table[layer.name]
        return LayerCost(lat, en)


def _layer(name, segment, role="backbone", op="conv"):
    return LayerSpec(op, 8, 8, (4, 4), (4, 4), segment=segment, role=role, name=name)


def test_hand_worked_two_exit_network():
    # backbone A (seg 0) | exit head E1 (seg 0) | backbone B (seg 1) | final head F (seg 1)
    layers = [_layer("A", 0), _layer("E1", 0, "exit"), _layer("B", 1), _layer("F", 1)]
    table = {"A": (1.0, 10.0), "E1": (0.5, 2.0), "B": (3.0, 30.0), "F": (0.25, 1.0)}
    report = PerLayerTable(table).estimate(layers)
    lat, en = report.exit_path_costs()
    # Exit 1 pays A + E1; the final exit pays A + E1 (passed on the way) + B + F.
    assert lat == [1.5, 4.75]
    assert en == [12.0, 43.0]
    # 60 % of inputs leave at exit 1.
    t = expected_cost(lat, [0.6, 0.4])
    e = expected_cost(en, [0.6, 0.4])
    assert t == pytest.approx(0.6 * 1.5 + 0.4 * 4.75)  # 2.8 ms
    assert e == pytest.approx(0.6 * 12.0 + 0.4 * 43.0)  # 24.4 mJ
    assert t * e == pytest.approx(2.8 * 24.4)
    # The same network with no exit taken pays everything.
    assert expected_cost(lat, [0.0, 1.0]) == pytest.approx(report.latency_ms)


def test_unsupported_ops_are_counted_not_dropped():
    layers = [_layer("A", 0), _layer("X", 0, op="pool"), _layer("Y", 0, op="pool")]
    report = PerLayerTable({"A": (1.0, 1.0)}).estimate(layers)
    assert report.unsupported == {"pool": 2}


def test_rates_must_match_exits():
    with pytest.raises(ValueError):
        expected_cost([1.0, 2.0], [1.0])
