"""How well the profiled `cpu-local` device predicts whole models on this machine.

Profiles this machine into a workspace (`nasctl hw profile --device cpu-local`; reused
if the workspace already holds one, unless --reprofile), exports the reference zoo of
ONNX models (`nasctl.hardware.zoo.export_zoo`), measures every model end to end with
onnxruntime by the device's protocol, prices it with the device, and prints each
model's error and the figures: the share of models within ±10% and ±5% of their
measured latency, and the RMS percentage error.

    python benchmarks/cpu_local.py [--workspace DIR] [--reprofile | --refit] [--kernels N] [--rounds N] [--json FILE]
    python benchmarks/cpu_local.py [--workspace DIR] --rows-against OTHER

--rows-against compares the kernel table with OTHER's (a workspace whose `cpu-local` measured
the same context networks again: `--workspace OTHER --reprofile`, same --kernels): for the
kernels both hold, by kernel size, how far one measurement of a kernel's in-context time is
from the other's.

DIR defaults to runs/cpu-local-bench (git-ignored) beside this checkout's data.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from nasctl import workspace
from nasctl.hardware.fit import write_device
from nasctl.hardware.loader import load_device
from nasctl.hardware.measure.profile import (MEASUREMENTS_FILE, load_adjusted, profile_machine, refit_profile,
                                           validate_models)
from nasctl.hardware.measure.timing import Protocol

DEFAULT_WORKSPACE = Path(__file__).resolve().parents[1] / "runs" / "cpu-local-bench"


def ensure_device(folder: Path, reprofile: bool, kernels: int = 15000, rounds: int = 15, refit: bool = False):
    """The `cpu-local` device of the workspace `folder`, profiled first if it has none
    (or if `reprofile`), or fitted again from the networks its profile measured (`refit`);
    the workspace becomes the current one."""
    folder.mkdir(parents=True, exist_ok=True)
    workspace.set_workspace(folder)
    spec = folder / "hardware" / "cpu-local" / "spec.yaml"
    if refit and not reprofile:
        t0 = time.perf_counter()
        write_device(spec.parent, refit_profile("cpu-local", spec.parent))
        print(f"fitted again from {spec.parent / MEASUREMENTS_FILE} in {time.perf_counter() - t0:.0f} s")
    elif reprofile or not spec.is_file():
        t0 = time.perf_counter()
        fitted = profile_machine("cpu-local", Protocol(rounds=rounds, sessions=3), kernels=kernels)
        write_device(spec.parent, fitted)
        print(f"profiled {fitted.report['networks']} context networks ({fitted.report['layers']} kernels) "
              f"in {time.perf_counter() - t0:.0f} s -> {spec.parent}")
    else:
        print(f"reusing the profile in {spec.parent}")
    return load_device("cpu-local")


def print_machine_state(summary: dict) -> None:
    """How busy the machine was while validating, against the profile (`validate_models`)."""
    if "machine_vs_profile" in summary:
        print(f"the machine runs at {summary['machine_vs_profile']:.3f}x its profiled time now, by "
              f"{summary['machine_vs_profile_from']} (its load now against the "
              f"profile's typical chunk)")


def print_load_adjusted(what: str, adjusted: dict | None) -> None:
    if adjusted:
        print(f"{what}, predictions x {adjusted['factor']:.3f} (the machine's load now): "
              f"{adjusted['within_10pct'] * 100:.0f}% within ±10%, {adjusted['within_5pct'] * 100:.0f}% within ±5%, "
              f"worst {adjusted['worst_pct']:+.1f}%, median {adjusted['median_pct']:+.1f}%")


SIZE_BUCKETS_US = (0, 1, 2, 5, 20, 100, float("inf"))


def row_repeatability(table: Path, other: Path) -> list[dict]:
    """The kernels both tables hold, grouped by their time (the geometric mean of the two,
    in the buckets of SIZE_BUCKETS_US): per bucket the kernel count, the median
    |other / table - 1|, the shares within ±10% and within a factor of 2, and the median
    ratio."""
    from nasctl.hardware.lut import layer_from_row, read_lut

    def times(path: Path) -> dict:
        return {layer_from_row(r).shape_key(): float(r["latency_ms"]) * 1e3 for r in read_lut(path)}

    a, b = times(table), times(other)
    both = [k for k in a if k in b]
    size = np.array([np.sqrt(a[k] * b[k]) for k in both])
    ratio = np.array([b[k] / a[k] for k in both])
    out = []
    for lo, hi in zip(SIZE_BUCKETS_US, SIZE_BUCKETS_US[1:]):
        r = ratio[(size >= lo) & (size < hi)]
        if r.size:
            out.append({"from_us": lo, "to_us": hi, "kernels": int(r.size),
                        "median_abs_change": float(np.median(np.abs(r - 1))),
                        "within_10pct": float(np.mean(np.abs(r - 1) <= 0.10)),
                        "within_2x": float(np.mean(np.abs(np.log(r)) <= np.log(2))),
                        "median_ratio": float(np.median(r))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE, help="workspace holding hardware/cpu-local/")
    ap.add_argument("--reprofile", action="store_true", help="profile again even if the workspace has a profile")
    ap.add_argument("--refit", action="store_true", help="fit the device again from the networks its profile measured")
    ap.add_argument("--kernels", type=int, default=15000, help="kernels to profile (nasctl hw profile --kernels)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--json", type=Path, help="also write the full result as JSON here")
    ap.add_argument("--rows-against", type=Path, metavar="OTHER",
                    help="compare the kernel table with OTHER's cpu-local (the same context networks measured "
                         "again) by kernel size, and stop")
    args = ap.parse_args()

    if args.rows_against is not None:
        tables = [ws / "hardware" / "cpu-local" / "lut.csv" for ws in (args.workspace, args.rows_against)]
        missing = [str(t) for t in tables if not t.is_file()]
        if missing:
            raise SystemExit(f"no kernel table {' or '.join(missing)}: profile the workspace first "
                             f"(python benchmarks/cpu_local.py --workspace DIR)")
        rows = row_repeatability(*tables)
        print(f"{'kernel time':<16}{'kernels':>8}{'median change':>15}{'within ±10%':>13}{'within 2x':>11}"
              f"{'median ratio':>14}")
        for r in rows:
            print(f"{r['from_us']:g}-{r['to_us']:g} µs".ljust(16) + f"{r['kernels']:>8}{r['median_abs_change']:>14.1%}"
                  f"{r['within_10pct']:>13.0%}{r['within_2x']:>11.0%}{r['median_ratio']:>14.3f}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        return

    device = ensure_device(args.workspace, args.reprofile, args.kernels, args.rounds, args.refit)

    from nasctl.hardware.zoo import export_zoo

    zoo_dir = args.workspace / "zoo"
    paths = export_zoo(zoo_dir)
    doc = validate_models(device, paths, rounds=args.rounds)
    print(f"\n{'model':<28}{'predicted ms':>14}{'measured ms':>13}{'error':>9}")
    for r in doc["models"]:
        print(f"{r['model']:<28}{r['predicted_ms']:>14.3f}{r['measured_ms']:>13.3f}{r['error_pct']:>+8.1f}%")
    s = doc["summary"]
    print(f"\n{s['models']} zoo models: {s['within_10pct'] * 100:.0f}% within ±10%, "
          f"{s['within_5pct'] * 100:.0f}% within ±5%, RMS error {s['rms_error_pct']:.1f}%")
    print_machine_state(s)
    doc["load_adjusted"] = load_adjusted(doc["models"], s)
    print_load_adjusted("zoo", doc["load_adjusted"])
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
