"""`nasctl export` and `nasctl eval`: a front point as a deployable model, and its check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .render import out, print_json


def export(
    run: Annotated[str, typer.Argument(help="Run id under the workspace's runs/, or a run folder path.")],
    trial: Annotated[int, typer.Option(help="The trial to export (its number in trials.csv).", show_default=False)],
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Folder to write. [default: RUN/exports/trial-N]")] = None,
    retrain: Annotated[bool, typer.Option(
        "--retrain", help="Train the architecture from scratch on training + validation data first (the "
                          "final training before deploying), re-calibrate its thresholds and measure it on test.")]
    = False,
    epochs: Annotated[Optional[int], typer.Option(
        help="Epochs of --retrain. [default: 4 x the run's epochs]")] = None,
    dataset: Annotated[Optional[str], typer.Option(
        help="With --retrain: where the run's dataset is now (a moved folder or file). [default: as the run "
             "recorded it]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the card as one JSON document.")] = False,
):
    """Write a trial as model.onnx (the early-exit network as one graph, quantized as
    searched), model.pt (its state_dict) and card.yaml."""
    from ..deploy.export import export_trial

    folder, card = export_trial(run, trial, out_dir, retrain=retrain, epochs=epochs, dataset=dataset)
    if as_json:
        return print_json({"folder": str(folder), **card})
    size = (folder / "model.onnx").stat().st_size
    fig = card["figures"]["model"]
    out.print(f"trial {trial} of {card['run']['id']} -> {folder} (model.onnx {size / 1024:.1f} KiB, "
              f"{card['export_seconds']:.1f} s)", soft_wrap=True)
    out.print(f"exits {', '.join(card['exits'])}; policy {card['exit_policy']}; thresholds "
              + (", ".join(f"{k}={v:.4g}" for k, v in card["thresholds"].items()) or "none")
              + f"; test accuracy {fig['accuracy']:.2f}%", soft_wrap=True)


def eval_(
    folder: Annotated[Path, typer.Argument(help="An export folder (`nasctl export`).", show_default=False)],
    dataset: Annotated[Optional[str], typer.Option(
        help="Where the dataset is now, if it moved. [default: as the card records it]")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Timing rounds (interleaved, minimum).")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Run model.onnx with onnxruntime over the test split the search used: accuracy, the
    share leaving at each exit and the latency per exit taken, beside the recorded figures."""
    from ..deploy.export import evaluate_export

    doc = evaluate_export(folder, dataset, rounds)
    if as_json:
        return print_json(doc)
    model, trial = doc["model_figures"] or {}, doc["trial_figures"] or {}
    t = Table(title=f"{doc['model']} on {doc['dataset']['name']} test ({doc['dataset']['test']} inputs)")
    for c in ("", "onnxruntime", "model (torch)", "trial (run)"):
        t.add_column(c, justify="right" if c else "left")
    fmt = lambda v, unit="": "-" if v is None else f"{v:.2f}{unit}"  # noqa: E731
    t.add_row("accuracy %", fmt(doc["accuracy"]), fmt(model.get("accuracy")), fmt(trial.get("accuracy")))
    for e, r in doc["exit_rates"].items():
        t.add_row(f"exit rate {e} %", fmt(100 * r), fmt(_pct((model.get("exit_rates") or {}).get(e))),
                  fmt(_pct((trial.get("exit_rates") or {}).get(e))))
    for e, ms in doc["latency_ms"]["per_exit"].items():
        t.add_row(f"latency leaving at {e} ms", fmt(ms, ""), "", "")
    t.add_row("latency, mean ms", fmt(doc["latency_ms"]["mean"]), "", fmt(trial.get("latency_ms")) +
              " (predicted, run's device)")
    out.print(t)


def _pct(v):
    return None if v is None else 100 * v
