"""`nasctl search`: run a multi-objective, hardware-aware search."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..config import SearchConfig, make_config
from ..errors import UsageError
from ..objectives import objectives_help
from ..strategies import STRATEGIES
from .render import err, out, print_json


def _d(key: str) -> str:
    return f"[default: {SearchConfig.model_fields[key].default}]"


def search(
    space: Annotated[Optional[str], typer.Option(help=f"Search space name or YAML path. {_d('space')}")] = None,
    device: Annotated[Optional[str], typer.Option(help=f"Device name or YAML path. {_d('device')}")] = None,
    dataset: Annotated[Optional[str], typer.Option(
        help=f"'digits', a CIFAR-10 python-batches folder or an .npz file. {_d('dataset')}")] = None,
    strategy: Annotated[Optional[str], typer.Option(
        help="Search strategy: auto (what the search benchmark shows best for the budget: random proposals "
             "screened by a GP surrogate, 600 per real evaluation; tpe under 20 trials) or one of "
             f"{', '.join(STRATEGIES.names())}. {_d('strategy')}")] = None,
    objectives: Annotated[Optional[str], typer.Option(
        help=f"Comma-separated metrics to optimise: {objectives_help()}. "
             "[default: accuracy,edp; accuracy,latency_ms on devices that model latency only; "
             "and area_mm2 with --co-search]")] = None,
    budget: Annotated[Optional[int], typer.Option(help=f"Candidates to evaluate. {_d('budget')}")] = None,
    epochs: Annotated[Optional[int], typer.Option(help=f"Proxy-training epochs per candidate. {_d('epochs')}")] = None,
    repeats: Annotated[Optional[int], typer.Option(
        help=f"Proxy trainings per candidate, with other seeds; accuracy, exit rates and exit accuracies are "
             f"their mean (less noisy labels, for predictors too). {_d('repeats')}")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help=f"Training batch size. {_d('batch_size')}")] = None,
    lr: Annotated[Optional[float], typer.Option(help=f"Learning rate. {_d('lr')}")] = None,
    seed: Annotated[Optional[int], typer.Option(help=f"Seed of every random choice. {_d('seed')}")] = None,
    train_device: Annotated[Optional[str], typer.Option(
        help=f"Where to train: auto, cpu or cuda. {_d('train_device')}")] = None,
    max_latency_ms: Annotated[Optional[float], typer.Option(help="Constraint: expected latency (ms) at most this.")] = None,
    max_energy_mj: Annotated[Optional[float], typer.Option(help="Constraint: expected energy (mJ) at most this.")] = None,
    max_params: Annotated[Optional[int], typer.Option(help="Constraint: parameters at most this.")] = None,
    min_accuracy: Annotated[Optional[float], typer.Option(
        help="Constraint: accuracy (%) at least this.")] = None,
    accuracy_baseline: Annotated[Optional[str], typer.Option(
        help="Constraint: accuracy at least this run's best feasible accuracy less --max-accuracy-drop "
             "(e.g. a static baseline's run folder or id).")] = None,
    max_accuracy_drop: Annotated[Optional[float], typer.Option(
        help=f"With --accuracy-baseline: accuracy points below the baseline allowed. {_d('max_accuracy_drop')}")]
    = None,
    max_weight_kib: Annotated[Optional[str], typer.Option(
        help="Constraint: weights (at their bit widths) in KiB at most this, or 'device' for the device's "
             "on-chip weight memory.")] = None,
    accuracy: Annotated[Optional[str], typer.Option(
        help="Accuracy source: proxy (train each candidate), table:PATH:COLUMN, predictor:NAME (a predictor "
             "saved by `nasctl predictor train`; it also gives exit rates where it predicts exit_rate_* columns), "
             "or supernet:NAME (each candidate inherits its weights from a supernet saved by `nasctl supernet "
             "train`, batch norm recalibrated, exits calibrated and measured as proxy training does). "
             "[default: proxy]")] = None,
    finetune_epochs: Annotated[Optional[int], typer.Option(
        help=f"With --accuracy supernet:NAME: epochs each candidate fine-tunes its inherited weights. "
             f"{_d('finetune_epochs')}")] = None,
    storage: Annotated[Optional[str], typer.Option(
        help="Optuna storage URL (sqlite:///, postgresql://, mysql://) or journal:PATH. "
             "[default: study.db in the run folder]")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name in the storage. [default: the run id]")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Local worker processes on one study. [default: 1]")] = None,
    threads: Annotated[Optional[int], typer.Option(
        help="CPU threads per training. [default: 1 for inputs up to 16x16 pixels, where one thread trains "
             "fastest; else torch's default, or the cores shared among --workers]")] = None,
    surrogate: Annotated[Optional[str], typer.Option(
        help="Screen proposals with an accuracy predictor of this model kind (see `nasctl predictor models`), "
             "refit every generation on the trials so far; only the most promising get real evaluation.")] = None,
    screen: Annotated[Optional[int], typer.Option(
        help="With --surrogate: candidates proposed per real evaluation. [default: 5; with --strategy auto, "
             "600, fewer where a refit would screen over 15,000]")] = None,
    keep_weights: Annotated[Optional[str], typer.Option(
        help="Trained networks kept in the run's models/ folder, for `nasctl export`: all, front (only the "
             f"final front's) or none. {_d('keep_weights')}")] = None,
    exit_policy: Annotated[Optional[str], typer.Option(
        help=f"Early-exit confidence: max-softmax or entropy. {_d('exit_policy')}")] = None,
    exit_tolerance: Annotated[Optional[float], typer.Option(
        help="Accuracy points the early exits may cost on validation data (thresholds calibrated to it); "
             f"spaces with an exit_tolerance knob search it instead. {_d('exit_tolerance')}")] = None,
    exit_rates: Annotated[Optional[str], typer.Option(
        help="Calibrate thresholds to target exit rates instead, e.g. s1=0.3,s2=0.3 (share of all inputs).")] = None,
    pin: Annotated[Optional[str], typer.Option(
        help="Fix knobs of the space, e.g. exit_s1=0,exit_s2=0,backbone_bits=8 (a static baseline).")] = None,
    co_search: Annotated[Optional[bool], typer.Option(
        "--co-search", help="Search the device's own knobs too (cores, MAC array, SRAM sizes: its spec's "
                            "co_search section), recording each candidate's chip area.")] = None,
    preset: Annotated[Optional[str], typer.Option(
        help="Settings shipped in a workspace's presets/ folder (e.g. eenn); --config and flags override it.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        help="YAML or TOML file of settings (keys as in a run's config.yaml); flags override it.")] = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the resolved settings as YAML and exit.")] = False,
    resume: Annotated[Optional[str], typer.Option(
        help="Continue the run in this folder (or run id) to its budget; --budget may raise it.")] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="Run folder. [default: runs/<run-id>]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Search a space for the Pareto front of accuracy and device cost."""
    from ..config import read_config_file, read_settings
    from ..runs import parse_cell
    from ..engine import run_search
    from ..store import find_run, stored_config

    file_values, source = {}, "setting"
    run_dir_given = run_dir
    if resume is not None and (config is not None or preset is not None):
        given = "--config" if config is not None else "--preset"
        raise UsageError(f"--resume {resume} continues the run with its own settings (its config.yaml); {given} "
                         "cannot change them: give --budget, --workers or --threads alone")
    if resume is not None:
        run_dir = find_run(resume)
        file_values, source = read_config_file(run_dir / "config.yaml"), str(run_dir / "config.yaml")
    elif config is not None or preset is not None:
        file_values, source = read_settings(config, preset)
    joined = None
    if resume is None and storage and study and (joined := stored_config(storage, study)):
        # joining a search another machine started: its settings, this machine's flags on top
        file_values, source = {**joined, **file_values}, f"study '{study}'"
    cfg = make_config(file_values, source, space=space, device=device, dataset=dataset, accuracy=accuracy,
                      strategy=strategy, objectives=objectives.split(",") if objectives else None,
                      budget=budget, epochs=epochs, repeats=repeats, finetune_epochs=finetune_epochs,
                      batch_size=batch_size, lr=lr, seed=seed,
                      train_device=train_device, max_latency_ms=max_latency_ms, max_energy_mj=max_energy_mj,
                      max_params=max_params, max_weight_kib=max_weight_kib, min_accuracy=min_accuracy,
                      accuracy_baseline=accuracy_baseline, max_accuracy_drop=max_accuracy_drop,
                      storage=storage, study=study,
                      workers=workers, threads=threads,
                      surrogate=surrogate, screen=screen, keep_weights=keep_weights,
                      exit_policy=exit_policy, exit_tolerance=exit_tolerance,
                      exit_rates=_assignments("--exit-rates", exit_rates, float, "s1=0.3,s2=0.2"),
                      pin=_assignments("--pin", pin, parse_cell, "exit_s1=0,exit_s2=0,backbone_bits=8"),
                      co_search=co_search)
    if resume is not None:
        _check_resume(resume, make_config(file_values, source), cfg, run_dir_given)
    elif joined:
        _check_same_search(f"--study {study}", "the study", make_config(joined, f"study '{study}'"), cfg,
                           "joining a study")
    if print_config:
        import yaml

        from ..hardware.loader import load_device
        from ..spaces.loader import load_space
        from ..tables import is_table

        from ..engine import resolve_strategy
        from ..spaces.pinned import pin_knobs

        pin_knobs(load_space(cfg.space), cfg.pin)  # a malformed space or device file, a bad pin fails here,
        if not is_table(cfg.device):  # as the search would
            load_device(cfg.device)
        resolve_strategy(cfg)
        if cfg.surrogate:
            from ..predictors import PREDICTORS

            PREDICTORS.get(cfg.surrogate)
        return out.out(yaml.safe_dump(cfg.model_dump(), sort_keys=False), end="", highlight=False)
    with _Progress() as progress:
        result = run_search(cfg, run_dir, resume=resume is not None, on_start=progress.start,
                            on_trial=progress.update)
    if as_json:
        return print_json({"run_dir": str(result.run_dir), "front": result.front,
                           "objectives": cfg.objectives,
                           "constraints": [str(c) for c in result.constraints],
                           "timings": result.timings, "unused_budget": result.unused_budget,
                           "failed": result.failed, "notes": result.notes})
    out.print(_front_table(result.front, cfg.objectives))
    out.print(f"{len(result.trials)} candidates evaluated in {result.timings['total_s']:.0f} s; "
              f"{len(result.front)} on the Pareto front.")
    out.print(f"Run folder: {result.run_dir}")
    for note in result.notes:
        err.print(f"note: {note}", highlight=False, markup=False)
    if result.unused_budget > 0:
        err.print(f"note: {result.unused_budget} of the budget's {cfg.budget} trials unused: strategy "
                  f"'{cfg.strategy}' proposed nothing new", highlight=False)


def _assignments(flag: str, text: Optional[str], kind, example: str) -> Optional[dict]:
    """`a=1,b=2` as {"a": kind("1"), "b": kind("2")}; a malformed item is a one-line usage error
    quoting `example`, a valid value of `flag`."""
    if text is None:
        return None
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        try:
            if not (eq and name.strip()):
                raise ValueError
            if name.strip() in out:
                raise typer.BadParameter(f"'{name.strip()}' is given twice; give each name once", param_hint=flag)
            out[name.strip()] = kind(value.strip())
        except ValueError:
            raise typer.BadParameter(f"'{item}' is not NAME=VALUE (e.g. {flag} {example})",
                                     param_hint=flag) from None
    return out


class _Progress:
    """A rich progress bar on stderr (terminals only), one step per evaluated candidate."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.description}"), console=err,
                                  disable=not err.is_terminal)
        self._task = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._progress.stop()

    def start(self, total: int, done: int) -> None:
        self._task = self._progress.add_task("", total=total, completed=done)
        self._progress.start()

    def update(self, row: dict, done: int) -> None:
        cost = f"{row['latency_ms'] * 1e3:.3g} µs" if row["edp"] is None else f"EDP {row['edp'] * 1e6:.3g} µJ·µs"
        self._progress.update(self._task, completed=done, description=f"last: {row['accuracy']:.1f}% {cost}")


RESUME_MAY_CHANGE = ("budget", "workers", "threads")  # how far and how fast, not what the run searches


def _check_resume(run: str, stored, cfg, run_dir_given) -> None:
    """One line where a flag given with --resume would change what the run searches: its
    trials so far were made with the stored settings, and a run holds one search."""
    if run_dir_given is not None:
        raise UsageError(f"--resume {run} continues that run in its own folder; give --run-dir only for a new search")
    _check_same_search(f"--resume {run}", "the run", stored, cfg, "with --resume")


def _check_same_search(label: str, whose: str, stored, cfg, when: str) -> None:
    """One line where the settings would change what a search already under way searches
    (a run resumed, a shared study joined): only RESUME_MAY_CHANGE may differ."""
    before, after = stored.model_dump(), cfg.model_dump()
    changed = [k for k in after if k not in RESUME_MAY_CHANGE and after[k] != before.get(k)]
    if changed:
        k = changed[0]
        raise UsageError(f"{label}: {whose} searched with {k} {before.get(k)!r}; --{k.replace('_', '-')} "
                         f"{after[k]!r} would change it ({when} only "
                         f"{', '.join('--' + m for m in RESUME_MAY_CHANGE)} may change; start a new search instead)")


def _front_table(front: list[dict], objectives: list[str]) -> Table:
    """The front, with only the columns that mean something for this search."""
    from ..runs import DISPLAY, display

    archs = [json.loads(row["arch"]) for row in front]
    exit_cols = [k for k in (front[0] if front else {}) if k.startswith("exit_rate_")]

    def metric(name: str) -> tuple[str, callable]:  # in the unit `runs show` uses
        return f"{DISPLAY[name][0]} {DISPLAY[name][1]}", lambda r, a: display(name, r[name], unit=False)

    cols: list[tuple[str, callable]] = [
        ("trial", lambda r, a: str(r["trial"])), ("acc %", lambda r, a: f"{r['accuracy']:.1f}"), metric("latency_ms")]
    if any(r["energy_mj"] is not None for r in front):
        cols += [metric("energy_mj"), metric("edp")]
    cols.append(("params", lambda r, a: f"{r['params']:,}"))
    if any("backbone_bits" in a for a in archs):
        cols.append(("bits b/e", lambda r, a: f"{a.get('backbone_bits', '-')}/{a.get('exit_bits', '-')}"))
    if any(r.get("area_mm2") is not None for r in front):
        cols += [("area mm²", lambda r, a: f"{r['area_mm2']:.3g}"),
                 ("accelerator", lambda r, a: f"{a['hw_cores']}×{a['hw_mac_array']} "
                                              f"{a['hw_weight_sram_kib']}/{a['hw_act_sram_kib']} KiB")]
    if len(exit_cols) > 1 and any(r.get("exit_overhead") is not None for r in front):
        cols += [("exit overhead %", lambda r, a: f"{100 * r['exit_overhead']:.2f}"),
                 ("dyn. eff. %", lambda r, a: f"{100 * r['dynamic_efficiency']:.1f}")]
    if len(exit_cols) > 1:
        cols.append(("exits taken", lambda r, a: " ".join(
            f"{k.removeprefix('exit_rate_')}:{r[k]:.0%}" for k in exit_cols if r[k] > 0)))
    table = Table(title=f"Pareto front ({', '.join(objectives)})")
    for name, _ in cols:
        table.add_column(name, justify="left" if name in ("exits taken", "accelerator") else "right")
    for row, arch in zip(front, archs):
        table.add_row(*(fmt(row, arch) for _, fmt in cols))
    return table
