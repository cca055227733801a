"""Kernels too short for onnxruntime's profiler, timed end to end in chains (an experiment).

onnxruntime's profiler records whole microseconds and costs about 2 µs a node itself, so the
in-context time `hw profile` gives a kernel of a fraction of a microsecond is either floored
or one microsecond high, by where the machine's per-node cost falls that hour
(benchmarks/README.md, "the table's rows do not repeat").  This script times such kernels
without the profiler: a tiny token network (8x8 input, patches to 4 or 16 tokens) with the
kernel chained CHAIN times, end to end by `hw validate`'s protocol; the slope over the chain
lengths is the kernel's cost.  A linear that changes the width is chained with its way back
(half the pair's slope each); an add is chained as a tensor added to itself.  Kernels: the
token-layout linears (with their activation), layer norms and adds of the given ONNX models.

It writes a copy of WORKSPACE's `cpu-local` into OUT with those kernels' rows in the table
(each row the chained cost less its kernel group's offset, so the device prices the kernel
at the chained cost before the working-set factor); `nasctl --workspace OUT hw validate ...`
then prices with them.  The copy's regressors are fitted again when first used.

    python benchmarks/chains.py --workspace WS --out OUT [--json FILE] MODEL.onnx ...
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.lut import (KERNEL_FLOOR_MS, REGRESSORS_FILE, kernel_group, layer_from_row, read_lut,
                                 row_from_layer, write_lut)
from nasctl.hardware.measure.context import NetBuilder
from nasctl.hardware.measure.runner import Protocol, measure_models
from nasctl.hardware.onnx_import import import_onnx

CHAIN = (2, 8, 14)
TOKENS = (4, 16)  # what an 8x8 input patched by 4 or 2 gives


def chainable(layer: LayerSpec) -> bool:
    """A token-layout linear (plain or with GELU), layer norm or add over 4 or 16 tokens."""
    return (layer.in_hw[1] == 1 and layer.in_hw[0] in TOKENS and layer.w_bits == 32
            and ((layer.op, layer.fn) in {("linear", ""), ("linear", "gelu"), ("norm", "layer"), ("add", "")}))


def chain_network(layer: LayerSpec, k: int, seed: int = 0) -> bytes:
    """An ONNX network of `layer` chained `k` times (with its way back for a linear that
    changes the width) between a patch conv and a classifier."""
    b = NetBuilder(np.random.default_rng(seed), (1, 1, 8, 8))
    tokens = layer.in_hw[0]
    side = int(round(np.sqrt(tokens)))
    x = b.conv("input", layer.in_ch, 8 // side, 8 // side, pad=0)
    tag = b._tag()
    x = b.transpose(b.reshape(x, (1, layer.in_ch, tokens), tag), (0, 2, 1), tag)
    for _ in range(k):
        if layer.op == "linear":
            x = b.linear(x, layer.out_ch, act=layer.fn)
            if layer.out_ch != layer.in_ch:
                x = b.linear(x, layer.in_ch, act=layer.fn)
        elif layer.op == "norm":
            x = b.layer_norm(x)
        else:
            x = b.add(x, x)
    return b.model(b.classifier(b.token_mean(b.layer_norm(x)), 10)).SerializeToString()


def chained_cost_ms(layer: LayerSpec, protocol: Protocol, repeats: int = 2) -> float:
    """The kernel's cost: the slope of the chains' end-to-end times (fastest of `repeats`
    measurements) over the chain lengths."""
    best = None
    for rep in range(repeats):
        t = np.array(measure_models([chain_network(layer, k) for k in CHAIN], protocol, seed=rep))
        best = t if best is None else np.minimum(best, t)
    pair = layer.op == "linear" and layer.out_ch != layer.in_ch
    return float(np.polyfit(CHAIN, best, 1)[0]) / (2 if pair else 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, required=True, help="workspace holding hardware/cpu-local/")
    ap.add_argument("--out", type=Path, required=True, help="workspace to write the device with chained rows into")
    ap.add_argument("--json", type=Path, help="also write each kernel's chained cost here")
    ap.add_argument("models", type=Path, nargs="+", help="ONNX models whose kernels to chain")
    args = ap.parse_args()

    import yaml

    source = args.workspace / "hardware" / "cpu-local"
    if not (source / "lut.csv").is_file():
        raise SystemExit(f"no kernel table {source / 'lut.csv'}: profile the workspace first")
    missing = [str(p) for p in args.models if not p.is_file()]
    if missing:
        raise SystemExit(f"no such model: {', '.join(missing)}")
    kernels: dict[tuple, LayerSpec] = {}
    for path in args.models:
        for layer in import_onnx(path).layers:
            if chainable(layer):
                kernels.setdefault(layer.shape_key(), layer)
    print(f"{len(kernels)} kernels to chain", flush=True)
    protocol = Protocol(threads=1, rounds=10, repeats=3, sessions=3, spread_s=1.0)
    chained = {}
    for i, (key, layer) in enumerate(kernels.items()):
        chained[key] = chained_cost_ms(layer, protocol)
        print(f"{i + 1:>3}/{len(kernels)} {layer.op} {layer.fn or '-'} {layer.in_ch}->{layer.out_ch} over "
              f"{layer.in_hw[0]} tokens: {chained[key] * 1e3:.3f} µs", flush=True)

    target = args.out / "hardware" / "cpu-local"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(REGRESSORS_FILE))
    spec = yaml.safe_load((target / "spec.yaml").read_text(encoding="utf-8"))
    offsets = (spec.get("overhead") or {}).get("per_kernel_ms") or {}
    rows = [r for r in read_lut(target / "lut.csv") if layer_from_row(r).shape_key() not in chained]
    for key, ms in chained.items():
        layer = kernels[key]
        rows.append(row_from_layer(layer, max(ms - offsets.get(kernel_group(layer), 0.0), KERNEL_FLOOR_MS)))
    write_lut(target / "lut.csv", rows)
    print(f"wrote {target} ({len(chained)} chained rows)")
    if args.json:
        args.json.write_text(json.dumps([{"op": kernels[k].op, "fn": kernels[k].fn, "in_ch": kernels[k].in_ch,
                                          "out_ch": kernels[k].out_ch, "tokens": kernels[k].in_hw[0],
                                          "chained_ms": v} for k, v in chained.items()], indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
