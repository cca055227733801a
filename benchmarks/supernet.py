"""Weight-sharing supernet on `ee-mbv2` (or `--space ee-vit`) with `digits`: speed of scoring
a candidate, rank agreement with stand-alone training, and a 2,000-candidate search against
the default one.

1. The supernet: `nasctl supernet train` into WORKSPACE (`--epochs`, reused when it is
   there already; its card's training time counts below).
2. Speed: per-candidate time of `--accuracy supernet:N` (inherit, recalibrate BN, calibrate
   exits, measure) beside 5-epoch proxy training of the same candidates, one thread each,
   measured in interleaved rounds (candidate by candidate, both ways), the minimum over
   `--rounds` per candidate; the median over candidates of each and their ratio.
3. Rank agreement: Kendall tau between the supernet's figures (accuracy, each exit rate)
   and the mean of stand-alone trainings, on two sets of 50 candidates from
   `predictors_eenn.candidates`: "tune" (seed 1, 3 trainings each: what the recipe was
   tuned on), "held" (seed 2, 10 trainings each: the held-out figure) and "held2" (seed 4,
   10 trainings each: a second held-out set).  The labels are
   read from their caches (runs/supernet-bench/labels-*.csv, made with
   `predictors_eenn.trainings`; another space's: labels-SPACE-*.csv); a set whose caches
   are incomplete is skipped, or trained first with `--train-labels`.  Beside each
   held-out set's figure, the yardstick of a predictor (ridge, GP, boosted trees, as
   `nasctl predictor train` fits them) fitted to the tune set's labels.
4. With `--search`: `nasctl search --accuracy supernet:N --budget 2000` (`--strategy`,
   `--workers`, journal storage, no kept weights) timed, plus the supernet's training time, against a
   default search (`nasctl search`, seed 0; or `--default-json FILE`, its recorded wall
   time); then every front point of the supernet search is retrained stand-alone as the
   default search trains (5 epochs, its seed) and priced again with its new exit rates,
   and the hypervolume of that retrained front is printed beside the default front's, at
   the default run's reference point (`nasctl.runs`), beside the default front trained once
   more with another seed, and at a reference point of the fronts themselves
   (`--fronts-only`: the searches of an earlier run, their fronts retrained again).

    python benchmarks/supernet.py [--space ee-mbv2] [--workspace runs/supernet-bench/ws] [--name bench] \\
        [--epochs E] [--members K [--member-counts 1,3]] [--train-labels] [--rounds 3] [--timing 8] \\
        [--sets tune,held,held2] [--partial] [--search] [--budget 2000] [--strategy nsga2] [--workers 1] \\
        [--default-json FILE] [--fronts-only]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import predictors_eenn as pe  # noqa: E402

from nasctl.predictors.metrics import kendall_tau  # noqa: E402
from nasctl.spaces.loader import load_space  # noqa: E402

LABELS = Path("runs/supernet-bench")
# candidates(space, 50, seed), trainings: "held2" was drawn after the held set had been looked at
# knob by knob (issue 19's member count was chosen on the tune set)
SETS = {"tune": (1, 3), "held": (2, 10), "held2": (4, 10)}


def nasctl(*args, workspace=None) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [str(Path(sys.executable).parent / "nasctl")] + (["--workspace", str(workspace)] if workspace else [])
    t0 = time.perf_counter()
    res = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd + [str(a) for a in args])} failed: {res.stderr.strip()[-400:]}")
    return time.perf_counter() - t0, res


def supernet(args):
    from nasctl import workspace
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.supernet import store

    args.workspace.mkdir(parents=True, exist_ok=True)
    workspace.set_workspace(args.workspace)
    if not (args.workspace / store.FOLDER / args.name / store.CARD).is_file():
        print(f"training supernet '{args.name}' ({args.epochs or 'default'} epochs) ...", flush=True)
        nasctl("supernet", "train", "--space", args.space, *(("--epochs", args.epochs) if args.epochs else ()),
               "--name", args.name, "--seed", 0, "--members", args.members or 1, workspace=args.workspace)
    space = load_space(args.space)
    data = load_dataset(pe.DATASET, 0)
    nets, card = store.load_members(args.name, space, data, split_seed=0)
    if args.members is not None and store.members(card) != args.members:
        raise SystemExit(f"supernet '{args.name}' in {args.workspace} has {store.members(card)} member(s), not "
                         f"--members {args.members}: give another --name")
    s = card["settings"]
    print(f"supernet '{args.name}': {store.members(card)} member(s), {card['epochs_done']} epochs (batch "
          f"{s['batch_size']}, lr {s['lr']}, {s['random_subnets']} random sub-networks a step, distillation "
          f"{s['distill']}), trained in {card['train_seconds']:.0f} s")
    return space, data, nets, card


def timing(space, data, nets, args) -> None:
    from nasctl.evaluation.train import TrainSettings, evaluate
    from nasctl.supernet.score import calibration_inputs, score_members

    archs = pe.candidates(space, args.timing, 3)
    settings = TrainSettings(epochs=5, threads=1)
    cal = calibration_inputs(data, 0)
    best = np.full((2, len(archs)), np.inf)
    for _ in range(args.rounds):
        for i, arch in enumerate(archs):
            t0 = time.perf_counter()
            score_members(nets, arch, data, settings, cal)
            t1 = time.perf_counter()
            evaluate(space, arch, data, settings, seed=0)
            t2 = time.perf_counter()
            best[:, i] = np.minimum(best[:, i], (t1 - t0, t2 - t1))
    sn, proxy = np.median(best, axis=1)
    ratios = best[1] / best[0]
    print(f"per candidate ({len(archs)} candidates, min over {args.rounds} interleaved rounds, median over "
          f"candidates, one thread): supernet ({len(nets)} member{'s' * (len(nets) > 1)}) {sn * 1e3:.0f} ms, "
          f"5-epoch proxy training {proxy:.2f} s: "
          f"{proxy / sn:.0f}x faster (per candidate {ratios.min():.0f}x - {ratios.max():.0f}x)")


def label_file(base: Path, r: int) -> Path:
    """The cache of the r-th training of a label set (`predictors_eenn.trainings`)."""
    return base if r == 0 else base.with_name(f"{base.stem}-r{r}{base.suffix}")


def complete(space, archs, base: Path, count: int) -> bool:
    from nasctl.spaces.base import arch_key

    for r in range(count):
        path = label_file(base, r)
        if not path.is_file():
            return False
        with path.open(newline="") as f:
            have = {row["arch"] for row in csv.DictReader(f)}
        if any(arch_key(a) not in have for a in archs):
            return False
    return True


def partial(archs, base: Path, count: int):
    """Each candidate's columns averaged over the cache files that hold every candidate
    (no training); (rows, how many files) or (None, 0)."""
    from nasctl.spaces.base import arch_key

    runs = []
    for r in range(count):
        path = label_file(base, r)
        if path.is_file():
            with path.open(newline="") as f:
                have = {row["arch"]: row for row in csv.DictReader(f)}
            if all(arch_key(a) in have for a in archs):
                runs.append([have[arch_key(a)] for a in archs])
    if not runs:
        return None, 0
    return [{c: (str(np.mean([float(run[i][c]) for run in runs])) if runs[0][i][c] else "")
             for c in runs[0][i] if c != "arch"} for i in range(len(archs))], len(runs)


def self_agreement(archs, base: Path, count: int) -> str:
    """How the labels' own trainings agree: one against the mean of the others, and the
    mean of one half against the other half's (Kendall tau, averaged over the splits)."""
    from itertools import combinations

    from nasctl.spaces.base import arch_key

    runs = []
    for r in range(count):
        with label_file(base, r).open(newline="") as f:
            have = {row["arch"]: row for row in csv.DictReader(f)}
        runs.append([float(have[arch_key(a)]["accuracy"]) for a in archs])
    runs = np.array(runs)
    if count < 2:
        return "one training: no self-agreement"
    one = np.mean([kendall_tau(runs[i], np.delete(runs, i, 0).mean(0)) for i in range(count)])
    line = f"the labels' trainings: one against the mean of the other {count - 1} {one:.3f}"
    if count >= 4:
        halves = [kendall_tau(runs[list(c)].mean(0), np.delete(runs, list(c), 0).mean(0))
                  for c in combinations(range(count), count // 2)]
        line += f", the mean of {count // 2} against the mean of the other {count - count // 2} {np.mean(halves):.3f}"
    return line


def label_cache(space_name: str, label: str) -> Path:
    """The cache of a label set's first training (`label_file` names the others)."""
    return LABELS / (f"labels-{label}-e5.csv" if space_name == pe.SPACE else f"labels-{space_name}-{label}-e5.csv")


def tune_labels(space):
    """The tune set's candidates and the means of their trainings, where all are cached
    (for `yardstick`), else None."""
    seed, count = SETS["tune"]
    archs = pe.candidates(space, 50, seed)
    cache = label_cache(space.name, "tune")
    if not complete(space, archs, cache, count):
        return None
    rows, _ = partial(archs, cache, count)
    return archs, np.array([float(r["accuracy"]) for r in rows])


def yardstick(space, fitted, archs, want) -> str:
    """How a predictor (`nasctl predictor train`'s models, default settings) fitted to the
    tune set's stand-alone labels ranks a held-out set: what 50 x 3 trainings give without
    a supernet."""
    from nasctl.predictors import make_predictor

    taus = []
    for kind in ("ridge", "gp", "gbt"):
        got, _ = make_predictor(kind, space, seed=0).fit(fitted[0], fitted[1]).predict(archs)
        taus.append(f"{kind} {kendall_tau(want, np.asarray(got)):.3f}")
    return "a predictor fitted to the tune set's labels ranks it at " + ", ".join(taus)


def agreement(space, data, nets, args) -> None:
    from types import SimpleNamespace

    from nasctl.evaluation.train import TrainSettings
    from nasctl.supernet.score import calibration_inputs, score_members

    cal = calibration_inputs(data, 0)
    exits = space.exit_names()
    for label, (seed, count) in SETS.items():
        if label not in args.sets.split(","):
            continue
        archs = pe.candidates(space, 50, seed)
        cache = label_cache(space.name, label)
        if complete(space, archs, cache, count) or args.train_labels:
            rows = pe.trainings(space, archs, cache, SimpleNamespace(epochs=5, seed=0, jobs=1), 0, count)
            print(f"{label} set: {self_agreement(archs, cache, count)}")
        elif args.partial:
            rows, count = partial(archs, cache, count)
            if rows is None:
                print(f"{label}: no complete training in {cache}; skipped")
                continue
            count = f"the {count} finished (of {SETS[label][1]})"
        else:
            print(f"{label}: labels incomplete in {cache} (+ -r1 ... -r{count - 1}); skipped (--partial: "
                  "use the trainings finished so far)")
            continue
        want = np.array([float(r["accuracy"]) for r in rows])
        counts = sorted({min(int(k), len(nets)) for k in args.member_counts.split(",")} | {len(nets)})
        for k in counts[:-1]:  # the first k members alone
            got = np.array([score_members(nets[:k], a, data, TrainSettings(threads=1), cal)[0].accuracy
                            for a in archs])
            print(f"{label} set, the first {k} member{'s' * (k > 1)}: accuracy Kendall tau "
                  f"{kendall_tau(want, got):.3f}")
        results = [score_members(nets, a, data, TrainSettings(threads=1), cal)[0] for a in archs]
        got = np.array([r.accuracy for r in results])
        line = [f"accuracy {kendall_tau(want, got):.3f}"]
        for e in exits:
            mine = np.array([r.exit_rates[space.active_exits(a).index(e)] if e in space.active_exits(a) else 0.0
                             for r, a in zip(results, archs)])
            theirs = np.array([float(r[f"exit_rate_{e}"]) for r in rows])
            line.append(f"exit rate {e} {kendall_tau(theirs, mine):.3f} (mean {mine.mean():.2f} vs {theirs.mean():.2f})")
        print(f"{label} set (50 candidates, labels: mean of {count} 5-epoch trainings; {len(nets)} member"
              f"{'s' * (len(nets) > 1)}), Kendall tau: " + ", ".join(line))
        print(f"  mean accuracy: supernet {got.mean():.2f}%, stand-alone {want.mean():.2f}%")
        fitted = tune_labels(space) if label != "tune" else None  # the tune set's, trained above if asked
        if fitted is not None:
            print(f"  yardstick: {yardstick(space, fitted, archs, want)}")


def search(args, card) -> None:
    from nasctl import runs
    from nasctl.config import make_config
    from nasctl.engine import Evaluator
    from nasctl.objectives import minimisation_matrix, pareto_front

    out = args.workspace / "runs"
    big = out / f"supernet-{args.strategy}-{args.budget}"
    if args.fronts_only:  # the two searches of an earlier run, their fronts retrained again
        default = runs.load(str(Path(json.loads(Path(args.default_json).read_text())["run_dir"]) if args.default_json
                                else out / "default"))
    else:
        for stale in (big, *(() if args.default_json else (out / "default",))):  # its own runs from an earlier time
            if stale.exists():
                import shutil

                shutil.rmtree(stale)
        big.mkdir(parents=True)
        wall, _ = nasctl("search", "--space", args.space, "--accuracy", f"supernet:{args.name}", "--budget",
                         args.budget, "--strategy", args.strategy, "--keep-weights", "none", "--seed", 0,
                         "--storage", f"journal:{big / 'study.journal'}", "--run-dir", big / "run", "--workers",
                         args.workers, "--json", workspace=args.workspace)
        if args.default_json:  # a default search run beforehand: its `nasctl search --json` document
            doc = json.loads(Path(args.default_json).read_text())
            default, default_wall = runs.load(doc["run_dir"]), float(doc["timings"]["total_s"])
        else:
            default_wall, _ = nasctl("search", "--space", args.space, "--seed", 0, "--run-dir", out / "default",
                                     "--json")
            default = runs.load(str(out / "default"))
        print(f"search of {args.budget} candidates with the supernet ({args.strategy}, {args.workers} worker"
              f"{'s' if args.workers > 1 else ''}): {wall:.0f} s + its training "
              f"{card['train_seconds']:.0f} s = {wall + card['train_seconds']:.0f} s; the default search "
              f"(40 candidates, proxy training): {default_wall:.0f} s")
    found = runs.load(str(big / "run"))
    # architectures that differ only in knobs without effect (an exit that is off, its width
    # and bits) tie on the front: one of each tie is retrained
    front = list({tuple(row[o] for o in found.objectives): row
                  for row in pareto_front(found.feasible, found.objectives)}.values())
    cfg = make_config(None, "setting", space=args.space, seed=0, keep_weights="none")  # as the default search
    evaluator = Evaluator(cfg)
    t0 = time.perf_counter()
    retrained = []
    for row in front:
        arch = json.loads(row["arch"])
        retrained.append({**evaluator(arch), "trial": row["trial"]})
    objectives = default.objectives
    ref = runs.reference_point(default.feasible, objectives)
    flip = runs._flip([ref[o] for o in objectives], objectives)
    hv_default = runs.hypervolume(minimisation_matrix(default.feasible, objectives), flip)
    hv_found = runs.hypervolume(minimisation_matrix([r for r in retrained if r["feasible"]], objectives), flip)
    hv_claimed = runs.hypervolume(minimisation_matrix(front, objectives), flip)
    print(f"front of the supernet search: {len(front)} points, retrained stand-alone in {time.perf_counter() - t0:.0f} s")
    print(f"hypervolume at the default run's reference point {ref}: default front {hv_default:.4g}, supernet "
          f"front retrained {hv_found:.4g} ({hv_found / hv_default:.2f}x; as the supernet scored it {hv_claimed:.4g})")
    # The default front is the best of 40 single trainings, each scored by the training that
    # chose it; trained once more (the seed of a second --repeats training), it shows how
    # much of its hypervolume is that luck.
    from nasctl.engine import candidate_seed
    from nasctl.evaluation.train import evaluate

    again = []
    for row in pareto_front(default.feasible, objectives):
        arch = json.loads(row["arch"])
        r = evaluate(evaluator.net_space, arch, evaluator.dataset, evaluator.settings,
                     seed=candidate_seed(0, f"{row['arch']}#1"))
        again.append(evaluator.row(arch, r.accuracy, r.exit_rates, r.train_seconds))
    hv_again = runs.hypervolume(minimisation_matrix([r for r in again if r["feasible"]], objectives), flip)
    print(f"the default front trained once more (another seed): {hv_again:.4g} ({hv_again / hv_default:.2f}x); "
          f"the supernet front retrained against it: {hv_found / hv_again:.2f}x")
    # The default run's reference point lies beyond its largest trial (EDP about a thousand
    # times the fronts'): there the volume is nearly the best accuracy times the reference EDP.
    # At a reference point of the fronts themselves, the whole trade-off counts.
    fronts = [r for r in retrained + again + list(pareto_front(default.feasible, objectives)) if r["feasible"]]
    near = runs._flip([runs.reference_point(fronts, objectives)[o] for o in objectives], objectives)
    hv = {name: runs.hypervolume(minimisation_matrix([r for r in rows if r["feasible"]], objectives), near)
          for name, rows in (("default", pareto_front(default.feasible, objectives)), ("again", again),
                             ("supernet", retrained))}
    print(f"at the fronts' own reference point {runs.reference_point(fronts, objectives)}: default front "
          f"{hv['default']:.4g}, trained once more {hv['again']:.4g}, supernet front retrained {hv['supernet']:.4g} "
          f"({hv['supernet'] / hv['default']:.2f}x the default front, {hv['supernet'] / hv['again']:.2f}x it trained "
          f"once more)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=pe.SPACE, help="an mbv2- or vit-kind space")
    ap.add_argument("--workspace", type=Path, default=LABELS / "ws")
    ap.add_argument("--name", help="the supernet's name (default: bench, or bench-SPACE for another space)")
    ap.add_argument("--epochs", type=int, help="the supernet's (default: `nasctl supernet train`'s for the space)")
    ap.add_argument("--members", type=int, help="`nasctl supernet train --members` of a supernet trained here "
                                                "(default 1; one trained already is checked against it)")
    ap.add_argument("--member-counts", default="1",
                    help="rank agreement also of the first K members alone, for each K listed (e.g. 1,3)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timing", type=int, default=8, help="candidates timed both ways")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-tau", action="store_true")
    ap.add_argument("--sets", default="tune,held,held2", help="label sets to measure rank agreement on")
    ap.add_argument("--train-labels", action="store_true",
                    help="train the stand-alone labels a set lacks (one thread each) before comparing")
    ap.add_argument("--partial", action="store_true",
                    help="a label set whose trainings are unfinished: use the cache files that are complete")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--budget", type=int, default=2000)
    ap.add_argument("--strategy", default="nsga2")
    ap.add_argument("--workers", type=int, default=1, help="local workers of the supernet search (`--workers`); "
                                                           "the default search runs as `nasctl search` does")
    ap.add_argument("--fronts-only", action="store_true",
                    help="with --search: do not search again; retrain the fronts of the searches run before")
    ap.add_argument("--default-json", help="the `nasctl search --seed 0 --json` output of a default search run "
                                           "beforehand, instead of running one")
    args = ap.parse_args()
    args.name = args.name or ("bench" if args.space == pe.SPACE else f"bench-{args.space}")
    import torch

    torch.set_num_threads(1)
    space, data, nets, card = supernet(args)
    if not args.skip_timing:
        timing(space, data, nets, args)
    if not args.skip_tau:
        agreement(space, data, nets, args)
    if args.search:
        search(args, card)


if __name__ == "__main__":
    main()
