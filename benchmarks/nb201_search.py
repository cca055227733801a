"""How close each search strategy gets to the true accuracy/cost fronts of NAS-Bench-201.

Every strategy named searches the `nb201` space through nasctl's own search loop
(`nasctl.loop.search_loop`, the loop `nasctl search` runs) with trials kept in memory,
answered from the benchmark tables instead of training: a budget counts distinct
architectures queried (trained); re-proposing one costs nothing, and so does a cell the
front has no cost for (it fails before training, as in `nasctl search`).  With a
surrogate (`NAME+KIND[:N]`, `nasctl search --strategy NAME --surrogate KIND --screen
N`), the costs of the candidates screened come from the table without counting as a
query, as the engine computes costs on a device and counts only trainings.

A front is `ACC:COST[@HOLES]`:
- ACC: test accuracy on `c10` (CIFAR-10), `c100` or `in16` (ImageNet16-120);
- COST: a HW-NAS-Bench latency (`eyeriss`, `fpga`, `pixel3`, `raspi4`), `flops` or
  `params`, a sum of them (`eyeriss+fpga`, ms added), or a monotone transform `log:`,
  `sqrt:` or `sq:` of one (which reshapes the front once both axes are scaled);
- HOLES: `degenerate` (no cost for the 341 cells whose output is cut off from the input,
  as many public latency tables leave them) or `randP` (no cost for P% of the cells,
  drawn with a fixed seed).
The fronts are split in two: TUNING, on which strategies and `--strategy auto` were
tuned, and HELD_OUT, which were not looked at while tuning (`--fronts tuning`,
`held-out`, `all`, or a comma-separated list).

A run's score is the hypervolume of every architecture it queried as a fraction of the
hypervolume of the true front of the whole table, both objectives scaled to the true
front's range (0 at its best, 1 at its worst value) with the reference point at 1.01.
The 341 degenerate cells (CIFAR-10 accuracy exactly 10.0) are left out of the true
front but stay queryable.  Printed per front: mean ± std over the seeds; then each
strategy's worst front, and which strategies beat `random` on every front.

    python benchmarks/nb201_search.py [--data DIR] [--fronts tuning|held-out|all|F1,F2]
        [--strategies nsga2,random,random+gp:600] [--budgets 300] [--seeds 10] [--jobs 2]

DIR holds `nb201_acc.csv` and `hwnasbench_nb201.csv` (default: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from nasctl.loop import MemoryTrials, Unpriced, search_loop
from nasctl.predictors import PREDICTORS
from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space
from nasctl.strategies import STRATEGIES
from nasctl.strategies.auto import AUTO, choose as choose_auto
from nasctl.surrogate import Surrogate
from nb201_data import DEFAULT_DATA

ACCURACY = {"c10": "cifar10_test", "c100": "cifar100_test", "in16": "imagenet16_test"}
COSTS = {**{d: f"cifar10_{d}_latency_ms" for d in ("eyeriss", "fpga", "pixel3", "raspi4")},
         "flops": "cifar10_flops_M", "params": "params_M"}
TRANSFORMS = {"log": np.log, "sqrt": np.sqrt, "sq": np.square}
TUNING = ("c10:eyeriss", "c10:fpga", "c10:pixel3", "c10:raspi4", "c100:fpga", "c10:flops",
          "c10:log:pixel3", "c10:eyeriss@degenerate")
HELD_OUT = ("c100:pixel3@degenerate", "in16:eyeriss", "c10:params", "c10:raspi4@rand10",
            "c100:eyeriss+fpga", "c10:sqrt:fpga", "in16:sq:raspi4@degenerate", "in16:flops")
SLOW = ("gp",)  # ~1 s a proposal: only when named
# Run by default besides every strategy but SLOW: random proposals, nearly the whole
# space by the first refit, screened by a GP on WL features.
SCREENED = ("random+gp:600",)
OBJECTIVES = ["accuracy", "latency_ms"]
HOLE_SEED = 20240601  # the cells `randP` leaves without a cost: the same for every run


def parse_front(spec: str) -> tuple[str, list[str], str | None, str | None]:
    """(accuracy column, cost columns summed, transform, holes) of `ACC:COST[@HOLES]`."""
    body, _, holes = spec.partition("@")
    acc, _, cost = body.partition(":")
    fn, _, expr = cost.rpartition(":")
    terms = expr.split("+")
    ok_holes = holes == "" or holes == "degenerate" or (holes.startswith("rand") and holes[4:].isdigit()
                                                        and 0 < int(holes[4:]) < 100)
    if acc not in ACCURACY or (fn and fn not in TRANSFORMS) or not all(t in COSTS for t in terms) or not ok_holes:
        raise SystemExit(f"error: front '{spec}' is not ACC:[FN:]COST[+COST][@HOLES] with ACC one of "
                         f"{', '.join(ACCURACY)}, FN one of {', '.join(TRANSFORMS)}, COST one of "
                         f"{', '.join(COSTS)}, HOLES 'degenerate' or randP (0 < P < 100)")
    return ACCURACY[acc], [COSTS[t] for t in terms], fn or None, holes or None


class Front:
    """One accuracy/cost table over every NB201 cell, keyed by the cell's knob indices
    (costs NaN where the front has a hole), and the scaling of its true front."""

    def __init__(self, data: Path, spec: str):
        import pandas as pd
        from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

        acc_col, cost_cols, fn, holes = parse_front(spec)
        self.spec, self.space = spec, load_space("nb201")
        acc = pd.read_csv(data / "nb201_acc.csv", usecols=["arch_str", "cifar10_test", acc_col]
                          if acc_col != "cifar10_test" else ["arch_str", acc_col])
        cost = pd.read_csv(data / "hwnasbench_nb201.csv", usecols=["arch_str", *dict.fromkeys(cost_cols)])
        table = acc.merge(cost, on="arch_str", validate="one_to_one")
        c = table[cost_cols].sum(axis=1).to_numpy(dtype=float, copy=True)
        c = TRANSFORMS[fn](np.maximum(c, 1e-9) if fn == "log" else c) if fn else c
        degenerate = table["cifar10_test"].to_numpy() == 10.0
        if holes == "degenerate":
            c[degenerate] = np.nan
        elif holes:
            drop = np.random.default_rng(HOLE_SEED).random(len(c)) < int(holes[4:]) / 100
            c[drop] = np.nan
        self.sizes = np.array([len(v.choices) for v in self.space.variables()])
        self.codes = {arch_key(self.space.parse_arch(s)): i for i, s in enumerate(table["arch_str"])}
        self.accuracy, self.cost = table[acc_col].to_numpy(dtype=float), c
        self.holes = int(np.isnan(c).sum())
        ok = ~degenerate & ~np.isnan(c)
        F = np.column_stack([-self.accuracy, c])[ok]
        front = F[NonDominatedSorting().do(F, only_non_dominated_front=True)]
        self.lo, self.hi = front.min(axis=0), front.max(axis=0)
        self.front_size = len(front)
        self.front_hv = self.hypervolume(front)

    def hypervolume(self, F: np.ndarray) -> float:
        from pymoo.indicators.hv import HV

        return float(HV(ref_point=np.full(2, 1.01))((F - self.lo) / (self.hi - self.lo)))

    def price(self, arch: dict, accuracy: float, rates: list[float]) -> dict:
        """A trials row of `arch` at the given accuracy, its cost from the table."""
        key = arch_key(arch)
        cost = self.cost[self.codes[key]]
        if cost != cost:
            raise Unpriced(f"front {self.spec} has no cost for {key}")
        return {"arch": key, "accuracy": accuracy, "latency_ms": float(cost), "feasible": True}

    def evaluate(self, arch: dict) -> dict:
        """The trials row of `arch`: its accuracy and cost from the table (one query)."""
        row = self.price(arch, 0.0, [1.0])
        row["accuracy"] = float(self.accuracy[self.codes[row["arch"]]])
        return row


def search(front: Front, strategy_name: str, budget: int, seed: int, screen: int = 5) -> np.ndarray:
    """Objective values (minimisation) of the distinct architectures the strategy queried,
    in order, searched by nasctl's loop.  `NAME+KIND` screens the strategy's proposals
    with a surrogate of predictor model KIND as `nasctl search --surrogate KIND --screen
    SCREEN` does."""
    name, _, kind = strategy_name.partition("+")
    strategy = STRATEGIES.get(name)()
    strategy.setup(front.space, 2, 0, seed=seed, budget=budget * (screen if kind else 1), pool=bool(kind))
    surrogate = Surrogate(kind, front.space, seed=seed, budget=budget) if kind else None
    trials = MemoryTrials()
    search_loop(front.space, strategy, trials, front.evaluate, front.price, objectives=OBJECTIVES,
                constraints=[], budget=budget, surrogate=surrogate, screen=screen)
    rows = sorted(trials.finished_rows(), key=lambda r: r["trial"])
    return np.array([[-r["accuracy"], r["latency_ms"]] for r in rows]).reshape(-1, 2)


_FRONTS: dict[tuple[Path, str], Front] = {}


def score(data: Path, spec: str, strategy_name: str, budget: int, seed: int, screen: int) -> tuple[float, float, int]:
    """(hypervolume fraction, seconds, queries) of one run."""
    if (data, spec) not in _FRONTS:
        _FRONTS[data, spec] = Front(data, spec)
    front = _FRONTS[data, spec]
    t = time.perf_counter()
    F = search(front, strategy_name, budget, seed, screen)
    return front.hypervolume(F) / front.front_hv, time.perf_counter() - t, len(F)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="folder holding nb201_acc.csv and hwnasbench_nb201.csv")
    ap.add_argument("--fronts", default="all", help="tuning, held-out, all, or comma-separated ACC:COST[@HOLES]")
    ap.add_argument("--strategies", default=",".join([*(n for n in STRATEGIES.names() if n not in SLOW), *SCREENED]),
                    help=f"comma-separated strategy names ('{AUTO}': what nasctl search --strategy auto "
                         f"runs at each budget), NAME+KIND for NAME screened by a surrogate of "
                         f"predictor model KIND, NAME+KIND:N with N proposals per query (default: every "
                         f"strategy but {', '.join(SLOW)}, and {', '.join(SCREENED)})")
    ap.add_argument("--budgets", default="300", help="comma-separated numbers of table queries")
    ap.add_argument("--seeds", type=int, default=10, help="runs per setting, seeds FIRST..FIRST+SEEDS-1")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--screen", type=int, default=5, help="with NAME+KIND: proposals per table query "
                                                           "(NAME+KIND:N sets it for one)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    ap.add_argument("--json", type=Path, help="also write every run's score to this file")
    args = ap.parse_args()
    for name in ("nb201_acc.csv", "hwnasbench_nb201.csv"):
        if not (args.data / name).is_file():
            raise SystemExit(f"error: {args.data / name} not found; pass --data DIR or set NASCTL_NB201_DIR")
    strategies = args.strategies.split(",")
    budgets = [int(b) for b in args.budgets.split(",")]
    screens = {}  # (strategy spec, budget) -> (NAME[+KIND], N)
    for spec in strategies:
        if spec == AUTO:  # what `nasctl search --strategy auto` runs at each budget
            for b in budgets:
                choice = choose_auto(b)
                screens[spec, b] = (f"{choice.strategy}+{choice.surrogate}" if choice.surrogate else choice.strategy,
                                    choice.screen)
            continue
        name, _, screen = spec.partition(":")
        strategy, _, kind = name.partition("+")
        STRATEGIES.get(strategy)  # an unknown name fails here, naming the allowed ones
        if kind:
            PREDICTORS.get(kind)
        if screen and not (kind and screen.isdigit() and int(screen) >= 2):
            raise SystemExit(f"error: '{spec}': N in NAME+KIND:N is a whole number of at least 2, "
                             "after a surrogate KIND")
        for b in budgets:
            screens[spec, b] = (name, int(screen or args.screen))
    fronts = {"tuning": list(TUNING), "held-out": list(HELD_OUT), "all": [*TUNING, *HELD_OUT]}.get(
        args.fronts) or args.fronts.split(",")
    for f in fronts:
        parse_front(f)
    seeds = range(args.first_seed, args.first_seed + args.seeds)

    print(f"NB201 search through nasctl's search loop: hypervolume of all queried architectures / true "
          f"front's, mean ± std over seeds {seeds.start}-{seeds.stop - 1}; degenerate cells left out of the "
          f"true front")
    for f in fronts:
        front = Front(args.data, f)
        print(f"  {f:<28} {'(held out)' if f in HELD_OUT else '(tuning)  ' if f in TUNING else '          '}"
              f" true front {front.front_size} points, {front.holes} cells without a cost")
    tasks = [(args.data, f, screens[s, b][0], b, seed, screens[s, b][1])
             for s in strategies for f in fronts for b in budgets for seed in seeds]
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Serial() as pool:
        results = dict(zip(tasks, pool.map(score, *zip(*tasks))))
    if args.json:
        args.json.write_text(json.dumps([{"front": t[1], "strategy": s, "budget": t[3], "seed": t[4],
                                          "hv": r[0], "seconds": r[1], "queries": r[2]}
                                         for s in strategies for t, r in results.items()
                                         if (t[2], t[5]) == screens[s, t[3]]], indent=1))

    means = {}
    for b in budgets:
        print()
        print(f"at {b} queries: " + "  ".join(f"[{i}] {f}" for i, f in enumerate(fronts)))
        print(f"{'strategy':<16}" + "".join(f"{'[' + str(i) + ']':>15}" for i in range(len(fronts)))
              + f"{'worst':>8}{'mean':>7}{'s/run':>7}")
        for s in strategies:
            cells, secs = [], []
            for f in fronts:
                runs = [results[args.data, f, screens[s, b][0], b, seed, screens[s, b][1]] for seed in seeds]
                hv = np.array([r[0] for r in runs])
                means[s, f, b] = hv.mean()
                secs += [r[1] for r in runs]
                cells.append(f"{hv.mean():.3f} ± {hv.std():.3f}")
            worst = min(means[s, f, b] for f in fronts)
            mean = np.mean([means[s, f, b] for f in fronts])
            print(f"{s:<16}" + "".join(f"{c:>15}" for c in cells) + f"{worst:>8.3f}{mean:>7.3f}{np.mean(secs):>7.2f}")
    top = max(budgets)
    print()
    for s in strategies:
        worst = min(fronts, key=lambda f: means[s, f, top])
        print(f"{s}: worst front at {top} queries {worst} {means[s, worst, top]:.3f}")
    if "random" in strategies:
        beat = [s for s in strategies if s != "random" and all(means[s, f, top] > means["random", f, top]
                                                               for f in fronts)]
        print(f"beat random at {top} queries on every front: {', '.join(beat) or 'none'}")
        for s in strategies:
            lost = [f for f in fronts if s != "random" and means[s, f, top] <= means["random", f, top]]
            if lost:
                print(f"  {s} does not beat random on: {', '.join(lost)}")


class _Serial:
    """The executor interface, run in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, *iterables):
        return map(fn, *iterables)


if __name__ == "__main__":
    main()
