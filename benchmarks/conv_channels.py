"""Dense convs on this machine's onnxruntime: what their input and output channels cost.

onnxruntime runs a float dense conv in a blocked channel layout (NCHWc, blocks of 16
floats with AVX-512): with fewer input channels than a block, on its input as it is; with
more, padded to whole blocks - and the output channels padded to whole blocks.  The
kernel tables' padded MACs (`lut._padded_macs`, a regressor feature and the work of a
nearest-neighbour one) count them that way.  This script times single 3x3 convs with a
ReLU (one thread, interleaved rounds, minimum, paced over 5 s: `measure_models`) of 3-48
input channels into 32 and 33 outputs at 47x47 (SqueezeNet's fire modules: 8 -> 32), and
prints each one's time, time per MAC and padded MACs, and with `--workspace` what that
workspace's `cpu-local` prices it at.

  python benchmarks/conv_channels.py [--workspace runs/cpu-local-bench] [--rounds 15] [--spread 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from depthwise import arguments, layer, model, time_models, workspace_device  # noqa: E402

from nasctl.hardware.lut import _padded_macs  # noqa: E402

SIZE = 47
CASES = [(cin, cout) for cin in (3, 4, 8, 12, 16, 20, 24, 32, 48) for cout in (32, 33)]


def main() -> None:
    args = arguments(__doc__)
    ms = time_models([model(cin, SIZE, 1, 3, cout, 1) for cin, cout in CASES], args)
    device = workspace_device(args)
    print(f"3x3 convs at {SIZE}x{SIZE}, ReLU, one thread")
    print(f"{'in':>4} {'out':>4} {'ms':>8} {'ps/MAC':>7} {'ps/padded MAC':>13}"
          + (f" {'priced ms':>9}" if device else ""))
    for (cin, cout), t in zip(CASES, ms):
        spec = layer(cin, SIZE, 1, 3, cout, 1)
        line = f"{cin:>4} {cout:>4} {t:8.4f} {t * 1e9 / spec.macs:7.2f} {t * 1e9 / _padded_macs(spec):13.2f}"
        if device is not None:
            line += f" {device.estimate([spec]).latency_ms:9.4f}"
        print(line)


if __name__ == "__main__":
    main()
