import pytest

from nasctl.hardware.base import CostModel, LayerCost, dynamic_efficiency, exit_overhead, expected_cost
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


def test_hand_worked_exit_overhead_and_dynamic_efficiency():
    # backbone A | exit head E1 | backbone B | exit head E2 | backbone C | final head F
    layers = [_layer("A", 0), _layer("E1", 0, "exit"), _layer("B", 1), _layer("E2", 1, "exit"),
              _layer("C", 2), _layer("F", 2)]
    table = {"A": (1.0, 10.0), "E1": (0.5, 2.0), "B": (2.0, 20.0), "E2": (0.5, 4.0), "C": (1.0, 10.0),
             "F": (0.5, 1.0)}
    report = PerLayerTable(table).estimate(layers)
    rates = [0.5, 0.3, 0.2]
    # The static network is A + B + C + F: 4.5 ms, 41 mJ.
    assert report.static_costs() == (pytest.approx(4.5), pytest.approx(41.0))
    # Exit heads paid on the way: exit 1 pays E1 (2), exit 2 and the final exit E1 + E2 (6).
    heads = report.exit_path_costs(roles={"exit"})[1]
    assert heads == [2.0, 6.0, 6.0]
    # 0.5 x 2 + 0.3 x 6 + 0.2 x 6 = 4 mJ of exit heads against 41 mJ static.
    assert exit_overhead(heads, rates, 41.0) == pytest.approx(4 / 41)
    lat, en = report.exit_path_costs()
    assert lat == [1.5, 4.0, 5.5] and en == [12.0, 36.0, 47.0]
    t = expected_cost(lat, rates)   # 0.75 + 1.2 + 1.1 = 3.05 ms
    e = expected_cost(en, rates)    # 6 + 10.8 + 9.4 = 26.2 mJ
    assert (t, e) == (pytest.approx(3.05), pytest.approx(26.2))
    # EDP 3.05 x 26.2 = 79.91 against 4.5 x 41 = 184.5: 1 - 79.91 / 184.5 = 0.5669
    assert dynamic_efficiency(t * e, 4.5 * 41.0) == pytest.approx(1 - 79.91 / 184.5)
    assert dynamic_efficiency(184.5, 184.5) == 0.0
    # Every input to the final classifier: heads cost 6 / 41, EDP grows (negative efficiency).
    assert exit_overhead(heads, [0, 0, 1], 41.0) == pytest.approx(6 / 41)
    assert dynamic_efficiency(5.5 * 47.0, 4.5 * 41.0) < 0
