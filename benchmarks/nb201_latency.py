"""How well a device fitted from a few measured NB201 networks ranks all 15,625 of them.

For each HW-NAS-Bench device (eyeriss, fpga, pixel3, raspi4): draw N architectures at
random from the 15,284 that are not degenerate, fit a `lut` device to their end-to-end
latencies (`nasctl.hardware.fit.fit_from_models`: per-kernel costs by non-negative
least squares over the kernels of each `nb201` layer list, plus a per-model overhead,
grouping chosen by cross-validation), price every architecture with it, and print the
Spearman rank correlation between predicted and true latency, mean ± std over the
draws, next to FLOPs' own correlation with latency.

Each draw is fitted three times, with the layer lists of `unused_ops: run` (every op of
the cell, as NB201's PyTorch network runs them), `unused_ops: lone-convs` (those ops left
out but for an unused node that is one conv's output; nasctl.spaces.nb201) and
`unused_ops: drop` (ops whose output reaches the cell output only through `none` edges
left out, as dead-code elimination does), and "chosen" takes the one whose fit has the
lowest cross-validated error on the N measured networks - what a user can do without the
other 15,625 - N latencies.

Correlations are over all 15,625 architectures; "chosen, ok" is over the 15,284
non-degenerate ones (a degenerate cell ignores its input; pixel3 and raspi4 time those
networks near zero).

    python benchmarks/nb201_latency.py [--data DIR] [--sizes 20,100,1000] [--draws 5]

DIR holds HW-NAS-Bench's `hwnasbench_nb201.csv` (default: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from nasctl import workspace
from nasctl.hardware.fit import fit_from_models, write_device
from nasctl.hardware.loader import load_device
from nasctl.spaces.loader import load_space
from nasctl.spaces.nb201 import Nb201Space
from nb201_data import DEFAULT_DATA

DEVICES = ("eyeriss", "fpga", "pixel3", "raspi4")
VARIANTS = ("run", "lone-convs", "drop")


def fit_and_rank(name: str, layer_lists: list, latency_ms: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, float]:
    """Predicted latency of every layer list from a device fitted to those in `train` -
    written to the workspace and loaded back, as `nasctl hw fit` leaves it - and the
    fit's cross-validated RMS error (%)."""
    fitted = fit_from_models(name, [layer_lists[i] for i in train], latency_ms[train])
    write_device(workspace.roots()[0].path / "hardware" / name, fitted)
    device = load_device(name)
    predicted = np.array([device.estimate(layers).latency_ms for layers in layer_lists])
    return predicted, min(fitted.report["cv_rms_error_pct_by_grouping"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding hwnasbench_nb201.csv")
    ap.add_argument("--sizes", default="20,100,1000", help="numbers of measured architectures to fit from")
    ap.add_argument("--draws", type=int, default=5, help="random draws (seeds 0..draws-1) per size")
    args = ap.parse_args()
    table_path = args.data / "hwnasbench_nb201.csv"
    if not table_path.is_file():
        raise SystemExit(f"error: {table_path} not found; pass --data DIR or set NASCTL_NB201_DIR")
    sizes = [int(n) for n in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as scratch:  # the fitted devices' workspace
        workspace.set_workspace(Path(scratch))
        run(table_path, sizes, args.draws)


def run(table_path: Path, sizes: list[int], draws: int) -> None:
    import pandas as pd
    from scipy.stats import spearmanr

    base = load_space("nb201")
    table = pd.read_csv(table_path)
    archs = [base.parse_arch(s) for s in table["arch_str"]]
    shape, classes = base.spec.input_shape, base.spec.classes
    layer_lists = {}
    for variant in VARIANTS:
        space = Nb201Space(base.spec.model_copy(update={"unused_ops": variant}))
        layer_lists[variant] = [space.to_layers(a, shape, classes) for a in archs]
    ok = ~np.array([base.is_degenerate(a) for a in archs])
    pool = np.flatnonzero(ok)

    print(f"NB201 latency: lut devices fitted from N random non-degenerate architectures, {draws} draws "
          f"each;\nSpearman rho of predicted vs true latency over all {len(archs):,} architectures "
          f"(ok: the {ok.sum():,} non-degenerate ones)")
    beats = {}
    for dev in DEVICES:
        y = table[f"cifar10_{dev}_latency_ms"].to_numpy()
        flops_all = spearmanr(table["cifar10_flops_M"], y)[0]
        flops_ok = spearmanr(table["cifar10_flops_M"][ok], y[ok])[0]
        print(f"\n{dev}: FLOPs rho {flops_all:.3f} (ok {flops_ok:.3f})")
        print(f"{'N':>6}" + "".join(f"{v:>17}" for v in VARIANTS) + f"{'chosen':>17}{'chosen, ok':>17}  chose")
        for n in sizes:
            rho = {k: [] for k in (*VARIANTS, "chosen", "chosen_ok")}
            chose = []
            for seed in range(draws):
                train = np.random.default_rng(seed).choice(pool, n, replace=False)
                predicted, cv = {}, {}
                for variant in VARIANTS:
                    predicted[variant], cv[variant] = fit_and_rank(f"nb201-{dev}", layer_lists[variant], y, train)
                    rho[variant].append(spearmanr(predicted[variant], y)[0])
                chosen = min(VARIANTS, key=cv.get)
                chose.append(chosen)
                best = predicted[chosen]
                rho["chosen"].append(spearmanr(best, y)[0])
                rho["chosen_ok"].append(spearmanr(best[ok], y[ok])[0])
            print(f"{n:>6}" + "".join(f"{np.mean(r):>9.3f} ± {np.std(r):.3f}" for r in rho.values())
                  + "  " + ", ".join(f"{v} {chose.count(v)}" for v in VARIANTS if v in chose))
            if n == 100:
                beats[dev] = min(rho["chosen"]) > flops_all and min(rho["chosen_ok"]) > flops_ok
    if beats:
        verdict = "yes" if all(beats.values()) else "no (" + ", ".join(d for d, b in beats.items() if not b) + ")"
        print(f"\nN=100, chosen: beats FLOPs on every device in every draw: {verdict}")


if __name__ == "__main__":
    main()
