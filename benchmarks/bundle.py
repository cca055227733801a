"""A device measured through a profiling bundle against the `hw profile` device of the same
networks, on the reference zoo, on this machine.

Creates a fresh virtual environment holding only numpy and onnxruntime (`python3 -m venv`,
`pip install numpy onnxruntime`), writes a bundle (`nasctl hw bundle --kernels N --seed S`),
runs its runner in that environment (no nasctl, no torch there), fits a device of its
results (`nasctl hw fit --bundle-results`), profiles this machine with the same --kernels
and --seed (`nasctl hw profile`, back to back with the runner; `--profile-first` swaps the
order), then measures the zoo once and prices it with both devices (`validate_models`
with `compare`: the same measurements for both, so the measuring noise is shared), and
prints each figure, their differences, and the machine's load against each profile.

    python benchmarks/bundle.py [--workspace DIR] [--kernels N] [--seed S] [--rounds R] [--profile-first]
                                [--json FILE]

DIR defaults to runs/bundle-bench (git-ignored); the virtual environment is kept there
(DIR/target-venv) and reused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cpu_local import load_adjusted, print_load_adjusted

DEFAULT_WORKSPACE = Path(__file__).resolve().parents[1] / "runs" / "bundle-bench"


def nasctl(workspace: Path, *args) -> dict:
    """Run a nasctl command (its progress on stderr, passed through); its --json document."""
    cmd = [sys.executable, "-m", "nasctl", "--workspace", str(workspace), *map(str, args), "--json"]
    print("$ nasctl " + " ".join(map(str, cmd[3:])), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"nasctl {' '.join(map(str, args))} failed with exit code {done.returncode}")
    return json.loads(done.stdout)


def target_python(folder: Path) -> Path:
    """A virtual environment holding only numpy and onnxruntime (and what they need)."""
    python = folder / "bin" / "python"
    if not python.is_file():
        subprocess.run(["python3", "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "numpy", "onnxruntime"], check=True)
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            check=True).stdout
    packages = {p["name"].lower(): p["version"] for p in json.loads(listed)}
    assert not {"nasctl", "torch", "onnx"} & set(packages), packages
    print(f"target environment {folder}: " + ", ".join(f"{k} {v}" for k, v in sorted(packages.items())))
    return python


def summary_line(what: str, s: dict) -> str:
    return (f"{what}: {s['within_10pct'] * 100:.0f}% within ±10%, {s['within_5pct'] * 100:.0f}% within ±5%, "
            f"RMS error {s['rms_error_pct']:.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE)
    ap.add_argument("--kernels", type=int, default=2500, help="kernels to measure (both devices)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the context networks (both devices)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--profile-first", action="store_true", help="run hw profile before the bundle's runner")
    ap.add_argument("--json", type=Path, help="also write the full result as JSON here")
    args = ap.parse_args()
    ws = args.workspace
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "pyproject.toml").write_text("[tool.nasctl]\n", encoding="utf-8")
    python = target_python(ws / "target-venv")
    bundle = ws / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    seconds = {}

    def timed(what, f):
        t0 = time.perf_counter()
        result = f()
        seconds[what] = round(time.perf_counter() - t0, 1)
        print(f"  {what}: {seconds[what]:.0f} s", flush=True)
        return result

    written = timed("bundle", lambda: nasctl(ws, "hw", "bundle", "--out", bundle, "--kernels", args.kernels,
                                             "--seed", args.seed))
    print(f"  bundle {written['id']}: {written['networks']} networks, {written['kernels']} kernels, "
          f"{written['megabytes']:.0f} MB")

    def run_bundle():
        cmd = [str(python), str(bundle / "runner.py"), "--rounds", str(args.rounds)]
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        return nasctl(ws, "hw", "fit", "--device", "from-bundle", "--bundle-results", bundle / "results.csv")

    def profile():
        return nasctl(ws, "hw", "profile", "--device", "profiled", "--kernels", args.kernels, "--seed", args.seed,
                      "--rounds", args.rounds)

    steps = [("profile", profile), ("runner + fit", run_bundle)]
    for what, step in (steps if args.profile_first else steps[::-1]):
        timed(what, step)

    from nasctl import workspace
    from nasctl.hardware.loader import load_device
    from nasctl.hardware.measure.profile import validate_models
    from nasctl.hardware.zoo import export_zoo

    workspace.set_workspace(ws)
    profiled, from_bundle = load_device("profiled"), load_device("from-bundle")
    paths = export_zoo(ws / "zoo")
    doc = timed("zoo", lambda: validate_models(profiled, paths, rounds=args.rounds, compare=[from_bundle]))
    other = doc["compared"][0]
    print(f"\n{'model':<28}{'measured ms':>13}{'hw profile':>12}{'bundle':>9}")
    for a, b in zip(doc["models"], other["models"]):
        print(f"{a['model']:<28}{a['measured_ms']:>13.3f}{a['error_pct']:>+11.1f}%{b['error_pct']:>+8.1f}%")
    figures = {}
    print()
    for what, d in (("hw profile device", doc), ("bundle device", other)):
        s = d["summary"]
        print(summary_line(f"{s['models']} zoo models, {what}", s))
        adjusted = load_adjusted(d["models"], s)
        print_load_adjusted(f"  {what}", adjusted)
        figures[what] = {**s, "load_adjusted": adjusted}
    a, b = figures["hw profile device"], figures["bundle device"]
    print(f"\nbundle - hw profile: {(b['within_10pct'] - a['within_10pct']) * 100:+.1f} points within ±10%, "
          f"{(b['within_5pct'] - a['within_5pct']) * 100:+.1f} points within ±5%, "
          f"RMS error {b['rms_error_pct'] - a['rms_error_pct']:+.2f} points")
    if a["load_adjusted"] and b["load_adjusted"]:
        print(f"load-adjusted: {(b['load_adjusted']['within_10pct'] - a['load_adjusted']['within_10pct']) * 100:+.1f} "
              f"points within ±10%; the machine ran at {a['load_adjusted']['factor']:.3f}x the profile's reference "
              f"times and {b['load_adjusted']['factor']:.3f}x the runner's")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": seconds,
                                         "bundle": written, "figures": figures, "zoo": doc}, indent=2),
                             encoding="utf-8")


if __name__ == "__main__":
    main()
