"""Input a new user might give by mistake: each is refused in one line, before any work
(and before any run folder is made)."""

import json
import os
import subprocess
import sys

import pytest

from cli_helpers import invoke, one_line_error


@pytest.mark.parametrize("seed", ["4294967296", "-1"])
def test_seed_out_of_range_is_refused_before_a_run_folder(tmp_path, seed):
    result = invoke("search", "--seed", seed, "--budget", "1", "--epochs", "1")
    one_line_error(result, 2, f"--seed {seed}")
    assert "0 <= seed < 4294967296" in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_largest_seed_is_accepted_and_leaves_room_for_each_worker():
    assert invoke("search", "--seed", str(2**32 - 1), "--print-config").exit_code == 0
    one_line_error(invoke("search", "--seed", str(2**32 - 1), "--workers", "2", "--print-config"), 2,
                   "allowed: 0 <= seed <= 4294967294")


def test_max_accuracy_drop_needs_a_baseline():
    one_line_error(invoke("search", "--max-accuracy-drop", "0.5", "--print-config"), 2,
                   "--max-accuracy-drop 0.5: needs --accuracy-baseline")


def test_max_accuracy_drop_in_a_config_file_needs_a_baseline(tmp_path):
    (tmp_path / "c.yaml").write_text("max_accuracy_drop: 2.0\n")
    one_line_error(invoke("search", "--config", tmp_path / "c.yaml", "--print-config"), 2,
                   "max_accuracy_drop: needs accuracy_baseline")


def test_the_same_knob_twice_in_pin_is_refused():
    one_line_error(invoke("search", "--pin", "exit_s1=0,exit_s1=1", "--print-config"), 2,
                   "'exit_s1' is given twice")


NOISY = """
import sys, warnings
import nasctl.cli.hw as hw
real = hw.load_device
def noisy(name):  # the kind of warning a library gives during real work
    warnings.warn("overflow encountered in exp", RuntimeWarning)
    return real(name)
hw.load_device = noisy
sys.argv = ["nasctl", "hw", "show", "edge-quad", "--json"]
from nasctl.cli import main
main()
"""


@pytest.mark.parametrize("env, shown", [({}, False), ({"NASCTL_WARNINGS": "1"}, True)])
def test_library_warnings_stay_off_the_terminal_unless_asked_for(env, shown):
    environ = {k: v for k, v in os.environ.items() if k not in ("NASCTL_WARNINGS", "PYTHONWARNINGS")}
    result = subprocess.run([sys.executable, "-c", NOISY], capture_output=True, text=True, env={**environ, **env})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "edge-quad"
    assert ("RuntimeWarning: overflow encountered in exp" in result.stderr) == shown, result.stderr
