"""Leave one device out: a device fitted from a few measured NB201 networks, with and
without the other HW-NAS-Bench devices as a prior, against HELP.

The four HW-NAS-Bench devices (eyeriss, fpga, pixel3, raspi4) are first each fitted as
`nasctl hw fit --models` would, from 1000 random non-degenerate cells of their own table,
on the layer lists of each `unused_ops` convention - `run`, `lone-convs`, `drop`, from
most to least of the unused ops run - and written to a scratch workspace; the convention
whose fit has the lowest cross-validated error is the device's own (eyeriss and fpga
`run`, pixel3 and raspi4 `lone-convs`).  Then each device in turn is held out: N (5, 10,
20) cells are drawn at random from the 15,284 non-degenerate ones, and the device is
fitted from their latencies alone

  no prior   `fit_from_models` (today's `hw fit --models`) on each convention's layer
             lists, the one with the lowest cross-validated error kept; too few models
             to fit from scratch below 10 cells;
  prior      `nasctl.hardware.prior.fit_with_prior` (`hw fit --prior`), on each
             convention's layer lists with the other devices fitted on those lists as
             the prior: for `run` the devices whose own convention runs the unused ops,
             for `lone-convs` and `drop` those leaving them out.  The held-out device
             is taken to follow `run` or the convention most of its prior devices leaving
             unused ops out follow (`lone-convs`).  `run` is kept only where its fit
             explains the N cells clearly better than the contrast's: the score
             (2 x log CV error of the fit chosen + log CV error of the prior alone) / 3
             (ALPHA = 1/3) lower by ln RUN_MARGIN (2: `run`'s errors under half the
             contrast's, as prior.MARGIN asks of a prior).  The contrast is `lone-convs`;
             where no cell of the N has ops `run` and `lone-convs` count differently
             (about one draw in six at N = 10), `drop`, which leaves more out; where
             none tells `drop` from `run` either (about one in eleven), the cells cannot
             tell the conventions apart and `lone-convs` is kept: a measured device runs
             an exported graph, and an exporter leaves out an op whose output nothing
             reads.

The fitted device is written, loaded back and prices all 15,625 cells; the table prints
Spearman's rho against the held-out device's true latencies over all cells and over the
non-degenerate ones, mean ± std over the draws, the worst draw, the conventions kept
and the trust cross-validation chose (prior: prior only; prior+G: with a correction
in grouping G; none+G: no prior), and HELP's reported figures.  Nothing of the held-out
device but its N cells is used.

    python benchmarks/nb201_prior.py [--data DIR] [--sizes 5,10,20] [--seeds 0-9]

Draw seeds 100-109, 200-209 and 300-309 were used to design the method (its trust levels,
the rule for cells that cannot tell the conventions apart, prior.MARGIN), and with 3000-3049
ALPHA, RUN_MARGIN and the `lone-convs` contrast; 6000-6409 (five sets) were held out and
run once with this code; 1400-1809 and 5000-5409 were held out for earlier versions, and
0-9, 400-409, 500-509, 700-709, 800-809 and 900-1309 were run with earlier versions
(benchmarks/README.md).  The `lone-convs` convention was read off raspi4's whole table.  DIR holds
HW-NAS-Bench's `hwnasbench_nb201.csv` (default: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from nasctl import workspace
from nasctl.errors import UsageError
from nasctl.hardware.fit import distinct_layers, fit_from_models, write_device
from nasctl.hardware.loader import load_device
from nasctl.hardware.prior import fit_with_prior, prior_costs
from nasctl.spaces.loader import load_space
from nasctl.spaces.nb201 import Nb201Space
from nb201_data import DEFAULT_DATA

DEVICES = ("eyeriss", "fpga", "pixel3", "raspi4")
VARIANTS = ("run", "lone-convs", "drop")  # from most to least of the unused ops run
PRIOR_CELLS, PRIOR_SEED = 1000, 12345  # each prior device's own sample of its table
# With a prior: the weight of the prior-only fit in the choice of layer lists, and how much
# lower `run`'s score must be for `run` to be kept (tuned on draw seeds 100-309 and 3000-3049).
ALPHA, RUN_MARGIN = 1 / 3, 2.0
EXACT = 1e-3  # CV errors (%) below this count as this: the fit explains the cells exactly
HELP = "HELP (Lee et al., NeurIPS 2021), 10 samples, its six test devices: rho 0.802-0.989, mean 0.932 (reported)"


class Priced:
    """All cells' layer lists of one variant as kernel counts, so that a device prices
    its distinct kernels once (`prior_costs`) instead of 15,625 lists."""

    def __init__(self, layer_lists: list):
        self.layer_lists = layer_lists
        self.kernels = distinct_layers(layer_lists)
        index = {k.shape_key(): i for i, k in enumerate(self.kernels)}
        self.counts = np.zeros((len(layer_lists), len(self.kernels)))
        for m, layers in enumerate(layer_lists):
            for layer in layers:
                self.counts[m, index[layer.shape_key()]] += 1

    def latency(self, device) -> np.ndarray:
        costs = prior_costs(device, self.kernels)
        run = device.estimate(self.layer_lists[0]).latency_ms - self.counts[0] @ costs  # per-model overhead
        predicted = self.counts @ costs + run
        for m in (1, len(self.layer_lists) // 2):  # the sum is the device's own estimate
            assert np.isclose(predicted[m], device.estimate(self.layer_lists[m]).latency_ms, rtol=1e-9)
        return predicted


def variant_score(fitted) -> float:
    """How well a fit explains the N cells, to choose between `run` and `drop`: the log of
    its cross-validated error; with a prior, mixed with that of the prior alone (weight
    ALPHA) - how well the prior devices of that layer-list convention explain the cells."""
    f = fitted.spec["fit"]
    if "prior" not in f:
        return float(np.log(max(best_cv(fitted), EXACT)))
    cv = f["prior"]["cv_rms_error_pct"]
    return float((1 - ALPHA) * np.log(max(best_cv(fitted), EXACT)) + ALPHA * np.log(max(cv["prior"], EXACT)))


def best_cv(fitted) -> float:
    """The cross-validated RMS error (%) of the fit kept."""
    f = fitted.spec["fit"]
    return min((f["prior"]["cv_rms_error_pct"] if "prior" in f else f["cv_rms_error_pct_by_grouping"]).values())


def fit_chosen(name: str, priced: dict, y: np.ndarray, train: np.ndarray, priors=None, followed=None):
    """Predicted latency of every cell from the layer-list convention chosen on the N cells,
    written to the workspace and loaded back, as `nasctl hw fit` leaves it; the convention
    and the fit.  Without `priors`: the lowest cross-validated error of the fits from
    scratch (ties: the first in VARIANTS), or where no cell's ops differ between the
    conventions, `drop`, as before.  With `priors` (the prior devices by convention,
    each fitted on that convention's layer lists) and `followed` (the conventions the prior
    devices follow themselves), `choose` decides."""
    fits: dict = {}

    def fit(variant):
        if variant not in fits:
            layers = [priced[variant].layer_lists[i] for i in train]
            fits[variant] = (fit_with_prior(name, layers, y[train], priors[variant]) if priors
                             else fit_from_models(name, layers, y[train]))
        return fits[variant]

    def differ(a, b):  # whether some of the N cells' ops differ between conventions a and b
        return any(priced[a].layer_lists[i] != priced[b].layer_lists[i] for i in train)

    def tell(a, b):  # whether the N cells tell a from b: they differ, and the fits are not both exact
        return differ(a, b) and max(best_cv(fit(a)), best_cv(fit(b))) > EXACT

    if priors:
        variant = choose(fit, tell, followed)
    else:
        scores = {}
        for v in VARIANTS:
            try:
                scores[v] = variant_score(fit(v))
            except UsageError:  # too few cells to fit from scratch
                continue
        if not scores:
            raise UsageError("too few cells")
        if not any(differ("run", v) for v in VARIANTS[1:]):
            variant = max(scores, key=VARIANTS.index)  # no cell tells them apart: the most left out, as before
        else:
            variant = min(scores, key=lambda v: (scores[v], VARIANTS.index(v)))
    write_device(workspace.roots()[0].path / "hardware" / name, fit(variant))
    return priced[variant].latency(load_device(name)), variant, fit(variant)


def choose(fit, tell, followed) -> str:
    """With a prior: `run` or the convention leaving unused ops out that most prior devices
    follow (`followed`; ties: the first in VARIANTS), `out`.  `run` is kept where some prior
    device runs them and its fit scores lower than the contrast's by ln RUN_MARGIN; the
    contrast is `out`, or where the N cells cannot tell `out` from `run` (`tell`: no cell
    counts their ops differently, or both fits explain the cells exactly), the next
    convention in VARIANTS that they tell from it (`drop` leaves more ops out than
    `lone-convs`, so fewer draws are ties); where no convention differs on the cells, `out`."""
    leaving = [v for v in VARIANTS[1:] if v in followed]
    out = max(leaving, key=lambda v: (followed.count(v), -VARIANTS.index(v))) if leaving else None
    if out is None:
        return "run"
    if "run" not in followed:
        return out
    contrast = next((v for v in [out, *VARIANTS[1:]] if tell("run", v)), None)
    if contrast is None:
        return out  # no cell tells the conventions apart: an exporter leaves out what nothing reads
    return "run" if variant_score(fit("run")) + np.log(RUN_MARGIN) <= variant_score(fit(contrast)) else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding hwnasbench_nb201.csv")
    ap.add_argument("--sizes", default="5,10,20", help="numbers of measured cells to fit from")
    ap.add_argument("--seeds", default="0-9", help="draw seeds, FIRST-LAST (100-109, 200-309, 3000-3049 tuned the method)")
    ap.add_argument("--devices", default=",".join(DEVICES), help="devices to hold out in turn")
    args = ap.parse_args()
    table_path = args.data / "hwnasbench_nb201.csv"
    if not table_path.is_file():
        raise SystemExit(f"error: {table_path} not found; pass --data DIR or set NASCTL_NB201_DIR")
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    with tempfile.TemporaryDirectory() as scratch:  # the fitted devices' workspace
        workspace.set_workspace(Path(scratch))
        run(table_path, [int(n) for n in args.sizes.split(",")], seeds, args.devices.split(","))


def run(table_path: Path, sizes: list[int], seeds: list[int], held_out: list[str]) -> None:
    import pandas as pd
    from scipy.stats import spearmanr

    base = load_space("nb201")
    table = pd.read_csv(table_path)
    archs = [base.parse_arch(s) for s in table["arch_str"]]
    shape, classes = base.spec.input_shape, base.spec.classes
    priced = {v: Priced([Nb201Space(base.spec.model_copy(update={"unused_ops": v})).to_layers(a, shape, classes)
                         for a in archs]) for v in VARIANTS}
    ok = ~np.array([base.is_degenerate(a) for a in archs])
    pool = np.flatnonzero(ok)
    truth = {d: table[f"cifar10_{d}_latency_ms"].to_numpy() for d in DEVICES}

    own = np.random.default_rng(PRIOR_SEED).choice(pool, PRIOR_CELLS, replace=False)
    convention = {}
    for d in DEVICES:  # the prior devices, fitted from their own tables only, on each convention's lists
        scores = {}
        for v in VARIANTS:
            fitted = fit_from_models(f"prior-{d}.{v}", [priced[v].layer_lists[i] for i in own], truth[d][own])
            write_device(workspace.roots()[0].path / "hardware" / f"prior-{d}.{v}", fitted)
            scores[v] = variant_score(fitted)
        convention[d] = min(VARIANTS, key=lambda v: (scores[v], VARIANTS.index(v)))  # its own: the lowest CV error
        predicted = priced[convention[d]].latency(load_device(f"prior-{d}.{convention[d]}"))
        print(f"prior device prior-{d}: fitted from {PRIOR_CELLS} cells ({convention[d]} layer lists), "
              f"rho {spearmanr(predicted, truth[d])[0]:.3f}")
    print(f"\nLeave one device out, fitted from N random non-degenerate cells, draw seeds {seeds[0]}-{seeds[-1]}; "
          f"Spearman rho over all {len(archs):,} cells (ok: the {ok.sum():,} non-degenerate), mean ± std")
    print(f"{'device':>8}{'N':>4}{'no prior':>17}{'no prior, ok':>17}{'prior':>17}{'prior, ok':>17}"
          f"{'worst prior':>12}  conventions chosen (prior); trust chosen")
    summary = {}
    for d in held_out:
        others = [p for p in DEVICES if p != d]
        # `run`'s prior: the devices running unused ops; the others': those leaving them out
        priors = {v: [load_device(f"prior-{p}.{v}") for p in others if (convention[p] == "run") == (v == "run")]
                  for v in VARIANTS}
        own_conventions = [convention[p] for p in others]
        for n in sizes:
            rho = {"none": [], "none_ok": [], "prior": [], "prior_ok": []}
            trusts, chosen = [], []
            for seed in seeds:
                train = np.random.default_rng(seed).choice(pool, n, replace=False)
                try:
                    predicted = fit_chosen(d, priced, truth[d], train)[0]
                    rho["none"].append(spearmanr(predicted, truth[d])[0])
                    rho["none_ok"].append(spearmanr(predicted[ok], truth[d][ok])[0])
                except UsageError:  # too few cells to fit from scratch
                    rho["none"].append(np.nan)
                    rho["none_ok"].append(np.nan)
                predicted, variant, fitted = fit_chosen(d, priced, truth[d], train, priors, own_conventions)
                rho["prior"].append(spearmanr(predicted, truth[d])[0])
                rho["prior_ok"].append(spearmanr(predicted[ok], truth[d][ok])[0])
                chosen.append(variant)
                f = fitted.spec["fit"]
                trusts.append(f["prior"]["trust"].split("@")[0] if "prior" in f else "none")
            cells = "".join("too few".rjust(17) if np.isnan(r).any() else f"{np.mean(r):>9.3f} ± {np.std(r):.3f}"
                            for r in rho.values())
            counts = ", ".join(f"{t} {trusts.count(t)}" for t in sorted(set(trusts)))
            kept = ", ".join(f"{v} {chosen.count(v)}" for v in VARIANTS if v in chosen)
            print(f"{d:>8}{n:>4}{cells}{min(rho['prior']):>12.3f}  {kept}; {counts}", flush=True)
            summary[d, n] = {k: float(np.mean(r)) for k, r in rho.items()}
    tens = {d: s for (d, n), s in summary.items() if n == 10}
    if tens:
        means = ", ".join(f"{d} {s['prior']:.4f}" for d, s in tens.items())
        print(f"\nN = 10, prior: rho >= 0.95 on every device: "
              f"{'yes' if all(s['prior'] >= 0.95 for s in tens.values()) else 'no'} ({means}); "
              f"never below no prior (mean): {'yes' if all(not s['none'] > s['prior'] for s in tens.values()) else 'no'}")
    print(HELP)


if __name__ == "__main__":
    main()
