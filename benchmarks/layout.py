"""Layout reorders: the importer's prediction against what onnxruntime itself runs, and their share of models' time.

For each ONNX model given (folders: every *.onnx in them), the reorder nodes the importer
predicts (`ImportResult.layouts`, for this machine's vector width, `layout.machine_block`)
against those in onnxruntime's fully optimized graph of it (`onnx_import.runtime_reorders`),
by direction; with `--shares`, each model profiled once (one thread) for the share of its
profiled time its reorder nodes take.  Published models (`benchmarks/published.py` writes
them into WORKSPACE/published), the zoo (WORKSPACE/zoo), a bundle's context networks
(BUNDLE/networks/netNNNN.onnx) and ee-vit exports (`benchmarks/vit.py export`) are what
the figures in benchmarks/README.md were measured on.

  python benchmarks/layout.py [--shares] [--every N] PATH [PATH ...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nasctl.hardware.layout import machine_block  # noqa: E402
from nasctl.hardware.onnx_import import import_onnx, runtime_reorders  # noqa: E402


def models(paths: list[Path], every: int) -> list[Path]:
    found = []
    for p in paths:
        if p.is_dir():
            files = sorted(p.glob("*.onnx"))
            if (p / "bundle.json").is_file() or p.name == "networks":  # a bundle's context networks, not its kernels
                files = sorted(f for f in (p.glob("net*.onnx") if p.name == "networks" else p.glob("networks/net*.onnx"))
                               if re.fullmatch(r"net\d+\.onnx", f.name))
            found += files[::every]
        else:
            found.append(p)
    return found


def reorder_share(path: Path) -> float:
    """The share of the model's profiled node time (each node's fastest of 20 runs, one
    thread) its reorder nodes take."""
    import numpy as np

    from nasctl.hardware.measure.runner import make_session, random_feed, read_profile

    with tempfile.TemporaryDirectory() as tmp:
        session = make_session(path, 1, str(Path(tmp) / "p"))
        feed = random_feed(session, np.random.default_rng(0))
        for _ in range(20):
            session.run(None, feed)
        nodes, ops = read_profile(session.end_profiling())
    total = sum(ms for _, ms in nodes)
    return sum(ms for name, ms in nodes if ops.get(name, "").startswith("Reorder")) / total if total else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--shares", action="store_true", help="profile each model for its reorders' share of its time")
    ap.add_argument("--every", type=int, default=1, help="take every N-th model of a folder")
    args = ap.parse_args()
    block = machine_block()
    if block is None:
        sys.exit("this machine's onnxruntime runs no blocked layout (x86 with AVX2 or AVX-512 only)")
    total = Counter()
    for path in models(args.paths, args.every):
        predicted = Counter(r.direction for r in import_onnx(path).layouts[block])
        ran = Counter(runtime_reorders(path))
        total["models"] += 1
        total["agree"] += predicted == ran
        total["predicted"] += sum(predicted.values())
        total["ran"] += sum(ran.values())
        line = f"{path.stem:<36} ran in {ran['in']:>3} out {ran['out']:>3}   predicted in {predicted['in']:>3} " \
               f"out {predicted['out']:>3}" + ("" if predicted == ran else "   (differs)")
        if args.shares:
            line += f"   reorders {reorder_share(path) * 100:5.1f}% of its profiled time"
        print(line, flush=True)
    print(f"vector width {block}: {total['agree']} of {total['models']} models predicted exactly "
          f"({total['predicted']} reorders predicted, {total['ran']} run)")


if __name__ == "__main__":
    main()
