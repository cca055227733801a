"""Reading run folders: trials, Pareto front, hypervolume, comparisons, exports, plots.

Hypervolume is measured over a run's objectives (config.yaml `objectives`), in
minimisation form (maximised metrics such as accuracy are negated), against a reference
point chosen per objective as the worst value over the run's feasible trials plus 10% of
their range (10% of the value itself where every trial shares it, 1 where that value is
0). Only feasible trials count. The reference point is stored, in trials.csv units, in
the run folder's `summary.json`; as long as it describes the same objectives and the
same number of trials it is re-read rather than recomputed, so one edited by hand is
honoured. `compare` measures every run at the baseline's stored reference point.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from . import workspace
from .errors import ConfigError, UsageError
from .objectives import METRIC_TABLE, METRICS, check_objectives, metric, minimisation_matrix, pareto_front
from .specs import read_yaml
from .store import cell, find_run

SUMMARY_FILE = "summary.json"
REFERENCE_RULE = "per objective, the worst feasible value plus 10% of the feasible range"
# How metrics are shown on screen and in plots (label, unit, factor from the trials.csv
# unit), as objectives.METRIC_TABLE states it.
DISPLAY = {m.name: (m.label, m.unit, m.scale) for m in METRIC_TABLE}


@dataclass
class Run:
    """A run folder as read from disk: settings and every completely written trial."""

    name: str      # as the user named it (a run id or a path)
    path: Path
    config: dict
    trials: list[dict]

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def objectives(self) -> list[str]:
        return list(self.config["objectives"])

    @property
    def feasible(self) -> list[dict]:
        return [t for t in self.trials if t["feasible"]]

    @cached_property
    def front(self) -> list[dict]:
        return pareto_front(self.trials, self.objectives)


# ---------------------------------------------------------------- reading run folders

def load(run: str | Path) -> Run:
    """A run from a run folder path or a run id under the workspace's runs/.

    Its trials are trials.csv's rows; where trials.csv is missing, unreadable or holds
    fewer finished trials than the run's optuna study (study.db), they are read from the
    study instead, and one warning line on stderr says so."""
    path = find_run(str(run))
    config = read_yaml(path / "config.yaml")
    study = _RunStudy.of(path, config)
    if not (path / "trials.csv").is_file() and not (study and study.count()):
        raise UsageError(f"'{run}' is not a run folder: {path} holds no trials.csv")
    objectives = config.get("objectives")
    try:
        check_objectives(objectives if isinstance(objectives, list) else [])
    except UsageError as e:
        raise ConfigError(f"{path / 'config.yaml'}: objectives: {e}") from None
    return Run(str(run), path, config, _trials(path / "trials.csv", objectives, study))


def _trials(path: Path, objectives: Sequence[str], study: "_RunStudy | None") -> list[dict]:
    """trials.csv's rows, or the study's where trials.csv is missing, unreadable or short."""
    rows, error = None, None
    if not path.is_file():
        problem = f"{path} is missing"
    else:
        try:
            rows = _read_trials(path, objectives)
        except ConfigError as e:
            if study is None:
                raise
            problem, error = str(e), e
    if rows is not None:
        n = study.count() if study is not None else None
        if n is None or n <= len(rows):  # a study in other storage is consulted only where trials.csv fails
            return rows
        problem = f"{path} holds {len(rows)} finished trials but the run's {study.where} holds {n} (cut short?)"
    try:
        stored = study.rows()
    except Exception:  # noqa: BLE001 - optuna and SQLAlchemy raise many kinds; trials.csv decides then
        stored = None
    if not stored or (rows is not None and len(stored) <= len(rows)):
        if rows is None:
            raise error or UsageError(problem)
        return rows
    source = "the study" if rows is not None else f"the run's {study.where}"
    sys.stderr.write(f"warning: {problem}; read the {len(stored)} finished trials from {source} instead\n")
    return stored


@dataclass
class _RunStudy:
    """Where a run's optuna study is: its storage URL and study name (None: the only study
    in that storage, else one named as the run folder)."""

    url: str
    name: str | None
    folder: Path

    @classmethod
    def of(cls, path: Path, config: dict) -> "_RunStudy | None":
        url = config.get("storage")
        if not url:
            if not (path / "study.db").is_file():
                return None
            url = f"sqlite:///{(path / 'study.db').resolve()}"
        return cls(str(url), config.get("study"), path)

    @property
    def where(self) -> str:
        default = self.url == f"sqlite:///{(self.folder / 'study.db').resolve()}"
        shown = self.folder / "study.db" if default else re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", self.url)
        return f"optuna study{f' {self.name!r}' if self.name else ''} in {shown}"

    def _pick(self, names: Sequence[str]) -> str | None:
        if self.name is not None:
            return self.name if self.name in names else None
        if len(names) == 1:
            return names[0]
        return self.folder.name if self.folder.name in names else None

    def count(self) -> int | None:
        """Finished trials in the study, read straight from an SQLite file (cheap: no optuna);
        None for other storages or where it cannot be read."""
        if not self.url.startswith("sqlite:///"):
            return None
        db = Path(self.url.removeprefix("sqlite:///"))
        if not db.is_file():
            return None
        import sqlite3

        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=2)
            try:
                studies = dict(con.execute("SELECT study_name, study_id FROM studies").fetchall())
                name = self._pick(list(studies))
                if name is None:
                    return None
                return con.execute("SELECT COUNT(*) FROM trials WHERE study_id = ? AND state = 'COMPLETE'",
                                   (studies[name],)).fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            return None

    def rows(self) -> list[dict] | None:
        """The trials.csv rows the study holds (each finished trial's `row` attribute), typed
        as trials.csv would give them; None where the study cannot be found."""
        import optuna

        from .store import open_storage

        storage = open_storage(self.url)
        name = self._pick(optuna.get_all_study_names(storage))
        if name is None:
            return None
        study = optuna.load_study(study_name=name, storage=storage)
        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        return [{"trial": t.number, **{k: v if k == "arch" else parse_cell(cell(v))
                                       for k, v in t.user_attrs["row"].items() if k != "trial"}}
                for t in sorted(trials, key=lambda t: t.number) if isinstance(t.user_attrs.get("row"), dict)]


def parse_cell(text: str):
    """A CSV cell (or a flag's value) as the type it spells: None, bool, int, float or str."""
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _read_trials(path: Path, objectives: Sequence[str]) -> list[dict]:
    """Typed rows of trials.csv. A last line without its line end is a trial still being
    written and is left out; anything else malformed is an error naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    text = text[:text.rfind("\n") + 1]
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    missing = [c for c in ("trial", "arch", *objectives, "feasible") if c not in (header or [])]
    if missing:
        raise ConfigError(f"{path}: line 1: header lacks column(s) {', '.join(missing)}")
    rows, lines = [], {}
    for values in reader:
        where = f"{path}: line {reader.line_num}"
        if len(values) != len(header):
            raise ConfigError(f"{where}: {len(values)} fields where the header has {len(header)}")
        row = {c: (v if c == "arch" else parse_cell(v)) for c, v in zip(header, values)}
        if not isinstance(row["trial"], int) or isinstance(row["trial"], bool):
            raise ConfigError(f"{where}: trial '{row['trial']}' is not a whole number")
        if row["trial"] in lines:
            raise ConfigError(f"{where}: trial {row['trial']} is there twice (line {lines[row['trial']]} too)")
        lines[row["trial"]] = reader.line_num
        if not isinstance(row["feasible"], bool):
            raise ConfigError(f"{where}: feasible '{row['feasible']}' is neither true nor false")
        for o in objectives:
            if isinstance(row[o], bool) or not isinstance(row[o], (int, float)) or not math.isfinite(row[o]):
                raise ConfigError(f"{where}: {o} '{row[o] if row[o] is not None else ''}' is not a finite number")
        try:
            arch = json.loads(row["arch"])
        except json.JSONDecodeError:
            arch = None
        if not isinstance(arch, dict):
            raise ConfigError(f"{where}: arch is not a JSON object")
        rows.append(row)
    return rows


# ---------------------------------------------------------------- hypervolume

def _flip(values: Sequence[float], objectives: Sequence[str]) -> np.ndarray:
    """Natural units <-> minimisation form: negating maximised metrics is its own inverse."""
    return minimisation_matrix([dict(zip(objectives, values))], objectives)[0]


def reference_point(rows: Sequence[dict], objectives: Sequence[str]) -> dict[str, float] | None:
    """The reference point of REFERENCE_RULE in natural (trials.csv) units; None without rows."""
    if not rows:
        return None
    F = minimisation_matrix(rows, objectives)
    worst, span = F.max(axis=0), np.ptp(F, axis=0)
    pad = np.where(span > 0, 0.1 * span, np.where(worst != 0, 0.1 * np.abs(worst), 1.0))
    return dict(zip(objectives, _flip(worst + pad, objectives).tolist()))


def hypervolume(F: np.ndarray, ref: Sequence[float]) -> float:
    """Volume dominated by the rows of F (minimisation) and bounded by `ref`. Exact sweep
    for two objectives; pymoo's HV for more. Points not better than `ref` in every
    objective add nothing."""
    ref = np.asarray(ref, dtype=float)
    F = np.asarray(F, dtype=float).reshape(-1, len(ref))
    F = F[np.all(F < ref, axis=1)]
    if not len(F):
        return 0.0
    if len(ref) == 2:
        volume, ceiling = 0.0, ref[1]
        for f1, f2 in sorted(map(tuple, F)):
            if f2 < ceiling:
                volume += (ref[0] - f1) * (ceiling - f2)
                ceiling = f2
        return float(volume)
    from pymoo.indicators.hv import HV

    return float(HV(ref_point=ref)(F))


def run_hypervolume(run: Run, ref: dict[str, float]) -> float:
    objectives = run.objectives
    if not run.feasible:
        return 0.0
    return hypervolume(minimisation_matrix(run.feasible, objectives), _flip([ref[o] for o in objectives], objectives))


def hypervolume_history(run: Run, ref: dict[str, float]) -> list[float]:
    """Hypervolume of the feasible trials among the first k, for k = 1 .. all trials."""
    objectives = run.objectives
    r = _flip([ref[o] for o in objectives], objectives)
    history, seen = [], []
    for t in run.trials:
        if t["feasible"]:
            seen.append(t)
        history.append(hypervolume(minimisation_matrix(seen, objectives), r) if seen else 0.0)
    return history


# ---------------------------------------------------------------- summaries

def best(rows: Sequence[dict], metrics: Sequence[str]) -> dict[str, dict]:
    """Best value of each metric over `rows` (in its direction) and the trial holding it."""
    out = {}
    for m in metrics:
        have = [r for r in rows if isinstance(r.get(m), (int, float)) and not isinstance(r.get(m), bool)]
        if have:
            pick = (max if metric(m).higher_is_better else min)(have, key=lambda r: r[m])
            out[m] = {"value": pick[m], "trial": pick["trial"]}
    return out


def _stored_reference(run: Run) -> tuple[dict[str, float], str] | None:
    path = run.path / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not valid JSON; delete it to have it written afresh") from None
    if not isinstance(doc, dict):
        return None
    ref = doc.get("reference_point")
    if (doc.get("objectives") != run.objectives or doc.get("trials") != len(run.trials)
            or not isinstance(ref, dict)):
        return None
    if not all(isinstance(ref.get(o), (int, float)) and math.isfinite(ref[o]) for o in run.objectives):
        raise ConfigError(f"{path}: reference_point needs a number for each of {', '.join(run.objectives)}")
    return {o: float(ref[o]) for o in run.objectives}, str(doc.get("reference_rule", "stored"))


def summarise(run: Run) -> dict:
    """Settings, counts, reference point, hypervolume and per-metric best of one run."""
    stored = _stored_reference(run)
    ref, rule = stored if stored else (reference_point(run.feasible, run.objectives), REFERENCE_RULE)
    cfg = run.config
    return {"run": run.id, "path": str(run.path),
            **{k: cfg.get(k) for k in ("space", "device", "dataset", "strategy", "seed", "budget", "epochs")},
            "created": str(cfg.get("created", "")), "objectives": run.objectives,
            "trials": len(run.trials), "feasible": len(run.feasible), "front_size": len(run.front),
            "reference_point": ref, "reference_rule": rule,
            "hypervolume": None if ref is None else run_hypervolume(run, ref),
            "best": best(run.feasible, [m for m in METRICS if m in (run.trials[0] if run.trials else {})])}


def write_summary(run_dir: str | Path | Run) -> dict:
    """Summarise a run and store it as summary.json in its folder; returns the summary.  A
    summary.json recording more trials than the run now holds (a run only grows: its files
    were damaged or cut short) is left as it is, with a warning, so that its reference
    point survives."""
    run = run_dir if isinstance(run_dir, Run) else load(run_dir)
    summary = summarise(run)
    path = run.path / SUMMARY_FILE
    try:
        before = json.loads(path.read_text(encoding="utf-8")).get("trials") if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        before = None
    if isinstance(before, int) and not isinstance(before, bool) and before > len(run.trials):
        sys.stderr.write(f"warning: {path} records {before} trials but the run now holds {len(run.trials)} (its "
                         f"trials.csv or study damaged or cut short?); {SUMMARY_FILE} is left as it was\n")
        return summary
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def list_runs() -> list[dict]:
    """A summary of every run folder under the workspace's runs/, oldest first; a run that
    cannot be read is listed with its problem."""
    folder = workspace.runs_folder()
    rows = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if (path / "trials.csv").is_file() or ((path / "config.yaml").is_file() and (path / "study.db").is_file()):
            try:
                rows.append(summarise(load(path)))
            except UsageError as e:  # config and trials.csv problems included
                rows.append({"run": path.name, "path": str(path), "problem": str(e)})
    return sorted(rows, key=lambda r: (r.get("created") or "", r["run"]))


def compare(runs: Sequence[Run], baseline: Run, min_ratio: float | None = None) -> dict:
    """Every run's hypervolume at the baseline's stored reference point, its ratio to the
    baseline's, and whether it meets `min_ratio`. The baseline is listed first; it is held
    to `min_ratio` too where it is one of `runs` (a run compared with itself has ratio 1)."""
    if min_ratio is not None and not (math.isfinite(min_ratio) and min_ratio > 0):
        raise UsageError(f"--min-hv-ratio {min_ratio:g} is not allowed; give a positive number such as 0.9")
    objectives = baseline.objectives
    for r in runs:
        if set(r.objectives) != set(objectives):
            raise UsageError(f"run '{r.name}' optimises {','.join(r.objectives)} but baseline '{baseline.name}' "
                             f"optimises {','.join(objectives)}; compare runs with the same objectives")
    base = write_summary(baseline)
    ref = base["reference_point"]
    if ref is None:
        raise UsageError(f"baseline '{baseline.name}' has no feasible trial, so no hypervolume to compare with")
    hv_base = base["hypervolume"]
    if hv_base <= 0:
        raise UsageError(f"baseline '{baseline.name}' has hypervolume 0 at its reference point "
                         f"{base['reference_point']}; no trial is better than it in every objective")
    base_path = baseline.path.resolve()
    gated = {r.path.resolve() for r in runs}
    rows = []
    for r in [baseline, *(r for r in runs if r.path.resolve() != base_path)]:
        hv = run_hypervolume(r, ref)
        ratio = hv / hv_base
        under_test = min_ratio is not None and r.path.resolve() in gated
        rows.append({"run": r.name, "path": str(r.path), "baseline": r is baseline,
                     **{k: r.config.get(k) for k in ("space", "device", "strategy", "seed")},
                     "trials": len(r.trials), "feasible": len(r.feasible), "front_size": len(r.front),
                     "hypervolume": hv, "hv_ratio": ratio, "best": best(r.feasible, objectives),
                     "passed": bool(ratio >= min_ratio) if under_test else None})
    return {"objectives": objectives, "reference_point": ref,
            "reference_source": f"baseline '{baseline.name}', stored in {baseline.path / SUMMARY_FILE}",
            "reference_rule": base["reference_rule"], "baseline": baseline.name, "min_hv_ratio": min_ratio,
            "runs": rows, "passed": all(r["passed"] is not False for r in rows)}


# ---------------------------------------------------------------- export and plots

def export_rows(run: Run, front_only: bool = False) -> list[dict]:
    """Trials (or the front) with the architecture decoded into `arch.<knob>` columns."""
    rows = []
    for t in run.front if front_only else run.trials:
        arch = {f"arch.{k}": v for k, v in json.loads(t["arch"]).items()}
        rows.append({"trial": t["trial"], **arch, **{k: v for k, v in t.items() if k not in ("trial", "arch")}})
    return rows


def write_export(rows: Sequence[dict], fmt: str, out: io.TextIOBase) -> None:
    if fmt == "json":
        out.write(json.dumps(list(rows), indent=2) + "\n")
        return
    columns = list(dict.fromkeys(c for r in rows for c in r))
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([cell(r.get(c)) for c in columns])


def display(name: str, value: float, named: bool = False, unit: bool = True) -> str:
    """A metric value in its on-screen unit, e.g. `3.76 µJ·µs` (`EDP 3.76 µJ·µs` if named,
    `3.76` without the unit)."""
    m = metric(name)
    text = m.format(value, unit=unit)
    return f"{m.label} {text}" if named else text


def describe_reference(ref: dict[str, float] | None) -> str:
    if ref is None:
        return "none (no feasible trial)"
    return ", ".join(display(o, v, named=True) for o, v in ref.items())


def hypervolume_units(objectives: Sequence[str]) -> tuple[str, float]:
    """Unit of a hypervolume shown in on-screen units, and the factor from trials.csv units."""
    units = [metric(o).unit or metric(o).label for o in objectives]  # counts: the metric's label
    return " × ".join(units), math.prod(metric(o).scale for o in objectives)


def _axis_label(name: str) -> str:
    return metric(name).axis_label


def _dominated_region(front: Sequence[dict], objectives: Sequence[str], ref: dict[str, float]):
    """Outline (x values, y values, natural units) of the area the 2-objective front
    dominates up to the reference point: a staircase closed through the reference point."""
    r = _flip([ref[o] for o in objectives], objectives)
    F = minimisation_matrix(front, objectives)
    F = F[np.lexsort((F[:, 1], F[:, 0]))]
    F = F[np.all(F < r, axis=1)]
    corners = [(F[0, 0], r[1])] if len(F) else []
    for i, (f1, f2) in enumerate(F):
        corners.append((f1, f2))
        corners.append((F[i + 1, 0] if i + 1 < len(F) else r[0], f2))
    corners.append((r[0], r[1]))
    natural = [_flip(c, objectives) for c in corners]
    return [c[0] for c in natural], [c[1] for c in natural]


def plot(run: Run, out_dir: Path | None = None) -> list[Path]:
    """Write pareto.png (first two objectives) and hypervolume.png into `out_dir`
    (default: the run folder's plots/); returns their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not run.trials:
        raise UsageError(f"run '{run.name}' has no trials yet; nothing to plot")
    out_dir = Path(out_dir) if out_dir is not None else run.path / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(run)
    ref = summary["reference_point"]
    x, y = run.objectives[:2]
    sx, sy = metric(x).scale, metric(y).scale

    fig = Figure(figsize=(7, 5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for rows, label, marker in ((run.feasible, "feasible trial", "o"),
                                ([t for t in run.trials if not t["feasible"]], "infeasible trial", "x")):
        if rows:
            ax.scatter([t[x] * sx for t in rows], [t[y] * sy for t in rows], c="0.65", marker=marker, s=22,
                       label=label, zorder=2)
    front = sorted(run.front, key=lambda t: t[x])
    if front:
        fx, fy = [t[x] * sx for t in front], [t[y] * sy for t in front]
        if len(run.objectives) == 2 and ref is not None:
            rx, ry = _dominated_region(front, run.objectives, ref)
            ax.fill([v * sx for v in rx], [v * sy for v in ry], color="tab:blue", alpha=0.12, lw=0, zorder=1,
                    label="dominated, up to the reference point")
            ax.plot([v * sx for v in rx[1:-2]], [v * sy for v in ry[1:-2]], c="tab:blue", lw=1.2, zorder=3)
        ax.scatter(fx, fy, c="tab:blue", s=40, zorder=4, edgecolors="white", linewidths=0.6,
                   label=f"Pareto front ({len(front)})")
        if len(front) <= 15:
            for t, px, py in zip(front, fx, fy):
                ax.annotate(f"#{t['trial']}", (px, py), textcoords="offset points", xytext=(5, 4), fontsize=8,
                            color="tab:blue")
    if ref is not None:
        ax.scatter([ref[x] * sx], [ref[y] * sy], marker="*", s=90, c="tab:red", zorder=4,
                   label="hypervolume reference point")
    for name, set_scale in ((x, ax.set_xscale), (y, ax.set_yscale)):
        values = [t[name] for t in run.trials]
        if min(values) > 0 and max(values) >= 20 * min(values):  # spans decades: log axis
            set_scale("log")
    ax.set_xlabel(_axis_label(x))
    ax.set_ylabel(_axis_label(y))
    shown = "" if len(run.objectives) == 2 else f" (of {', '.join(run.objectives)})"
    ax.set_title(f"{run.id}: {len(run.trials)} trials, {len(run.front)} on the front{shown}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2, frameon=False)
    pareto_png = out_dir / "pareto.png"
    fig.savefig(pareto_png)

    fig = Figure(figsize=(7, 4), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    units, factor = hypervolume_units(run.objectives)
    history = [h * factor for h in hypervolume_history(run, ref)] if ref is not None else [0.0] * len(run.trials)
    ax.step(range(1, len(history) + 1), history, where="post", c="tab:blue")
    ax.plot(range(1, len(history) + 1), history, "o", c="tab:blue", ms=3)
    ax.set_xlabel("trials evaluated")
    ax.set_ylabel(f"hypervolume ({units})")
    ax.set_title(f"{run.id}: hypervolume of the feasible trials so far\nreference point: {describe_reference(ref)}", fontsize=10)
    ax.set_xlim(0.5, len(history) + 0.5)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    hv_png = out_dir / "hypervolume.png"
    fig.savefig(hv_png)
    return [pareto_png, hv_png]
