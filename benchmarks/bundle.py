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
                                [--reuse] [--control] [--json FILE]

DIR defaults to runs/bundle-bench (git-ignored); the virtual environment is kept there
(DIR/target-venv) and reused.  `--reuse` keeps the devices of a previous run; `--control`
profiles once more (device `profiled-again`) and prices the zoo with it too: how far two
`hw profile` devices of the same networks measured minutes apart are from each other,
the noise floor the bundle device's difference is to be read against.
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
    ap.add_argument("--reuse", action="store_true", help="keep the devices a previous run of this script wrote")
    ap.add_argument("--control", action="store_true", help="profile once more (device 'profiled-again'): how far "
                    "two hw profile devices of the same networks are apart")
    ap.add_argument("--json", type=Path, help="also write the full result as JSON here")
    args = ap.parse_args()
    ws = args.workspace
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "pyproject.toml").write_text("[tool.nasctl]\n", encoding="utf-8")
    bundle = ws / "bundle"
    seconds, written = {}, None

    def timed(what, f):
        t0 = time.perf_counter()
        result = f()
        seconds[what] = round(time.perf_counter() - t0, 1)
        print(f"  {what}: {seconds[what]:.0f} s", flush=True)
        return result

    def profile(name):
        return nasctl(ws, "hw", "profile", "--device", name, "--kernels", args.kernels, "--seed", args.seed,
                      "--rounds", args.rounds)

    if not args.reuse:
        python = target_python(ws / "target-venv")
        shutil.rmtree(bundle, ignore_errors=True)
        written = timed("bundle", lambda: nasctl(ws, "hw", "bundle", "--out", bundle, "--kernels", args.kernels,
                                                 "--seed", args.seed))
        print(f"  bundle {written['id']}: {written['networks']} networks, {written['kernels']} kernels, "
              f"{written['megabytes']:.0f} MB")

        def run_bundle():
            cmd = [str(python), str(bundle / "runner.py"), "--rounds", str(args.rounds)]
            print("$ " + " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            return nasctl(ws, "hw", "fit", "--device", "from-bundle", "--bundle-results", bundle / "results.csv",
                          "--overwrite")

        steps = [("profile", lambda: profile("profiled")), ("runner + fit", run_bundle)]
        for what, step in (steps if args.profile_first else steps[::-1]):
            timed(what, step)
    if args.control:
        timed("profile again", lambda: profile("profiled-again"))

    from nasctl import workspace
    from nasctl.hardware.loader import load_device
    from nasctl.hardware.measure.profile import validate_models
    from nasctl.hardware.zoo import export_zoo

    workspace.set_workspace(ws)
    names = {"hw profile": "profiled", "bundle": "from-bundle"}
    if args.control or (ws / "hardware" / "profiled-again").is_dir():
        names["hw profile again"] = "profiled-again"
    devices = [load_device(n) for n in names.values()]
    paths = export_zoo(ws / "zoo")
    doc = timed("zoo", lambda: validate_models(devices[0], paths, rounds=args.rounds, compare=devices[1:]))
    docs = dict(zip(names, [doc, *doc["compared"]]))
    print(f"\n{'model':<28}{'measured ms':>13}" + "".join(f"{w:>18}" for w in names))
    for i, r in enumerate(doc["models"]):
        print(f"{r['model']:<28}{r['measured_ms']:>13.3f}" + "".join(f"{d['models'][i]['error_pct']:>+17.1f}%"
                                                                    for d in docs.values()))
    figures = {}
    print()
    for what, d in docs.items():
        s = d["summary"]
        print(summary_line(f"{s['models']} zoo models, {what} device", s))
        adjusted = load_adjusted(d["models"], s)
        print_load_adjusted(f"  {what} device", adjusted)
        figures[what] = {**s, "load_adjusted": adjusted}
    a = figures["hw profile"]
    for what, b in list(figures.items())[1:]:
        print(f"\n{what} - hw profile: {(b['within_10pct'] - a['within_10pct']) * 100:+.1f} points within ±10%, "
              f"{(b['within_5pct'] - a['within_5pct']) * 100:+.1f} points within ±5%, "
              f"RMS error {b['rms_error_pct'] - a['rms_error_pct']:+.2f} points")
        if a["load_adjusted"] and b["load_adjusted"]:
            gap = (b["load_adjusted"]["within_10pct"] - a["load_adjusted"]["within_10pct"]) * 100
            print(f"  load-adjusted: {gap:+.1f} points within ±10%; the machine ran at "
                  f"{a['load_adjusted']['factor']:.3f}x the hw profile device's times and "
                  f"{b['load_adjusted']['factor']:.3f}x the {what} device's (by {b['machine_vs_profile_from']})")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": seconds,
                                         "bundle": written, "figures": figures, "zoo": doc}, indent=2),
                             encoding="utf-8")


if __name__ == "__main__":
    main()
