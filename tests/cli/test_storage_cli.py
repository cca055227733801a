"""`nasctl search --storage`: a storage that cannot be opened is one line saying what is allowed."""

import pytest

from cli_helpers import invoke, one_line_error

ALLOWED = ("allowed: an SQLAlchemy database URL (sqlite:///PATH, postgresql://USER:PW@HOST/DB, "
           "mysql://USER:PW@HOST/DB) or journal:PATH (an optuna journal file)")


@pytest.mark.parametrize("url, reason", [
    ("bogus://x", "Can't load plugin: sqlalchemy.dialects:bogus"),
    ("not-a-url", "Could not parse SQLAlchemy URL"),
])
def test_bad_storage_says_what_is_allowed(tmp_path, url, reason):
    run = tmp_path / "run"
    result = invoke("search", "--budget", "1", "--storage", url, "--run-dir", run)
    one_line_error(result, 2, f"cannot open storage '{url}': {reason}")
    assert result.stderr.strip().endswith(ALLOWED)
    assert "Traceback" not in result.stderr and not run.exists()
