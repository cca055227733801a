"""Plugins: kinds, strategies and spec files from other installed distributions, found
through entry points.  A distribution is simulated by a dist-info folder on sys.path."""

import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from nasctl import registry
from nasctl.cli import app
from nasctl.errors import UsageError
from nasctl.spaces.loader import SPACE_KINDS, load_space
from nasctl.strategies import STRATEGIES

runner = CliRunner()
ORIGIN = "fakeplug 1.2"

ENTRY_POINTS = """\
[nasctl.space_kinds]
fake = fakeplug.spaces:FakeSpace
nb201 = fakeplug.spaces:FakeSpace
broken = fakeplug.broken:Thing
missing = fakeplug.spaces:NoSuchClass

[nasctl.strategies]
fake-random = fakeplug.spaces:FakeRandom

[nasctl.data]
fakeplug = fakeplug
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed distribution `fakeplug` 1.2: space kinds `fake` (an NB201 variant),
    `nb201` (a clash with the built-in), `broken` (its module raises on import) and
    `missing` (no such class); a strategy; spec files of the kinds fake and broken."""
    site = tmp_path / "site"
    info = site / "fakeplug-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    package = site / "fakeplug"
    (package / "search_spaces").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spaces.py").write_text(textwrap.dedent("""\
        from nasctl.spaces.nb201 import Nb201Space
        from nasctl.strategies.random import RandomStrategy

        class FakeSpace(Nb201Space):
            pass

        class FakeRandom(RandomStrategy):
            pass
        """))
    (package / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (package / "search_spaces" / "fake-nb201.yaml").write_text("kind: fake\nchannels: 8\ncells_per_stage: 1\n")
    (package / "search_spaces" / "broken-space.yaml").write_text("kind: broken\n")
    (package / "search_spaces" / "missing-space.yaml").write_text("kind: missing\n")
    monkeypatch.syspath_prepend(str(site))
    registry.reset_plugins()
    yield
    registry.reset_plugins()
    for name in [m for m in sys.modules if m == "fakeplug" or m.startswith("fakeplug.")]:
        del sys.modules[name]


def invoke(*args):
    return runner.invoke(app, list(args))


def test_plugin_kinds_are_found_lazily_with_their_origin(plugin, capsys):
    assert "fake" in SPACE_KINDS and "fake-random" in STRATEGIES.names()
    assert "fakeplug.spaces" not in sys.modules  # listing imports no plugin module
    origins = {e.name: e.origin for e in SPACE_KINDS.entries()}
    assert origins["fake"] == ORIGIN and origins["mbv2"] == origins["nb201"] == "built-in"
    space = load_space("fake-nb201")
    assert type(space).__name__ == "FakeSpace" and space.spec.channels == 8
    assert STRATEGIES.get("fake-random").__name__ == "FakeRandom"


def test_space_list_shows_plugin_spec_files_and_kinds_with_their_origin(plugin):
    listed = invoke("space", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["fake-nb201"]["origin"] == ORIGIN and rows["fake-nb201"]["kind"] == "fake"
    assert rows["nb201"]["origin"] == "packaged"
    kinds = {k["name"]: k for k in json.loads(invoke("space", "list", "--kinds", "--json").stdout)}
    assert kinds["fake"] == {"name": "fake", "origin": ORIGIN}
    assert kinds["nb201"] == {"name": "nb201", "origin": "built-in"}
    assert "RuntimeError: boom at import" in kinds["broken"]["error"]
    table = invoke("space", "list").stdout
    assert "fake-nb201" in table and ORIGIN in table and "cannot be loaded" in table


def test_a_clash_with_a_built_in_is_refused_in_one_warning_line(plugin, capsys):
    assert SPACE_KINDS.get("nb201").__name__ == "Nb201Space"
    err = capsys.readouterr().err.strip().splitlines()
    clash = [line for line in err if "'nb201'" in line]
    assert len(clash) == 1 and clash[0].startswith("warning: plugin fakeplug 1.2:") and "built-in" in clash[0]
    SPACE_KINDS.names()
    assert capsys.readouterr().err == ""  # once per process


def test_a_plugin_that_fails_to_import_is_one_line_and_not_fatal(plugin):
    listed = invoke("space", "list")
    assert listed.exit_code == 0
    failing = [line for line in listed.stderr.splitlines() if "'broken'" in line]
    assert len(failing) == 1 and ORIGIN in failing[0] and "RuntimeError: boom at import" in failing[0]
    assert invoke("space", "show", "fake-nb201").exit_code == 0
    assert invoke("hw", "list").exit_code == 0
    for name, problem in (("broken-space", "RuntimeError: boom at import"),
                          ("missing-space", "has no attribute 'NoSuchClass'")):
        shown = invoke("space", "show", name)
        lines = shown.stderr.strip().splitlines()
        assert shown.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), shown.stderr
        assert ORIGIN in lines[0] and problem in lines[0]
    with pytest.raises(UsageError, match="^search-space kind 'broken' of plugin fakeplug 1.2 cannot be loaded"):
        SPACE_KINDS.get("broken")


def test_without_plugins_only_built_ins_are_listed():
    registry.reset_plugins()
    assert {e.origin for e in SPACE_KINDS.entries()} == {"built-in"}
    assert "fake" not in SPACE_KINDS
