"""The search loop: ask → evaluate → store → tell.

Strategies only propose; the engine prices each candidate on the device, scores its
accuracy (proxy training or a table), combines cost and exit rates into the expected
cost over the candidate's exits, stores the trial in the run's optuna study and in
trials.csv as soon as it finishes, and reports objective and constraint values back to
the strategy.  Every finished trial is kept: a search that stops (Ctrl-C, a killed
worker) continues with `--resume`, replaying the strategy over the stored results.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .config import SearchConfig
from .errors import Interrupted, UsageError, WorkFailed
from .hardware.base import dynamic_efficiency, exit_overhead, expected_cost
from .hardware.loader import load_device
from .objectives import CONSTRAINT_METRICS, METRICS, Constraint, pareto_front
from .spaces.base import arch_key
from .spaces.cosearch import CoSearchSpace, co_search
from .spaces.loader import load_space
from .spaces.pinned import pin_knobs
from .store import RunStore, TrialStore, open_storage
from .strategies import STRATEGIES
from .strategies.auto import AUTO, choose as choose_auto
from .loop import Unpriced, search_loop, summarise_failures
from .surrogate import Outcomes, Surrogate, log_refit
from .tables import ArchTable, MissingEntry, is_table

# `--accuracy predictor:NAME`: accuracy (and exit rates) from a saved predictor.
PREDICTOR_PREFIX = "predictor:"
# `--accuracy supernet:NAME`: each candidate measured with the weights it inherits from a saved supernet.
SUPERNET_PREFIX = "supernet:"
# Candidates proposed per real evaluation with --surrogate, unless --screen says.
DEFAULT_SCREEN = 5


@dataclass
class SearchResult:
    run_dir: Path
    trials: list[dict]
    front: list[dict]
    constraints: list[Constraint]
    timings: dict = field(default_factory=dict)
    unused_budget: int = 0  # trials left when the strategy stopped proposing new architectures
    notes: list[str] = field(default_factory=list)  # what the user should know: capped workers, failed trials
    failed: int = 0  # trials that failed (could not be priced, built or trained)


def candidate_seed(seed: int, key: str) -> int:
    """The training seed of one candidate: the same for the same run seed and architecture,
    whatever order (or worker) it is proposed in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


# Inputs of at most this many pixels train fastest on one torch thread: their tensors are
# too small to split (a digits candidate: 2.5 s on one thread, 4.0 s on two idle cores,
# 11.6 s on two beside one busy process; 32x32 inputs: 39 s on one thread, 27 s on two).
ONE_THREAD_PIXELS = 16 * 16


def train_threads(cfg: SearchConfig, input_shape: tuple[int, int, int]) -> int | None:
    """Torch CPU threads for each training: `threads` where set; else one for small
    inputs; else the cores shared among the local workers (None: torch's default, one per
    core, for a single worker)."""
    if cfg.threads is not None:
        return cfg.threads
    if input_shape[1] * input_shape[2] <= ONE_THREAD_PIXELS:
        return 1
    return max(1, (os.cpu_count() or 1) // cfg.workers) if cfg.workers > 1 else None


# Before a search with cost bounds: candidates sampled, and the most candidates priced in
# all, in looking for one that meets them (`Evaluator.check_costs_reachable`).
FEASIBILITY_SAMPLES = 64
FEASIBILITY_PRICES = 2000


class Evaluator:
    """Scores one architecture: cost on the device (or a latency table) and accuracy
    (proxy training or an accuracy table)."""

    def __init__(self, cfg: SearchConfig):
        self.cfg = cfg
        self.device = None if is_table(cfg.device) else load_device(cfg.path("device"))
        space = load_space(cfg.path("space"))
        self.space = pin_knobs(co_search(space, self.device, cfg.device) if cfg.co_search else space, cfg.pin)
        self.net_space = space if cfg.co_search else self.space  # the knobs accuracy depends on
        self._outcomes: dict[str, tuple[float, list[float]]] = {}
        self._exit_accuracies: dict[str, list[float]] = {}  # trained networks: each active exit's own accuracy
        self._networks: dict[str, str] = {}  # canonical form -> the first key scored with it
        self._costs: dict[str, dict] = {}  # key -> what pricing it gives whatever its exit rates (see `costs`)
        self.latency_table = ArchTable(cfg.device, self.space, low=0.0) if is_table(cfg.device) else None
        models_energy = self.device is not None and self.device.models_energy
        if not models_energy and {"energy_mj", "edp", "exit_overhead", "dynamic_efficiency"} & set(cfg.objectives):
            raise UsageError(f"device '{cfg.device}' models latency only; objectives energy_mj, edp, exit_overhead "
                             "and dynamic_efficiency "
                             "need a device that models energy (e.g. --objectives accuracy,latency_ms)")
        if not models_energy and cfg.max_energy_mj is not None:
            raise UsageError(f"device '{cfg.device}' models latency only; --max-energy-mj needs a device that models "
                             "energy (or bound the latency: --max-latency-ms)")
        if "area_mm2" in cfg.objectives and not cfg.co_search:
            raise UsageError("objective area_mm2 is the chip area of a co-searched accelerator: add --co-search")
        self.constraints = [Constraint(metric, self._limit(flag)) for flag, metric in CONSTRAINT_METRICS.items()
                            if getattr(cfg, flag) is not None]
        self.min_accuracy = self._min_accuracy()
        if self.min_accuracy is not None:
            self.constraints.append(Constraint("accuracy", self.min_accuracy, lower=True))
        self.exits = self.space.exit_names()
        unknown = sorted(set(cfg.exit_rates or ()) - set(self.exits[:-1]))
        if unknown:
            raise UsageError(f"exit_rates: unknown exit(s) {', '.join(unknown)}; early exits of space "
                             f"'{self.space.name}': {', '.join(self.exits[:-1]) or 'none'}")
        if cfg.repeats > 1 and cfg.accuracy != "proxy":
            raise UsageError(f"repeats {cfg.repeats}: repeated trainings need accuracy 'proxy', "
                             f"not '{cfg.accuracy}'")
        self.dataset = self.acc_table = self.acc_model = None
        self.keep_in: Path | None = None  # the run folder whose models/ keeps trained networks (see kept_in)
        self.supernet = None
        if cfg.accuracy == "proxy" or cfg.accuracy.startswith(SUPERNET_PREFIX):
            from .evaluation.datasets import load_dataset
            from .evaluation.train import TrainSettings, resolve_train_device

            self.train_device = resolve_train_device(cfg.train_device)
            self.dataset = load_dataset(cfg.dataset, cfg.seed)
            threads = train_threads(cfg, self.dataset.input_shape) if self.train_device == "cpu" else None
            self.settings = TrainSettings(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                                          device=self.train_device, exit_tolerance=cfg.exit_tolerance,
                                          exit_policy=cfg.exit_policy,
                                          exit_rates=None if cfg.exit_rates is None else
                                          {e: cfg.exit_rates.get(e, 0.0) for e in self.exits[:-1]},
                                          threads=threads)
            self.input_shape, self.classes = self.dataset.input_shape, self.dataset.classes
            if cfg.accuracy == "proxy":
                space.check_fits(self.input_shape, self.classes, min(cfg.batch_size, len(self.dataset.y_train)))
            else:
                self._load_supernet(cfg.accuracy.removeprefix(SUPERNET_PREFIX), space)
        elif is_table(cfg.accuracy):
            self.acc_table = ArchTable(cfg.accuracy, self.net_space, low=0.0, high=100.0)
            self.input_shape, self.classes = self._input()
        elif cfg.accuracy.startswith(PREDICTOR_PREFIX):
            self.acc_model = Outcomes.saved(cfg.accuracy.removeprefix(PREDICTOR_PREFIX), self.net_space)
            self.input_shape, self.classes = self._input()
        else:
            raise UsageError(f"accuracy source '{cfg.accuracy}' is not one of: proxy, table:PATH:COLUMN, "
                             f"{PREDICTOR_PREFIX}NAME, {SUPERNET_PREFIX}NAME")

    def _load_supernet(self, name: str, space) -> None:
        """The supernet `name`, checked against the space and dataset (and the split: it
        must not have trained on this search's validation or test inputs)."""
        from .supernet import store
        from .supernet.score import calibration_inputs

        if self.cfg.co_search:
            raise UsageError(f"accuracy '{SUPERNET_PREFIX}{name}' cannot be combined with --co-search yet")
        self.supernet_members, _ = store.load_members(name, space, self.dataset, split_seed=self.cfg.seed)
        self.supernet, self.supernet_name = self.supernet_members[0], name
        self.calibration = calibration_inputs(self.dataset, self.cfg.seed)

    def _input(self) -> tuple[tuple[int, int, int], int]:
        """Input shape and classes without training: the space's own, or else the dataset's."""
        try:
            return self.space.default_input()
        except UsageError:
            from .evaluation.datasets import load_dataset

            data = load_dataset(self.cfg.dataset, self.cfg.seed)
            return data.input_shape, data.classes

    def _min_accuracy(self) -> float | None:
        """The accuracy floor: min_accuracy, or the accuracy_baseline run's best feasible
        accuracy less max_accuracy_drop (e.g. a static network's, for early-exit ones)."""
        cfg = self.cfg
        if cfg.accuracy_baseline is None:
            return cfg.min_accuracy
        if cfg.min_accuracy is not None:
            raise UsageError("give min_accuracy or accuracy_baseline, not both")
        from .runs import load as load_run

        feasible = load_run(cfg.accuracy_baseline).feasible
        if not feasible:
            raise UsageError(f"accuracy baseline '{cfg.accuracy_baseline}' has no feasible trial")
        return max(r["accuracy"] for r in feasible) - cfg.max_accuracy_drop

    def _limit(self, flag: str) -> float | str:
        """A constraint's bound; max_weight_kib 'device' is the device's on-chip weight memory
        (with co-search, each candidate's own: its weight_capacity_kib column)."""
        value = getattr(self.cfg, flag)
        if value != "device":
            return value
        if self.cfg.co_search:
            return "weight_capacity_kib"
        capacity = getattr(self.device, "weight_capacity_bytes", None)
        if capacity is None:
            raise UsageError(f"max_weight_kib 'device': device '{self.cfg.device}' states no on-chip weight "
                             "memory; give a number of KiB")
        return capacity / 1024

    @property
    def columns(self) -> list[str]:
        hardware = ["area_mm2", "weight_capacity_kib"] if self.cfg.co_search else []
        return ["trial", "arch", "accuracy", "latency_ms", "energy_mj", "edp", "params", "macs", "weight_kib",
                *hardware, *[f"exit_rate_{e}" for e in self.exits], *[f"exit_acc_{e}" for e in self.exits],
                "exit_overhead", "dynamic_efficiency",
                "feasible", "train_s"]

    def resolved(self) -> dict:
        out: dict = {"input_shape": list(self.input_shape), "classes": self.classes}
        if self.device is not None:
            out["device"] = str(self.cfg.path("device"))
        out["space"] = str(self.cfg.path("space"))
        if self.min_accuracy is not None:
            out["min_accuracy"] = self.min_accuracy
        if self.dataset is not None:
            d = self.dataset
            out["dataset"] = {"name": d.name, "input_shape": list(d.input_shape), "classes": d.classes,
                              "train": len(d.y_train), "val": len(d.y_val), "test": len(d.y_test)}
            out["train_device"] = self.train_device
        if self.supernet is not None:
            out["supernet"] = {"name": self.supernet_name, "members": len(self.supernet_members),
                               "calibration_samples": len(self.calibration)}
        return out

    def __call__(self, arch: dict) -> dict:
        """The trials.csv row of `arch` (without its trial number).  Its cost is checked
        first: `Unpriced`, before any training, where it cannot be computed."""
        self.price(arch, 0.0, [0.0] * (len(self.space.active_exits(arch)) - 1) + [1.0])
        t0 = time.perf_counter()
        accuracy, rates = self.outcome(arch)
        return self.row(arch, accuracy, rates, time.perf_counter() - t0)

    def price(self, arch: dict, accuracy: float, rates: list[float]) -> dict:
        """The row of `arch` from a given (e.g. predicted) accuracy and exit rates;
        `Unpriced` where a latency table lacks it or the device cannot price its ops."""
        try:
            return self.row(arch, accuracy, rates, 0.0)
        except MissingEntry as e:
            raise Unpriced(str(e)) from None

    def check_costs_reachable(self, samples: int = FEASIBILITY_SAMPLES, max_prices: int = FEASIBILITY_PRICES) -> None:
        """Refuse, before anything is trained, cost bounds (latency, energy, parameters,
        weights) no candidate can meet.  Candidates are priced at their cheapest: every
        input leaving at the first exit.  `samples` seeded samples, then the least violating
        one improved knob by knob, stop at the first candidate meeting every cost bound;
        where none is found, a one-line UsageError names the cheapest found.  Architectures
        the device or table cannot price are passed over."""
        bounds = [c for c in self.constraints if c.metric != "accuracy"]
        if not bounds:
            return
        priced = 0

        def excess(arch: dict) -> tuple[float, dict | None]:
            nonlocal priced
            priced += 1
            try:
                row = self.price(arch, 0.0, [1.0] + [0.0] * (len(self.space.active_exits(arch)) - 1))
            except (Unpriced, UsageError):
                return float("inf"), None
            return sum(max(c.violation(row), 0.0) for c in bounds), row

        rng = np.random.default_rng([self.cfg.seed, 20])  # apart from the strategy's own stream
        best, best_excess, best_row = None, float("inf"), None
        for _ in range(samples):
            arch = self.space.sample(rng)
            value, row = excess(arch)
            if value <= 0:
                return
            if value < best_excess:
                best, best_excess, best_row = arch, value, row
        improved = best is not None
        while improved and priced < max_prices:
            improved = False
            for var in self.space.variables():
                for choice in var.choices:
                    if choice == best[var.name] or priced >= max_prices:
                        continue
                    arch = {**best, var.name: choice}
                    value, row = excess(arch)
                    if value <= 0:
                        return
                    if value < best_excess:
                        best, best_excess, best_row, improved = arch, value, row, True
        if best_row is None:
            return  # nothing could be priced: the search reports each candidate as it fails
        found = ", ".join(f"{c.metric} {best_row[c.metric]:.4g}" for c in bounds)
        wanted = ", ".join(str(c) for c in bounds)
        raise UsageError(f"no candidate of space '{self.space.name}' meets {wanted} on '{self.cfg.device}': "
                         f"the cheapest of {priced} priced ({samples} sampled, then improved knob by knob, "
                         f"every input leaving at the first exit) has {found}; relax the bound")

    def outcome(self, arch: dict) -> tuple[float, list[float]]:
        """What training tells about `arch` (or a table): its accuracy and the share of
        inputs leaving at each of its active exits, final classifier last.  With co-search,
        of its network alone: scored once, whatever accelerators it is paired with."""
        net = CoSearchSpace.split(arch)[0] if self.cfg.co_search else arch
        key = arch_key(net)
        if key not in self._outcomes:
            # the same network as one scored already (knobs apart that have no effect on
            # it) is not scored again, unless its own trained network is to be kept
            network = arch_key(self.net_space.canonical(net))
            same = self._networks.get(network)
            if same is not None and not self._keeps():
                self._outcomes[key] = self._outcomes[same]
                if same in self._exit_accuracies:
                    self._exit_accuracies[key] = self._exit_accuracies[same]
            else:
                self._outcomes[key] = self._score(net, key)
                self._networks.setdefault(network, key)
        return self._outcomes[key]

    def _keeps(self) -> bool:
        """Whether scoring a network keeps it in the run's models/ folder as it is scored
        (a supernet's front is kept once the search ends, `keep_front`)."""
        return self.keep_in is not None and (self.supernet is None or self.cfg.keep_weights == "all")

    def _score(self, net: dict, key: str) -> tuple[float, list[float]]:
        if self.acc_table is not None:
            return self.acc_table.lookup(key), [0.0] * (len(self.net_space.active_exits(net)) - 1) + [1.0]
        if self.acc_model is not None:
            return self.acc_model([net])[0]
        if self.supernet is not None:
            return self._inherit(net, key)
        from .evaluation.train import evaluate

        runs = [evaluate(self.net_space, net, self.dataset, self.settings,
                         seed=candidate_seed(self.cfg.seed, key if r == 0 else f"{key}#{r}"),
                         keep=self._keeper(net, key, candidate_seed(self.cfg.seed, key)) if r == 0 else None)
                for r in range(self.cfg.repeats)]
        self._exit_accuracies[key] = np.mean([res.exit_accuracies for res in runs], axis=0).tolist()
        return (float(np.mean([res.accuracy for res in runs])),
                np.mean([res.exit_rates for res in runs], axis=0).tolist())

    def keep_front(self, keys) -> None:
        """Keep the inherited networks of the architectures `keys` (measured again: the
        same figures), where their trials were measured with a supernet without keeping."""
        if self.supernet is None or self.keep_in is None:
            return
        for key in keys:
            self._inherit(json.loads(key), key, force_keep=True)

    def _inherit(self, net: dict, key: str, force_keep: bool = False) -> tuple[float, list[float]] | None:
        """Accuracy and exit rates of `net` with the weights it inherits from the supernet
        (`nasctl.supernet.score`); its network is kept as a trained one is.  With
        `force_keep` (its trial measured already), only its network is kept: None."""
        from .supernet.score import score_members

        seed = candidate_seed(self.cfg.seed, key)
        # with --keep-weights front, the front's networks are kept once the search ends (keep_front)
        keep = self._keeper(net, key, seed) if self.cfg.keep_weights == "all" or force_keep else None
        # kept afterwards: the first member's network alone, its trial's figures recorded already
        nets = self.supernet_members[:1] if force_keep else self.supernet_members
        result, model, own = score_members(nets, net, self.dataset, self.settings, self.calibration,
                                           finetune_epochs=self.cfg.finetune_epochs, seed=seed,
                                           extract=keep is not None)
        if keep is not None:  # of a supernet with members, the first member's network, with its own figures
            keep(model, own)
        if force_keep:
            return None
        self._exit_accuracies[key] = result.exit_accuracies
        return result.accuracy, result.exit_rates

    def _keeper(self, net: dict, key: str, seed: int):
        """What saves a trained network in the run's models/ folder (None: nothing kept).
        With --repeats, the first training is kept, with its own figures."""
        if self.keep_in is None:
            return None
        from .evaluation import kept

        def keep(model, result) -> None:
            cfg, data = self.cfg, self.dataset
            kept.save(kept.folder_of(self.keep_in, key), model.state_dict(), {
                "arch": net, "arch_key": key,
                "space": {"name": self.net_space.name, "file": str(cfg.path("space")),
                          "sha256": kept.sha256(Path(cfg.path("space")))},
                "input_shape": list(data.input_shape), "classes": data.classes,
                "normalisation": data.normalisation,
                "dataset": {"name": cfg.dataset, "split_seed": cfg.seed},
                "exits": self.net_space.active_exits(net), "exit_policy": self.settings.exit_policy,
                "thresholds": result.thresholds,
                "figures": {"accuracy": result.accuracy, "exit_rates": result.exit_rates,
                            "exit_accuracies": result.exit_accuracies, "val_accuracy": result.val_accuracy},
                "training": {"epochs": self.settings.epochs, "batch_size": self.settings.batch_size,
                             "lr": self.settings.lr, "weight_decay": self.settings.weight_decay,
                             "exit_weight": self.settings.exit_weight, "seed": seed,
                             "exit_tolerance": net.get("exit_tolerance", self.settings.exit_tolerance),
                             "exit_rates": self.settings.exit_rates},
                **({"supernet": {"name": self.supernet_name, "finetune_epochs": cfg.finetune_epochs,
                                 "calibration_samples": len(self.calibration),
                                 **({"member": 0, "members": len(self.supernet_members)}
                                    if len(self.supernet_members) > 1 else {})}}
                   if self.supernet is not None else {}),
            })
        return keep

    def costs(self, arch: dict) -> dict:
        """What pricing `arch` gives whatever its exit rates: layer totals, per-exit path
        costs (or the latency table's value); computed once per architecture and kept
        (screening prices the same candidates at every refit).  `MissingEntry` or
        `Unpriced` where it cannot be priced."""
        key = arch_key(arch)
        if key in self._costs:
            return self._costs[key]
        layers = self.space.to_layers(arch, self.input_shape, self.classes)
        device = self.device.derive(CoSearchSpace.split(arch)[1]) if self.cfg.co_search else self.device
        out = {"params": sum(layer.params for layer in layers), "macs": sum(layer.macs for layer in layers),
               "weight_kib": sum(layer.weight_bytes for layer in layers) / 1024,
               **({"area_mm2": device.spec.area_mm2, "weight_capacity_kib": device.weight_capacity_bytes / 1024}
                  if self.cfg.co_search else {})}
        if self.latency_table is not None:
            out["latency"] = self.latency_table.lookup(key)
        else:
            report = device.estimate(layers)
            if report.unsupported:
                ops = ", ".join(f"{op} x{n}" for op, n in report.unsupported.items())
                raise Unpriced(f"device '{device.name}' cannot price op(s) {ops}")
            out["paths"] = report.exit_path_costs()
            if out["paths"][1] is not None:
                out["static"] = report.static_costs()
                out["exit_energy"] = report.exit_path_costs(roles={"exit"})[1]
        self._costs[key] = out
        return out

    def row(self, arch: dict, accuracy: float, rates: list[float], train_s: float) -> dict:
        """The trials.csv row of `arch` given its accuracy and exit rates: costs on the
        device (expected over the exits) or from the latency table."""
        key = arch_key(arch)
        costs = self.costs(arch)
        active = self.space.active_exits(arch)
        overhead = efficiency = energy = None
        if self.latency_table is not None:
            latency = costs["latency"]
        else:
            lat_path, en_path = costs["paths"]
            latency = expected_cost(lat_path, rates)
            if en_path is not None:
                energy = expected_cost(en_path, rates)
                static_latency, static_energy = costs["static"]
                overhead = exit_overhead(costs["exit_energy"], rates, static_energy)
                efficiency = dynamic_efficiency(latency * energy, static_latency * static_energy)
        exit_rates = dict.fromkeys(self.exits, 0.0)
        exit_rates.update(zip(active, rates))
        net = CoSearchSpace.split(arch)[0] if self.cfg.co_search else arch
        exit_accuracies = dict(zip(active, self._exit_accuracies.get(arch_key(net), [])))
        row = {"arch": key, "accuracy": accuracy, "latency_ms": latency, "energy_mj": energy,
               "edp": None if energy is None else latency * energy,
               **{k: v for k, v in costs.items() if k not in ("latency", "paths", "static", "exit_energy")},
               **{f"exit_rate_{e}": p for e, p in exit_rates.items()},
               **{f"exit_acc_{e}": a for e, a in exit_accuracies.items()}, "exit_overhead": overhead,
               "dynamic_efficiency": efficiency, "train_s": train_s}
        row["feasible"] = all(c.violation(row) <= 0 for c in self.constraints)
        return row


def study_name(cfg: SearchConfig, run_dir: Path) -> str:
    return cfg.study or run_dir.name


def _only_study(db: Path) -> str | None:
    """The name of the one study in a run's study.db (None: no file, or not one study)."""
    if not db.is_file():
        return None
    import optuna

    try:
        names = optuna.get_all_study_names(storage=open_storage(f"sqlite:///{db.resolve()}"))
    except Exception:  # noqa: BLE001 - an unreadable study.db: the folder's name, as before
        return None
    return names[0] if len(names) == 1 else None


def storage_url(cfg: SearchConfig, run_dir: Path) -> str:
    return cfg.storage or f"sqlite:///{(run_dir / 'study.db').resolve()}"


def directions(cfg: SearchConfig) -> list[str]:
    return [f"{METRICS[o]}imize" for o in cfg.objectives]


def run_search(cfg: SearchConfig, run_dir: Path | None = None, *, resume: bool = False,
               on_start: Callable[[int, int], None] | None = None,
               on_trial: Callable[[dict, int], None] | None = None) -> SearchResult:
    """Run (or, with `resume`, continue) a search.  `on_start(budget, done)` is called once
    the inputs are checked and the run folder exists, `on_trial(row, done)` after each
    candidate this process evaluates."""
    t_start = time.perf_counter()
    notes = []
    cfg, auto = resolve_strategy(cfg)
    n_workers, why = worker_cap(cfg)
    if n_workers < cfg.workers:
        notes.append(f"--workers {cfg.workers} capped at {n_workers}: {why}")
        cfg = cfg.model_copy(update={"workers": n_workers})
    cores = os.cpu_count() or 1
    if cfg.threads is not None and cfg.threads > cores:  # more threads than cores only slows training (or crashes torch)
        notes.append(f"--threads {cfg.threads} capped at {cores}: this machine's cores")
        cfg = cfg.model_copy(update={"threads": cores})
    evaluator = Evaluator(cfg)
    if not resume:
        evaluator.check_costs_reachable()  # bounds no candidate meets fail before any folder is made
    STRATEGIES.get(cfg.strategy)  # an unknown strategy or surrogate fails before any folder is made
    if cfg.surrogate:
        from .predictors import PREDICTORS

        PREDICTORS.get(cfg.surrogate)
    if cfg.storage:
        open_storage(cfg.storage)  # an unreachable storage fails before any folder is made
    if resume:
        store = RunStore(run_dir, evaluator.columns)
        store.raise_budget(cfg.budget)  # what `runs show` and a later --resume read
    else:
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{evaluator.space.name}-{cfg.strategy}-s{cfg.seed}"
        store = RunStore.create(run_dir, run_id, evaluator.columns)
        store.write_config({**cfg.model_dump(), "resolved": {**evaluator.resolved(), **auto}})
    evaluator.keep_in = kept_in(cfg, store.path)
    if resume and not cfg.study and not cfg.storage:  # the run's own study.db: its study, even in a renamed folder
        found = _only_study(store.path / "study.db")
        if found is not None and found != store.path.name:
            cfg = cfg.model_copy(update={"study": found})
            notes.append(f"continued study '{found}' of {store.path / 'study.db'} (the run folder was renamed)")
    trials = TrialStore(storage_url(cfg, store.path), study_name(cfg, store.path), directions(cfg),
                        evaluator.space, objectives=cfg.objectives)
    index = trials.register(cfg.model_dump(), resume)
    if resume:
        trials.fail_stale()
        store.write_trials(trials.finished_rows())
    if on_start:
        on_start(cfg.budget, trials.n_claimed())
    from . import workspace

    explicit = workspace.explicit()
    workers = [multiprocessing.get_context("spawn").Process(
        target=_worker, args=(cfg.model_dump(), str(store.path), _resolved_paths(cfg),
                              None if explicit is None else str(explicit.resolve())), daemon=True)
        for _ in range(1, cfg.workers)]
    for w in workers:
        w.start()
    try:
        _work(evaluator, store, trials, worker=index, on_trial=on_trial)
        for w in workers:
            w.join()
        stopped = sum(w.exitcode != 0 for w in workers)
        if stopped:
            notes.append(f"{stopped} of {cfg.workers} local workers stopped early (their error is printed "
                         "above); the others ran the budget")
    except KeyboardInterrupt:
        for w in workers:
            w.terminate()
        done = len(trials.finished_rows())
        raise Interrupted(f"interrupted after {done} of {cfg.budget} trials; they are kept in "
                          f"{store.trials_path} (continue with --resume {store.path})") from None
    finally:
        rows = trials.finished_rows()
        store.write_trials(rows)
        front = pareto_front(rows, cfg.objectives)
        store.write_pareto(front)
        if cfg.keep_weights == "front" and not any(w.is_alive() for w in workers):
            from .evaluation import kept

            kept.prune(store.path, {_net_key(cfg, r["arch"]) for r in front})
            evaluator.keep_front([_net_key(cfg, r["arch"]) for r in front])
        if rows:
            from .runs import write_summary

            write_summary(store.path)
    failures = trials.failures()
    if failures:
        notes.append(summarise_failures(failures))
    result = SearchResult(store.path, rows, front, evaluator.constraints, {
        "total_s": round(time.perf_counter() - t_start, 3),
        "train_s": round(sum(r["train_s"] for r in rows), 3),
        "trials": len(rows)}, unused_budget=cfg.budget - trials.n_claimed(), notes=notes, failed=len(failures))
    if not rows:
        raise WorkFailed(f"no candidate could be evaluated: {summarise_failures(failures) or 'none was proposed'}; "
                         f"the run is kept in {store.path}")
    if rows and not front and evaluator.constraints:
        best = ", ".join(f"{c} (best seen {c.best(rows):.4g})" for c in evaluator.constraints)
        raise WorkFailed(f"no evaluated candidate meets {best}; "
                         f"all {len(rows)} trials are kept in {store.trials_path}")
    return result


# Memory one local worker process takes (torch, the dataset, a small candidate in training):
# about 210 MB measured for digits; more is kept free for the rest of the machine.
WORKER_BYTES = 300 * 2**20


def kept_in(cfg: SearchConfig, run_dir: Path) -> Path | None:
    """The run folder whose models/ keeps the trained networks (or those inheriting a
    supernet's weights); None (nothing kept) with --keep-weights none or where accuracy
    does not come from a network."""
    trains = cfg.accuracy == "proxy" or cfg.accuracy.startswith(SUPERNET_PREFIX)
    return None if cfg.keep_weights == "none" or not trains else run_dir


def _net_key(cfg: SearchConfig, key: str) -> str:
    """The key of the network a trial's architecture key names (with co-search, without
    the accelerator's knobs)."""
    arch = json.loads(key) if isinstance(key, str) else key
    return arch_key(CoSearchSpace.split(arch)[0] if cfg.co_search else arch)


def available_memory() -> int | None:
    """Bytes of memory available to new processes (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker_cap(cfg: SearchConfig) -> tuple[int, str]:
    """Local workers worth starting, and what capped them: at most one per trial of the
    budget, and as many as half the available memory holds."""
    cap, why = cfg.workers, ""
    if cfg.budget < cap:
        cap, why = cfg.budget, f"one per trial of --budget {cfg.budget}"
    free = available_memory()
    if free is not None and (fit := max(1, free // 2 // WORKER_BYTES)) < cap:
        cap, why = fit, (f"{free / 2**30:.1f} GiB of available memory holds {fit} "
                         f"(about {WORKER_BYTES // 2**20} MB each, half the memory kept free)")
    return cap, why


def resolve_strategy(cfg: SearchConfig) -> tuple[SearchConfig, dict]:
    """The settings with `strategy: auto` replaced by what it chooses (and the default
    `screen` filled in), and the choice for config.yaml's `resolved` section."""
    if cfg.strategy != AUTO:
        if cfg.strategy not in STRATEGIES:
            raise UsageError(f"unknown strategy '{cfg.strategy}'; allowed: {AUTO}, {', '.join(STRATEGIES.names())}")
        return cfg.model_copy(update={"screen": cfg.screen or DEFAULT_SCREEN}), {}
    choice = choose_auto(cfg.budget, cfg.surrogate, cfg.screen)
    cfg = cfg.model_copy(update={"strategy": choice.strategy, "surrogate": choice.surrogate, "screen": choice.screen})
    return cfg, {"strategy_auto": choice.why}


def _resolved_paths(cfg: SearchConfig) -> dict:
    return {what: cfg.path(what) for what in ("space", "device")}


def _worker(cfg_dump: dict, run_dir: str, paths: dict, workspace_dir: str | None = None) -> None:
    """A local worker process: the same search on the same study (the same files), its
    strategy seeded apart, names (supernets, predictors) resolved in the same workspace.
    An error ends it with one line on stderr and exit status 2; the other workers go on."""
    import sys

    from . import workspace
    from .errors import NasctlError

    workspace.set_workspace(None if workspace_dir is None else Path(workspace_dir))
    cfg = SearchConfig(**cfg_dump)
    cfg._paths.update(paths)
    try:
        evaluator = Evaluator(cfg)
        path = Path(run_dir)
        evaluator.keep_in = kept_in(cfg, path)
        trials = TrialStore(storage_url(cfg, path), study_name(cfg, path), directions(cfg), evaluator.space,
                            objectives=cfg.objectives)
        _work(evaluator, RunStore(path, evaluator.columns), trials, worker=trials.register(cfg_dump, False))
    except KeyboardInterrupt:
        pass
    except NasctlError as e:
        print(f"error: a local worker stopped: {e}", file=sys.stderr)
        sys.exit(2)


def _work(evaluator: Evaluator, store: RunStore, trials: TrialStore, worker: int,
          on_trial: Callable[[dict, int], None] | None = None) -> None:
    """This process's share of the search: the one loop (`nasctl.loop`), trials in the
    run's study, each finished row appended to trials.csv as it ends."""
    cfg, space = evaluator.cfg, evaluator.space
    strategy = STRATEGIES.get(cfg.strategy)()
    # With a surrogate, the strategy proposes `screen` candidates per real evaluation, a pool at a time.
    strategy.setup(space, len(cfg.objectives), len(evaluator.constraints), seed=cfg.seed + worker,
                   budget=cfg.budget * (cfg.screen if cfg.surrogate else 1), pool=bool(cfg.surrogate))
    surrogate = Surrogate(cfg.surrogate, space, seed=cfg.seed + worker, budget=cfg.budget) if cfg.surrogate else None

    def finished(row: dict, done: int) -> None:
        store.append(row)
        if on_trial:
            on_trial(row, done)

    search_loop(space, strategy, trials, evaluator, evaluator.price, objectives=cfg.objectives,
                constraints=evaluator.constraints, budget=cfg.budget, surrogate=surrogate, screen=cfg.screen,
                on_trial=finished, on_refit=lambda entry: log_refit(store.path, worker=worker, **entry))
