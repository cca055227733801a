"""Run folders and the optuna study that holds a run's trials.

A run folder holds `config.yaml` (the resolved settings), `trials.csv` (one row per
finished trial, appended as each finishes), `pareto.csv` (the non-dominated feasible
rows) and, by default, `study.db`: the SQLite optuna study every trial is stored in
first.  `--storage URL` puts the study in any optuna RDB (PostgreSQL, MySQL) or, as
`journal:PATH`, a journal file; workers on other machines join it by `--study NAME`.
"""

from __future__ import annotations

import csv
import fcntl
import time
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from . import __version__, workspace
from .errors import UsageError
from .spaces.base import arch_key

# Columns that measure time: they differ between otherwise identical runs.
TIMING_COLUMNS = ("train_s",)


def cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, ".6g")
    return "" if value is None else str(value)


def append_csv(path: Path, values: Sequence, header: Sequence[str] | None = None) -> None:
    """Append one row to a CSV file under an exclusive lock (local workers share run
    files); `header` first where the file is new or empty."""
    with open(path, "a", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if header is not None and f.tell() == 0:
            csv.writer(f).writerow(header)
        csv.writer(f).writerow(values)


class RunStore:
    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = list(columns)

    @classmethod
    def create(cls, run_dir: Path | None, run_id: str, columns: Sequence[str]) -> "RunStore":
        if run_dir is None:
            base = workspace.runs_folder()
            run_dir = base / run_id
            n = 1
            while run_dir.exists():
                n += 1
                run_dir = base / f"{run_id}-{n}"
        elif run_dir.exists() and not run_dir.is_dir():
            raise UsageError(f"--run-dir '{run_dir}' is a file, not a folder; give a folder for the run")
        elif (run_dir / "trials.csv").exists():
            raise UsageError(f"run folder '{run_dir}' already holds a run (trials.csv); choose another "
                             "--run-dir, or continue it with --resume")
        run_dir.mkdir(parents=True, exist_ok=True)
        store = cls(run_dir, columns)
        store.write_trials([])
        return store

    @property
    def trials_path(self) -> Path:
        return self.path / "trials.csv"

    def write_config(self, config: Mapping) -> None:
        doc = {**config, "nasctl_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (self.path / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def raise_budget(self, budget: int) -> None:
        """A resumed run's budget, raised by `--resume --budget`, in its config.yaml (the file
        otherwise as it was written)."""
        from .specs import read_yaml

        path = self.path / "config.yaml"
        doc = read_yaml(path)
        if isinstance(doc, dict) and isinstance(doc.get("budget"), int) and budget > doc["budget"]:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(yaml.safe_dump({**doc, "budget": budget}, sort_keys=False))
            tmp.replace(path)

    def append(self, row: Mapping) -> None:
        """Add one finished trial. The file is locked, so local workers can share it."""
        append_csv(self.trials_path, [cell(row.get(c)) for c in self.columns])

    def write_trials(self, rows: Sequence[Mapping]) -> None:
        self._write(self.trials_path, rows)

    def write_pareto(self, rows: Sequence[Mapping]) -> Path:
        path = self.path / "pareto.csv"
        self._write(path, rows)
        return path

    def _write(self, path: Path, rows: Sequence[Mapping]) -> None:
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            for row in rows:
                w.writerow([cell(row.get(c)) for c in self.columns])
        tmp.replace(path)


def find_run(name: str) -> Path:
    """A run folder from a path or a run id under the workspace's runs/."""
    for candidate in (Path(name), workspace.runs_folder() / name):
        if (candidate / "config.yaml").is_file():
            return candidate
    places = dict.fromkeys(str(p) for p in (Path(name), workspace.runs_folder() / name))  # one, where a path
    raise UsageError(f"run '{name}' not found: no config.yaml in " + " nor in ".join(f"'{p}'" for p in places))


def read_run_config(run_dir: Path) -> dict:
    from .config import INFO_KEYS
    from .specs import read_yaml

    data = read_yaml(run_dir / "config.yaml")
    return {k: v for k, v in data.items() if k not in INFO_KEYS}


_SQLITE_LISTENING = False


def _fast_sqlite_commits() -> None:
    """SQLite connections in write-ahead-log mode with `synchronous=NORMAL`: a commit no
    longer waits for the disk (the study's ~25 commits per trial cost 1-13 ms each with
    the default rollback journal, more than measuring a candidate with a supernet takes);
    a trial is still never lost when the process stops or is killed (only a crash of the
    whole machine may lose the last ones).  Set on every SQLite connection SQLAlchemy opens."""
    global _SQLITE_LISTENING
    if _SQLITE_LISTENING:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_connection, _record):
        if isinstance(dbapi_connection, sqlite3.Connection):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    _SQLITE_LISTENING = True


def open_storage(url: str):
    """The optuna storage behind `url` (an RDB URL, or journal:PATH), connected; a one-line
    UsageError where it cannot be opened."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if url.startswith("sqlite:"):
        _fast_sqlite_commits()
    try:
        if url.startswith("journal:"):
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
        return optuna.storages.get_storage(url)
    except Exception as e:  # noqa: BLE001 - SQLAlchemy and optuna raise many kinds here
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
        db = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        if db is not None and db.is_file() and ("malformed" in reason or "not a database" in reason):
            raise UsageError(f"{db} is damaged and cannot be read as a study ({reason}); if it is a run's "
                             f"study.db, move it aside and --resume rebuilds the study from the run's "
                             "trials.csv") from None
        raise UsageError(f"cannot open storage '{url}': {reason}; allowed: an SQLAlchemy database URL "
                         "(sqlite:///PATH, postgresql://USER:PW@HOST/DB, mysql://USER:PW@HOST/DB) "
                         "or journal:PATH (an optuna journal file)") from None


class TrialStore:
    """The optuna study of a run: each evaluated candidate is one trial whose values are
    the objectives, whose params are the architecture's knobs, and whose user attribute
    `row` is its trials.csv row."""

    def __init__(self, storage: str, study_name: str, directions: Sequence[str], space,
                 objectives: Sequence[str] | None = None):
        import optuna

        self._storage = open_storage(storage)
        self.study = optuna.create_study(storage=self._storage, study_name=study_name,
                                         directions=list(directions), load_if_exists=True)
        self._study_id = self._storage.get_study_id_from_name(study_name)
        if [d.name.lower() for d in self.study.directions] != list(directions):
            raise UsageError(f"study '{study_name}' in '{storage}' optimises other objectives")
        if objectives is not None and self.study.metric_names is None:
            # Named objectives: optuna-dashboard and plot_pareto_front label their axes with them.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names(list(objectives))
        self._optuna = optuna
        self._space = space
        self._distributions = {v.name: optuna.distributions.CategoricalDistribution(list(v.choices))
                               for v in space.variables()}
        self.worker = 0  # this process's index among the study's workers (set by `register`)

    def register(self, config: Mapping, resume: bool) -> int:
        """Record the search's settings (first worker) and return this worker's index: 0 for
        the search that made the study (and for its resumption), 1, 2, ... for each worker that
        joins it, so that their strategies are seeded apart."""
        attrs = self.study.user_attrs
        if "config" not in attrs:
            self.study.set_user_attr("config", dict(config))
        self.worker = 0
        if not resume:
            self.worker = sum(1 for k in attrs if k.startswith("worker_"))
            self.study.set_user_attr(f"worker_{self.worker}", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return self.worker

    def finished_rows(self) -> list[dict]:
        trials = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.COMPLETE,))
        return [{**t.user_attrs["row"], "trial": t.number} for t in sorted(trials, key=lambda t: t.number)]

    def _failed(self) -> list:
        """Trials that failed for a reason (a table lacked the architecture), as opposed to
        trials stopped by Ctrl-C or a killed worker, which fail without one."""
        trials = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.FAIL,))
        return [t for t in trials if "error" in t.user_attrs]

    def failed_keys(self) -> set[str]:
        return {t.user_attrs["arch"] for t in self._failed()}

    def failures(self) -> list[str]:
        """The reason of every failed trial."""
        return [t.user_attrs["error"] for t in self._failed()]

    def n_claimed(self) -> int:
        """Trials finished, failed or in flight: what counts against the budget. A stopped
        trial does not count: its architecture is evaluated again; nor does one that failed
        before any training (its cost could not be computed)."""
        ts = self._optuna.trial.TrialState
        return len(self.study.get_trials(deepcopy=False, states=(ts.COMPLETE, ts.RUNNING))) + \
            sum(t.user_attrs.get("counts", True) for t in self._failed())

    def fail_stale(self) -> int:
        """Mark trials left RUNNING by a stopped search as stopped (before resuming it)."""
        stale = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.RUNNING,))
        for t in stale:
            self.study.tell(t.number, state=self._optuna.trial.TrialState.FAIL, skip_if_finished=True)
        return len(stale)

    def start(self, arch: Mapping, key: str, budget: int | None = None):
        """Open a trial for `arch` (marked running, so other workers count it), or None
        where another worker claimed the same architecture first (of two workers racing
        for one candidate, the lower trial number keeps it), or where `budget` trials were
        already claimed before this one (two workers that each saw one trial left both
        open one; the later is stopped, so the search never runs past its budget)."""
        optuna = self._optuna
        ts = optuna.trial.TrialState
        # One write: the trial is created running with the architecture as its params and
        # its key and worker as user attributes (asking with fixed params wrote each param
        # apart, about twenty writes a trial, each taking the journal file's lock).
        template = optuna.trial.create_trial(  # checks each param against its choices
            state=ts.RUNNING, params={name: arch[name] for name in self._distributions},
            distributions=self._distributions, user_attrs={"arch": key, "worker": self.worker})
        trial = optuna.trial.Trial(self.study, self._storage.create_new_trial(self._study_id, template_trial=template))
        before = 0  # trials claimed before this one
        for t in self.study.get_trials(deepcopy=False, states=(ts.COMPLETE, ts.RUNNING, ts.FAIL)):
            if t.number >= trial.number or (t.state == ts.FAIL and "error" not in t.user_attrs):
                continue
            if len(t.params) == len(arch) and _key_of(t) == key:
                self.stop(trial)
                return None
            before += t.state != ts.FAIL or t.user_attrs.get("counts", True)
        if budget is not None and before >= budget:
            self.stop(trial)
            return None
        return trial

    def finish(self, trial, row: Mapping, values: Sequence[float], violations: Mapping[str, float]) -> int:
        trial.set_user_attr("row", dict(row))
        for name, v in violations.items():
            trial.set_constraint(name, float(v))
        self.study.tell(trial, list(values))
        return trial.number

    def fail(self, trial, reason: str, *, counts: bool = True) -> None:
        """The trial's architecture cannot be evaluated; it is not tried again.  It counts
        against the budget unless `counts` is false (it failed before any training)."""
        trial.set_user_attr("error", reason)
        if not counts:
            trial.set_user_attr("counts", False)
        self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)

    def stop(self, trial) -> None:
        """The trial was interrupted: it does not count, and a resumed search retries it."""
        self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)


def _key_of(trial) -> str:
    """A trial's architecture key: the one stored with it (comparing stored keys, not
    re-serialising every trial's params, keeps a start's cost from growing with the trials
    before it), or that of its params where an earlier version of nasctl stored none."""
    stored = trial.user_attrs.get("arch")
    return stored if stored is not None else arch_key(trial.params)


def stored_config(storage: str, study_name: str) -> dict | None:
    """The settings of an existing study's search (for a worker joining it), or None."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    except KeyError:
        return None
    return study.user_attrs.get("config")
