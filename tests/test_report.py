"""`nasctl report`: one self-contained HTML file with the plots embedded, and the PNGs."""

import base64
from html.parser import HTMLParser

import numpy as np
import pytest
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.config import make_config
from nasctl.engine import Evaluator
from nasctl.store import RunStore

runner = CliRunner()


def make_run(folder, pin=None, trials=5):
    """A run folder as a search writes it, with accuracies and exit rates given instead of trained."""
    cfg = make_config({"pin": pin or {}}, budget=trials, objectives=["accuracy", "edp", "exit_overhead"])
    ev = Evaluator(cfg)
    store = RunStore.create(folder, folder.name, ev.columns)
    store.write_config({**cfg.model_dump(), "resolved": ev.resolved()})
    rng = np.random.default_rng(len(folder.name))
    for i in range(trials):
        arch = ev.space.sample(rng)
        early = len(ev.space.active_exits(arch)) - 1
        rates = [0.6 / early] * early + [0.4] if early else [1.0]
        store.append({"trial": i, **ev.row(arch, 80.0 + 3 * i, rates, 0.0)})
    return folder


class Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.links = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        for key in ("href", "src"):
            if key in attrs and not attrs[key].startswith("data:"):
                self.links.append(attrs[key])


def test_report_embeds_the_front_and_writes_pngs(tmp_path):
    run = make_run(tmp_path / "eenn")
    static = make_run(tmp_path / "static-int8", pin={"exit_s1": 0, "exit_s2": 0, "backbone_bits": 8})
    result = runner.invoke(app, ["report", str(run), "--baseline", str(static)])
    assert result.exit_code == 0, result.output
    page = (run / "report" / "report.html").read_text()
    parser = Images()
    parser.feed(page)
    assert parser.links == []                                # nothing to fetch: opens offline
    front = [img for img in parser.images if "Pareto front" in img["alt"]]
    assert len(front) == 1 and front[0]["src"].startswith("data:image/png;base64,")
    png = base64.b64decode(front[0]["src"].removeprefix("data:image/png;base64,"))
    assert png == (run / "report" / "front.png").read_bytes() and png.startswith(b"\x89PNG")
    assert {p.name for p in (run / "report").glob("*.png")} == {"front.png", "exit_rates.png", "layers.png",
                                                                 "mapping.png"}
    assert "static-int8 (exit_s1=0, exit_s2=0, backbone_bits=8)" in page
    assert "4xK" in page or "4xOY" in page or "2xK" in page  # the mapping table


def test_report_of_a_chosen_trial_and_bad_trial(tmp_path):
    run = make_run(tmp_path / "eenn", trials=3)
    result = runner.invoke(app, ["report", str(run), "--trial", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "Trial 1: cost per layer" in (tmp_path / "out" / "report.html").read_text()
    result = runner.invoke(app, ["report", str(run), "--trial", "9"])
    assert result.exit_code == 2
    assert "run '" in result.stderr and "has no trial 9; its trials are 0 to 2" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_static_rows_have_no_exit_overhead(tmp_path):
    import csv

    run = make_run(tmp_path / "static", pin={"exit_s1": 0, "exit_s2": 0})
    with open(run / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["exit_overhead"]) == 0 and float(r["dynamic_efficiency"]) == pytest.approx(0, abs=1e-9)
               for r in rows)
