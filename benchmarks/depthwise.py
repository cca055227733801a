"""Depthwise convs on this machine's onnxruntime: blocked-layout kernels against channel by channel.

onnxruntime runs a float depthwise conv whose channels are a multiple of 4 in a blocked
layout, and any other one channel by channel (an im2col and a GEMM a channel).  This
script times single depthwise convs (3x3 with a ReLU, one thread, interleaved rounds,
minimum, paced over 5 s: `measure_models`) of aligned and unaligned channel counts at several sizes, fits
the unaligned ones' time as a fixed cost per channel plus a time per MAC (stride 1), and,
with `--workspace`, prints what that workspace's `cpu-local` prices each at.

Then depthwise convs with a channel multiplier (each input channel to 2 or 4 outputs:
FastViT's downsampling) beside the same convs without one and grouped convs of two input
channels a group: onnxruntime runs a multiplier conv as a grouped conv, group by group,
and the script prints each one's GMAC/s and kernel type (`lut.kernel_type`: `conv_g`).

  python benchmarks/depthwise.py [--workspace runs/cpu-local-bench] [--rounds 15] [--spread 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nasctl.hardware.layers import LayerSpec  # noqa: E402
from nasctl.hardware.lut import DEPTHWISE_ALIGN, kernel_type  # noqa: E402
from nasctl.hardware.measure.context import NetBuilder  # noqa: E402
from nasctl.hardware.measure.runner import Protocol  # noqa: E402
from nasctl.hardware.measure.timing import measure_models  # noqa: E402

# (channels, input size, stride): ShuffleNetV2's 58 and ReXNet's 162 and 906 beside aligned neighbours
CASES = [(56, 28, 1), (58, 28, 1), (60, 28, 1), (62, 28, 1), (64, 28, 1), (36, 28, 1), (20, 28, 1),
         (58, 7, 1), (58, 14, 1), (58, 56, 1), (58, 56, 2), (56, 56, 2), (162, 40, 1), (160, 40, 1), (906, 5, 1),
         (904, 5, 1)]


# (channels, input size, stride, kernel, output channels, groups): FastViT-T8's 48 -> 96
# 7x7 stride 2 in 48 groups beside the depthwise conv and grouped convs of the same input
MULTIPLIER_CASES = [(48, 32, 2, 7, 48, 48), (48, 32, 2, 7, 96, 48), (48, 32, 2, 7, 96, 24), (48, 32, 2, 3, 48, 48),
                    (48, 32, 2, 3, 96, 48), (64, 32, 1, 3, 64, 64), (64, 32, 1, 3, 128, 64), (64, 32, 1, 3, 256, 64),
                    (64, 32, 1, 3, 128, 32), (96, 16, 1, 3, 96, 96), (96, 16, 1, 3, 192, 96)]


def model(channels: int, size: int, stride: int, k: int = 3, out: int = 0, groups: int = 0) -> bytes:
    b = NetBuilder(np.random.default_rng(0), (1, channels, size, size))
    return b.model(b.conv("input", out or channels, k, stride, groups=groups or channels,
                          act="relu")).SerializeToString()


def layer(channels: int, size: int, stride: int, k: int = 3, out: int = 0, groups: int = 0) -> LayerSpec:
    side = (size - 1) // stride + 1
    return LayerSpec("conv", channels, out or channels, (size, size), (side, side), (k, k), stride,
                     groups or channels, fn="relu")


def arguments(doc: str) -> argparse.Namespace:
    """The options of a script timing single convs (this one, `conv_channels.py`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, help="price each conv with this workspace's cpu-local too")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--spread", type=float, default=5.0, help="seconds the rounds are paced over")
    return ap.parse_args()


def time_models(models: list, args: argparse.Namespace) -> list:
    """Each model's time (ms), one thread, interleaved rounds paced over `--spread` s."""
    return measure_models(models, Protocol(threads=1, rounds=args.rounds, spread_s=args.spread))


def workspace_device(args: argparse.Namespace):
    """The `cpu-local` of `--workspace`, or None."""
    if args.workspace is None:
        return None
    from nasctl.hardware.loader import load_device

    return load_device(str(args.workspace / "hardware" / "cpu-local" / "spec.yaml"))


def main() -> None:
    args = arguments(__doc__)
    every = CASES + MULTIPLIER_CASES
    times = time_models([model(*c) for c in every], args)
    ms, multiplier_ms = times[:len(CASES)], times[len(CASES):]
    device = workspace_device(args)
    print(f"{'channels':>8} {'size':>4} {'stride':>6} {'kernel type':>13} {'ms':>8} {'us/channel':>10} "
          f"{'ns/MAC':>7}" + (f" {'priced ms':>9}" if device else ""))
    for (c, hw, s), t in zip(CASES, ms):
        spec = layer(c, hw, s)
        line = (f"{c:>8} {hw:>4} {s:>6} {kernel_type(spec):>13} {t:8.4f} {t * 1e3 / c:10.3f} "
                f"{t * 1e6 / spec.macs:7.3f}")
        if device is not None:
            line += f" {device.estimate([spec]).latency_ms:9.4f}"
        print(line)
    plain = [(c, hw, t) for (c, hw, s), t in zip(CASES, ms) if c % DEPTHWISE_ALIGN and s == 1]
    A = np.array([[c, layer(c, hw, 1).macs] for c, hw, _ in plain], dtype=float)
    t = np.array([t for *_, t in plain])
    (per_channel, per_mac), *_ = np.linalg.lstsq(A / t[:, None], np.ones(len(t)), rcond=None)
    print(f"channel by channel, stride 1: {per_channel * 1e3:.3f} us a channel + {per_mac * 1e6:.3f} ns per MAC")
    by = {c[:3]: x for c, x in zip(CASES, ms)}
    print(f"58 channels at 28x28 against 56 and 60: {by[58, 28, 1] / by[56, 28, 1]:.1f}x and "
          f"{by[58, 28, 1] / by[60, 28, 1]:.1f}x the time")
    print(f"\n{'in':>4} {'size':>4} {'stride':>6} {'k':>2} {'out':>4} {'groups':>6} {'kernel type':>13} {'ms':>8} "
          f"{'GMAC/s':>7}" + (f" {'priced ms':>9}" if device else ""))
    for c, t in zip(MULTIPLIER_CASES, multiplier_ms):
        spec = layer(*c)
        line = f"{c[0]:>4} {c[1]:>4} {c[2]:>6} {c[3]:>2} {c[4]:>4} {c[5]:>6} {kernel_type(spec):>13} {t:8.4f} " \
               f"{spec.macs / t / 1e6:7.2f}"
        if device is not None:
            line += f" {device.estimate([spec]).latency_ms:9.4f}"
        print(line)


if __name__ == "__main__":
    main()
