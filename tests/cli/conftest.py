import pytest


@pytest.fixture
def ws(tmp_path):
    """An empty workspace folder."""
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"
