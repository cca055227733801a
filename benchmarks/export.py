"""From a front point to a deployed model: export every front trial of a search, run it
with onnxruntime, and compare with what the search recorded.

    python benchmarks/export.py [--run RUN] [--budget B] [--epochs E] [--seed S] [--rounds 15] [--json FILE]

Without --run it first runs `nasctl search` on the embedded defaults (digits, ee-mbv2,
edge-quad; budget 40, 5 epochs, seed 0 unless given) into a temporary run folder.  For each
front trial it prints:
  - export time and model.onnx size;
  - accuracy and exit rates of the exported graph under onnxruntime, beside the trial's
    (the largest difference over the exits, in points);
  - latency of an input leaving at the first exit and of one reaching the final
    classifier (onnxruntime, 1 thread, interleaved minimum), the saving this is, and the
    share of the final path's MACs that leaving at the first exit skips;
  - `nasctl predict model.onnx --device <run's device>` with the card beside it, against
    the trial's recorded latency and energy;
  - how many of its 8-bit convolutions onnxruntime runs as integer kernels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nasctl(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nasctl", "--workspace", str(ROOT), *args], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"nasctl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def macs_per_exit(card: dict) -> list[float]:
    """MACs of reaching each exit (backbone to it and the heads passed)."""
    from nasctl.spaces.loader import load_space

    space = load_space(card["space"]["file"])
    layers = space.to_layers(card["arch"], tuple(card["input"]["shape"][1:]), card["classes"])
    n = len(card["exits"])
    return [float(sum(l.macs for l in layers if l.segment <= k)) for k in range(n)]


def integer_kernels(model: Path) -> tuple[int, int]:
    """(8-bit convs onnxruntime fuses into integer kernels, 8-bit convs) of an exported model."""
    import onnx

    from nasctl.hardware.onnx_import import _in_runtime, all_nodes as nodes

    m = onnx.load(model)
    init = {i.name: i.data_type for i in m.graph.initializer}
    producer = {o: n for n in nodes(m.graph) for o in n.output}
    convs = [n for n in nodes(m.graph) if n.op_type == "Conv" and (p := producer.get(n.input[1])) is not None
             and p.op_type == "DequantizeLinear" and init.get(p.input[0]) == onnx.TensorProto.UINT8]
    ran = _in_runtime(model)
    apart = ran.float_nodes if ran is not None else set()
    return sum((n.name, n.op_type) not in apart for n in convs), len(convs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="an existing run folder (else a search is run first)")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    tmp = tempfile.TemporaryDirectory(prefix="nasctl-export-bench-")
    run = Path(args.run) if args.run else Path(tmp.name) / "run"
    if not args.run:
        t0 = time.perf_counter()
        flags = [x for k in ("budget", "epochs", "seed") if getattr(args, k) is not None
                 for x in (f"--{k}", str(getattr(args, k)))]
        nasctl("search", *flags, "--run-dir", str(run))
        size = sum(f.stat().st_size for f in (run / "models").rglob("*") if f.is_file())
        print(f"nasctl search {' '.join(flags)}: {time.perf_counter() - t0:.0f} s; kept weights "
              f"{size / 2**20:.1f} MiB for {len(list((run / 'models').iterdir()))} trained networks")
    front = json.loads(nasctl("runs", "show", str(run), "--json"))["front"]
    rows = []
    print(f"{'trial':>5} {'export s':>8} {'KiB':>6} {'acc ort':>8} {'acc run':>8} {'max rate diff':>13} "
          f"{'first ms':>8} {'final ms':>8} {'saving':>7} {'MACs skipped':>12} {'pred lat':>9} {'pred en':>8} "
          f"{'int8 fused':>10}")
    for t in front:
        trial = int(t["trial"])
        out = Path(tmp.name) / f"trial-{trial}"
        t0 = time.perf_counter()
        card = json.loads(nasctl("export", str(run), "--trial", str(trial), "--out", str(out), "--json"))
        export_s = time.perf_counter() - t0
        ev = json.loads(nasctl("eval", str(out), "--rounds", str(args.rounds), "--json"))
        pred = json.loads(nasctl("predict", str(out / "model.onnx"), "--device", card["run"]["device"], "--json"))
        macs = macs_per_exit(card)
        exits = card["exits"]
        lat = ev["latency_ms"]["per_exit"]
        first = next((e for e in exits[:-1] if lat.get(e) is not None), None)
        saving = skipped = None
        if first is not None and lat.get("final") is not None:
            saving = 1 - lat[first] / lat["final"]
            skipped = 1 - macs[exits.index(first)] / macs[-1]
        run_fig = card["figures"]["run"]
        rate_diff = max(abs(ev["exit_rates"][e] - (run_fig["exit_rates"][e] or 0.0)) for e in exits) * 100
        expected = pred.get("expected") or {}
        fused, convs8 = integer_kernels(out / "model.onnx")
        row = {"trial": trial, "export_s": export_s, "onnx_kib": (out / "model.onnx").stat().st_size / 1024,
               "accuracy_onnx": ev["accuracy"], "accuracy_run": run_fig["accuracy"], "max_rate_diff": rate_diff,
               "first_exit": first, "first_ms": lat.get(first) if first else None, "final_ms": lat.get("final"),
               "saving": saving, "macs_skipped": skipped,
               "predicted_latency_ms": expected.get("latency_ms"), "run_latency_ms": run_fig["latency_ms"],
               "predicted_energy_mj": expected.get("energy_mj"), "run_energy_mj": run_fig["energy_mj"],
               "int8_convs_fused": fused, "int8_convs": convs8}
        rows.append(row)
        pct = lambda a, b: "-" if a is None or not b else f"{100 * (a / b - 1):+.2f}%"  # noqa: E731
        f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        print(f"{trial:>5} {export_s:>8.1f} {row['onnx_kib']:>6.1f} {ev['accuracy']:>8.2f} "
              f"{run_fig['accuracy']:>8.2f} {rate_diff:>13.2f} {f(row['first_ms'], '.3f'):>8} "
              f"{f(row['final_ms'], '.3f'):>8} {f(saving and 100 * saving, '.0f'):>6}% "
              f"{f(skipped and 100 * skipped, '.0f'):>11}% "
              f"{pct(expected.get('latency_ms'), run_fig['latency_ms']):>9} "
              f"{pct(expected.get('energy_mj'), run_fig['energy_mj']):>8} {fused:>5}/{convs8:<4}")
    ok = [r for r in rows if r["saving"] is not None]
    if ok:
        worst = min(r["saving"] / r["macs_skipped"] for r in ok if r["macs_skipped"])
        print(f"saving / MAC share skipped: worst {worst:.2f} over {len(ok)} models with an early exit taken")
    print(f"largest accuracy difference {max(abs(r['accuracy_onnx'] - r['accuracy_run']) for r in rows):.2f} points, "
          f"largest exit-rate difference {max(r['max_rate_diff'] for r in rows):.2f} points")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
