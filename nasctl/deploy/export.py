"""`nasctl export` and `nasctl eval`: from a trial of a run to a deployed model, and back.

An export folder holds
    model.onnx   the early-exit network as one graph (`nasctl.deploy.onnx_graph`)
    model.pt     its torch state_dict (weights, batch-norm statistics, QAT ranges)
    card.yaml    what it is and how it was made: space, architecture, bit widths, exits,
                 policy and thresholds, input shape and normalisation, classes, dataset
                 and split seed, the trial's figures from the run and this model's own,
                 package versions and the SHA-256 of both files
and, once `nasctl eval` ran, eval.json (what it measured).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..config import SEED_LIMIT
from ..errors import UsageError
from ..evaluation import kept

CARD = "card.yaml"
ONNX_FILE = "model.onnx"
WEIGHTS = "model.pt"
EVAL_FILE = "eval.json"
EXPORTS = "exports"
CARD_FORMAT = 1
RETRAIN_FACTOR = 4  # --retrain without --epochs: this many times the run's epochs


def _versions() -> dict:
    import importlib.metadata as md

    from .. import __version__

    out = {"nasctl": __version__}
    for pkg in ("torch", "onnx", "onnxruntime", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def trial_row(run, trial: int) -> dict:
    """The trials.csv row of trial `trial` of `run`; one-line errors for a failed or unknown one."""
    for row in run.trials:
        if row.get("trial") == trial:
            return row
    failed = _failed_reason(run, trial)
    if failed is not None:
        raise UsageError(f"trial {trial} of run '{run.id}' failed ({failed}); it has no model to export")
    numbers = sorted(r["trial"] for r in run.trials)
    shown = ", ".join(map(str, numbers[:12])) + (", ..." if len(numbers) > 12 else "")
    raise UsageError(f"run '{run.id}' has no finished trial {trial}; its trials: {shown or 'none'}")


def _failed_reason(run, trial: int) -> Optional[str]:
    from ..runs import _RunStudy

    study = _RunStudy.of(run.path, run.config)
    if study is None:
        return None
    try:
        import optuna

        from ..store import open_storage

        storage = open_storage(study.url)
        name = study._pick(optuna.get_all_study_names(storage))
        if name is None:
            return None
        for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False):
            if t.number == trial and t.state == optuna.trial.TrialState.FAIL:
                return str(t.user_attrs.get("error", "stopped before it finished"))
    except Exception:  # noqa: BLE001 - the study cannot be read: the trial is just unknown
        return None
    return None


def _net_arch(run, row: dict) -> dict:
    from ..spaces.cosearch import CoSearchSpace

    arch = json.loads(row["arch"]) if isinstance(row["arch"], str) else dict(row["arch"])
    return CoSearchSpace.split(arch)[0] if run.config.get("co_search") else arch


def _load_network(meta: dict, weights: Path):
    """The trained torch network a kept model's description and weights give."""
    from ..spaces.loader import load_space

    space_file = Path(meta["space"]["file"])
    if not space_file.is_file():
        raise UsageError(f"the search space file {space_file} the model was trained in no longer exists")
    if kept.sha256(space_file) != meta["space"]["sha256"]:
        raise UsageError(f"the search space file {space_file} has changed since the model was trained; "
                         "restore it to export this model")
    space = _exportable(load_space(space_file))
    net = space.build(meta["arch"], tuple(meta["input_shape"]), meta["classes"])
    state = kept.load_weights(weights, meta.get("weights_sha256"))
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise UsageError(f"{weights} does not hold this architecture's weights: "
                         f"{' '.join(str(e).split())[:200]}") from None
    return space, net.eval()


def _exportable(space):
    from ..spaces.mbv2 import Mbv2Space
    from ..spaces.vit import VitSpace

    if not isinstance(space, (Mbv2Space, VitSpace)):
        raise UsageError(f"space '{space.name}' is of a kind nasctl cannot export yet; allowed: mbv2, vit")
    return space


def _check_data(data, name: str, input_shape, classes: int) -> None:
    """One line where a dataset's inputs or classes are not the model's."""
    if tuple(data.input_shape) != tuple(input_shape) or data.classes != classes:
        raise UsageError(f"dataset '{name}' has inputs {list(data.input_shape)} and {data.classes} classes; the "
                         f"model takes {list(input_shape)} and {classes}")


def _retrain(meta: dict, epochs: int, dataset: Optional[str], on_epoch: Optional[Callable] = None):
    """Train the architecture from scratch on the training and validation splits for
    `epochs`, calibrate its thresholds on the validation split (inputs it has now seen)
    and measure it on the test split: the final training before deployment."""
    import numpy as np

    from ..engine import ONE_THREAD_PIXELS
    from ..evaluation.datasets import load_dataset
    from ..evaluation.train import TrainSettings, evaluate
    from ..spaces.loader import load_space

    data = load_dataset(dataset or meta["dataset"]["name"], meta["dataset"]["split_seed"])
    _check_data(data, dataset or meta["dataset"]["name"], meta["input_shape"], meta["classes"])
    both = type(data)(**{**data.__dict__, "x_train": np.concatenate([data.x_train, data.x_val]),
                         "y_train": np.concatenate([data.y_train, data.y_val])})
    t = meta["training"]
    c, h, w = data.input_shape
    settings = TrainSettings(epochs=epochs, batch_size=t["batch_size"], lr=t["lr"], weight_decay=t["weight_decay"],
                             exit_weight=t["exit_weight"], exit_tolerance=t["exit_tolerance"],
                             exit_policy=meta["exit_policy"], exit_rates=t.get("exit_rates"), device="cpu",
                             threads=1 if h * w <= ONE_THREAD_PIXELS else None)
    space = _exportable(load_space(Path(meta["space"]["file"])))
    got: dict[str, Any] = {}

    def keep(model, result) -> None:
        got["model"], got["result"] = model, result

    evaluate(space, meta["arch"], both, settings, seed=t["seed"], keep=keep)
    return space, got["model"].eval(), got["result"], settings


def export_trial(run_name: str, trial: int, out: Optional[Path] = None, *, retrain: bool = False,
                 epochs: Optional[int] = None, dataset: Optional[str] = None) -> tuple[Path, dict]:
    """Write trial `trial` of a run as an export folder; (the folder, its card)."""
    from ..runs import load as load_run

    t0 = time.perf_counter()
    run = load_run(run_name)
    row = trial_row(run, trial)
    arch = _net_arch(run, row)
    from ..spaces.base import arch_key

    folder = kept.folder_of(run.path, arch_key(arch))
    if not (folder / kept.META).is_file():
        why = {"none": "it ran with --keep-weights none", "front": "it kept only its final front's weights "
               "(--keep-weights front)"}.get(str(run.config.get("keep_weights")),
                                               "it kept no trained weights for it (accuracy not from training, "
                                               "or a run made before weights were kept)")
        raise UsageError(f"run '{run.id}' has no kept weights for trial {trial}: {why}; "
                         "re-run the search with --keep-weights all, or export with --retrain")
    meta = kept.read_meta(folder)
    if epochs is not None and not retrain:
        raise UsageError("--epochs sets the retraining's epochs: give it with --retrain")
    out = Path(out) if out is not None else run.path / EXPORTS / (f"trial-{trial}" + ("-retrained" if retrain else ""))
    made = _check_out(out, run.id, trial)  # before any retraining, which a folder it cannot write would waste
    try:
        return _export(run, trial, row, meta, folder, out, retrain, epochs, dataset, t0)
    except BaseException:
        if made and not any(out.iterdir()):
            out.rmdir()  # the folder this export made, left empty
        raise


def _export(run, trial: int, row: dict, meta: dict, folder: Path, out: Path, retrain: bool, epochs: Optional[int],
            dataset: Optional[str], t0: float) -> tuple[Path, dict]:
    import onnx

    from .onnx_graph import build_graph

    if retrain:
        epochs = epochs if epochs is not None else RETRAIN_FACTOR * int(meta["training"]["epochs"])
        if epochs < 1:
            raise UsageError(f"--epochs {epochs} is out of range; allowed: 1 or more")
        space, net, result, settings = _retrain(meta, epochs, dataset)
        thresholds = result.thresholds
        model_figures = {"accuracy": result.accuracy, "exit_rates": _named(meta["exits"], result.exit_rates),
                         "exit_accuracies": _named(meta["exits"], result.exit_accuracies),
                         "trained_on": "train+validation", "epochs": epochs,
                         "thresholds_calibrated_on": "validation (seen in training)",
                         "train_seconds": round(result.train_seconds, 3)}
        state = net.state_dict()
    else:
        space, net = _load_network(meta, folder / kept.WEIGHTS)
        thresholds = meta["thresholds"]
        f = meta["figures"]
        model_figures = {"accuracy": f["accuracy"], "exit_rates": _named(meta["exits"], f["exit_rates"]),
                         "exit_accuracies": _named(meta["exits"], f["exit_accuracies"]),
                         "trained_on": "train", "epochs": meta["training"]["epochs"]}
        if "supernet" in meta:  # the weights it inherited from a supernet (`--accuracy supernet:NAME`)
            model_figures.update(weights=f"inherited from supernet '{meta['supernet']['name']}', batch norm "
                                         "recalibrated", epochs=meta["supernet"].get("finetune_epochs", 0),
                                 supernet=meta["supernet"])
        state = None
    model = build_graph(net, meta["input_shape"], meta["classes"], meta["exits"], thresholds,
                        meta["exit_policy"], doc=f"nasctl export of trial {trial} of run {run.id}")
    onnx.save(model, out / ONNX_FILE)
    if state is None:
        shutil.copyfile(folder / kept.WEIGHTS, out / WEIGHTS)
    else:
        import torch

        torch.save({k: v.detach().cpu().contiguous() for k, v in state.items()}, out / WEIGHTS)
    layers = space.to_layers(meta["arch"], tuple(meta["input_shape"]), meta["classes"])
    card = {
        "format": CARD_FORMAT,
        "run": {"id": run.id, "path": str(run.path), "trial": trial, "device": run.config.get("device"),
                "objectives": run.objectives},
        "space": meta["space"], "arch": meta["arch"],
        "bits": {k: v for k, v in meta["arch"].items() if k.endswith("bits")},
        "layer_bits": [{"name": l.name, "op": l.op, "w_bits": l.w_bits, "a_bits": l.a_bits} for l in layers],
        "input": {"name": "input", "shape": [1, *meta["input_shape"]], "dtype": "float32",
                  "normalisation": meta["normalisation"]},
        "classes": meta["classes"],
        "outputs": {"logits": f"float32 [1, {meta['classes']}]", "exit": "int64 [1]: index into exits"},
        "exits": meta["exits"], "exit_policy": meta["exit_policy"],
        "thresholds": _named(meta["exits"][:-1], thresholds),
        "dataset": meta["dataset"],
        "figures": {
            "run": {"accuracy": row.get("accuracy"), "latency_ms": row.get("latency_ms"),
                    "energy_mj": row.get("energy_mj"), "edp": row.get("edp"),
                    "exit_rates": {e: row.get(f"exit_rate_{e}") for e in meta["exits"]},
                    "exit_accuracies": {e: row.get(f"exit_acc_{e}") for e in meta["exits"]},
                    "repeats": run.config.get("repeats", 1)},
            "model": model_figures,
        },
        "versions": _versions(),
        "files": {ONNX_FILE: kept.sha256(out / ONNX_FILE), WEIGHTS: kept.sha256(out / WEIGHTS)},
        "export_seconds": round(time.perf_counter() - t0, 3),
    }
    _write_card(out, card)
    (out / EVAL_FILE).unlink(missing_ok=True)  # measured on what was there before
    _record(run.path, out)
    return out, card


INDEX = "exports.json"  # in the run folder: the export folders made from it, wherever they are


def _record(run_dir: Path, folder: Path) -> None:
    path = Path(run_dir) / INDEX
    try:
        known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except ValueError:
        known = []
    entry = str(Path(folder).resolve())
    if entry not in known:
        try:
            path.write_text(json.dumps([*known, entry], indent=1), encoding="utf-8")
        except OSError:  # a read-only run folder: the export stands on its own
            pass


def exported(run_dir: Path) -> list[dict]:
    """The export folders made from a run that still hold a readable card: each as
    {folder, card, eval (eval.json's document, or None)}, by trial."""
    path = Path(run_dir) / INDEX
    try:
        folders = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except ValueError:
        folders = []
    found = []
    for folder in folders:
        try:
            card = read_card(Path(folder), check_files=False)
        except UsageError:
            continue
        ev = None
        if (Path(folder) / EVAL_FILE).is_file():
            try:
                ev = json.loads((Path(folder) / EVAL_FILE).read_text(encoding="utf-8"))
            except ValueError:
                pass
        found.append({"folder": folder, "card": card, "eval": ev})
    return sorted(found, key=lambda e: (e["card"]["run"]["trial"], e["folder"]))


def _named(names, values) -> dict:
    return {n: (None if v is None else float(v)) for n, v in zip(names, values)}


def _write_card(out: Path, card: dict) -> None:
    import yaml

    (out / CARD).write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")


def _check_out(out: Path, run_id: str, trial: int) -> bool:
    """Make the export folder `out`, refusing, in one line, a path that is not a folder it
    can write, or a folder holding another trial's export (which writing would replace);
    whether it made the folder."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder; give a folder to write the export into")
    if (out / CARD).is_file():
        try:
            held = read_card(out, check_files=False)["run"]
            theirs = (str(held["id"]), int(held["trial"]))
        except (UsageError, KeyError, TypeError, ValueError):
            theirs = None
        if theirs != (str(run_id), trial):
            what = f"trial {theirs[1]} of run '{theirs[0]}'" if theirs else "an export this one cannot read"
            raise UsageError(f"--out {out} holds the export of {what}; give another --out, or remove that "
                             "folder first")
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write the export to --out {out}: {e.strerror or e}") from None
    return made


def read_card(folder: Path, check_files: bool = True) -> dict:
    """An export folder's card, its files checked against their recorded hashes."""
    from ..specs import read_yaml

    folder = Path(folder)
    path = folder / CARD
    if not path.is_file():
        raise UsageError(f"'{folder}' is not an export folder: it has no {CARD} (make one with `nasctl export`)")
    card = read_yaml(path)
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise UsageError(f"{path}: format {card.get('format') if isinstance(card, dict) else '?'} is not "
                         f"supported; allowed: {CARD_FORMAT}")
    for key in ("exits", "files", "input", "dataset", "figures", "classes"):
        if key not in card:
            raise UsageError(f"{path} lacks '{key}'; it is not a card `nasctl export` wrote")
    seed = card["dataset"].get("split_seed") if isinstance(card["dataset"], dict) else None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise UsageError(f"{path}: dataset: split_seed {seed!r} is not a whole number in 0 ... {SEED_LIMIT - 1}")
    if check_files:
        for name, digest in card["files"].items():
            f = folder / name
            if not f.is_file():
                raise UsageError(f"{f} is missing from the export folder")
            if kept.sha256(f) != digest:
                raise UsageError(f"{f} has changed since it was exported (its SHA-256 differs from {CARD}'s)")
    return card


def evaluate_export(folder: Path, dataset: Optional[str] = None, rounds: int = 15) -> dict:
    """Run model.onnx with onnxruntime over the test split the search used: accuracy, the
    share leaving at each exit, and the latency per exit taken (one input that leaves
    there, timed by the `hw validate` protocol) and on average; beside the figures
    recorded for the model and the trial.  Written to eval.json too."""
    import numpy as np

    from ..evaluation.datasets import load_dataset
    from ..hardware.measure.timing import Protocol, interleaved_min, make_session

    folder = Path(folder)
    card = read_card(folder)
    data = load_dataset(dataset or card["dataset"]["name"], card["dataset"]["split_seed"])
    _check_data(data, dataset or card["dataset"]["name"], card["input"]["shape"][1:], card["classes"])
    try:
        sess = make_session(folder / ONNX_FILE, threads=1)
    except Exception as e:  # noqa: BLE001 - onnxruntime cannot load it
        raise UsageError(f"onnxruntime cannot load {folder / ONNX_FILE}: {' '.join(str(e).split())[:200]}") from None
    exits = card["exits"]
    taken = np.empty(len(data.y_test), dtype=np.int64)
    pred = np.empty(len(data.y_test), dtype=np.int64)
    for i, x in enumerate(data.x_test):
        logits, k = sess.run(None, {"input": x[None]})
        pred[i], taken[i] = int(np.argmax(logits)), int(k[0])
    n = len(taken)
    rates = np.bincount(taken, minlength=len(exits)) / n
    protocol = Protocol(threads=1, rounds=rounds)
    first = {k: int(np.flatnonzero(taken == k)[0]) for k in range(len(exits)) if (taken == k).any()}
    runs = [lambda i=i: sess.run(None, {"input": data.x_test[i][None]}) for i in first.values()]
    times = dict(zip(first, interleaved_min(runs, protocol))) if runs else {}
    latency = {exits[k]: float(times[k]) if k in times else None for k in range(len(exits))}
    doc = {
        "model": str(folder / ONNX_FILE),
        "dataset": {"name": dataset or card["dataset"]["name"], "split_seed": card["dataset"]["split_seed"],
                    "test": n},
        "accuracy": 100.0 * float((pred == data.y_test).mean()),
        "exit_rates": {e: float(r) for e, r in zip(exits, rates)},
        "latency_ms": {"per_exit": latency,
                       "mean": float(sum(rates[k] * times[k] for k in times)),
                       "protocol": protocol.describe(), "device": "this machine, onnxruntime CPU, 1 thread"},
        "model_figures": card["figures"].get("model"),
        "trial_figures": card["figures"].get("run"),
    }
    (folder / EVAL_FILE).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc
