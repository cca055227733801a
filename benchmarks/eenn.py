"""Early-exit co-design against static networks: the `eenn` preset and its static baselines.

Runs four searches with the same settings, budget and seed, at once in four processes of
one torch thread each (so each is deterministic; two CPU cores run them in about half the
time one search after another would take):

  eenn         the preset as shipped: exits, their thresholds and the bit widths searched
  eenn-int8    the same with every bit width (backbone and exit heads) pinned to 8: exits
               and thresholds searched, so its saving is the exits' alone
  static-int8  the same space with every exit pinned off and the backbone at 8 bits
  static-fp32  the same, with the backbone at 32 bits (fp32)

then picks, on the eenn front, the lowest-EDP point whose accuracy is within 1 point of the
most accurate static int8 network, and compares its expected EDP at iso-accuracy: with the
lowest-EDP static int8 (and fp32) network at least as accurate as it (the most accurate
static network where none is); the comparison with the most accurate static networks is
printed too.  The same choice and comparison are made for the eenn-int8 front, so the
saving from exits is told apart from the saving from lower bit widths.  Writes the four run
folders and an HTML report (`nasctl report`) under DIR and prints, as its last line, one
JSON document:

  accuracy, edp, latency_ms, energy_mj, exit_overhead, dynamic_efficiency, exit_rates,
  trial, arch                            of the chosen eenn point (null if none qualifies)
  static_int8_accuracy, static_int8_edp  of the most accurate static int8 network
  static_fp32_accuracy, static_fp32_edp  of the most accurate static fp32 network
  edp_reduction_vs_static_int8           1 - edp / EDP of matched_static_int8 (iso-accuracy)
  edp_reduction_vs_static_fp32           1 - edp / EDP of matched_static_fp32
  matched_static_int8, matched_static_fp32   trial, accuracy, edp of those static networks
  edp_reduction_vs_most_accurate_static_int8 / _fp32   1 - edp / static_int8_edp (fp32)
  exits_int8                             the same figures for the eenn-int8 search (bits pinned
                                         to 8: accuracy, edp, ..., edp_reduction_vs_static_int8,
                                         matched_static_int8, ...), null members if no point
                                         qualifies
  seed, budget, epochs, runs, report, wall_s

    python benchmarks/eenn.py --seed 0 --out DIR [--budget N] [--epochs N] [--dataset D] [--space S]

(`--space ee-vit`: the same comparison on the vision-transformer space; see benchmarks/vit.py.)
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
        elif v.name in ("backbone_bits", "attn_bits") or re.fullmatch(r"s\d+_bits", v.name):
            pins[v.name] = bits
    return pins


def int8_pins(space) -> dict:
    """Knob values that fix every bit width of `space` (backbone, stages, exit heads) at 8 and
    leave the exits and their thresholds free: the early-exit network without low-bit gains."""
    return {v.name: 8 for v in space.variables()
            if v.name in ("backbone_bits", "attn_bits", "exit_bits") or re.fullmatch(r"s\d+_bits", v.name)}


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


def choose(front: list[dict], best_int8: dict) -> dict | None:
    """The lowest-EDP front point within ACCURACY_MARGIN points of the most accurate static
    int8 network, or None."""
    qualifying = [r for r in front if r["accuracy"] >= best_int8["accuracy"] - ACCURACY_MARGIN]
    return min(qualifying, key=lambda r: r["edp"]) if qualifying else None


def compare(chosen: dict | None, exits: list[str], int8: list[dict], fp32: list[dict]) -> dict:
    """The figures of one chosen early-exit point against the static int8 and fp32 networks
    (`int8`, `fp32`: their feasible trials); every value None where no point was chosen."""
    best_int8, best_fp32 = most_accurate(int8), most_accurate(fp32)
    ref_int8 = matched(int8, chosen["accuracy"]) if chosen else None
    ref_fp32 = matched(fp32, chosen["accuracy"]) if chosen else None
    pick = (lambda key: chosen[key]) if chosen else (lambda key: None)
    return {
        "accuracy": pick("accuracy"), "edp": pick("edp"), "latency_ms": pick("latency_ms"),
        "energy_mj": pick("energy_mj"), "exit_overhead": pick("exit_overhead"),
        "dynamic_efficiency": pick("dynamic_efficiency"),
        "exit_rates": {e: chosen[f"exit_rate_{e}"] for e in exits} if chosen else None,
        "trial": pick("trial"), "arch": json.loads(chosen["arch"]) if chosen else None,
        # against the static network of at least the same accuracy with the lowest EDP
        "edp_reduction_vs_static_int8": 1 - chosen["edp"] / ref_int8["edp"] if chosen else None,
        "edp_reduction_vs_static_fp32": 1 - chosen["edp"] / ref_fp32["edp"] if chosen else None,
        "matched_static_int8": {k: ref_int8[k] for k in ("trial", "accuracy", "edp")} if chosen else None,
        "matched_static_fp32": {k: ref_fp32[k] for k in ("trial", "accuracy", "edp")} if chosen else None,
        # against the most accurate static network
        "edp_reduction_vs_most_accurate_static_int8": 1 - chosen["edp"] / best_int8["edp"] if chosen else None,
        "edp_reduction_vs_most_accurate_static_fp32": 1 - chosen["edp"] / best_fp32["edp"] if chosen else None,
    }


def summary_line(name: str, chosen: dict | None, figures: dict) -> str:
    """One printed line: the chosen point of search `name` against the static networks."""
    if not chosen:
        return f"{name}: no front point is within {ACCURACY_MARGIN:g} point of the static int8 accuracy"
    arch = json.loads(chosen["arch"])
    heads = [e for e in figures["exit_rates"] if arch.get(f"exit_{e}")]
    exits = f"exits {'+'.join(heads)} int{arch.get('exit_bits')}" if heads else "no early exit"
    ref_int8, ref_fp32 = figures["matched_static_int8"], figures["matched_static_fp32"]
    return (f"{name} chosen point: trial {chosen['trial']}, {chosen['accuracy']:.2f}%, "
            f"backbone int{arch.get('backbone_bits')}, {exits}, EDP {chosen['edp'] * 1e6:.4g} µJ·µs, exit rates "
            + " ".join(f"{e}:{r:.0%}" for e, r in figures["exit_rates"].items())
            + f"; EDP {_below(figures['edp_reduction_vs_static_int8'])} static int8 trial "
            f"{ref_int8['trial']} ({ref_int8['accuracy']:.2f}%, the lowest-EDP one at least as accurate), "
            f"{_below(figures['edp_reduction_vs_static_fp32'])} static fp32 trial {ref_fp32['trial']} "
            f"({ref_fp32['accuracy']:.2f}%); {_below(figures['edp_reduction_vs_most_accurate_static_int8'])} "
            "the most accurate static int8")


def _below(reduction: float) -> str:
    return f"{100 * reduction:.1f}% below" if reduction >= 0 else f"{-100 * reduction:.1f}% above"


def plan(values: dict, space) -> dict[str, dict]:
    """The settings of the four searches, by run-folder name."""
    return {"eenn": values,
            "eenn-int8": {**values, "pin": int8_pins(space)},
            "static-int8": {**values, "pin": static_pins(space, 8)},
            "static-fp32": {**values, "pin": static_pins(space, 32)}}


def summarize(done: dict) -> dict:
    """The figures of the finished searches (`plan`'s names, each a loaded run): the chosen
    eenn point against the static networks, and the same for the eenn-int8 search under
    `exits_int8`; `_chosen` and `_chosen_int8` hold the two chosen trial rows (or None)."""
    eenn, eenn8, int8, fp32 = done["eenn"], done["eenn-int8"], done["static-int8"], done["static-fp32"]
    best_int8, best_fp32 = most_accurate(int8.feasible), most_accurate(fp32.feasible)
    chosen, chosen8 = choose(eenn.front, best_int8), choose(eenn8.front, best_int8)
    exits = [k.removeprefix("exit_rate_") for k in eenn.trials[0] if k.startswith("exit_rate_")]
    return {
        **compare(chosen, exits, int8.feasible, fp32.feasible),
        "static_int8_accuracy": best_int8["accuracy"], "static_int8_edp": best_int8["edp"],
        "static_fp32_accuracy": best_fp32["accuracy"], "static_fp32_edp": best_fp32["edp"],
        "exits_int8": compare(chosen8, exits, int8.feasible, fp32.feasible),
        "_chosen": chosen, "_chosen_int8": chosen8,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="folder for the four run folders and the report")
    ap.add_argument("--preset", default="eenn")
    ap.add_argument("--space", help="search space of the four searches [default: the preset's]")
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
                                     ("dataset", args.dataset), ("space", args.space)) if v is not None})
    cfg = make_config(values, f"preset {args.preset}")  # checks the settings before anything runs
    space = load_space(cfg.space)
    searches = plan(values, space)
    taken = [name for name in searches if (args.out / name / "trials.csv").exists()]
    if taken:
        raise SystemExit(f"error: {args.out} already holds the run(s) {', '.join(taken)}; choose another --out")
    args.out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(len(searches)) as pool:
        jobs = {name: pool.apply_async(_search, (v, str(args.out / name))) for name, v in searches.items()}
        done = {name: runs.load(job.get()) for name, job in jobs.items()}

    eenn = done["eenn"]
    figures = summarize(done)
    chosen, chosen8 = figures.pop("_chosen"), figures.pop("_chosen_int8")
    report = write_report(eenn, [done[n] for n in searches if n != "eenn"], args.out / "report",
                          chosen["trial"] if chosen else None)
    result = {"seed": cfg.seed, "budget": cfg.budget, "epochs": cfg.epochs, "dataset": cfg.dataset, **figures,
              "runs": {name: str(r.path) for name, r in done.items()}, "report": str(report),
              "wall_s": round(time.perf_counter() - t0, 1)}
    best_int8, best_fp32 = most_accurate(done["static-int8"].feasible), most_accurate(done["static-fp32"].feasible)
    print(f"{args.preset}: {len(eenn.trials)} trials per search, seed {cfg.seed}, {cfg.epochs} epochs, "
          f"{result['wall_s']:.0f} s")
    print(f"most accurate static int8: {best_int8['accuracy']:.2f}%, EDP {best_int8['edp'] * 1e6:.4g} µJ·µs "
          f"(trial {best_int8['trial']})")
    print(f"most accurate static fp32: {best_fp32['accuracy']:.2f}%, EDP {best_fp32['edp'] * 1e6:.4g} µJ·µs "
          f"(trial {best_fp32['trial']})")
    print(summary_line("eenn", chosen, result))
    print(summary_line("eenn-int8 (exits alone, every bit width 8)", chosen8, result["exits_int8"]))
    print(f"report: {report}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
