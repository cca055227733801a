"""benchmarks/cpu_local.py --rows-against: a kernel table's rows against the same kernels measured again."""
import pytest

from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import row_from_layer, write_lut


def _linear(cin: int) -> LayerSpec:
    return LayerSpec("linear", cin, 16, (4, 1), (4, 1), (1, 1), 1, 1, 32, 32)


def test_rows_are_compared_kernel_by_kernel_in_buckets_of_their_time(tmp_path, bench_module):
    # (kernel, time in the table, time measured again), ms
    kernels = [(_linear(8), 0.0005, 0.0005 * 3.0),   # a sub-µs kernel 3x dearer the second time
               (_linear(16), 0.0006, 0.0006 * 1.05),
               (_linear(24), 0.050, 0.050 * 0.95),  # 20-100 µs
               (_linear(32), 0.040, 0.040 * 1.2)]
    write_lut(tmp_path / "a.csv", [row_from_layer(k, a) for k, a, _ in kernels])
    # the other table lacks one kernel and holds one the first does not: neither is compared
    write_lut(tmp_path / "b.csv", [row_from_layer(k, b) for k, _, b in kernels[:-1]]
              + [row_from_layer(_linear(40), 0.001)])
    rows = bench_module("cpu_local").row_repeatability(tmp_path / "a.csv", tmp_path / "b.csv")
    assert [(r["from_us"], r["kernels"]) for r in rows] == [(0, 2), (20, 1)]
    small, large = rows
    assert small["within_10pct"] == 0.5 and small["within_2x"] == 0.5
    assert small["median_ratio"] == pytest.approx((3.0 + 1.05) / 2)
    assert large["median_abs_change"] == pytest.approx(0.05) and large["within_10pct"] == 1.0
