"""How well each accuracy predictor ranks NAS-Bench-201 architectures it has not seen.

For each number N of training architectures (default 50, 100, 200, 1000) and each of
10 random splits (seeds 0-9): draw N of the 15,284 non-degenerate NB201 cells, train
every predictor model (its default encoding: WL features for vector models, the
cell graph for `gcn`) on their CIFAR-10 test accuracy, predict every other
non-degenerate cell, and print Kendall tau and Spearman over those held-out
architectures, mean ± std over the splits, with the mean training time.

    python benchmarks/predictors_nb201.py [--data DIR] [--sizes 50,100,200,1000] [--splits 10] \
        [--models ridge,gbt,gp,mlp,gcn,gp:path] [--column cifar10_test] [--jobs N]

`MODEL:ENCODING` fits MODEL on another encoding than its default.

DIR holds NAS-Bench-201's `nb201_acc.csv` (default: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout).  `--jobs N` fits N predictors at a
time in worker processes, each with one thread.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from nasctl.predictors import PREDICTORS, make_predictor
from nasctl.predictors.metrics import kendall_tau, spearman
from nasctl.spaces.loader import load_space
from nb201_data import DEFAULT_DATA

_data: tuple | None = None  # (space, archs, y) of this process


def load(table: Path, column: str) -> None:
    """Read the non-degenerate architectures and their accuracy into this process."""
    import pandas as pd

    global _data
    space = load_space("nb201")
    df = pd.read_csv(table)
    archs = [space.parse_arch(s) for s in df["arch_str"]]
    keep = [i for i, a in enumerate(archs) if not space.is_degenerate(a)]
    _data = space, [archs[i] for i in keep], df[column].to_numpy(dtype=float)[keep]


def one(task: tuple[int, str, int]) -> tuple[float, float, float]:
    """Kendall tau and Spearman on the held-out architectures, and the fit's seconds."""
    n, spec, seed = task
    model, _, encoding = spec.partition(":")
    space, archs, y = _data
    order = np.random.default_rng(seed).permutation(len(archs))
    train, test = order[:n], order[n:]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optimiser convergence notes
        options = {"encoding": encoding} if encoding else {}
        predictor = make_predictor(model, space, seed=seed, **options).fit([archs[i] for i in train], y[train])
    secs = time.perf_counter() - t0
    mean, _ = predictor.predict([archs[i] for i in test])
    return kendall_tau(y[test], mean), spearman(y[test], mean), secs


def worker(table: Path, column: str) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    load(table, column)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding nb201_acc.csv")
    ap.add_argument("--sizes", default="50,100,200,1000", help="numbers of training architectures")
    ap.add_argument("--splits", type=int, default=10, help="random splits (seeds 0..splits-1) per size")
    ap.add_argument("--models", default=",".join(PREDICTORS.names()),
                    help="predictor models to compare; MODEL:ENCODING for one on another encoding than its default")
    ap.add_argument("--column", default="cifar10_test", help="accuracy column of nb201_acc.csv")
    ap.add_argument("--jobs", type=int, default=1, help="predictors fitted at a time (worker processes)")
    args = ap.parse_args()
    table = args.data / "nb201_acc.csv"
    if not table.is_file():
        raise SystemExit(f"error: {table} not found; pass --data DIR or set NASCTL_NB201_DIR")
    load(table, args.column)
    groups = [(int(n), model) for n in args.sizes.split(",") for model in args.models.split(",")]
    tasks = [(n, model, seed) for n, model in groups for seed in range(args.splits)]
    print(f"NB201 {args.column}: {len(_data[1])} non-degenerate architectures; {args.splits} splits per size; "
          "metrics over all held-out architectures, mean ± std over splits")
    print(f"{'model':10} {'train':>5}  {'Kendall tau':>13}  {'Spearman':>13}  {'fit s':>6}")
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(args.jobs, initializer=worker, initargs=(table, args.column))
        results = pool.map(one, tasks)
    else:
        results = map(one, tasks)
    best: dict[int, tuple[float, str]] = {}
    for n, model in groups:
        taus, rhos, secs = np.array([next(results) for _ in range(args.splits)]).T
        print(f"{model:10} {n:5d}  {np.mean(taus):6.3f} ± {np.std(taus):.3f}  "
              f"{np.mean(rhos):6.3f} ± {np.std(rhos):.3f}  {np.mean(secs):6.1f}", flush=True)
        best[n] = max(best.get(n, (-1.0, "")), (float(np.mean(rhos)), model))
    print("best Spearman per size: " + ", ".join(f"{n}: {rho:.3f} ({m})" for n, (rho, m) in best.items()))


if __name__ == "__main__":
    main()
