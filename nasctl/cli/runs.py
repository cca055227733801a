"""`nasctl runs list|show|compare|export|plot`: look at, compare and gate run folders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from .. import runs, workspace
from ..errors import WorkFailed
from ..objectives import metric
from .render import out, print_json
from .search import _front_table

app = typer.Typer(no_args_is_help=True, help="Run folders: list, show, compare (a CI gate), export, plot.")

RunArg = Annotated[str, typer.Argument(help="Run id under the workspace's runs/, or a run folder path.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _hv(value: float | None, objectives: list[str]) -> str:
    if value is None:
        return "-"
    units, factor = runs.hypervolume_units(objectives)
    return f"{value * factor:.4g} {units}"


@app.command("list")
def list_runs(as_json: JsonOpt = False):
    """List the runs under the workspace's runs/ folder."""
    rows = runs.list_runs()
    if as_json:
        return print_json(rows)
    if not rows:
        out.print(f"No runs in {workspace.runs_folder()}.")
        return
    table = Table("id", "space", "device", "strategy", "seed", "trials", "front", "hypervolume", "created",
                  caption="hypervolume: in the objectives' units as `runs show` prints them, each run at its own "
                          "reference point; `runs compare` measures runs at one shared point")
    table.columns[0].no_wrap = True
    for r in rows:
        if "problem" in r:
            table.add_row(r["run"], f"[red]{r['problem']}[/red]", *[""] * 7)
            continue
        hv = "-" if r["hypervolume"] is None else f"{r['hypervolume'] * runs.hypervolume_units(r['objectives'])[1]:.4g}"
        table.add_row(r["run"], str(r["space"]), str(r["device"]), str(r["strategy"]), str(r["seed"]),
                      str(r["trials"]), str(r["front_size"]), hv, r["created"][:16].replace("T", " "))
    out.print(table)


@app.command("show")
def show(run: RunArg, as_json: JsonOpt = False):
    """Show a run: settings, hypervolume, Pareto front and the best trial per metric."""
    loaded = runs.load(run)
    summary = runs.write_summary(loaded)
    if as_json:
        return print_json({**summary, "summary_file": str(loaded.path / runs.SUMMARY_FILE), "front": loaded.front})
    s = summary
    out.print(f"[bold]{s['run']}[/bold]  {s['path']}")
    out.print(f"space {s['space']} · device {s['device']} · dataset {s['dataset']} · strategy {s['strategy']} · "
              f"seed {s['seed']} · epochs {s['epochs']} · created {s['created']}")
    out.print("objectives: " + ", ".join(f"{o} {metric(o).arrow}" + (f" ({metric(o).unit})" if metric(o).unit else "")
                                         for o in s["objectives"]), highlight=False)
    out.print(f"{s['trials']} trials ({s['feasible']} feasible), {s['front_size']} on the Pareto front")
    out.print(f"hypervolume {_hv(s['hypervolume'], s['objectives'])} at reference point {runs.describe_reference(s['reference_point'])}")
    out.print(f"  reference point: {s['reference_rule']}; stored in {loaded.path / runs.SUMMARY_FILE}")
    out.print(_front_table(loaded.front, s["objectives"]))
    table = Table("metric", "column", "best", "trial", title="Best feasible trial per metric")
    for name, b in s["best"].items():
        m = metric(name)
        table.add_row(m.label, f"{name} {m.arrow}", runs.display(name, b["value"]), str(b["trial"]))
    out.print(table)


@app.command("compare")
def compare(
    run: Annotated[list[str], typer.Argument(help="Runs to compare (ids or folder paths).")],
    baseline: Annotated[Optional[str], typer.Option(
        help="Run the others are measured against. [default: the first RUN]")] = None,
    min_hv_ratio: Annotated[Optional[float], typer.Option(
        help="Gate: exit 1 when a run's hypervolume is below this times the baseline's (a run given "
             "as its own baseline has ratio 1).")] = None,
    as_json: JsonOpt = False,
):
    """Compare runs side by side at the baseline's reference point; optionally gate on hypervolume."""
    loaded = [runs.load(r) for r in run]
    base = runs.load(baseline) if baseline is not None else loaded[0]
    # The first RUN, when it is the baseline by default, is held to the gate only where it is
    # the one run given (a run compared with itself, ratio 1).
    gated = loaded if baseline is not None else loaded[1:] or loaded
    result = runs.compare(gated, base, min_hv_ratio)
    if as_json:
        print_json(result)
    else:
        objectives = result["objectives"]
        table = Table("", *[r["run"] + (" (baseline)" if r["baseline"] else "") for r in result["runs"]])
        for label, key in (("space", "space"), ("device", "device"), ("strategy", "strategy"), ("seed", "seed")):
            table.add_row(label, *[str(r[key]) for r in result["runs"]])
        table.add_row("trials (feasible)", *[f"{r['trials']} ({r['feasible']})" for r in result["runs"]])
        table.add_row("front size", *[str(r["front_size"]) for r in result["runs"]])
        table.add_row("hypervolume", *[_hv(r["hypervolume"], objectives) for r in result["runs"]])
        table.add_row("HV ratio", *[f"{r['hv_ratio']:.3f}" for r in result["runs"]])
        for o in objectives:
            table.add_row(f"best {o}", *[f"{runs.display(o, r['best'][o]['value'])} (#{r['best'][o]['trial']})"
                                         if o in r["best"] else "-" for r in result["runs"]])
        if min_hv_ratio is not None:
            table.add_row(f"HV ratio ≥ {min_hv_ratio:g}",
                          *["baseline" if r["passed"] is None else "[green]pass[/green]" if r["passed"]
                            else "[red]FAIL[/red]" for r in result["runs"]])
        out.print(table)
        out.print(f"reference point: {runs.describe_reference(result['reference_point'])} ({result['reference_source']}; "
                  f"{result['reference_rule']})")
    failed = [r for r in result["runs"] if r["passed"] is False]
    if failed:
        raise WorkFailed("; ".join(f"run '{r['run']}' hypervolume ratio {r['hv_ratio']:.3f} is below --min-hv-ratio "
                                   f"{min_hv_ratio:g} of baseline '{result['baseline']}'"
                                   + (" (the run itself)" if r["baseline"] else "") for r in failed))


@app.command("export")
def export(
    run: RunArg,
    fmt: Annotated[Literal["csv", "json"], typer.Option("--format", help="File format.")] = "csv",
    out_file: Annotated[Optional[Path], typer.Option("--out", help="File to write. [default: stdout]")] = None,
    front: Annotated[bool, typer.Option("--front", help="Only the Pareto front.")] = False,
):
    """Export trials (or the front) with each architecture decoded into arch.<knob> columns."""
    rows = runs.export_rows(runs.load(run), front_only=front)
    if out_file is None:
        return runs.write_export(rows, fmt, sys.stdout)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with open(out_file, "w", newline="", encoding="utf-8") as f:
        runs.write_export(rows, fmt, f)
    out.print(f"{len(rows)} {'front ' if front else ''}trials written to {out_file}")


@app.command("plot")
def plot(
    run: RunArg,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for the PNGs. [default: RUN/plots]")] = None,
):
    """Plot the Pareto front (first two objectives) and hypervolume against trials as PNGs."""
    for path in runs.plot(runs.load(run), out_dir):
        out.print(str(path), soft_wrap=True)
