from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _isolated_workspace(monkeypatch, tmp_path):
    """Run every test from an empty folder, so runs/ and workspace look-ups stay in tmp_path
    and only the packaged data (this checkout's data folders) is found."""
    monkeypatch.delenv("NASCTL_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    from nasctl import workspace

    workspace.set_workspace(None)
