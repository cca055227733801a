"""The whole `nasctl` command tree."""

from __future__ import annotations

from . import deploy, hw, hw_bundle, hw_lut, predict, predictor, report, runs, search, space, supernet  # noqa: F401 - hw_* add hw commands
from .base import new_app

app = new_app()
app.command("search")(search.search)
app.command("predict")(predict.predict)
app.command("export")(deploy.export)
app.command("eval")(deploy.eval_)
app.command("report")(report.report)
app.add_typer(space.app, name="space")
app.add_typer(hw.app, name="hw")
app.add_typer(runs.app, name="runs")
app.add_typer(predictor.app, name="predictor")
app.add_typer(supernet.app, name="supernet")
