"""Early-exit aware predictors on `ee-mbv2` with `digits`: accuracy, exit rates, exit
accuracies and expected EDP of candidates that were never trained.

1. Samples 150 distinct `ee-mbv2` architectures (seeded) and proxy-trains each on the
   built-in digits data set as `nasctl search` does (`nasctl.evaluation.train.evaluate`,
   `--epochs`, default 5): the accuracy of its early-exit decisions, the share of inputs
   leaving at each exit and each exit's own accuracy.  Rows are appended to a CSV as
   they finish, and a later run reuses them (`--cache`, one file per epoch count).
   `--repeats R` trains each candidate R times (other seeds; the digits split stays)
   and uses the mean.  With `--label-noise`, the held-out candidates of the first split
   are trained R more times, and the Kendall tau between the two means is printed: how
   far the labels themselves agree, the most a predictor can show.
2. Trains predictors on 100 of them and prints Kendall tau on the other 50:
   - accuracy, per model (its default encoding);
   - every exit rate, by one multi-target predictor (`--rates-model`);
   - each early exit's accuracy, on the candidates that have that exit;
   - expected EDP on `--device`: each candidate's exit path costs weighted by the exit
     rates, predicted rates against measured ones.
   The first line uses the first 100 candidates sampled for training; the second the
   mean ± std over `--splits` random 100/50 splits.

    python benchmarks/predictors_eenn.py [--cache FILE] [--candidates 150] [--train 100] \
        [--epochs 5] [--repeats 1] [--jobs 2] [--label-noise] [--models ridge,gbt,gp,mlp] [--rates-model gp] \
        [--device edge-quad]

Proxy training is the slow part (3-8 s a candidate on one core at 5 epochs); `--jobs`
trains that many candidates at once, one thread each.
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from nasctl.predictors import make_predictor
from nasctl.predictors.metrics import kendall_tau
from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space

SPACE, DATASET = "ee-mbv2", "digits"


def candidates(space, n: int, seed: int) -> list[dict]:
    rng, seen, out = np.random.default_rng(seed), set(), []
    while len(out) < n:
        arch = space.sample(rng)
        if arch_key(arch) not in seen:
            seen.add(arch_key(arch))
            out.append(arch)
    return out


def train_one(arch: dict, epochs: int, data_seed: int, seed: int, space_name: str = SPACE) -> dict:
    """One candidate's trials row: proxy-trained on digits split by `data_seed`, with `seed`."""
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings, evaluate

    space = load_space(space_name)
    t0 = time.perf_counter()
    res = evaluate(space, arch, load_dataset(DATASET, data_seed), TrainSettings(epochs=epochs, threads=1), seed=seed)
    active = space.active_exits(arch)
    row = {"arch": arch_key(arch), "accuracy": res.accuracy, "train_s": time.perf_counter() - t0}
    for e in space.exit_names():
        k = active.index(e) if e in active else None
        row[f"exit_rate_{e}"] = 0.0 if k is None else res.exit_rates[k]
        row[f"exit_acc_{e}"] = "" if k is None else res.exit_accuracies[k]
    return row


def measure(space, archs: list[dict], cache: Path, epochs: int, seed: int, jobs: int, offset: int = 0) -> list[dict]:
    """Each candidate's trials row (digits split by `seed`; candidate n trained with
    seed + offset + n), proxy-trained where the cache lacks it."""
    exits = space.exit_names()
    columns = ["arch", "accuracy", *[f"exit_rate_{e}" for e in exits], *[f"exit_acc_{e}" for e in exits], "train_s"]
    done = {}
    if cache.is_file():
        with cache.open(newline="") as f:
            done = {r["arch"]: r for r in csv.DictReader(f)}
    todo = [(n, a) for n, a in enumerate(archs) if arch_key(a) not in done]
    if todo:
        cache.parent.mkdir(parents=True, exist_ok=True)
        new = not cache.is_file()
        with cache.open("a", newline="") as f, ProcessPoolExecutor(jobs) as pool:
            w = csv.DictWriter(f, columns)
            if new:
                w.writeheader()
            rows = pool.map(train_one, [a for _, a in todo], [epochs] * len(todo), [seed] * len(todo),
                            [seed + offset + n for n, _ in todo], [space.name] * len(todo))
            for i, row in enumerate(rows, 1):
                w.writerow(row)
                f.flush()
                done[row["arch"]] = {c: str(v) for c, v in row.items()}
                print(f"  trained {i}/{len(todo)}: accuracy {row['accuracy']:.2f}% in {row['train_s']:.1f} s",
                      flush=True)
    return [done[arch_key(a)] for a in archs]


def trainings(space, archs: list[dict], cache: Path, args, first: int, count: int) -> list[dict]:
    """Each candidate's columns averaged over trainings first .. first + count - 1 (the
    r-th with seeds offset by 10000 r; cached in CACHE, CACHE-r1, ...)."""
    runs = [measure(space, archs, cache if r == 0 else cache.with_name(f"{cache.stem}-r{r}{cache.suffix}"),
                    args.epochs, args.seed, args.jobs, offset=10_000 * r) for r in range(first, first + count)]
    return [{c: (str(np.mean([float(run[i][c]) for run in runs])) if runs[0][i][c] else "")
             for c in runs[0][i] if c != "arch"} for i in range(len(archs))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, help="CSV of proxy-trained candidates, read and appended to "
                                               "(default runs/predictors-eenn/candidates-eEPOCHS.csv)")
    ap.add_argument("--candidates", type=int, default=150)
    ap.add_argument("--train", type=int, default=100, help="candidates to train predictors on; the rest are held out")
    ap.add_argument("--epochs", type=int, default=5, help="proxy-training epochs per candidate")
    ap.add_argument("--jobs", type=int, default=2, help="candidates trained at once (one thread each)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="trainings per candidate (other seeds); its columns are their mean")
    ap.add_argument("--label-noise", action="store_true",
                    help="train the first split's held-out candidates REPEATS more times with other seeds and print "
                         "the Kendall tau between the two means")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--splits", type=int, default=10, help="random train/held-out splits for the mean ± std")
    ap.add_argument("--models", default="ridge,gbt,gp,mlp", help="models predicting accuracy")
    ap.add_argument("--rates-model", default="gp", help="model predicting exit rates and exit accuracies")
    ap.add_argument("--device", default="edge-quad", help="device pricing the expected EDP")
    args = ap.parse_args()

    space = load_space(SPACE)
    archs = candidates(space, args.candidates, args.seed)
    cache = args.cache or Path(f"runs/predictors-eenn/candidates-e{args.epochs}.csv")
    rows = trainings(space, archs, cache, args, 0, args.repeats)
    exits = space.exit_names()
    acc = np.array([float(r["accuracy"]) for r in rows])
    rates = np.array([[float(r[f"exit_rate_{e}"]) for e in exits] for r in rows])
    exit_acc = np.array([[float(r[f"exit_acc_{e}"]) if r[f"exit_acc_{e}"] else np.nan for e in exits] for r in rows])
    lat, energy = path_costs(space, archs, args.device)
    edp = expected(lat, rates) * expected(energy, rates)

    splits = [np.arange(len(archs))] + [np.random.default_rng(s).permutation(len(archs)) for s in range(args.splits)]
    results: dict[str, list[float]] = {}

    def record(label: str, value: float) -> None:
        results.setdefault(label, []).append(value)

    for order in splits:
        train, test = order[:args.train], order[args.train:]
        tr, te = [archs[i] for i in train], [archs[i] for i in test]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optimiser convergence notes
            for model in args.models.split(","):
                mean, _ = make_predictor(model, space, seed=args.seed).fit(tr, acc[train]).predict(te)
                record(f"accuracy ({model})", kendall_tau(acc[test], mean))
            predicted, _ = make_predictor(args.rates_model, space, seed=args.seed).fit(tr, rates[train]).predict(te)
            predicted = np.clip(predicted, 0, None)
            predicted /= predicted.sum(axis=1, keepdims=True)
            for k, e in enumerate(exits):
                record(f"exit rate {e} ({args.rates_model})", kendall_tau(rates[test, k], predicted[:, k]))
            for k, e in enumerate(exits):
                has = [i for i in train if not np.isnan(exit_acc[i, k])]
                held = [i for i in test if not np.isnan(exit_acc[i, k])]
                p = make_predictor(args.rates_model, space, seed=args.seed).fit(
                    [archs[i] for i in has], exit_acc[has, k])
                record(f"exit accuracy {e} ({args.rates_model})",
                       kendall_tau(exit_acc[held, k], p.predict([archs[i] for i in held])[0]))
            predicted_edp = expected(lat[test], predicted) * expected(energy[test], predicted)
            record(f"expected EDP on {args.device}", kendall_tau(edp[test], predicted_edp))

    print(f"{SPACE} on {DATASET}: {len(archs)} proxy-trained candidates ({args.epochs} epochs, mean of "
          f"{args.repeats} training{'s' * (args.repeats > 1)}), "
          f"predictors trained on {args.train}, Kendall tau on the other {len(archs) - args.train}")
    print(f"{'target':34} {'first split':>11}  {f'{args.splits} random splits':>17}")
    for label, values in results.items():
        print(f"{label:34} {values[0]:11.3f}  {np.mean(values[1:]):8.3f} ± {np.std(values[1:]):.3f}")
    if args.label_noise:
        held = archs[args.train:]
        again = trainings(space, held, cache.with_name(cache.stem + "-held.csv"), args, args.repeats, args.repeats)
        print(f"labels: Kendall tau between two means of {args.repeats} training(s) (other seeds) of the "
              f"{len(held)} held-out candidates:")
        for column in ("accuracy", *[f"exit_acc_{e}" for e in exits]):
            pairs = [(float(a[column]), float(b[column])) for a, b in zip(rows[args.train:], again) if a[column]]
            first, second = np.array(pairs).T
            print(f"  {column:32} {kendall_tau(first, second):.3f}")


def path_costs(space, archs, device_name: str):
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.hardware.loader import load_device

    data = load_dataset(DATASET, 0)
    return space.path_costs(load_device(device_name), archs, data.input_shape, data.classes)


def expected(path: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Σ_k p_k · cost of reaching exit k, per candidate (exits it lacks have rate 0)."""
    return np.nansum(path * rates, axis=1)


if __name__ == "__main__":
    main()
