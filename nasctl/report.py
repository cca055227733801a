"""`nasctl report RUN`: one self-contained HTML page about a search, and its plots as PNGs.

The page (report.html) holds every plot as an embedded PNG (a base64 `data:` URI) and no
link to anything outside it, so it opens anywhere without a network connection:

  front.png      accuracy against expected EDP: the run's trials and its front, with the
                 front of every baseline run (e.g. the same search with exits pinned off
                 at int8 and at fp32)
  exit_rates.png the share of test inputs leaving at each exit, per front point
  layers.png     latency and energy of each layer of one network (the lowest-EDP front
                 point unless a trial is chosen), backbone and exit heads apart
  mapping.png    how the device mapped each of those layers onto its cores
                 (1 core, n cores split over output channels "nxK" or rows "nxOY")

Layer costs are priced afresh from the run's space and device (config.yaml `resolved`),
which gives the same numbers the search stored.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import UsageError
from .objectives import metric
from .runs import Run

REPORT_FILE = "report.html"
_COLOURS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


@dataclass
class LayerRow:
    name: str
    op: str
    role: str
    exit: str        # the first exit the layer lies before (its own, for an exit head)
    bits: int
    macs: int
    mapping: str
    latency_ms: float
    energy_mj: float | None


def label(run: Run) -> str:
    """A run as a legend names it: its id, and its pinned knobs if any."""
    pins = run.config.get("pin") or {}
    return f"{run.id}" + (f" ({', '.join(f'{k}={v}' for k, v in pins.items())})" if pins else "")


def accuracy_edp_front(rows: Sequence[dict]) -> list[dict]:
    """The feasible rows no other feasible row beats in both accuracy and EDP, by EDP."""
    from .objectives import pareto_front

    rows = [r for r in rows if r.get("edp") is not None]
    return sorted(pareto_front(rows, ["accuracy", "edp"]), key=lambda r: r["edp"])


def pick(run: Run, trial: int | None) -> dict:
    """Trial `trial` of the run, or its lowest-EDP front point."""
    if trial is not None:
        for t in run.trials:
            if t["trial"] == trial:
                return t
        raise UsageError(f"run '{run.name}' has no trial {trial}; its trials are 0 to {len(run.trials) - 1}")
    front = [t for t in run.front if t.get("edp") is not None]
    if not front:
        raise UsageError(f"run '{run.name}' has no feasible trial with an EDP to report "
                         "(the report needs a device that models energy)")
    return min(front, key=lambda t: t["edp"])


def layer_rows(run: Run, row: dict) -> list[LayerRow]:
    """Each layer of the trial's network with its cost and core mapping on the run's device
    (with co-search, on the trial's own accelerator)."""
    from .hardware.loader import load_device
    from .spaces.cosearch import CoSearchSpace
    from .spaces.loader import load_space

    resolved = run.config.get("resolved") or {}

    def named(key: str) -> str:
        path = resolved.get(key)
        return path if path and Path(path).is_file() else run.config[key]

    space, device = load_space(named("space")), load_device(named("device"))
    arch = json.loads(row["arch"])
    if run.config.get("co_search"):  # the network, on the accelerator it was paired with
        arch, hw = CoSearchSpace.split(arch)
        device = device.derive(hw)
    layers = space.to_layers(arch, tuple(resolved["input_shape"]), resolved["classes"])
    exits = space.active_exits(arch)
    report = device.estimate(layers)
    return [LayerRow(layer.name, layer.op, layer.role, exits[layer.segment], max(layer.w_bits, layer.a_bits),
                     layer.macs, cost.mapping, cost.latency_ms, cost.energy_mj)
            for layer, cost in zip(layers, report.costs)]


# ---------------------------------------------------------------- plots

def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_front(run: Run, baselines: Sequence[Run], chosen: dict, path: Path) -> None:
    ax = (fig := _figure(7.5, 5.5)).add_subplot()
    sy = metric("edp").scale
    rows = [t for t in run.feasible if t.get("edp") is not None]
    sx = metric("accuracy").scale
    ax.scatter([t["accuracy"] * sx for t in rows], [t["edp"] * sy for t in rows], c="0.7", s=16, label="trials")
    for r, colour, name in [(run, "tab:blue", run.id)] + [
            (b, _COLOURS[i % len(_COLOURS)], f"baseline {b.id}") for i, b in enumerate(baselines)]:
        front = accuracy_edp_front(r.feasible)
        if front:
            ax.plot([t["accuracy"] * sx for t in front], [t["edp"] * sy for t in front], "o-", c=colour, ms=5,
                    drawstyle="steps-post", label=f"front: {name}")
    ax.scatter([chosen["accuracy"] * sx], [chosen["edp"] * sy], marker="*", s=160, c="gold", edgecolors="k",
               zorder=5, label=f"trial {chosen['trial']} (layers below)")
    edps = [t["edp"] for r in (run, *baselines) for t in r.feasible if t.get("edp") is not None]
    if edps and min(edps) > 0 and max(edps) >= 20 * min(edps):
        ax.set_yscale("log")
    ax.set_xlabel(metric("accuracy").axis_label)
    ax.set_ylabel(f"expected {metric('edp').axis_label}")
    ax.set_title("Pareto front: accuracy against expected energy-delay product", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center", ncols=2, frameon=False)
    fig.savefig(path)


def plot_exit_rates(run: Run, exits: Sequence[str], path: Path) -> None:
    front = accuracy_edp_front(run.feasible) or sorted(run.front, key=lambda t: t["trial"])
    ax = (fig := _figure(7.5, 1.4 + 0.3 * max(len(front), 3))).add_subplot()
    left = [0.0] * len(front)
    names = [f"#{t['trial']}  {t['accuracy']:.1f}%" for t in front]
    for i, e in enumerate(exits):
        shares = [100 * (t.get(f"exit_rate_{e}") or 0.0) for t in front]
        ax.barh(names, shares, left=left, color="tab:blue" if e == "final" else _COLOURS[i % len(_COLOURS)],
                label=f"exit {e}")
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of test inputs leaving at each exit (%)")
    ax.set_title("Exit rates per front point (lowest EDP first)", fontsize=10)
    fig.legend(fontsize=7, ncols=len(exits), loc="outside lower center", frameon=False)
    fig.savefig(path)


def plot_layers(layers: Sequence[LayerRow], trial: int, path: Path) -> None:
    fig = _figure(max(7.5, 0.22 * len(layers)), 5.5)
    axes = fig.subplots(2, 1, sharex=True)
    x = range(len(layers))
    colours = ["tab:orange" if lay.role == "exit" else "tab:blue" for lay in layers]
    lat, en = metric("latency_ms"), metric("energy_mj")
    axes[0].bar(x, [lay.latency_ms * lat.scale for lay in layers], color=colours)
    axes[0].set_ylabel(f"{lat.label} ({lat.unit})")
    axes[1].bar(x, [(lay.energy_mj or 0.0) * en.scale for lay in layers], color=colours)
    axes[1].set_ylabel(f"{en.label} ({en.unit})")
    axes[1].set_xticks(list(x), [lay.name for lay in layers], rotation=90, fontsize=6)
    axes[0].set_title(f"Per-layer cost of trial {trial} (blue: backbone, orange: exit heads)", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)


def plot_mapping(layers: Sequence[LayerRow], trial: int, path: Path) -> None:
    ax = (fig := _figure(max(7.5, 0.22 * len(layers)), 3.8)).add_subplot()
    kinds = sorted({lay.mapping for lay in layers}, key=lambda m: (len(m), m))
    colour = {m: c for m, c in zip(kinds, ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red",
                                           "tab:purple", "tab:brown", "tab:pink"))}
    lat = metric("latency_ms")
    for m in kinds:
        idx = [i for i, lay in enumerate(layers) if lay.mapping == m]
        ax.bar(idx, [layers[i].latency_ms * lat.scale for i in idx], color=colour.get(m, "k"),
               label="1 core" if m == "1" else m)
    ax.set_xticks(range(len(layers)), [lay.name for lay in layers], rotation=90, fontsize=6)
    ax.set_ylabel(f"{lat.label} ({lat.unit})")
    ax.set_title(f"Core mapping chosen per layer of trial {trial} (least EDP per layer)", fontsize=10)
    ax.legend(fontsize=7, ncols=len(kinds))
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)


# ---------------------------------------------------------------- the page

def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f'{html.escape(alt)}</figcaption></figure>'


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# Metrics of the front tables; area_mm2 too where the run co-searched the accelerator.
POINT_METRICS = ("accuracy", "latency_ms", "energy_mj", "edp", "exit_overhead", "dynamic_efficiency")


def _point_metrics(rows: Sequence[dict]) -> list[str]:
    return [*POINT_METRICS, *(["area_mm2"] if any(t.get("area_mm2") is not None for t in rows) else [])]


def point_header(rows: Sequence[dict]) -> list[str]:
    return ["trial", *(metric(m).heading for m in _point_metrics(rows)), "exit rates", "architecture"]


def _point_rows(rows: Sequence[dict], exits: Sequence[str], like: Sequence[dict] = ()) -> list[list[str]]:
    """Table rows of `rows`, with the columns of point_header(`like` or `rows`)."""
    names = _point_metrics(like or rows)
    return [[t["trial"], *(metric(m).format(t.get(m), unit=False) for m in names),
             " ".join(f"{e}:{t.get(f'exit_rate_{e}') or 0:.0%}" for e in exits), t["arch"]] for t in rows]

def _exports_section(run: Run) -> list[str]:
    """The models exported from the run (`nasctl export`), with what `nasctl eval` measured."""
    from .deploy.export import exported

    models = exported(run.path)
    if not models:
        return []
    rows = []
    for m in models:
        card, ev = m["card"], m["eval"] or {}
        trial_fig, own = card["figures"]["run"], card["figures"]["model"]
        rates = lambda r: " ".join(f"{e}:{(r or {}).get(e) or 0:.0%}" for e in card["exits"])  # noqa: E731
        mean = (ev.get("latency_ms") or {}).get("mean")
        rows.append([card["run"]["trial"], m["folder"], own.get("trained_on", "train"),
                     f"{own['accuracy']:.2f}", "-" if not ev else f"{ev['accuracy']:.2f}",
                     rates(trial_fig.get("exit_rates")), "-" if not ev else rates(ev.get("exit_rates")),
                     "-" if mean is None else f"{mean:.4g}"])
    return ["<h2>Exported models</h2>",
            "<p>Models written by <code>nasctl export</code>; the onnxruntime columns are what "
            "<code>nasctl eval</code> measured on the test split (- where it has not run).</p>",
            _table(["trial", "folder", "trained on", "accuracy (torch)", "accuracy (onnxruntime)",
                    "exit rates (trial)", "exit rates (onnxruntime)", "measured latency ms (mean)"], rows)]


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:80em;color:#222}
table{border-collapse:collapse;font-size:0.8em;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#eee}td:last-child{font-family:monospace;font-size:0.85em}img{max-width:100%}
figure{margin:1em 0}figcaption{font-size:0.8em;color:#555}"""


def write_report(run: Run, baselines: Sequence[Run] = (), out_dir: Path | None = None,
                 trial: int | None = None) -> Path:
    """Write report.html and its PNGs into `out_dir` (default: the run folder's report/)."""
    if not run.trials:
        raise UsageError(f"run '{run.name}' has no trials yet; nothing to report")
    out_dir = Path(out_dir) if out_dir is not None else run.path / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = pick(run, trial)
    layers = layer_rows(run, chosen)
    exits = [k.removeprefix("exit_rate_") for k in run.trials[0] if k.startswith("exit_rate_")]
    pngs = {name: out_dir / f"{name}.png" for name in ("front", "exit_rates", "layers", "mapping")}
    plot_front(run, baselines, chosen, pngs["front"])
    plot_exit_rates(run, exits, pngs["exit_rates"])
    plot_layers(layers, chosen["trial"], pngs["layers"])
    plot_mapping(layers, chosen["trial"], pngs["mapping"])

    cfg = run.config
    settings = [[k, json.dumps(cfg.get(k)) if isinstance(cfg.get(k), (dict, list)) else cfg.get(k)]
                for k in ("space", "device", "dataset", "strategy", "objectives", "budget", "epochs", "seed",
                          "exit_policy", "exit_tolerance", "exit_rates", "pin") if k in cfg]
    acc, edp, lat, en = (metric(m) for m in ("accuracy", "edp", "latency_ms", "energy_mj"))
    base_rows = []
    for b in (run, *baselines):
        front = accuracy_edp_front(b.feasible)
        best = max(b.feasible, key=lambda t: (t["accuracy"], -(t.get("edp") or 0)), default=None)
        base_rows.append([label(b), len(b.trials), len(front), acc.format(best and best["accuracy"], unit=False),
                          edp.format(best and best["edp"], unit=False),
                          edp.format(front[0]["edp"] if front else None, unit=False)])
    layer_table = _table(["layer", "op", "role", "exit", "bits", "MACs", "mapping", lat.heading, en.heading],
                         [[lay.name, lay.op, lay.role, lay.exit, lay.bits, f"{lay.macs:,}", lay.mapping,
                           lat.format(lay.latency_ms, unit=False), en.format(lay.energy_mj, unit=False)]
                          for lay in layers])
    parts = [
        f"<h1>nasctl report: {html.escape(run.id)}</h1>",
        f"<p>{len(run.trials)} trials, {len(run.feasible)} feasible, {len(run.front)} on the Pareto front of "
        f"{html.escape(', '.join(run.objectives))}. Expected latency, energy and EDP are averages over the "
        "share of test inputs leaving at each exit; exit overhead is the energy of the exit heads on that "
        "expected path over the energy of the same network without exits; dynamic efficiency is "
        "1 - EDP / that network's EDP.</p>",
        "<h2>Settings</h2>", _table(["setting", "value"], settings),
        "<h2>Front against the baselines</h2>", _img(pngs["front"], "Pareto front: accuracy against expected EDP"),
        _table(["run", "trials", "accuracy-EDP front", f"best {acc.heading}", f"its {edp.heading}",
                f"least front {edp.heading}"], base_rows),
        "<h2>Pareto front</h2>", _table(point_header(run.front),
                                        _point_rows(sorted(run.front, key=lambda t: t["edp"] or 0), exits)),
        "<h2>Exit rates</h2>", _img(pngs["exit_rates"], "Exit rates per front point"),
        f"<h2>Trial {chosen['trial']}: cost per layer and core mapping</h2>",
        _table(point_header(run.front), _point_rows([chosen], exits, like=run.front)),
        _img(pngs["layers"], f"Per-layer latency and energy of trial {chosen['trial']}"),
        _img(pngs["mapping"], f"Core mapping per layer of trial {chosen['trial']}"),
        layer_table,
        *_exports_section(run),
    ]
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>nasctl report: '
            f'{html.escape(run.id)}</title><style>{_STYLE}</style></head><body>\n' + "\n".join(parts)
            + "\n</body></html>\n")
    path = out_dir / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path
