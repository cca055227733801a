"""What onnxruntime's CPU transpose costs by the copies it makes: a chain of transposes timed
end to end (`hw validate`'s protocol, interleaved rounds, minimum), the slope over two chain
lengths being one transpose's cost.

A head split (T, H, B) -> (H, T, B), as attention runs it, copies the trailing block of B
floats at a time: `lut._copies` counts T x H copies.  Printed per case: the cost of one
transpose, per copy and per element, beside the same-size transpose that moves the
innermost dim (a copy per element).

    python benchmarks/transposes.py [--tokens 16,64,256] [--blocks 2,3,4,8,12,16,24,32,64,128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from nasctl.hardware.lut import _copies
from nasctl.hardware.measure.runner import Protocol, measure_models
from nasctl.hardware.onnx_import import import_onnx

CHAIN = (2, 50)
HEADS = 4


def chain(shape, perm, inverse, n: int):
    """`n` transposes, alternately `perm` and its inverse, on a float tensor of `shape`."""
    nodes, x = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Transpose", [x], [f"t{i}"], perm=list(perm if i % 2 == 0 else inverse)))
        x = f"t{i}"
    # every transpose's output a graph output: else onnxruntime cancels the pairs
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(f"t{i}", TensorProto.FLOAT, None) for i in range(n)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="16,64,256")
    ap.add_argument("--blocks", default="2,3,4,8,12,16,24,32,64,128")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    cases = []
    for t in (int(v) for v in args.tokens.split(",")):
        for b in (int(v) for v in args.blocks.split(",")):
            cases.append((f"split {t}x{HEADS}x{b}", (1, t, HEADS, b), (0, 2, 1, 3), (0, 2, 1, 3)))
        cases.append((f"innermost {t}x{HEADS}x12", (1, t, HEADS, 12), (0, 3, 2, 1), (0, 3, 2, 1)))
    with tempfile.TemporaryDirectory(prefix="nasctl-transposes-") as tmp:
        models, copies = [], []
        for i, (_, shape, perm, inverse) in enumerate(cases):
            one = Path(tmp) / f"one-{i}.onnx"
            one.write_bytes(chain(shape, perm, inverse, 1).SerializeToString())
            copies.append(_copies(import_onnx(one).layers[0]))
            models += [chain(shape, perm, inverse, n).SerializeToString() for n in CHAIN]
        ms = measure_models(models, Protocol(threads=1, rounds=args.rounds, spread_s=3.0)).reshape(-1, len(CHAIN))
    per = (ms[:, 1] - ms[:, 0]) / (CHAIN[1] - CHAIN[0]) * 1e3  # µs per transpose
    print(f"{'transpose':<22}{'elements':>9}{'copies':>8}{'us each':>9}{'ns/copy':>9}{'ns/element':>11}")
    for (name, shape, _, _), us, c in zip(cases, per, copies):
        n = int(np.prod(shape))
        print(f"{name:<22}{n:>9}{c:>8}{us:>9.3f}{us * 1e3 / c:>9.2f}{us * 1e3 / n:>11.3f}")


if __name__ == "__main__":
    main()
