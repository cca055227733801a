"""`nasctl predictor models|train|predict|eval|list|show`."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .. import workspace
from ..errors import UsageError
from .render import err, out, print_json, print_rows

app = typer.Typer(no_args_is_help=True,
                  help="Accuracy predictors: train one on measured architectures, predict, evaluate, list, show.")

DATA_HELP = ("CSV with an `arch` column (JSON knob values, or NB201 strings for nb201) and the target column(s); "
             "a run folder (its trials.csv); or table:PATH:COLUMN.")


def _names(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        raise UsageError(f"--input-shape '{text}' is not C,H,W (three whole numbers)") from None


@app.command("models")
def models():
    """List the predictor model kinds (names on one line)."""
    from ..predictors import PREDICTORS

    typer.echo(" ".join(PREDICTORS.names()))


@app.command("train")
def train(
    space: Annotated[str, typer.Option(help="Search space of the architectures.", show_default=False)],
    data: Annotated[str, typer.Option(help=DATA_HELP, show_default=False)],
    model: Annotated[str, typer.Option(help="Model kind (see `nasctl predictor models`).", show_default=False)],
    name: Annotated[str, typer.Option(help="Name to save it under (predictors/NAME/ in the workspace).",
                                      show_default=False)],
    target: Annotated[Optional[str], typer.Option(
        help="Target column, or several joined by commas (one model predicts them all); "
             "default: the COLUMN of table:PATH:COLUMN.", show_default=False)] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of every random choice.")] = 0,
    encoding: Annotated[Optional[str], typer.Option(
        help="onehot or ordinal; adjacency, path or wl on cell spaces (default: wl there, else onehot).",
        show_default=False)] = None,
    zero_cost: Annotated[Optional[str], typer.Option(
        help="Zero-cost proxies to add as features, comma-separated: synflow, naswot, grad_norm.",
        show_default=False)] = None,
    input_shape: Annotated[Optional[str], typer.Option(
        help="Input C,H,W the proxies' network is built for (default: the space's).", show_default=False)] = None,
    classes: Annotated[Optional[int], typer.Option(
        min=1, help="Classes of the proxies' network (default: the space's).", show_default=False)] = None,
    target_map: Annotated[str, typer.Option(help="rank or standard: the scale the model fits targets on.")]
    = "rank",
    cv: Annotated[int, typer.Option(min=0, help="Cross-validation folds for the card's metrics (0: none).")] = 5,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a predictor of the same name.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Train a predictor on measured architectures and save it with its card."""
    from ..predictors import make_predictor
    from ..predictors.data import read
    from ..predictors.metrics import cross_validated, reports
    from ..predictors.store import FOLDER
    from ..spaces.loader import load_space

    the_space = load_space(space)
    folder = workspace.new_entry(FOLDER, name, "predictor")
    if folder.exists() and not overwrite:
        raise UsageError(f"predictor '{name}' already exists in {folder}; pass --overwrite to replace it")
    rows = read(data, the_space, _names(target))
    if not rows.targets:
        raise UsageError("no target column: give --target COLUMN (or --data table:PATH:COLUMN)")

    def make():
        return make_predictor(model, the_space, seed=seed, encoding=encoding, zero_cost=_names(zero_cost),
                              input_shape=_shape(input_shape), classes=classes, target_map=target_map)

    predictor = make()
    n = len(rows.archs)
    if n < predictor.min_rows:
        raise UsageError(f"data '{data}' has {n} usable rows; model '{model}' needs at least {predictor.min_rows}")
    flat = [t for j, t in enumerate(rows.targets) if rows.Y[:, j].min() == rows.Y[:, j].max()]
    if flat:
        raise UsageError(f"data '{data}': target '{flat[0]}' is {rows.Y[0, rows.targets.index(flat[0])]:g} in every "
                         "row; a predictor needs targets that differ to learn which architectures do better")
    Y = rows.Y if len(rows.targets) > 1 else rows.Y[:, 0]
    metrics: dict = {}
    with err.status(f"training {model} on {n} architectures"):
        folds = min(cv, n // predictor.min_rows)
        if folds >= 2:
            metrics["cross_validation"] = {"folds": folds,
                                           **reports(rows.Y, cross_validated(make, rows.archs, Y, folds, seed),
                                                     rows.targets)}
        predictor.fit(rows.archs, Y)
        metrics["training_fit"] = reports(rows.Y, predictor.predict(rows.archs)[0], rows.targets)
    if folder.exists():
        shutil.rmtree(folder)
    card_path = predictor.save(folder, {"name": name, "target": rows.targets, "data": rows.card(),
                                        "metrics": metrics})
    doc = {"name": name, "path": str(folder), "model": model, "space": the_space.name, "target": rows.targets,
           "encoding": predictor.encoding, "rows": n, "skipped_rows": rows.skipped, "metrics": metrics}
    if as_json:
        return print_json(doc)
    skipped = f" ({rows.skipped} rows without a value left out)" if rows.skipped else ""
    out.print(f"Trained {model} ({predictor.encoding} encoding) on {n} architectures{skipped}.")
    if "cross_validation" in metrics:
        _metrics_table(metrics["cross_validation"], f"{metrics['cross_validation']['folds']}-fold cross-validation")
    out.print(f"Saved predictor '{name}' to {card_path.parent}")


def _metrics_table(per_target: dict, title: str) -> None:
    table = Table("target", "Kendall tau", "Spearman", "MAE", "top-10% precision", "rows", title=title)
    for t, m in per_target.items():
        if isinstance(m, dict):
            table.add_row(t, f"{m['kendall_tau']:.3f}", f"{m['spearman']:.3f}", f"{m['mae']:.4g}",
                          f"{m['top10_precision']:.2f}", str(m["rows"]))
    out.print(table)


@app.command("predict")
def predict(
    name: Annotated[str, typer.Argument(help="Predictor name or folder.")],
    data: Annotated[str, typer.Option(help="CSV (or run folder) with an `arch` column.", show_default=False)],
    out_path: Annotated[Path, typer.Option("--out", help="CSV to write.", show_default=False)],
):
    """Predict every architecture of --data; write `arch`, `predicted_<target>` (and `std_<target>`)."""
    from ..predictors import load_predictor
    from ..predictors.data import read

    predictor = load_predictor(name)
    card_targets = _card(name).get("target") or [f"target{i}" for i in range(predictor.targets)]
    rows = read(data, predictor.space)
    mean, std = predictor.predict(rows.archs)
    mean = mean.reshape(len(rows.archs), -1)
    std = None if std is None else std.reshape(len(rows.archs), -1)
    header = ["arch", *[f"predicted_{t}" for t in card_targets]] + \
             ([f"std_{t}" for t in card_targets] if std is not None else [])
    with out_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i, text in enumerate(rows.texts):
            w.writerow([text, *(format(v, ".6g") for v in mean[i]),
                        *(format(v, ".6g") for v in (std[i] if std is not None else []))])
    err.print(f"Wrote {len(rows.texts)} predictions to {out_path}")


@app.command("eval")
def evaluate(
    name: Annotated[str, typer.Argument(help="Predictor name or folder.")],
    data: Annotated[str, typer.Option(help=DATA_HELP, show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Kendall tau, Spearman, MAE and the precision of the predicted top 10% on measured data."""
    from ..predictors import load_predictor
    from ..predictors.data import read
    from ..predictors.metrics import reports
    from ..tables import is_table

    predictor = load_predictor(name)
    targets = _card(name).get("target") or []
    rows = read(data, predictor.space, [] if is_table(data) else targets)
    if targets and rows.targets != targets:
        raise UsageError(f"predictor '{name}' predicts {', '.join(targets)}; data '{data}' gives "
                         f"{', '.join(rows.targets)}: evaluate it on its own target")
    if len(rows.targets) != predictor.targets:
        raise UsageError(f"predictor '{name}' predicts {predictor.targets} target(s) ({', '.join(targets)}); "
                         f"data '{data}' gives {len(rows.targets)}")
    if len(rows.archs) < 2:
        raise UsageError(f"data '{data}' has {len(rows.archs)} usable rows; evaluating needs at least 2")
    doc = reports(rows.Y, predictor.predict(rows.archs)[0], targets or rows.targets)
    if as_json:
        return print_json(doc)
    _metrics_table(doc, f"predictor '{name}' on {data}")


def _card(name: str) -> dict:
    from ..predictors.store import find, read_card

    return read_card(find(name))


@app.command("list")
def list_predictors(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List the saved predictors and where each comes from (one whose card cannot be read is
    listed with the reason, on stderr)."""
    from ..errors import NasctlError
    from ..predictors.store import read_card, saved

    rows = []
    for s in saved():
        try:
            card = read_card(s.path)
        except NasctlError as e:
            err.print(f"warning: predictor '{s.name}' is unreadable: {e}", soft_wrap=True, markup=False)
            card = {"model": "(unreadable)"}
        rows.append({"name": s.name, "model": card.get("model"), "space": card.get("space"),
                     "target": ",".join(card.get("target") or []), "rows": (card.get("data") or {}).get("rows"),
                     "origin": s.origin, "path": str(s.path)})
    print_rows(rows, {k: k for k in ("name", "model", "space", "target", "rows", "origin", "path")}, as_json)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Predictor name or folder.")],
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Show a predictor's card: model, space, target, encoding, training data, metrics, versions."""
    card = _card(name)
    if as_json:
        return print_json(card)
    out.print_json(data=card)
