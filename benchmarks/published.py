"""How well the profiled `cpu-local` device predicts published architectures it never saw.

Builds ONNX models from torchvision and timm definitions (random weights: latency does not
depend on them), some exported with torch's TorchScript exporter and some with its dynamo
exporter, several quantized to int8 QDQ by onnxruntime's static quantizer (per channel),
at several resolutions.  Each is measured end to end with onnxruntime by the protocol
`nasctl hw validate` uses and priced by the `cpu-local` device profiled on this machine
(`benchmarks/cpu_local.py`'s workspace; profiled first if it has none), and
`nasctl predict` is timed on each (wall clock, start-up included; the max is the figure).

The set is split in two halves, fixed here, alternating within each family: `tuning`
(what changes to the profiler and the importer were checked against) and `held-out`
(looked at only to report).  The held-out half's figures are the result (benchmarks/README.md
says which one change a held-out model prompted).

    python benchmarks/published.py [--workspace DIR] [--split tuning|held-out|all] [--only NAME,...]
                                   [--rounds N] [--no-predict-timing | --predict-timing-only]
                                   [--compare OTHER_DIR ...] [--by-kernel] [--json FILE]

torchvision and timm are needed only here: `pip install --no-deps torchvision==0.28.0 timm onnxscript onnx_ir`
beside the CPU torch.  torchvision's compiled ops do not load beside the CPU build of
torch; its model definitions need none of them, so an empty stand-in module takes the
place of `torchvision._meta_registrations` before the import.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cpu_local import DEFAULT_WORKSPACE, ensure_device, load_adjusted, print_load_adjusted, print_machine_state

# (name, library, constructor name, input px, int8, exporter, family).  Families alternate
# between the halves in this order.
MODELS = [
    # residual nets, grouped convs
    ("resnet18-224", "tv", "resnet18", 224, False, "ts", "resnet"),
    ("resnet10t-176", "timm", "resnet10t", 176, False, "ts", "resnet"),
    ("resnet50-160", "tv", "resnet50", 160, False, "dynamo", "resnet"),
    ("resnet18d-128", "timm", "resnet18d", 128, False, "ts", "resnet"),
    ("resnext50-128", "tv", "resnext50_32x4d", 128, False, "ts", "resnet"),
    ("seresnext26d-128", "timm", "seresnext26d_32x4d", 128, False, "ts", "resnet"),
    ("regnetx-200mf-224", "timm", "regnetx_002", 224, False, "ts", "regnet"),
    ("regnety-400mf-160", "tv", "regnet_y_400mf", 160, False, "ts", "regnet"),
    ("regnetx-400mf-192", "tv", "regnet_x_400mf", 192, False, "dynamo", "regnet"),
    ("regnety-004-224", "timm", "regnety_004", 224, False, "ts", "regnet"),
    # mobile nets
    ("mobilenetv2-224", "tv", "mobilenet_v2", 224, False, "ts", "mobilenet"),
    ("mobilenetv3-large-224", "tv", "mobilenet_v3_large", 224, False, "ts", "mobilenet"),
    ("mobilenetv3-small-160", "tv", "mobilenet_v3_small", 160, False, "dynamo", "mobilenet"),
    ("mobilenetv4-small-256", "timm", "mobilenetv4_conv_small", 256, False, "ts", "mobilenet"),
    ("mobilenetv3-small050-224", "timm", "mobilenetv3_small_050", 224, False, "ts", "mobilenet"),
    ("mobilenetv1-128", "timm", "mobilenetv1_100", 128, False, "ts", "mobilenet"),
    # searched mobile nets, mixed kernels
    ("efficientnet-b0-224", "tv", "efficientnet_b0", 224, False, "ts", "nas"),
    ("mixnet-s-224", "timm", "mixnet_s", 224, False, "ts", "nas"),
    ("mnasnet-224", "tv", "mnasnet1_0", 224, False, "ts", "nas"),
    ("fbnetc-192", "timm", "fbnetc_100", 192, False, "dynamo", "nas"),
    ("efficientnet-lite0-160", "timm", "efficientnet_lite0", 160, False, "ts", "nas"),
    ("mixnet-m-128", "timm", "mixnet_m", 128, False, "ts", "nas"),
    ("tinynet-e-106", "timm", "tinynet_e", 106, False, "ts", "nas"),
    ("spnasnet-160", "timm", "spnasnet_100", 160, False, "ts", "nas"),
    ("semnasnet075-224", "timm", "semnasnet_075", 224, False, "ts", "nas"),
    ("hardcorenas-a-192", "timm", "hardcorenas_a", 192, False, "ts", "nas"),
    # light CNNs
    ("ghostnet-224", "timm", "ghostnet_100", 224, False, "ts", "light"),
    ("lcnet050-224", "timm", "lcnet_050", 224, False, "ts", "light"),
    ("rexnet-160", "timm", "rexnet_100", 160, False, "ts", "light"),
    ("lcnet100-160", "timm", "lcnet_100", 160, False, "dynamo", "light"),
    ("repghostnet050-224", "timm", "repghostnet_050", 224, False, "ts", "light"),
    ("mobileone-s0-160", "timm", "mobileone_s0", 160, False, "ts", "light"),
    # classic CNNs
    ("shufflenetv2-224", "tv", "shufflenet_v2_x1_0", 224, False, "ts", "classic"),
    ("squeezenet11-224", "tv", "squeezenet1_1", 224, False, "ts", "classic"),
    ("densenet121-128", "tv", "densenet121", 128, False, "ts", "classic"),
    ("googlenet-160", "tv", "googlenet", 160, False, "ts", "classic"),
    ("vovnet19-slim-160", "timm", "ese_vovnet19b_slim", 160, False, "ts", "classic"),
    ("shufflenetv2-05-160", "tv", "shufflenet_v2_x0_5", 160, False, "dynamo", "classic"),
    ("squeezenet10-128", "tv", "squeezenet1_0", 128, False, "ts", "classic"),
    ("dla34-128", "timm", "dla34", 128, False, "ts", "classic"),
    # modern CNNs
    ("convnext-tiny-128", "tv", "convnext_tiny", 128, False, "ts", "convnext"),
    ("convnext-atto-160", "timm", "convnext_atto", 160, False, "ts", "convnext"),
    ("convnextv2-atto-128", "timm", "convnextv2_atto", 128, False, "dynamo", "convnext"),
    ("inception-next-atto-160", "timm", "inception_next_atto", 160, False, "ts", "convnext"),
    # transformers and hybrids
    ("deit-tiny-224", "timm", "deit_tiny_patch16_224", 224, False, "ts", "vit"),
    ("vit-b16-96", "tv", "vit_b_16", 96, False, "ts", "vit"),
    ("levit-128s-224", "timm", "levit_128s", 224, False, "ts", "vit"),
    ("deit-tiny-160", "timm", "deit_tiny_patch16_224", 160, False, "dynamo", "vit"),
    ("mobilevit-xxs-256", "timm", "mobilevit_xxs", 256, False, "ts", "vit"),
    ("efficientvit-b0-224", "timm", "efficientvit_b0", 224, False, "ts", "vit"),
    ("edgenext-xxs-256", "timm", "edgenext_xx_small", 256, False, "ts", "vit"),
    ("mobilevitv2-050-160", "timm", "mobilevitv2_050", 160, False, "ts", "vit"),
    ("efficientvit-m0-224", "timm", "efficientvit_m0", 224, False, "ts", "vit"),
    ("fastvit-t8-128", "timm", "fastvit_t8", 128, False, "ts", "vit"),
    ("pvt-v2-b0-160", "timm", "pvt_v2_b0", 160, False, "ts", "vit"),
    ("tiny-vit-5m-224", "timm", "tiny_vit_5m_224", 224, False, "ts", "vit"),
    # int8 QDQ (onnxruntime static quantizer, per channel)
    ("resnet18-224-int8", "tv", "resnet18", 224, True, "ts", "int8"),
    ("mobilenetv2-224-int8", "tv", "mobilenet_v2", 224, True, "ts", "int8"),
    ("mobilenetv4-small-256-int8", "timm", "mobilenetv4_conv_small", 256, True, "ts", "int8"),
    ("efficientnet-b0-224-int8", "tv", "efficientnet_b0", 224, True, "ts", "int8"),
    ("regnetx-200mf-160-int8", "timm", "regnetx_002", 160, True, "ts", "int8"),
    ("mobilenetv3-large-192-int8", "tv", "mobilenet_v3_large", 192, True, "ts", "int8"),
    ("shufflenetv2-224-int8", "tv", "shufflenet_v2_x1_0", 224, True, "ts", "int8"),
    ("resnet50-128-int8", "tv", "resnet50", 128, True, "ts", "int8"),
    ("squeezenet11-160-int8", "tv", "squeezenet1_1", 160, True, "ts", "int8"),
    ("deit-tiny-160-int8", "timm", "deit_tiny_patch16_224", 160, True, "ts", "int8"),
]


@dataclass(frozen=True)
class Entry:
    name: str
    library: str
    ctor: str
    px: int
    int8: bool
    exporter: str
    family: str
    split: str


def entries() -> list[Entry]:
    """The set, each model with its half: alternating within its family, in table order."""
    seen: dict[str, int] = {}
    out = []
    for name, lib, ctor, px, int8, exporter, family in MODELS:
        k = seen.get(family, 0)
        seen[family] = k + 1
        out.append(Entry(name, lib, ctor, px, int8, exporter, family, "tuning" if k % 2 == 0 else "held-out"))
    return out


def _import_zoo():
    """torchvision and timm, their compiled ops stood in for (see the module docstring)."""
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import timm
    import torchvision

    return torchvision, timm


def export(entry: Entry, folder: Path) -> Path:
    """The entry's ONNX file in `folder`, built if missing."""
    path = folder / f"{entry.name}.onnx"
    if path.is_file():
        return path
    import torch

    torchvision, timm = _import_zoo()
    torch.manual_seed(0)
    if entry.library == "tv":
        kwargs = {"image_size": entry.px} if entry.ctor.startswith("vit_") else {}
        if entry.ctor == "googlenet":
            kwargs = {"aux_logits": False, "init_weights": True}
        model = getattr(torchvision.models, entry.ctor)(**kwargs)
    else:
        kwargs = {"img_size": entry.px} if any(k in entry.ctor for k in ("deit", "tiny_vit", "pvt", "mobilevit")) else {}
        try:
            model = timm.create_model(entry.ctor, **kwargs)
        except TypeError:
            model = timm.create_model(entry.ctor)
    model.eval()
    x = torch.randn(1, 3, entry.px, entry.px)
    target = path.with_suffix(".float.onnx") if entry.int8 else path
    # Not under no_grad: eval mode without autograd takes torch's fused attention, which the
    # TorchScript exporter cannot write.
    if entry.exporter == "dynamo":
        torch.onnx.export(model, (x,), str(target), dynamo=True, verbose=False, optimize=True)
    else:
        torch.onnx.export(model, (x,), str(target), dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["logits"])
    if entry.int8:
        from nasctl.hardware.measure.context import quantize_int8

        rng = np.random.default_rng(0)
        feeds = [{_input_name(target): rng.standard_normal((1, 3, entry.px, entry.px)).astype(np.float32)}
                 for _ in range(4)]
        quantize_int8(target, path, feeds, per_channel=True)
        target.unlink()
        for extra in folder.glob(f"{entry.name}*.data"):
            extra.unlink()
    return path


def _input_name(path: Path) -> str:
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.input[0].name


def predict_seconds(path: Path, workspace: Path, rounds: int = 3) -> float:
    """Wall seconds of `nasctl predict PATH --device cpu-local` in `workspace`, start-up
    included (min of `rounds`)."""
    best = np.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "nasctl", "--workspace", str(workspace), "predict", str(path),
                               "--device", "cpu-local"], capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        if done.returncode:
            raise SystemExit(f"nasctl predict {path.name} failed: {done.stderr.strip()[-300:]}")
    return float(best)


def predict_times(paths: list[Path], workspace: Path, rounds: int = 3) -> list[float]:
    """`predict_seconds` of every model, the models interleaved round by round (min over rounds)."""
    best = [np.inf] * len(paths)
    for _ in range(rounds):
        for i, path in enumerate(paths):
            best[i] = min(best[i], predict_seconds(path, workspace, rounds=1))
    return best


def summary(rows: list[dict]) -> dict:
    err = np.array([r["error_pct"] for r in rows]) / 100
    return {"models": len(rows), "within_10pct": float(np.mean(np.abs(err) <= 0.10)),
            "within_5pct": float(np.mean(np.abs(err) <= 0.05)), "rms_error_pct": float(np.sqrt(np.mean(err ** 2)) * 100),
            "worst_pct": float(err[np.argmax(np.abs(err))] * 100),
            "unpriced_models": sum(bool(r["unsupported"]) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE, help="workspace holding hardware/cpu-local/")
    ap.add_argument("--split", choices=("tuning", "held-out", "all"), default="all")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--no-predict-timing", action="store_true", help="skip timing `nasctl predict` on each model")
    ap.add_argument("--export-only", action="store_true", help="only build the ONNX files")
    ap.add_argument("--predict-timing-only", action="store_true",
                    help="only time `nasctl predict` on each model (no latency measured)")
    ap.add_argument("--refit", action="store_true", help="fit cpu-local again from the networks its profile measured")
    ap.add_argument("--compare", type=Path, action="append", default=[], metavar="DIR",
                    help="another workspace whose cpu-local prices the same measurement (repeatable)")
    ap.add_argument("--by-kernel", action="store_true",
                    help="only profile the models and print, per kernel type, the in-context time beside the price "
                         "(`nasctl hw validate --by-kernel`): where the errors come from")
    ap.add_argument("--json", type=Path, help="also write the full result as JSON here")
    args = ap.parse_args()

    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chosen = [e for e in entries() if args.split in ("all", e.split)
              and (not args.only or e.name in args.only.split(","))]
    if not chosen:
        raise SystemExit(f"no model matches --split {args.split} --only {args.only}")
    folder = args.workspace / "published"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = [export(e, folder) for e in chosen]
    if args.export_only:
        return
    print(f"{len(paths)} models ready in {folder} ({time.perf_counter() - t0:.0f} s)")
    if args.predict_timing_only:
        times = predict_times(paths, args.workspace)
        for e, t in sorted(zip(chosen, times), key=lambda et: -et[1]):
            print(f"{e.name:<30}{e.split:>9}{t:>8.2f} s")
        print(f"nasctl predict: max {max(times):.2f} s, median {np.median(times):.2f} s, "
              f"{sum(t > 1 for t in times)} of {len(times)} over 1 s")
        return
    device = ensure_device(args.workspace, reprofile=False, refit=args.refit)
    if args.by_kernel:
        from nasctl.hardware.measure.profile import kernel_breakdown
        from nasctl.hardware.measure.runner import Protocol

        doc = kernel_breakdown(device, paths, Protocol(rounds=args.rounds, sessions=3), worst=15)
        total = sum(doc["end_to_end_ms"])
        print(f"\n{'kernel type':<22}{'layers':>7}{'priced ms':>11}{'measured ms':>13}{'difference':>12}"
              f"{'of the total':>14}")
        for r in doc["kernels"]:
            d = r["predicted_ms"] - r["measured_ms"]
            print(f"{r['kernel']:<22}{r['layers']:>7}{r['predicted_ms']:>11.3f}{r['measured_ms']:>13.3f}{d:>+12.3f}"
                  f"{d / total * 100:>+13.2f}%")
        print(f"\n{'model':<28}{'layer':<26}{'kernel type':<16}{'priced ms':>10}{'measured ms':>12}  shape")
        for r in doc["worst_layers"]:
            print(f"{r['model']:<28}{r['layer']:<26}{r['kernel']:<16}{r['predicted_ms']:>10.3f}{r['measured_ms']:>12.3f}"
                  f"  {r['in_ch']}x{r['in_hw'][0]}x{r['in_hw'][1]} -> {r['out_ch']}x{r['out_hw'][0]}x{r['out_hw'][1]} "
                  f"k{r['kernel_size'][0]} g{r['groups']} {r['fn']}")
        if args.json:
            args.json.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        return

    from nasctl.hardware.loader import load_device
    from nasctl.hardware.measure.profile import validate_models

    missing = [str(d) for d in args.compare if not (d / "hardware" / "cpu-local" / "spec.yaml").is_file()]
    if missing:
        ap.error(f"--compare {missing[0]}: no hardware/cpu-local/spec.yaml there (a workspace `nasctl hw profile` wrote)")
    others = [load_device(str(d / "hardware" / "cpu-local" / "spec.yaml")) for d in args.compare]
    doc = validate_models(device, paths, rounds=args.rounds, compare=others)
    times = None if args.no_predict_timing else predict_times([Path(r["path"]) for r in doc["models"]], args.workspace)
    for i, (e, r) in enumerate(zip(chosen, doc["models"])):
        r.update(split=e.split, family=e.family, exporter=e.exporter, int8=e.int8)
        if times is not None:
            r["predict_s"] = times[i]
    print(f"\n{'model':<30}{'half':>9}{'predicted ms':>14}{'measured ms':>13}{'error':>9}"
          + ("" if args.no_predict_timing else f"{'predict s':>11}"))
    for r in sorted(doc["models"], key=lambda r: (r["split"], r["model"])):
        line = (f"{r['model']:<30}{r['split']:>9}{r['predicted_ms']:>14.3f}{r['measured_ms']:>13.3f}"
                f"{r['error_pct']:>+8.1f}%")
        if "predict_s" in r:
            line += f"{r['predict_s']:>11.2f}"
        if r["unsupported"]:
            line += f"  unpriced: {r['unsupported']}"
        print(line)
    doc["halves"] = {}
    for half in ("tuning", "held-out"):
        rows = [r for r in doc["models"] if r["split"] == half]
        if not rows:
            continue
        s = doc["halves"][half] = summary(rows)
        print(f"\n{half}: {s['models']} models, {s['within_10pct'] * 100:.0f}% within ±10%, "
              f"{s['within_5pct'] * 100:.0f}% within ±5%, RMS error {s['rms_error_pct']:.1f}%, "
              f"worst {s['worst_pct']:+.1f}%, {s['unpriced_models']} with unpriced ops")
    print_machine_state(doc["summary"])
    doc["halves_load_adjusted"] = {}
    for half in ("tuning", "held-out"):
        adjusted = load_adjusted([r for r in doc["models"] if r["split"] == half], doc["summary"])
        if adjusted:
            doc["halves_load_adjusted"][half] = adjusted
            print_load_adjusted(half, adjusted)
    for other, compared in zip(args.compare, doc.get("compared", [])):
        print(f"\n{other}'s cpu-local against the same measurement:")
        compared["halves"] = {}
        for half in ("tuning", "held-out"):
            rows = [r for e, r in zip(chosen, compared["models"]) if e.split == half]
            if rows:
                s = compared["halves"][half] = summary(rows)
                print(f"{half}: {s['within_10pct'] * 100:.0f}% within ±10%, {s['within_5pct'] * 100:.0f}% within "
                      f"±5%, RMS error {s['rms_error_pct']:.1f}%, worst {s['worst_pct']:+.1f}%")
                print_load_adjusted(half, load_adjusted(rows, compared["summary"]))
    if not args.no_predict_timing:
        slowest = max(doc["models"], key=lambda r: r["predict_s"])
        print(f"nasctl predict: max {slowest['predict_s']:.2f} s ({slowest['model']}), "
              f"median {np.median([r['predict_s'] for r in doc['models']]):.2f} s")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
