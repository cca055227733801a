"""Early-exit co-design against static networks: the `eenn` preset and its static baselines.

Runs three searches with the same settings, budget and seed, at once in three processes of
one torch thread each (so each is deterministic; two CPU cores run them in about a third
of the time one search after another would take):

  eenn         the preset as shipped: exits, their thresholds and the bit widths searched
  static-int8  the same space with every exit pinned off and the backbone at 8 bits
  static-fp32  the same, with the backbone at 32 bits (fp32)

then picks, on the eenn front, the lowest-EDP point whose accuracy is within 1 point of the
most accurate static int8 network, and compares its expected EDP at iso-accuracy: with the
lowest-EDP static int8 (and fp32) network at least as accurate as it (the most accurate
static network where none is); the comparison with the most accurate static networks is
printed too.  Writes the three run folders and an HTML
report (`nasctl report`) under DIR and prints, as its last line, one JSON document:

  accuracy, edp, latency_ms, energy_mj, exit_overhead, dynamic_efficiency, exit_rates,
  trial, arch                            of the chosen eenn point (null if none qualifies)
  static_int8_accuracy, static_int8_edp  of the most accurate static int8 network
  static_fp32_accuracy, static_fp32_edp  of the most accurate static fp32 network
  edp_reduction_vs_static_int8           1 - edp / EDP of matched_static_int8 (iso-accuracy)
  edp_reduction_vs_static_fp32           1 - edp / EDP of matched_static_fp32
  matched_static_int8, matched_static_fp32   trial, accuracy, edp of those static networks
  edp_reduction_vs_most_accurate_static_int8 / _fp32   1 - edp / static_int8_edp (fp32)
  seed, budget, epochs, runs, report, wall_s

    python benchmarks/eenn.py --seed 0 --out DIR [--budget N] [--epochs N] [--dataset D]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import time
from pathlib import Path

ACCURACY_MARGIN = 1.0  # points below the best static int8 network a chosen point may be


def static_pins(space, bits: int) -> dict:
    """Knob values that make `space` static at `bits`: exits off, backbone bit widths fixed,
    the knobs of absent exits at their first choice (they change nothing)."""
    early = set(space.exit_names()[:-1])
    pins = {}
    for v in space.variables():
        if v.name.startswith("exit_"):
            pins[v.name] = 0 if v.name.removeprefix("exit_") in early else v.choices[0]
        elif v.name == "backbone_bits" or re.fullmatch(r"s\d+_bits", v.name):
            pins[v.name] = bits
    return pins


def _search(values: dict, run_dir: str) -> str:
    """One search in this process, on one torch thread."""
    import torch

    from nasctl.config import make_config
    from nasctl.engine import run_search

    torch.set_num_threads(1)
    return str(run_search(make_config(values, "eenn benchmark"), Path(run_dir)).run_dir)


def most_accurate(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: (r["accuracy"], -r["edp"]))


def matched(rows: list[dict], accuracy: float) -> dict:
    """The static network an early-exit point at `accuracy` replaces: the lowest-EDP one at
    least as accurate (iso-accuracy), or the most accurate where none is."""
    as_good = [r for r in rows if r["accuracy"] >= accuracy]
    return min(as_good, key=lambda r: r["edp"]) if as_good else most_accurate(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="folder for the three run folders and the report")
    ap.add_argument("--preset", default="eenn")
    ap.add_argument("--budget", type=int, help="candidates per search [default: the preset's]")
    ap.add_argument("--epochs", type=int, help="training epochs per candidate [default: the preset's]")
    ap.add_argument("--dataset", help="digits, a CIFAR-10 python-batches folder or an .npz [default: the preset's]")
    args = ap.parse_args()

    from nasctl import runs
    from nasctl.config import make_config, read_settings
    from nasctl.report import write_report
    from nasctl.spaces.loader import load_space

    t0 = time.perf_counter()
    values, _ = read_settings(preset=args.preset)
    values.update({k: v for k, v in (("seed", args.seed), ("budget", args.budget), ("epochs", args.epochs),
                                     ("dataset", args.dataset)) if v is not None})
    cfg = make_config(values, f"preset {args.preset}")  # checks the settings before anything runs
    space = load_space(cfg.space)
    searches = {"eenn": values,
                "static-int8": {**values, "pin": static_pins(space, 8)},
                "static-fp32": {**values, "pin": static_pins(space, 32)}}
    taken = [name for name in searches if (args.out / name / "trials.csv").exists()]
    if taken:
        raise SystemExit(f"error: {args.out} already holds the run(s) {', '.join(taken)}; choose another --out")
    args.out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(len(searches)) as pool:
        jobs = {name: pool.apply_async(_search, (v, str(args.out / name))) for name, v in searches.items()}
        done = {name: runs.load(job.get()) for name, job in jobs.items()}

    eenn, int8, fp32 = done["eenn"], done["static-int8"], done["static-fp32"]
    best_int8, best_fp32 = most_accurate(int8.feasible), most_accurate(fp32.feasible)
    qualifying = [r for r in eenn.front if r["accuracy"] >= best_int8["accuracy"] - ACCURACY_MARGIN]
    chosen = min(qualifying, key=lambda r: r["edp"]) if qualifying else None
    report = write_report(eenn, [int8, fp32], args.out / "report", chosen["trial"] if chosen else None)
    exits = [k.removeprefix("exit_rate_") for k in eenn.trials[0] if k.startswith("exit_rate_")]
    pick = (lambda key: chosen[key]) if chosen else (lambda key: None)
    ref_int8 = matched(int8.feasible, chosen["accuracy"]) if chosen else None
    ref_fp32 = matched(fp32.feasible, chosen["accuracy"]) if chosen else None
    result = {
        "seed": cfg.seed, "budget": cfg.budget, "epochs": cfg.epochs, "dataset": cfg.dataset,
        "accuracy": pick("accuracy"), "edp": pick("edp"), "latency_ms": pick("latency_ms"),
        "energy_mj": pick("energy_mj"), "exit_overhead": pick("exit_overhead"),
        "dynamic_efficiency": pick("dynamic_efficiency"),
        "exit_rates": {e: chosen[f"exit_rate_{e}"] for e in exits} if chosen else None,
        "trial": pick("trial"), "arch": json.loads(chosen["arch"]) if chosen else None,
        "static_int8_accuracy": best_int8["accuracy"], "static_int8_edp": best_int8["edp"],
        "static_fp32_accuracy": best_fp32["accuracy"], "static_fp32_edp": best_fp32["edp"],
        # against the static network of at least the same accuracy with the lowest EDP
        "edp_reduction_vs_static_int8": 1 - chosen["edp"] / ref_int8["edp"] if chosen else None,
        "edp_reduction_vs_static_fp32": 1 - chosen["edp"] / ref_fp32["edp"] if chosen else None,
        "matched_static_int8": {k: ref_int8[k] for k in ("trial", "accuracy", "edp")} if chosen else None,
        "matched_static_fp32": {k: ref_fp32[k] for k in ("trial", "accuracy", "edp")} if chosen else None,
        # against the most accurate static network
        "edp_reduction_vs_most_accurate_static_int8": 1 - chosen["edp"] / best_int8["edp"] if chosen else None,
        "edp_reduction_vs_most_accurate_static_fp32": 1 - chosen["edp"] / best_fp32["edp"] if chosen else None,
        "runs": {name: str(r.path) for name, r in done.items()}, "report": str(report),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"{args.preset}: {len(eenn.trials)} trials per search, seed {cfg.seed}, {cfg.epochs} epochs, "
          f"{result['wall_s']:.0f} s")
    print(f"most accurate static int8: {best_int8['accuracy']:.2f}%, EDP {best_int8['edp'] * 1e6:.4g} µJ·µs "
          f"(trial {best_int8['trial']})")
    print(f"most accurate static fp32: {best_fp32['accuracy']:.2f}%, EDP {best_fp32['edp'] * 1e6:.4g} µJ·µs "
          f"(trial {best_fp32['trial']})")
    if chosen:
        print(f"chosen early-exit point: trial {chosen['trial']}, {chosen['accuracy']:.2f}%, EDP "
              f"{chosen['edp'] * 1e6:.4g} µJ·µs, exit rates "
              + " ".join(f"{e}:{chosen[f'exit_rate_{e}']:.0%}" for e in exits)
              + f"; EDP {100 * result['edp_reduction_vs_static_int8']:.1f}% below static int8 trial "
              f"{ref_int8['trial']} ({ref_int8['accuracy']:.2f}%, the lowest-EDP one at least as accurate), "
              f"{100 * result['edp_reduction_vs_static_fp32']:.1f}% below static fp32 trial {ref_fp32['trial']} "
              f"({ref_fp32['accuracy']:.2f}%); {100 * result['edp_reduction_vs_most_accurate_static_int8']:.1f}% "
              "below the most accurate static int8")
    else:
        print(f"no front point is within {ACCURACY_MARGIN:g} point of the static int8 accuracy")
    print(f"report: {report}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
