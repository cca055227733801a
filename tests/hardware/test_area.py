"""Chip area and co-search choices of analytical accelerators."""

import json

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware.accelerator import AcceleratorSpec, AnalyticalAccelerator
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.loader import load_device

runner = CliRunner()


def small_spec(**changes) -> dict:
    spec = {"name": "small", "kind": "analytical", "cores": 2, "clock_mhz": 100, "mac_array": {"k": 2, "c": 2},
            "macs_per_pe_cycle": {8: 1}, "vector_lanes": 3, "weight_sram_kib": 10, "act_sram_kib": 6,
            "dram_gb_s": 1, "noc_gb_s": 1,
            "energy": {"mult_pj": {8: 0.2}, "add_pj": {8: 0.03}, "sram_pj_per_byte": 1, "dram_pj_per_byte": 10,
                       "noc_pj_per_byte": 1, "static_mw": 100},
            "area": {"pe_mm2": 0.5, "vector_lane_mm2": 0.25, "sram_mm2_per_kib": 0.125, "router_mm2": 1},
            "co_search": {"cores": [1, 2], "mac_array": [{"k": 2, "c": 2}, {"k": 4, "c": 4}],
                          "weight_sram_kib": [10, 20], "act_sram_kib": [6], "sram_energy_exponent": 0.5}}
    return {**spec, **changes}


def test_area_by_hand():
    # per core: 4 PEs x 0.5 + 3 lanes x 0.25 + (10 + 6) KiB x 0.125 + router 1 = 2 + 0.75 + 2 + 1 = 5.75
    assert AcceleratorSpec.model_validate(small_spec()).area_mm2 == pytest.approx(2 * 5.75)
    # one core has no router: 4.75
    assert AcceleratorSpec.model_validate(small_spec(cores=1)).area_mm2 == pytest.approx(4.75)
    # edge-quad: 4 x (1024 x 0.0012121 + 8 x 0.0776 + 2048 x 0.0039058 + 0.0631)
    assert load_device("edge-quad").spec.area_mm2 == pytest.approx(39.6967, abs=1e-4)
    assert AcceleratorSpec.model_validate(small_spec(area=None, co_search=None)).area_mm2 is None


def test_co_search_needs_an_area_section():
    with pytest.raises(ValidationError, match="co_search needs an area section"):
        AcceleratorSpec.model_validate(small_spec(area=None))


def test_derived_accelerators_take_the_knobs_and_scale_static_power_with_area():
    base = AnalyticalAccelerator.from_dict(small_spec())
    assert base.co_search_knobs() == {"cores": (1, 2), "mac_array": ("k2-c2", "k4-c4"),
                                      "weight_sram_kib": (10, 20), "act_sram_kib": (6,)}
    knobs = {"cores": 1, "mac_array": "k4-c4", "weight_sram_kib": 20, "act_sram_kib": 6}
    derived = base.derive(knobs)
    assert derived is base.derive(dict(knobs))  # cached per choice
    s = derived.spec
    assert (s.cores, s.mac_array.pes, s.weight_sram_kib, derived.weight_capacity_bytes) == (1, 16, 20, 20 * 1024)
    # 16 x 0.5 + 0.75 + 26 x 0.125 = 12, against the base's 11.5
    assert s.area_mm2 == pytest.approx(12.0)
    assert s.energy.static_mw == pytest.approx(100 * 12.0 / 11.5)
    assert s.energy.sram_pj_per_byte == pytest.approx(1 * (26 / 16) ** 0.5)  # 20 + 6 KiB against 10 + 6
    conv = LayerSpec(op="conv", in_ch=8, out_ch=8, in_hw=(8, 8), out_hw=(8, 8), kernel=(3, 3), w_bits=8, a_bits=8)
    assert derived.estimate([conv]).latency_ms != base.estimate([conv]).latency_ms


def test_hw_show_gives_the_area_and_the_co_search_choices():
    result = runner.invoke(app, ["hw", "show", "edge-quad", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["area_mm2"] == pytest.approx(39.697) and doc["co_search"]["cores"] == [1, 2, 4, 8]
    assert "ISCA 2017" in doc["sources"]["area.pe_mm2"]
