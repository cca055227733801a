"""Int8 dense convs on this machine's onnxruntime: fused, unfused and float, by width.

Of the dense convs onnxruntime's static quantizer writes (QDQ), onnxruntime fuses some
into an integer kernel (QLinearConv: `conv_w8a8`) and runs others unfused: dequantize,
its plain channels-first float conv, quantize (`conv_w8a8_dq`).  Which one a conv gets
depends on the graph around it; the importer reads it from the graph onnxruntime
optimizes the model into.  The plain float conv is not the blocked one a float network
runs, and its cost over the blocked conv's is not a constant.  This script builds, for
each width and size (`CASES`), three residual basic blocks of 3x3 convs as a float
network and as onnxruntime's int8 one (per-channel weights), measures both in context as
`hw profile` does (`attribution.measure_networks`, `in_context_costs`) and prints the
median 3x3 conv of each kernel type against the float one; with `--workspace`, what that
workspace's `cpu-local` prices each at (each network priced whole, its run overhead left
out).

  python benchmarks/dequantized.py [--workspace runs/X] [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nasctl.hardware.lut import kernel_type  # noqa: E402
from nasctl.hardware.measure.attribution import in_context_costs, measure_networks  # noqa: E402
from nasctl.hardware.measure.context import NetBuilder, _Blocks, quantize  # noqa: E402
from nasctl.hardware.measure.profile import reference_networks  # noqa: E402
from nasctl.hardware.measure.runner import Protocol  # noqa: E402

# (channels, size): narrow convs as the other context networks hold, ResNet-18's four stages
# at 224 px, and wide convs on small maps (many weights, dequantized at every run, per MAC)
CASES = [(32, 40), (48, 32), (64, 56), (128, 28), (256, 14), (512, 7), (256, 6), (512, 3)]


def network(width: int, size: int, int8: bool):
    """Three residual basic blocks of `width` channels at `size` px and a classifier; int8
    (per-channel weights) or float."""
    rng = np.random.default_rng(width)
    b = NetBuilder(rng, (1, width, size, size))
    blocks, x = _Blocks(b, rng), "input"
    for _ in range(3):
        x = blocks.basic(x, width, 1, "relu")
    model = b.model(b.classifier(b.global_pool(x), 10))
    return (quantize(model, rng, per_channel=True) if int8 else model), f"{'int8 ' * int8}{width}ch {size}px"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, help="price each conv with this workspace's cpu-local too")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    nets = [network(w, size, int8) for w, size in CASES for int8 in (False, True)]
    # The profile's small reference networks beside them: the run overhead and the
    # profiler's cost per node are fitted on short networks, which these are not.
    with tempfile.TemporaryDirectory(prefix="nasctl-dequantized-") as tmp:
        measured = measure_networks(nets + reference_networks(3), Protocol(threads=1, rounds=args.rounds,
                                                                             spread_s=3.0), Path(tmp))
    costs, _ = in_context_costs(measured)
    device, prices = None, []
    if args.workspace is not None:
        from nasctl.hardware.loader import load_device

        device = load_device(str(args.workspace / "hardware" / "cpu-local" / "spec.yaml"))
        # each network priced whole, as `nasctl predict` prices a model, its run overhead
        # (which its first layer carries) left out, as `hw validate --by-kernel` does
        run = float(device.spec.overhead.per_model_ms)
        for m in measured[:len(nets)]:
            ms = [cost.latency_ms for cost in device.estimate(m.layers).costs]
            prices.append([ms[0] - run, *ms[1:]])
    types = ("conv", "conv_w8a8_dq", "conv_w8a8")
    print(f"{'width':>5} {'px':>3} " + " ".join(f"{t + ' ms':>16}" for t in types)
          + f" {'dq/float':>8} {'fused/float':>11}" + ("   priced ms (" + ", ".join(types) + ")" if device else ""))
    for k, (w, size) in enumerate(CASES):
        ms, priced = {}, {}
        for i in (2 * k, 2 * k + 1):
            for j, (layer, t) in enumerate(zip(measured[i].layers, costs[i])):
                kt = kernel_type(layer)
                if layer.op == "conv" and layer.kernel == (3, 3) and kt in types:
                    ms.setdefault(kt, []).append(t)
                    if device is not None:
                        priced.setdefault(kt, []).append(prices[i][j])
        med = {t: float(np.median(v)) for t, v in ms.items()}
        cells = " ".join(f"{med[t]:16.4f}" if t in med else f"{'-':>16}" for t in types)
        ratio = lambda t: f"{med[t] / med['conv']:.2f}" if t in med and "conv" in med else "-"  # noqa: E731
        line = f"{w:>5} {size:>3} {cells} {ratio('conv_w8a8_dq'):>8} " \
               f"{ratio('conv_w8a8'):>11}"
        if device is not None:
            line += "   " + ", ".join(f"{np.median(priced[t]):.4f}" if t in priced else "-" for t in types)
        print(line)


if __name__ == "__main__":
    main()
