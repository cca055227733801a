"""Runs on optuna storage: config files, resume, storage URLs, local workers."""

import csv
import json

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from tests.cli.cli_helpers import SMALL_SPACE

runner = CliRunner()
FAST = ["--epochs", "1", "--strategy", "random", "--space", SMALL_SPACE]


def search(*args):
    return runner.invoke(app, ["search", *args])


def rows(run):
    with open(run / "trials.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_config_file_with_flags_overriding(tmp_path):
    cfg = tmp_path / "search.yaml"
    cfg.write_text(yaml.safe_dump({"budget": 7, "epochs": 1, "seed": 4, "strategy": "random"}))
    result = search("--config", str(cfg), "--budget", "3", "--print-config")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["budget"] == 3 and resolved["seed"] == 4 and resolved["objectives"] == ["accuracy", "edp"]
    toml = tmp_path / "search.toml"
    toml.write_text('budget = 5\nobjectives = ["accuracy", "latency_ms"]\n')
    resolved = yaml.safe_load(search("--config", str(toml), "--print-config").stdout)
    assert resolved["budget"] == 5 and resolved["objectives"] == ["accuracy", "latency_ms"]


@pytest.mark.parametrize("content, message", [
    ("budget: -1\n", "search.yaml: budget: Input should be greater than or equal to 1"),
    ("budgets: 3\n", "search.yaml: budgets: unknown key"),
    ("objectives: [accuracy, speed]\n", "unknown objective 'speed'"),
    ("budget: [1\n", "search.yaml: line 2 is not valid YAML"),
])
def test_config_file_errors_name_file_and_key(tmp_path, content, message):
    cfg = tmp_path / "search.yaml"
    cfg.write_text(content)
    result = search("--config", str(cfg), "--print-config")
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_run_config_reruns_the_same_search(tmp_path):
    assert search("--budget", "3", *FAST, "--seed", "2", "--run-dir", str(tmp_path / "a")).exit_code == 0
    result = search("--config", str(tmp_path / "a" / "config.yaml"), "--run-dir", str(tmp_path / "b"))
    assert result.exit_code == 0, result.output
    strip = lambda rs: [{k: v for k, v in r.items() if k != "train_s"} for r in rs]  # noqa: E731
    assert strip(rows(tmp_path / "a")) == strip(rows(tmp_path / "b"))


def test_trials_live_in_an_optuna_study(tmp_path):
    run = tmp_path / "run"
    assert search("--budget", "3", *FAST, "--run-dir", str(run)).exit_code == 0
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{run / 'study.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    csv_rows = rows(run)
    for t, r in zip(done, csv_rows):
        assert json.loads(r["arch"]) == t.params
        assert t.values == pytest.approx([float(r["accuracy"]), float(r["edp"])], rel=1e-5)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]


def test_resume_continues_without_redoing_work(tmp_path, monkeypatch):
    from nasctl.evaluation import train

    run = tmp_path / "run"
    assert search("--budget", "3", *FAST, "--seed", "1", "--run-dir", str(run)).exit_code == 0
    first = rows(run)
    calls = []
    real = train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = search("--resume", str(run), "--budget", "5")
    assert result.exit_code == 0, result.output
    assert len(calls) == 2  # only the new candidates are trained
    assert yaml.safe_load((run / "config.yaml").read_text())["budget"] == 5  # the raised budget is the run's
    after = rows(run)
    assert after[:3] == first and len(after) == 5
    # the same as an uninterrupted run of budget 5
    assert search("--budget", "5", *FAST, "--seed", "1", "--run-dir", str(tmp_path / "full")).exit_code == 0
    assert [r["arch"] for r in rows(tmp_path / "full")] == [r["arch"] for r in after]


def test_resume_keeps_the_runs_search_and_finds_its_study_in_a_renamed_folder(tmp_path, monkeypatch):
    from nasctl.evaluation import train

    run = tmp_path / "run"
    assert search("--budget", "2", *FAST, "--seed", "1", "--run-dir", str(run)).exit_code == 0
    for extra, text in [(["--space", "nb201"], "the run searched with space"),
                        (["--seed", "7"], "the run searched with seed 1; --seed 7 would change it"),
                        (["--objectives", "accuracy,latency_ms"], "the run searched with objectives"),
                        (["--run-dir", str(tmp_path / "other")], "give --run-dir only for a new search"),
                        (["--preset", "eenn"], "--preset cannot change them"),
                        (["--config", str(run / "config.yaml")], "--config cannot change them")]:
        result = search("--resume", str(run), "--budget", "3", *extra)
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
        assert text in result.stderr, result.stderr
    assert len(rows(run)) == 2  # nothing was added
    moved = tmp_path / "moved"
    run.rename(moved)
    calls = []
    real = train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = search("--resume", str(moved), "--budget", "3")
    assert result.exit_code == 0, result.output
    assert len(calls) == 1 and len(rows(moved)) == 3  # the two done are kept, not trained again
    assert optuna.get_all_study_names(storage=f"sqlite:///{moved / 'study.db'}") == ["run"]


def test_resume_of_unknown_run_is_one_line():
    result = search("--resume", "no-such-run")
    assert result.exit_code == 2 and result.stderr.startswith("error: run 'no-such-run' not found")


def test_journal_storage_and_named_study(tmp_path):
    journal = tmp_path / "journal.log"
    result = search("--budget", "2", *FAST, "--storage", f"journal:{journal}", "--study", "shared",
                    "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="shared", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(study.trials) == 2


def test_two_local_workers_share_one_study(tmp_path):
    run = tmp_path / "run"
    result = search("--budget", "6", *FAST, "--workers", "2", "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    got = rows(run)
    assert 6 <= len(got) <= 7  # a worker may finish the candidate it started as the budget filled
    assert len({r["arch"] for r in got}) == len(got)


def test_a_second_machine_joins_with_storage_and_study(tmp_path):
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    first = search("--budget", "2", *FAST, "--seed", "3", "--storage", db, "--study", "team",
                   "--run-dir", str(tmp_path / "m1"))
    assert first.exit_code == 0, first.output
    # the joiner gives only storage, study and a higher budget: it takes the rest of the settings
    second = search("--budget", "4", "--storage", db, "--study", "team", "--run-dir", str(tmp_path / "m2"))
    assert second.exit_code == 0, second.output
    config = yaml.safe_load((tmp_path / "m2" / "config.yaml").read_text())
    assert config["seed"] == 3 and config["strategy"] == "random" and config["epochs"] == 1
    study = optuna.load_study(study_name="team", storage=db)
    archs = [t.user_attrs["arch"] for t in study.trials]
    assert len(archs) == 4 and len(set(archs)) == 4
    assert len(rows(tmp_path / "m2")) == 4  # the joiner's trials.csv holds the whole study
    # a joiner whose flags would change what the study searches is refused: one study, one search
    third = search("--budget", "5", "--epochs", "2", "--storage", db, "--study", "team",
                   "--run-dir", str(tmp_path / "m3"))
    assert third.exit_code == 2 and "--study team: the study searched with epochs 1; --epochs 2" in third.stderr
    assert not (tmp_path / "m3").exists() and len(optuna.load_study(study_name="team", storage=db).trials) == 4


def test_repeats_average_trainings_with_other_seeds(tmp_path, monkeypatch):
    from nasctl.engine import candidate_seed
    from nasctl.evaluation import train

    seeds = []
    real = train.evaluate

    def recorded(*a, **k):
        seeds.append(k["seed"])
        return real(*a, **k)

    monkeypatch.setattr(train, "evaluate", recorded)
    run = tmp_path / "run"
    # trained on the CPU, as the trainings below that it is compared with (a GPU gives other digits)
    result = search("--budget", "2", *FAST, "--seed", "3", "--repeats", "3", "--train-device", "cpu",
                    "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    assert len(seeds) == 6 and len(set(seeds)) == 6  # three trainings a candidate, each with its own seed
    first = rows(run)[0]
    assert seeds[0] == candidate_seed(3, first["arch"])  # the first: the seed of a single training
    # the row holds the mean of the three trainings
    monkeypatch.setattr(train, "evaluate", real)
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.spaces.loader import load_space

    space, data = load_space(SMALL_SPACE), load_dataset("digits", 3)
    arch = json.loads(first["arch"])
    settings = train.TrainSettings(epochs=1, threads=1)  # as the search trains on 8x8 digits
    runs = [real(space, arch, data, settings, seed=s) for s in seeds[:3]]
    assert float(first["accuracy"]) == pytest.approx(sum(r.accuracy for r in runs) / 3, abs=1e-3)  # 6 digits kept
    assert float(first["exit_acc_final"]) == pytest.approx(sum(r.exit_accuracies[-1] for r in runs) / 3, abs=1e-3)
    assert yaml.safe_load((run / "config.yaml").read_text())["repeats"] == 3
    bad = search("--repeats", "0", "--run-dir", str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "repeats" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    table = tmp_path / "acc.csv"
    table.write_text("arch,acc\n")
    bad = search("--repeats", "2", "--accuracy", f"table:{table}:acc", "--run-dir", str(tmp_path / "bad2"))
    assert bad.exit_code == 2 and "repeated trainings need accuracy 'proxy'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_small_inputs_train_on_one_thread_unless_told_otherwise(monkeypatch):
    from nasctl.config import make_config
    from nasctl.engine import Evaluator, train_threads

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert Evaluator(make_config(train_device="cpu")).settings.threads == 1  # digits: 8x8 pixels
    assert Evaluator(make_config(train_device="cpu", threads=3)).settings.threads == 3
    assert train_threads(make_config(), (3, 32, 32)) is None                # torch's default: one per core
    assert train_threads(make_config(workers=4), (3, 32, 32)) == 2          # the cores shared among workers
    assert train_threads(make_config(workers=4, threads=1), (3, 32, 32)) == 1
    assert yaml.safe_load(search("--threads", "2", "--print-config").stdout)["threads"] == 2


def test_print_config_checks_the_space_and_device_files(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("kind: mbv2\nname: bad\n")
    result = search("--space", str(space), "--print-config")
    assert result.exit_code == 2 and f"{space}: stem: Field required" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = search("--device", "nope", "--print-config")
    assert result.exit_code == 2 and "unknown device 'nope'" in result.stderr


def test_resume_of_a_run_whose_study_db_is_damaged_says_how_to_go_on(tmp_path):
    run = tmp_path / "run"
    assert search("--budget", "1", *FAST, "--run-dir", str(run)).exit_code == 0
    db = run / "study.db"
    db.write_bytes(b"not a database " * 200)
    for journal in run.glob("study.db-*"):  # its write-ahead log, which would restore it
        journal.unlink()
    import subprocess
    import sys

    # a fresh interpreter: this one keeps the study's database open from the search above
    result = subprocess.run([sys.executable, "-m", "nasctl", "search", "--resume", str(run), "--budget", "2"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "study.db is damaged" in result.stderr and "move it aside and --resume rebuilds" in result.stderr
    db.rename(run / "study.db.bad")  # as the message says: the finished trial is kept, one more is added
    assert search("--resume", str(run), "--budget", "2").exit_code == 0 and len(rows(run)) == 2


def test_a_network_scored_already_is_not_trained_again_for_knobs_without_effect(tmp_path, monkeypatch):
    from nasctl.config import make_config
    from nasctl.engine import Evaluator
    from nasctl.evaluation import train

    trained = []
    real = train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda space, arch, *a, **k: trained.append(arch) or real(space, arch, *a, **k))
    evaluator = Evaluator(make_config(space=SMALL_SPACE, epochs=1, train_device="cpu", keep_weights="none"))
    off = {"s1_depth": 1, "s1_channels": 8, "s1_expand": 1, "s1_kernel": 3, "s2_depth": 1, "s2_channels": 16,
           "s2_expand": 3, "s2_kernel": 3, "exit_s1": 0, "exit_s1_width": 8, "exit_tolerance": 0.5,
           "backbone_bits": 32, "exit_bits": 32}
    # the exit is off: its width, bit width and tolerance change nothing
    same = {**off, "exit_s1_width": 16, "exit_tolerance": 2.0, "exit_bits": 4}
    first, second = evaluator(off), evaluator(same)
    assert len(trained) == 1
    assert second["arch"] != first["arch"] and second["train_s"] < first["train_s"]
    for column in ("accuracy", "exit_rate_final", "exit_acc_final", "latency_ms", "energy_mj", "macs"):
        assert second[column] == first[column], column
    # with the exit on, its width and bits matter: a network of its own
    on = evaluator({**off, "exit_s1": 1})
    assert len(trained) == 2 and on["macs"] > first["macs"]
    # a run that keeps every trained network trains each candidate it keeps
    keeping = Evaluator(make_config(space=SMALL_SPACE, epochs=1, train_device="cpu", keep_weights="all"))
    keeping.keep_in = tmp_path
    keeping(off), keeping(same)
    assert len(trained) == 4 and len(list((tmp_path / "models").iterdir())) == 2
