"""`--strategy auto`, the default: what it chooses, and that a run records the choice."""

import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.config import make_config, read_settings
from nasctl.strategies.auto import MAX_SCREENED, choose

runner = CliRunner()


def test_auto_is_the_default_and_the_eenn_preset_uses_it():
    assert make_config().strategy == "auto"
    values, _ = read_settings(preset="eenn")
    assert values["strategy"] == "auto" and "surrogate" not in values


def test_auto_screens_random_proposals_with_a_gp_and_prices_a_bounded_number_per_refit():
    at300 = choose(300)
    assert (at300.strategy, at300.surrogate, at300.screen) == ("random", "gp", 600)
    big = choose(5000)  # a refit every 417 real evaluations: 600 each would price 250,000
    assert big.surrogate == "gp" and big.screen * 417 <= MAX_SCREENED
    mine = choose(300, surrogate="ridge", screen=50)  # what the user says wins
    assert (mine.surrogate, mine.screen) == ("ridge", 50)


def test_auto_uses_tpe_where_the_budget_is_too_small_for_a_surrogate():
    tiny = choose(12)
    assert (tiny.strategy, tiny.surrogate) == ("tpe", None) and "under 20" in tiny.why


def test_a_run_records_what_auto_chose_and_resumes_with_it(table, tmp_path):
    path, _ = table
    run = tmp_path / "run"
    args = ["search", "--space", "nb201", "--accuracy", f"table:{path}:acc", "--device", f"table:{path}:lat"]
    result = runner.invoke(app, [*args, "--budget", "24", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["strategy"], config["surrogate"], config["screen"]) == ("random", "gp", 600)
    assert "screened by a 'gp' surrogate" in config["resolved"]["strategy_auto"]
    assert (run / "surrogate.csv").is_file()  # screening ran
    resumed = runner.invoke(app, ["search", "--resume", str(run), "--budget", "30"])
    assert resumed.exit_code == 0, resumed.output
    assert len((run / "trials.csv").read_text().splitlines()) == 31


def test_unknown_strategy_names_auto_among_the_allowed():
    result = runner.invoke(app, ["search", "--strategy", "foo", "--budget", "2"])
    assert result.exit_code == 2
    assert "unknown strategy 'foo'; allowed: auto, agemoea" in result.output
