"""The search loop: ask → evaluate → store → tell.

Strategies only propose; the engine prices each candidate on the device, trains it,
combines the two into the expected cost over its exits, writes the trial as soon as
it finishes, and reports objective and constraint values back to the strategy.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import workspace
from .config import SearchConfig
from .errors import Interrupted, UsageError, WorkFailed
from .hardware.base import expected_cost
from .hardware.loader import load_device
from .objectives import CONSTRAINT_METRICS, Constraint, minimisation_matrix, pareto_mask
from .spaces.base import arch_key
from .spaces.loader import load_space
from .store import RunStore
from .strategies import STRATEGIES

# How many rounds in a row a strategy may propose only candidates already evaluated.
_MAX_STALLED_ROUNDS = 50


@dataclass
class SearchResult:
    run_dir: Path
    trials: list[dict]
    front: list[dict]
    constraints: list[Constraint]
    timings: dict = field(default_factory=dict)


def candidate_seed(seed: int, key: str) -> int:
    """The training seed of one candidate: the same for the same run seed and architecture,
    whatever order the strategy proposes it in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


def run_search(cfg: SearchConfig, run_dir: Path | None = None,
               on_start: Callable[[int], None] | None = None,
               on_trial: Callable[[dict, int], None] | None = None) -> SearchResult:
    """Run a search; `on_start(budget)` is called once the inputs are checked and the run
    folder exists, `on_trial(row, n_done)` after each evaluated candidate."""
    from .evaluation.datasets import load_dataset
    from .evaluation.train import TrainSettings, evaluate, resolve_train_device

    t_start = time.perf_counter()
    space = load_space(cfg.space)
    device = load_device(cfg.device)
    strategy = STRATEGIES.get(cfg.strategy)()
    if not device.models_energy and {"energy_mj", "edp"} & set(cfg.objectives):
        raise UsageError(f"device '{device.name}' models latency only; objectives energy_mj and edp "
                         "need a device that models energy")
    train_device = resolve_train_device(cfg.train_device)
    dataset = load_dataset(cfg.dataset, cfg.seed)
    settings = TrainSettings(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                             device=train_device, exit_tolerance=cfg.exit_tolerance)
    constraints = [Constraint(metric, getattr(cfg, flag)) for flag, metric in CONSTRAINT_METRICS.items()
                   if getattr(cfg, flag) is not None]

    exits = space.exit_names()
    columns = ["trial", "arch", "accuracy", "latency_ms", "energy_mj", "edp", "params", "macs",
               *[f"exit_rate_{e}" for e in exits], "feasible", "train_s"]
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{space.name}-{cfg.strategy}-s{cfg.seed}"
    store = RunStore.create(run_dir, run_id, columns)
    store.write_config({**cfg.model_dump(), "resolved": {
        "space": str(workspace.find("search_spaces", cfg.space, "search space")),
        "device": str(workspace.find("hardware", cfg.device, "device")),
        "dataset": {"name": dataset.name, "input_shape": list(dataset.input_shape),
                    "classes": dataset.classes, "train": len(dataset.y_train),
                    "val": len(dataset.y_val), "test": len(dataset.y_test)},
        "train_device": train_device}})

    def evaluate_candidate(arch: dict) -> dict:
        report = device.estimate(space.to_layers(arch, dataset.input_shape, dataset.classes))
        if report.unsupported:
            ops = ", ".join(f"{op} x{n}" for op, n in report.unsupported.items())
            raise UsageError(f"device '{device.name}' cannot price op(s) {ops} of space '{space.name}'")
        lat_path, en_path = report.exit_path_costs()
        t0 = time.perf_counter()
        res = evaluate(space, arch, dataset, settings, seed=candidate_seed(cfg.seed, arch_key(arch)))
        latency = expected_cost(lat_path, res.exit_rates)
        energy = expected_cost(en_path, res.exit_rates) if en_path is not None else None
        rates = dict.fromkeys(exits, 0.0)
        rates.update(zip(space.active_exits(arch), res.exit_rates))
        row = {"arch": arch_key(arch), "accuracy": res.accuracy, "latency_ms": latency,
               "energy_mj": energy, "edp": None if energy is None else latency * energy,
               "params": sum(layer.params for layer in report.layers),
               "macs": sum(layer.macs for layer in report.layers),
               **{f"exit_rate_{e}": p for e, p in rates.items()},
               "train_s": time.perf_counter() - t0}
        row["feasible"] = all(c.violation(row) <= 0 for c in constraints)
        return row

    strategy.setup(space, len(cfg.objectives), len(constraints), seed=cfg.seed, budget=cfg.budget)
    trials: list[dict] = []
    seen: dict[str, dict] = {}
    stalled = 0
    if on_start:
        on_start(cfg.budget)
    try:
        while len(trials) < cfg.budget and stalled < _MAX_STALLED_ROUNDS:
            archs = [space.validate(a) for a in strategy.ask(cfg.budget - len(trials))]
            if not archs:
                break
            before = len(trials)
            for arch in archs:
                key = arch_key(arch)
                if key not in seen and len(trials) < cfg.budget:
                    row = {"trial": len(trials), **evaluate_candidate(arch)}
                    seen[key] = row
                    trials.append(row)
                    store.append(row)
                    if on_trial:
                        on_trial(row, len(trials))
            told = [a for a in archs if arch_key(a) in seen]
            rows = [seen[arch_key(a)] for a in told]
            strategy.tell(told, minimisation_matrix(rows, cfg.objectives),
                          [[c.violation(r) for c in constraints] for r in rows])
            stalled = stalled + 1 if len(trials) == before else 0
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {len(trials)} of {cfg.budget} trials; they are kept in "
                          f"{store.trials_path}") from None
    finally:
        front = _front(trials, cfg.objectives)
        store.write_pareto(front)
    result = SearchResult(store.path, trials, front, constraints, {
        "total_s": round(time.perf_counter() - t_start, 3),
        "train_s": round(sum(t["train_s"] for t in trials), 3),
        "trials": len(trials)})
    if trials and not front and constraints:
        best = ", ".join(f"{c} (best seen {min(t[c.metric] for t in trials):.4g})" for c in constraints)
        raise WorkFailed(f"no evaluated candidate meets {best}; "
                         f"all {len(trials)} trials are kept in {store.path / 'trials.csv'}")
    return result


def _front(trials: list[dict], objectives: list[str]) -> list[dict]:
    feasible = [t for t in trials if t["feasible"]]
    if not feasible:
        return []
    F = minimisation_matrix(feasible, objectives)
    mask = pareto_mask(F)
    order = sorted(range(len(feasible)), key=lambda i: tuple(F[i]))
    return [feasible[i] for i in order if mask[i]]
