"""Early exits on a vision transformer: the `eenn` comparison on ee-vit, and ONNX exports of
sampled ee-vit networks.

    python benchmarks/vit.py compare --out DIR [--seed 0] [--budget 24] [--epochs N]
        benchmarks/eenn.py's four searches (the early-exit space as shipped; exits with every
        bit width pinned to 8; static int8; static fp32), same budget and seed, with the eenn
        preset's settings on the ee-vit space, and its printed comparison: the EDP of the
        chosen early-exit point against the static networks at iso-accuracy.

    python benchmarks/vit.py export --out DIR [-n 8] [--seed 0] [--input 1x8x8] [--classes 10]
        N architectures sampled from ee-vit (seeded; float, as torch exports them) as
        DIR/vit-<i>.onnx with untrained weights, and DIR/archs.json: for each file its
        architecture and the latency and energy ee-vit's layers are priced at on every shipped
        device - e.g. to check `nasctl predict` on a measured device against these networks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEVICES = ("edge-quad", "edge-single", "eyeriss-like", "mcu-m7", "h100")


def export_archs(out: Path, n: int = 8, seed: int = 0, input_shape=(1, 8, 8), classes: int = 10) -> list[Path]:
    """Write `n` sampled ee-vit networks (float) to `out` as ONNX, and `out/archs.json`."""
    import numpy as np
    import torch

    from nasctl.hardware.loader import load_device
    from nasctl.spaces.loader import load_space

    space = load_space("ee-vit")
    space.check_fits(input_shape, classes, 1)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    devices = {name: load_device(name) for name in DEVICES}
    paths, records = [], []
    for i in range(n):
        arch = {**space.sample(rng), "backbone_bits": 32, "exit_bits": 32}
        model = space.build(arch, input_shape, classes).eval()
        path = out / f"vit-{i}.onnx"
        torch.onnx.export(model, (torch.zeros(1, *input_shape),), str(path), dynamo=False, opset_version=17,
                          input_names=["input"], do_constant_folding=True)
        layers = space.to_layers(arch, input_shape, classes)
        priced = {}
        for name, device in devices.items():
            report = device.estimate(layers)
            priced[name] = {"latency_ms": report.latency_ms, "energy_mj": report.energy_mj}
        records.append({"file": path.name, "arch": arch, "exits": space.active_exits(arch), "priced": priced})
        paths.append(path)
    (out / "archs.json").write_text(json.dumps({"space": "ee-vit", "input_shape": list(input_shape),
                                                "classes": classes, "networks": records}, indent=1))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="the eenn comparison on ee-vit")
    cmp.add_argument("--out", type=Path, required=True)
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--budget", type=int, default=24, help="candidates per search [default: 24]")
    cmp.add_argument("--epochs", type=int)
    exp = sub.add_parser("export", help="sampled ee-vit networks as ONNX files")
    exp.add_argument("--out", type=Path, required=True)
    exp.add_argument("-n", type=int, default=8)
    exp.add_argument("--seed", type=int, default=0)
    exp.add_argument("--input", default="1x8x8", help="C x H x W [default: 1x8x8, digits]")
    exp.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    if args.command == "export":
        shape = tuple(int(x) for x in args.input.lower().split("x"))
        if len(shape) != 3:
            raise SystemExit(f"error: --input {args.input}: give C x H x W, e.g. 1x8x8")
        for path in export_archs(args.out, args.n, args.seed, shape, args.classes):
            print(path)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import eenn

    sys.argv = [sys.argv[0], "--space", "ee-vit", "--out", str(args.out), "--seed", str(args.seed),
                "--budget", str(args.budget)] + (["--epochs", str(args.epochs)] if args.epochs else [])
    eenn.main()


if __name__ == "__main__":
    main()
