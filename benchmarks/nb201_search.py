"""How close each search strategy gets to NAS-Bench-201's true accuracy/latency fronts.

Every registered strategy (or those named; gp, at about a second a proposal, only when
named) searches the `nb201` space for CIFAR-10
test accuracy (maximised) against the latency of each HW-NAS-Bench device (eyeriss,
fpga, pixel3, raspi4; minimised), driven as the engine drives it, but answered from
the benchmark tables instead of training: a budget counts distinct architectures
queried; re-proposing one already queried costs nothing.  The score of a run is the
hypervolume of every architecture it queried as a fraction of the hypervolume of the
true front of the whole table, both objectives scaled to the true front's range
(0 at its best, 1 at its worst value) with the reference point at 1.01 (1% beyond the
front's nadir; points beyond it add nothing).  Printed: mean ± std over the seeds.

The 341 degenerate cells (the cell output is cut off from its input; CIFAR-10 accuracy
exactly 10.0) are left out of the true front, but stay queryable: a strategy that
proposes one pays a query and gets the table's values, which lie beyond the
reference point and add nothing to the score.

    python benchmarks/nb201_search.py [--data DIR] [--strategies nsga2,random,tpe+ridge]
        [--devices eyeriss,fpga,pixel3,raspi4] [--budgets 100,300] [--seeds 10] [--screen 5] [--jobs 2]

`NAME+KIND` runs strategy NAME with surrogate-assisted screening (`nasctl search
--surrogate KIND --screen N`, N from --screen or from `NAME+KIND:N`): a predictor of
model KIND, refit on the queries so far, picks one in N of the strategy's proposals for
a query; the strategy is told the predicted values of the others.  Latencies of the
candidates screened come from the table and are not counted as queries (the engine
computes them on the device model; only accuracy costs training).  By default
`random+gp:600` runs too: random proposals screened by a GP, 600 per query (at 300
queries the first refit screens 15,000 of the 15,625 cells, the second the rest).

DIR holds `nb201_acc.csv` and `hwnasbench_nb201.csv` (default: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space
from nasctl.predictors import PREDICTORS
from nasctl.strategies import STRATEGIES
from nasctl.surrogate import Surrogate, choose
from nb201_data import DEFAULT_DATA

DEVICES = ("eyeriss", "fpga", "pixel3", "raspi4")
STALLED_ROUNDS = 50  # as the engine: stop after this many rounds proposing nothing new
SLOW = ("gp",)       # ~1 s a proposal: run on its own with fewer seeds
# Screened searches run by default besides every strategy but SLOW: random proposals,
# nearly the whole space by the first refit, screened by a GP on WL features.
SCREENED = ("random+gp:600",)


class Table:
    """Objective values (minimisation: -accuracy, latency) of every NB201 cell for one
    device, keyed by the cell's knob indices, and the scaling of the true front."""

    def __init__(self, data: Path, device: str):
        import pandas as pd
        from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

        self.space = load_space("nb201")
        acc = pd.read_csv(data / "nb201_acc.csv", usecols=["arch_str", "cifar10_test"])
        lat = pd.read_csv(data / "hwnasbench_nb201.csv", usecols=["arch_str", f"cifar10_{device}_latency_ms"])
        table = acc.merge(lat, on="arch_str", validate="one_to_one")
        self.sizes = np.array([len(v.choices) for v in self.space.variables()])
        codes = np.array([self.code(self.space.parse_arch(s)) for s in table["arch_str"]])
        self.F = np.full((int(np.prod(self.sizes)), 2), np.nan)
        self.F[codes] = np.column_stack([-table["cifar10_test"], table[f"cifar10_{device}_latency_ms"]])
        ok = table["cifar10_test"].to_numpy() != 10.0
        front = self.F[codes[ok]][NonDominatedSorting().do(self.F[codes[ok]], only_non_dominated_front=True)]
        self.lo, self.hi = front.min(axis=0), front.max(axis=0)
        self.front_size = len(front)
        self.front_hv = self.hypervolume(front)

    def code(self, arch) -> int:
        return int(np.ravel_multi_index(self.space.to_indices(arch), self.sizes))

    def hypervolume(self, F: np.ndarray) -> float:
        from pymoo.indicators.hv import HV

        return float(HV(ref_point=np.full(2, 1.01))((F - self.lo) / (self.hi - self.lo)))


def search(table: Table, strategy_name: str, budget: int, seed: int, screen: int = 5) -> np.ndarray:
    """Objective values of the distinct architectures the strategy queried, in order.
    `NAME+KIND` screens the strategy's proposals with a surrogate of predictor model KIND
    as `nasctl search --surrogate KIND --screen SCREEN` does; latencies, which the engine
    computes exactly on a device, come from the table."""
    name, _, kind = strategy_name.partition("+")
    strategy = STRATEGIES.get(name)()
    strategy.setup(table.space, 2, 0, seed=seed, budget=budget * (screen if kind else 1), pool=bool(kind))
    surrogate = Surrogate(kind, table.space, seed=seed, budget=budget) if kind else None
    seen: dict[str, np.ndarray] = {}
    passed_over: dict[str, dict] = {}  # as the engine: reconsidered at every refit
    stalled = 0
    while len(seen) < budget and stalled < STALLED_ROUNDS:
        n = surrogate.ask_size(len(seen), budget - len(seen), screen) if surrogate else budget - len(seen)
        archs = strategy.ask(n)
        ready = surrogate is not None and surrogate.ready(len(seen))
        if not archs and not (ready and passed_over):
            break
        fresh = {arch_key(a): a for a in archs if arch_key(a) not in seen}
        new = list(fresh.values())
        candidates = new + [a for k, a in passed_over.items() if k not in fresh and k not in seen] if ready else new
        predicted = _screen(table, surrogate, candidates, seen, surrogate.n_real(len(candidates), screen)) \
            if ready and candidates else {}
        passed_over = {arch_key(a): a for a in candidates if arch_key(a) in predicted}
        before = len(seen)
        for arch in candidates:
            key = arch_key(arch)
            if key not in predicted and len(seen) < budget:
                seen[key] = table.F[table.code(arch)]
        known = {**predicted, **seen}
        told = [a for a in archs if arch_key(a) in known]
        if told:
            strategy.tell(told, np.array([known[arch_key(a)] for a in told]).reshape(-1, 2), np.zeros((len(told), 0)))
        stalled = stalled + 1 if len(seen) == before else 0
    return np.array(list(seen.values()))


def _row(f: np.ndarray) -> dict:
    """A table row as the engine's trials hold it."""
    return {"accuracy": -f[0], "latency_ms": f[1]}


def _screen(table: Table, surrogate: Surrogate, candidates: list[dict], seen: dict, n_pick: int) -> dict:
    """Refit the surrogate on the queried architectures; the predicted objective values of
    the candidates it does not pick for a query."""
    surrogate.refit([{"arch": k, **_row(f)} for k, f in seen.items()])
    F = np.array([[-acc, table.F[table.code(a)][1]] for a, (acc, _) in zip(candidates, surrogate.predict(candidates))])
    pick = set(choose([_row(f) for f in F], [_row(f) for f in seen.values()], ["accuracy", "latency_ms"],
                      [0.0] * len(candidates), n_pick))
    return {arch_key(a): f for i, (a, f) in enumerate(zip(candidates, F)) if i not in pick}


_TABLES: dict[tuple[Path, str], Table] = {}


def score(data: Path, device: str, strategy_name: str, budget: int, seed: int, screen: int) -> tuple[float, float, int]:
    """(hypervolume fraction, seconds, queries) of one run."""
    if (data, device) not in _TABLES:
        _TABLES[data, device] = Table(data, device)
    table = _TABLES[data, device]
    t = time.perf_counter()
    F = search(table, strategy_name, budget, seed, screen)
    return table.hypervolume(F) / table.front_hv, time.perf_counter() - t, len(F)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="folder holding nb201_acc.csv and hwnasbench_nb201.csv")
    ap.add_argument("--strategies", default=",".join([*(n for n in STRATEGIES.names() if n not in SLOW), *SCREENED]),
                    help=f"comma-separated strategy names, NAME+KIND for NAME screened by a surrogate of "
                         f"predictor model KIND, NAME+KIND:N with N proposals per query (default: every "
                         f"strategy but {', '.join(SLOW)}, and {', '.join(SCREENED)})")
    ap.add_argument("--devices", default=",".join(DEVICES), help="comma-separated HW-NAS-Bench devices")
    ap.add_argument("--budgets", default="100,300", help="comma-separated numbers of table queries")
    ap.add_argument("--seeds", type=int, default=10, help="runs per setting, seeds 0..SEEDS-1")
    ap.add_argument("--screen", type=int, default=5, help="with NAME+KIND: proposals per table query "
                                                           "(NAME+KIND:N sets it for one)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    args = ap.parse_args()
    for name in ("nb201_acc.csv", "hwnasbench_nb201.csv"):
        if not (args.data / name).is_file():
            raise SystemExit(f"error: {args.data / name} not found; pass --data DIR or set NASCTL_NB201_DIR")
    strategies = args.strategies.split(",")
    screens = {}
    for spec in strategies:
        name, _, screen = spec.partition(":")
        strategy, _, kind = name.partition("+")
        STRATEGIES.get(strategy)  # an unknown name fails here, naming the allowed ones
        if kind:
            PREDICTORS.get(kind)
        if screen and not (kind and screen.isdigit() and int(screen) >= 2):
            raise SystemExit(f"error: '{spec}': N in NAME+KIND:N is a whole number of at least 2, "
                             "after a surrogate KIND")
        screens[spec] = (name, int(screen or args.screen))
    devices = args.devices.split(",")
    bad = [d for d in devices if d not in DEVICES]
    if bad:
        raise SystemExit(f"error: unknown device(s) {', '.join(bad)}; allowed: {', '.join(DEVICES)}")
    budgets = [int(b) for b in args.budgets.split(",")]
    seeds = range(args.seeds)

    print("NB201 search: hypervolume of all queried architectures / true front's, CIFAR-10 accuracy vs "
          f"latency, mean ± std over {args.seeds} seeds; degenerate cells left out of the true front")
    for device in devices:
        table = Table(args.data, device)
        print(f"  {device}: true front {table.front_size} points")
    tasks = [(args.data, d, screens[s][0], b, seed, screens[s][1])
             for s in strategies for d in devices for b in budgets for seed in seeds]
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Serial() as pool:
        results = dict(zip(tasks, pool.map(score, *zip(*tasks))))

    cols = [(d, b) for d in devices for b in budgets]
    print()
    print(f"{'strategy':<14}" + "".join(f"{d + ' ' + str(b):>16}" for d, b in cols) + f"{'s/run':>8}")
    means = {}
    for s in strategies:
        cells, secs = [], []
        for d, b in cols:
            runs = [results[args.data, d, screens[s][0], b, seed, screens[s][1]] for seed in seeds]
            hv = np.array([r[0] for r in runs])
            means[s, d, b] = hv.mean()
            secs += [r[1] for r in runs]
            cells.append(f"{hv.mean():.3f} ± {hv.std():.3f}")
        print(f"{s:<14}" + "".join(f"{c:>16}" for c in cells) + f"{np.mean(secs):>8.2f}")
    top = max(budgets)
    print()
    for d in devices:
        best = max(strategies, key=lambda s: means[s, d, top])
        print(f"{d}: best at {top} queries {best} {means[best, d, top]:.3f}")
    if "random" in strategies:
        beat = [s for s in strategies if s != "random" and all(means[s, d, top] > means["random", d, top]
                                                               for d in devices)]
        print(f"beat random at {top} queries on every device: {', '.join(beat) or 'none'}")


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
