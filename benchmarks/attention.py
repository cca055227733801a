"""Whole attentions timed end to end in chains, against what a device prices them at.

A small transformer's attention is a dozen kernels of a microsecond or two (the
projections, the heads' split and merge, the keys' transpose, the scores' product, its
softmax, the product mixing the values), too short for onnxruntime's profiler.  This
script times whole attentions (`chains.attention_chain("keys", ...)`: the four
projections included) chained 2, 8 and 14 times, end to end, as `hw profile` times its
chains (one thread, interleaved rounds paced over 1 s, two passes, the least time of each
chain), for 4, 16 and 64 tokens, widths 16, 32 and 48 and 1, 2 and 4 heads, and prints
each attention's time (the slope over the lengths) beside what each `--workspace`'s
`cpu-local` prices the same chains at (the slope of their prices).

  python benchmarks/attention.py --workspace runs/p [--workspace runs/q] [--rounds 15]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nasctl.hardware.loader import load_device  # noqa: E402
from nasctl.hardware.measure.chains import CHAIN_LENGTHS, CHAIN_PASSES, attention_chain  # noqa: E402
from nasctl.hardware.measure.profile import chain_protocol  # noqa: E402
from nasctl.hardware.measure.runner import Protocol  # noqa: E402
from nasctl.hardware.measure.timing import measure_models  # noqa: E402
from nasctl.hardware.onnx_import import import_onnx  # noqa: E402

CASES = list(itertools.product((4, 16, 64), (16, 32, 48), (1, 2, 4)))  # tokens, width, heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, action="append", default=[],
                    help="price the chains with this workspace's cpu-local (repeatable)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    devices = [load_device(str(ws / "hardware" / "cpu-local" / "spec.yaml")) for ws in args.workspace]
    models = [[attention_chain("keys", t, h, w // h, k) for k in CHAIN_LENGTHS] for t, w, h in CASES]
    protocol = chain_protocol(Protocol(threads=1, rounds=args.rounds, repeats=3, sessions=3))
    best = np.full((len(CASES), len(CHAIN_LENGTHS)), np.inf)
    for p in range(CHAIN_PASSES):
        for i in (range(len(CASES)) if p % 2 == 0 else reversed(range(len(CASES)))):
            best[i] = np.minimum(best[i], measure_models([m.SerializeToString() for m in models[i]], protocol,
                                                         seed=i + p * len(CASES)))
    print("whole attentions (4 projections), one link's time (µs): chained end to end, and priced by each "
          "device (its ratio to the chained)")
    print(f"{'tokens':>6} {'width':>5} {'heads':>5} {'chained':>8}"
          + "".join(f" {ws.name:>14}" for ws in args.workspace))
    ratios = [[] for _ in devices]
    with tempfile.TemporaryDirectory() as tmp:
        for (t, w, h), chain, times in zip(CASES, models, best):
            slope = np.polyfit(CHAIN_LENGTHS, times, 1)[0]
            line = f"{t:>6} {w:>5} {h:>5} {slope * 1e3:8.2f}"
            layers = []
            for k, model in zip(CHAIN_LENGTHS, chain):
                path = Path(tmp) / f"chain{k}.onnx"
                path.write_bytes(model.SerializeToString())
                layers.append(import_onnx(path).layers)
            for j, device in enumerate(devices):
                priced = np.polyfit(CHAIN_LENGTHS, [device.estimate(lay).latency_ms for lay in layers], 1)[0]
                ratios[j].append(priced / slope)
                line += f" {priced * 1e3:7.2f} {priced / slope:5.2f}x"
            print(line)
    for ws, r in zip(args.workspace, ratios):
        print(f"{ws.name}: priced at {min(r):.2f}-{max(r):.2f}x the chained time, "
              f"{np.mean(np.abs(np.array(r) - 1) <= 0.1) * 100:.0f}% within ±10%")


if __name__ == "__main__":
    main()
