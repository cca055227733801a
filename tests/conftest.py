import csv
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The CLI prints 200 columns wide where its output is not a terminal, unless COLUMNS says
# otherwise; the tests read that output, so a shell's COLUMNS must not narrow and wrap it.
os.environ.pop("COLUMNS", None)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def bench_module():
    """benchmarks/NAME.py as a module: `bench_module("eenn")`."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(autouse=True)
def _isolated_workspace(monkeypatch, tmp_path):
    """Run every test from an empty folder, so runs/ and workspace look-ups stay in tmp_path
    and only the packaged data (this checkout's data folders) is found."""
    monkeypatch.delenv("NASCTL_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    from nasctl import workspace

    workspace.set_workspace(None)


@pytest.fixture
def table(tmp_path):
    """A synthetic benchmark table of every NB201 cell: accuracy `acc` rises with 3x3 convs,
    latency `lat` with every conv; cells whose first edge is an average pooling have an
    empty `lat` cell. Returns (path, rows)."""
    from nasctl.spaces.loader import load_space

    space = load_space("nb201")
    rng = np.random.default_rng(0)
    names = [v.name for v in space.variables()]
    rows = []
    for ops in itertools.product(*(v.choices for v in space.variables())):
        text = space.format_arch(dict(zip(names, ops)))
        acc = 80 + 2.5 * ops.count("nor_conv_3x3") + ops.count("nor_conv_1x1") + rng.normal(0, 0.3)
        lat = 1 + 0.4 * ops.count("nor_conv_3x3") + 0.1 * ops.count("nor_conv_1x1")
        rows.append({"arch_str": text, "acc": round(acc, 3), "lat": "" if ops[0] == "avg_pool_3x3" else lat})
    path = tmp_path / "bench.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["arch_str", "acc", "lat"])
        w.writeheader()
        w.writerows(rows)
    return path, rows
