"""Early-exit aware predictors on `ee-mbv2` with `digits`: accuracy, exit rates, exit
accuracies and expected EDP of candidates that were never trained.

1. Samples 150 distinct `ee-mbv2` architectures (seeded) and proxy-trains each on the
   built-in digits data set as `nasctl search` does (`nasctl.evaluation.train.evaluate`,
   5 epochs): the accuracy of its early-exit decisions, the share of inputs leaving at
   each exit and each exit's own accuracy.  Rows are appended to a CSV as they finish,
   and a later run reuses them (`--cache`).
2. Trains predictors on 100 of them and prints Kendall tau on the other 50:
   - accuracy, per model (its default encoding);
   - every exit rate, by one multi-target predictor (`--rates-model`);
   - each early exit's accuracy, on the candidates that have that exit;
   - expected EDP on `--device`: each candidate's exit path costs weighted by the exit
     rates, predicted rates against measured ones.
   The first line uses the first 100 candidates sampled for training; the second the
   mean ± std over `--splits` random 100/50 splits.

    python benchmarks/predictors_eenn.py [--cache FILE] [--candidates 150] [--train 100] \
        [--epochs 5] [--models ridge,gbt,gp,mlp] [--rates-model gp] [--device edge-quad]

Proxy training is the slow part (a few seconds a candidate on two cores).
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings
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


def measure(space, archs: list[dict], cache: Path, epochs: int, seed: int) -> list[dict]:
    """Each candidate's trials row, proxy-trained where the cache lacks it."""
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings, evaluate

    exits = space.exit_names()
    columns = ["arch", "accuracy", *[f"exit_rate_{e}" for e in exits], *[f"exit_acc_{e}" for e in exits], "train_s"]
    done = {}
    if cache.is_file():
        with cache.open(newline="") as f:
            done = {r["arch"]: r for r in csv.DictReader(f)}
    todo = [(n, a) for n, a in enumerate(archs) if arch_key(a) not in done]
    if todo:
        cache.parent.mkdir(parents=True, exist_ok=True)
        dataset = load_dataset(DATASET, seed)
        settings = TrainSettings(epochs=epochs, threads=1)
        new = not cache.is_file()
        with cache.open("a", newline="") as f:
            w = csv.DictWriter(f, columns)
            if new:
                w.writeheader()
            for i, (n, arch) in enumerate(todo, 1):
                t0 = time.perf_counter()
                res = evaluate(space, arch, dataset, settings, seed=seed + n)
                active = space.active_exits(arch)
                row = {"arch": arch_key(arch), "accuracy": res.accuracy, "train_s": time.perf_counter() - t0}
                for e in exits:
                    k = active.index(e) if e in active else None
                    row[f"exit_rate_{e}"] = 0.0 if k is None else res.exit_rates[k]
                    row[f"exit_acc_{e}"] = "" if k is None else res.exit_accuracies[k]
                w.writerow(row)
                f.flush()
                done[row["arch"]] = {c: str(v) for c, v in row.items()}
                print(f"  trained {i}/{len(todo)}: accuracy {res.accuracy:.2f}% in {row['train_s']:.1f} s", flush=True)
    return [done[arch_key(a)] for a in archs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("runs/predictors-eenn/candidates.csv"),
                    help="CSV of proxy-trained candidates (read, and appended to)")
    ap.add_argument("--candidates", type=int, default=150)
    ap.add_argument("--train", type=int, default=100, help="candidates to train predictors on; the rest are held out")
    ap.add_argument("--epochs", type=int, default=5, help="proxy-training epochs per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--splits", type=int, default=10, help="random train/held-out splits for the mean ± std")
    ap.add_argument("--models", default="ridge,gbt,gp,mlp", help="models predicting accuracy")
    ap.add_argument("--rates-model", default="gp", help="model predicting exit rates and exit accuracies")
    ap.add_argument("--device", default="edge-quad", help="device pricing the expected EDP")
    args = ap.parse_args()

    space = load_space(SPACE)
    archs = candidates(space, args.candidates, args.seed)
    rows = measure(space, archs, args.cache, args.epochs, args.seed)
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

    print(f"{SPACE} on {DATASET}: {len(archs)} proxy-trained candidates ({args.epochs} epochs), "
          f"predictors trained on {args.train}, Kendall tau on the other {len(archs) - args.train}")
    print(f"{'target':34} {'first split':>11}  {f'{args.splits} random splits':>17}")
    for label, values in results.items():
        print(f"{label:34} {values[0]:11.3f}  {np.mean(values[1:]):8.3f} ± {np.std(values[1:]):.3f}")


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
