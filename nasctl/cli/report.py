"""`nasctl report`: a self-contained HTML report of a run, with its plots as PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .render import out


def report(
    run: Annotated[str, typer.Argument(help="Run id under the workspace's runs/, or a run folder path.")],
    baseline: Annotated[Optional[list[str]], typer.Option(
        help="A run to plot the front against (e.g. the static int8 or fp32 search); repeat for more.")] = None,
    trial: Annotated[Optional[int], typer.Option(
        help="Trial whose per-layer cost and core mapping to show. [default: the lowest-EDP front point]")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder to write. [default: RUN/report]")] = None,
):
    """Write a run's report.html (plots embedded, opens offline) and its PNGs.

    Plots: the front against baseline runs, exit rates per point, per-layer cost, core mapping."""
    from .. import runs
    from ..report import write_report

    path = write_report(runs.load(run), [runs.load(b) for b in baseline or []], out_dir, trial)
    out.print(str(path), soft_wrap=True)
