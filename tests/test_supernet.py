"""Weight-sharing supernets of mbv2 and vit spaces: sub-networks inherit exactly, a saved
supernet scores the same in a fresh interpreter, one for another (or a changed) space is
refused, and a search and an export run on inherited weights."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.cli.cli_helpers import SMALL_VIT, invoke, one_line_error

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "name": "tiny", "kind": "mbv2",
    "stem": {"channels": 8, "kernel": 3, "stride": 1},
    "stages": [{"depth": [1, 2], "channels": [8, 12], "expand": [1, 2], "kernel": [3, 5], "stride": 1},
               {"depth": [1, 2], "channels": [12, 16], "expand": [2, 3], "kernel": [3, 5], "stride": 2}],
    "head": {"channels": 16},
    "exits": {"after_stages": [1], "width": [8, 16], "tolerance": [0.5, 2]},
    "quantization": {"backbone_bits": [32, 8, 4], "exit_bits": [32, 8, 4]},
}
TINY_VIT = yaml.safe_load(Path(SMALL_VIT).read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as searches on small inputs use (two threads beside other busy
    processes slow these tiny convolutions down tenfold)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _workspace(folder: Path, spec: dict = TINY) -> Path:
    (folder / "search_spaces").mkdir(parents=True, exist_ok=True)
    (folder / "search_spaces" / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    return folder


def _small_digits(path: Path) -> Path:
    """A small .npz of the digits (240 training, 150 test images): quick to train on."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(d.target))
    x = (d.images * 16).astype(np.uint8)
    np.savez(path, x_train=x[idx[:240]], y_train=d.target[idx[:240]],
             x_test=x[idx[240:390]], y_test=d.target[idx[240:390]])
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workspace with the tiny space and a supernet 'sn' of it trained for 2 epochs."""
    ws = _workspace(tmp_path_factory.mktemp("ws"))
    data = _small_digits(ws / "digits.npz")
    res = invoke("--workspace", ws, "supernet", "train", "--space", "tiny", "--dataset", data, "--epochs", 2,
                 "--name", "sn", "--warmup-epochs", 1, "--json")
    assert res.exit_code == 0, res.output
    return ws, data, json.loads(res.stdout)


def _space(spec: dict = TINY):
    from nasctl.spaces.mbv2 import Mbv2Space
    from nasctl.spaces.vit import VitSpace

    return {"mbv2": Mbv2Space, "vit": VitSpace}[spec["kind"]].from_dict(spec)


def _archs(space, n=6):
    """The smallest and largest, and sampled ones covering 4, 8 and 32 bits, exits on and
    off, an mbv2 block expanded 1x, a vit with and without its stem at both patch sizes."""
    from nasctl.supernet.elastic import Supernet

    net = Supernet(space, (1, 8, 8), 10)
    rng = np.random.default_rng(1)
    out = [net.smallest(), net.largest()]
    flag = f"exit_{space.exit_names()[0]}"
    for i in range(n):
        arch = space.sample(rng)
        arch["backbone_bits"], arch["exit_bits"] = [4, 8, 32][i % 3], [32, 4, 8][i % 3]
        arch[flag] = i % 2
        if "s1_expand" in arch:
            arch["s1_expand"] = 1 if i % 4 == 0 else arch["s1_expand"]
        if "patch" in arch:
            arch["patch"], arch["conv_stem"] = [2, 4][i % 2], (i // 2) % 2
        out.append(arch)
    return out


@pytest.mark.parametrize("spec", [TINY, TINY_VIT], ids=["mbv2", "vit"])
def test_an_extracted_subnet_computes_exactly_what_the_supernet_computes_for_it(spec):
    import torch

    from nasctl.supernet.elastic import Supernet

    space = _space(spec)
    torch.manual_seed(0)
    net = Supernet(space, (1, 8, 8), 10)
    x = torch.rand(32, 1, 8, 8)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    net.train()
    for _ in range(6):  # weights, batch-norm statistics and activation ranges away from their initial values
        opt.zero_grad()
        sum(o.square().mean() for o in net(x, space.sample(rng))).backward()
        opt.step()
    archs = _archs(space)
    flag = f"exit_{space.exit_names()[0]}"
    assert {a["backbone_bits"] for a in archs} == {4, 8, 32} and {a[flag] for a in archs} == {0, 1}
    for mode in ("eval", "train"):
        for arch in archs:
            getattr(net, mode)()
            with torch.no_grad():
                # copies first: in training mode every forward moves the activation ranges and BN statistics
                own, scratch = net.extract(arch), net.network(arch).train(mode == "train")
                assert own.training == (mode == "train")
                shared, alone, scratch = net(x, arch), own(x), scratch(x)
            assert len(shared) == len(space.active_exits(arch))
            for a, b, c in zip(shared, alone, scratch):
                assert torch.equal(a, b) and torch.equal(a, c), (mode, arch)
    # the extracted module is the architecture's own network: its state_dict loads into the space's build
    arch = archs[3]
    plain = space.build(arch, (1, 8, 8), 10)
    plain.load_state_dict(net.extract(arch).state_dict())
    # and a larger sub-network's extra channels and blocks are not part of a smaller one
    small, large = net.tensors(net.smallest()), net.tensors(net.largest())
    assert sum(t.numel() for t in small.values()) < sum(t.numel() for t in large.values())


SCORE = """
import json, sys
import torch
from nasctl import workspace
from nasctl.evaluation.datasets import load_dataset
from nasctl.evaluation.train import TrainSettings
from nasctl.spaces.loader import load_space
from nasctl.supernet import store
from nasctl.supernet.score import calibration_inputs, score
workspace.set_workspace(__import__("pathlib").Path(sys.argv[1]))
space = load_space("tiny")
data = load_dataset(sys.argv[2], 0)
net, _ = store.load("sn", space, data)
cal = calibration_inputs(data, 0)
out = []
for arch in json.loads(sys.argv[3]):
    r, _ = score(net, arch, data, TrainSettings(threads=1), cal)
    out.append([r.accuracy, r.exit_rates, r.exit_accuracies, r.thresholds])
print(json.dumps(out))
"""


def test_a_saved_supernet_reloads_in_a_fresh_interpreter_and_scores_identically(trained, tmp_path):
    ws, data, card = trained
    assert card["space"] == "tiny" and card["epochs_done"] == 2 and (ws / "supernets" / "sn" / "weights.pt").is_file()
    assert not (ws / "supernets" / "sn" / "checkpoint.pt").exists()
    archs = _archs(_space(), 4)
    runs = [subprocess.run([sys.executable, "-c", SCORE, str(ws), str(data), json.dumps(archs)], cwd=ROOT,
                           capture_output=True, text=True)]
    assert runs[0].returncode == 0, runs[0].stderr[-2000:]
    first = json.loads(runs[0].stdout)
    assert all(abs(sum(rates) - 1) < 1e-9 and 0 <= acc <= 100 for acc, rates, _, _ in first)
    # and here, in this process, after the supernet scored other architectures
    from nasctl import workspace
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings
    from nasctl.supernet import store
    from nasctl.supernet.score import calibration_inputs, score

    workspace.set_workspace(ws)
    d = load_dataset(str(data), 0)
    net, _ = store.load("sn", _space(), d)
    cal = calibration_inputs(d, 0)
    here = []
    for arch in reversed(_archs(_space(), 6)):
        r, _ = score(net, arch, d, TrainSettings(threads=1), cal)
        here.append([r.accuracy, r.exit_rates, r.exit_accuracies, r.thresholds])
    assert here[::-1][:len(first)] == first


def test_a_resumed_training_ends_with_the_weights_of_an_uninterrupted_one(trained):
    import torch

    from nasctl import workspace
    from nasctl.supernet import train_and_save
    from nasctl.supernet.train import SupernetSettings

    ws, data, _ = trained
    workspace.set_workspace(ws)

    def stop(done, loss):
        raise KeyboardInterrupt  # Ctrl-C after the first of two epochs

    with pytest.raises(KeyboardInterrupt):
        train_and_save("tiny", str(data), "half", SupernetSettings(epochs=2, warmup_epochs=1), 0, on_epoch=stop)
    folder = ws / "supernets" / "half"
    assert (folder / "checkpoint.pt").is_file() and not (folder / "card.yaml").exists()
    train = ("--workspace", ws, "supernet", "train", "--space", "tiny", "--dataset", data, "--name", "half")
    one_line_error(invoke(*train), 2, "exists")
    one_line_error(invoke(*train, "--resume", "--lr", 0.1), 2, "another lr 0.1, warmup_epochs 2 than its checkpoint's (0.005, 1)")
    one_line_error(invoke(*train, "--resume", "--seed", 3), 2, "another seed 3 than its checkpoint's (0)")
    res = invoke(*train, "--warmup-epochs", 1, "--resume")  # its own 2 epochs, not the space kind's 10
    assert res.exit_code == 0, res.output
    a = torch.load(folder / "weights.pt", weights_only=True)
    b = torch.load(ws / "supernets" / "sn" / "weights.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (folder / "checkpoint.pt").exists()
    one_line_error(invoke(*train, "--resume"), 2, "no checkpoint")


def test_broken_cards_checkpoints_and_out_of_range_settings_are_refused_in_one_line(trained, tmp_path):
    ws, data, _ = trained
    ws = Path(shutil.copytree(ws, tmp_path / "ws"))
    good = yaml.safe_load((ws / "supernets" / "sn" / "card.yaml").read_text(encoding="utf-8"))
    for name, change, text in [("b1", {"input_shape": "abc"}, "input_shape: 'abc'"),
                               ("b2", {"input_shape": None}, "input_shape: None"),
                               ("b3", {"classes": "ten"}, "classes: 'ten'"),
                               ("b4", {"classes": -1}, "classes: -1"),
                               ("b5", {"dataset": "digits"}, "dataset: 'digits' is not a mapping")]:
        shutil.copytree(ws / "supernets" / "sn", ws / "supernets" / name)
        (ws / "supernets" / name / "card.yaml").write_text(yaml.safe_dump({**good, **change}), encoding="utf-8")
        one_line_error(invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data,
                              "--accuracy", f"supernet:{name}", "--budget", 2), 2, text)
    res = invoke("--workspace", ws, "supernet", "list", "--json")  # the good one listed, the broken ones named
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["sn"]["space"] == "tiny" and rows["b5"]["space"] == "(unreadable)"
    assert "supernet 'b5' is unreadable" in res.stderr
    train = ("--workspace", ws, "supernet", "train", "--space", "tiny", "--dataset", data, "--epochs", 1)
    for bad, text in [(("--seed", 2**32), "--seed"), (("--lr", "inf"), "--lr"), (("--name", "has space"), "plain name"),
                      (("--name", "a:b"), "plain name"), (("--name", ""), "--name: the value '' is empty")]:
        one_line_error(invoke(*train, *bad), 2, text)
    # an unfinished training: its checkpoint record or weights broken, or --epochs below what it has done
    from nasctl import workspace
    from nasctl.supernet import train_and_save
    from nasctl.supernet.train import SupernetSettings

    workspace.set_workspace(ws)

    def stop(done, loss):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_and_save("tiny", str(data), "cut", SupernetSettings(epochs=3, warmup_epochs=1), 0, on_epoch=stop)
    folder = ws / "supernets" / "cut"
    resume = ("--workspace", ws, "supernet", "train", "--space", "tiny", "--dataset", data, "--name", "cut",
              "--warmup-epochs", 1, "--resume")
    one_line_error(invoke(*resume, "--epochs", 1), 2, "trained 2 epochs already; allowed: --epochs 2 or more")
    meta = (folder / "checkpoint.json").read_text(encoding="utf-8")
    for broken, text in [('{"epoch": ', "not a readable checkpoint record"), ("[]", "not a checkpoint record")]:
        (folder / "checkpoint.json").write_text(broken, encoding="utf-8")
        one_line_error(invoke(*resume), 2, text)
    (folder / "checkpoint.json").write_text(meta, encoding="utf-8")
    weights = (folder / "checkpoint.pt").read_bytes()
    (folder / "checkpoint.pt").write_bytes(weights[:1000])
    one_line_error(invoke(*resume), 2, "checkpoint.pt is not a readable torch state_dict")
    (folder / "checkpoint.pt").write_bytes(weights)
    res = invoke(*resume)
    assert res.exit_code == 0, res.output


def test_a_supernet_for_another_space_or_a_changed_space_is_refused_in_one_line(trained, tmp_path):
    ws, data, _ = trained
    one_line_error(invoke("--workspace", ws, "search", "--space", "ee-mbv2", "--dataset", data,
                          "--accuracy", "supernet:sn", "--budget", 2), 2, "trained for space 'tiny', not 'ee-mbv2'")
    one_line_error(invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data,
                          "--accuracy", "supernet:nope", "--budget", 2), 2, "unknown supernet 'nope'; known: ")
    one_line_error(invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data, "--seed", 1,
                          "--accuracy", "supernet:sn", "--budget", 2), 2, "split by seed 0")
    one_line_error(invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data,
                          "--finetune-epochs", 1, "--budget", 2), 2, "needs accuracy supernet:NAME")
    changed = tmp_path / "changed"
    shutil.copytree(ws, changed)
    _workspace(changed, {**TINY, "head": {"channels": 24}})  # same knobs, other weights
    one_line_error(invoke("--workspace", changed, "search", "--space", "tiny", "--dataset", data,
                          "--accuracy", "supernet:sn", "--budget", 2), 2, "another version of space 'tiny'")
    one_line_error(invoke("--workspace", ws, "supernet", "train", "--space", "nb201", "--epochs", 1),
                   2, "allowed: mbv2, vit")


def test_a_search_scores_candidates_on_inherited_weights_and_exports_them(trained, tmp_path):
    import torch

    ws, data, _ = trained
    run_dir = tmp_path / "run"
    res = invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data, "--accuracy", "supernet:sn",
                 "--strategy", "random", "--budget", 6, "--run-dir", run_dir, "--json")
    assert res.exit_code == 0, res.output
    from nasctl.runs import load as load_run

    rows = load_run(str(run_dir)).trials
    assert len(rows) == 6
    for row in rows:
        assert abs(row["exit_rate_s1"] + row["exit_rate_final"] - 1) < 1e-6 and row["exit_acc_final"] is not None
    with_exit = [r for r in rows if json.loads(r["arch"])["exit_s1"]]
    # each trial's figures are the supernet's score of its architecture
    from nasctl import workspace
    from nasctl.evaluation import kept
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings, measure
    from nasctl.supernet import store
    from nasctl.supernet.score import calibration_inputs, score

    workspace.set_workspace(ws)
    d = load_dataset(str(data), 0)
    net, _ = store.load("sn", _space(), d)
    for row in rows:
        arch = json.loads(row["arch"])
        r, _ = score(net, arch, d, TrainSettings(threads=1), calibration_inputs(d, 0))
        assert r.accuracy == pytest.approx(row["accuracy"], abs=1e-3)
        # the kept model is the inherited, recalibrated network: it loads into build_mbv2 and measures the same
        meta = kept.read_meta(kept.folder_of(run_dir, row["arch"] if isinstance(row["arch"], str) else json.dumps(arch)))
        plain = _space().build(arch, (1, 8, 8), 10)
        plain.load_state_dict(torch.load(kept.folder_of(run_dir, json.dumps(arch, separators=(",", ":")))
                                         / "model.pt", weights_only=True))
        again = measure(plain.eval(), _space(), arch, d, TrainSettings(threads=1))
        assert again.accuracy == r.accuracy and again.exit_rates == r.exit_rates
        assert meta["supernet"]["name"] == "sn"
    # --keep-weights front: only the final front's networks are kept, measured again at the end
    front_dir = tmp_path / "front"
    res = invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data, "--accuracy", "supernet:sn",
                 "--strategy", "random", "--budget", 5, "--run-dir", front_dir, "--keep-weights", "front", "--json")
    assert res.exit_code == 0, res.output
    front = json.loads(res.stdout)["front"]
    assert sorted(p.name for p in (front_dir / "models").iterdir()) == sorted(kept.digest(r["arch"]) for r in front)
    for r in front:
        assert kept.read_meta(kept.folder_of(front_dir, r["arch"]))["figures"]["accuracy"] == r["accuracy"]
    trial = (with_exit or rows)[0]["trial"]
    res = invoke("--workspace", ws, "export", run_dir, "--trial", trial, "--out", tmp_path / "exp", "--json")
    assert res.exit_code == 0, res.output
    card = yaml.safe_load((tmp_path / "exp" / "card.yaml").read_text())
    row = next(r for r in rows if r["trial"] == trial)
    assert card["figures"]["model"]["accuracy"] == pytest.approx(row["accuracy"], abs=1e-3)
    assert card["figures"]["model"]["weights"] == "inherited from supernet 'sn', batch norm recalibrated"
    assert (tmp_path / "exp" / "model.onnx").is_file()


def test_a_supernet_with_members_scores_candidates_by_the_mean_of_its_members(trained, tmp_path):
    """--members K: K supernets from seeds of their own on one split (the first is the
    supernet one member would be); a search records each candidate's mean figures and keeps
    the first member's network with its own; a training stopped in a later member resumes
    to the same weights; a card with a broken member count is refused in one line."""
    import torch

    from nasctl import workspace
    from nasctl.evaluation import kept
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings
    from nasctl.runs import load as load_run
    from nasctl.supernet import store, train_and_save
    from nasctl.supernet.score import calibration_inputs, score, score_members
    from nasctl.supernet.train import SupernetSettings

    ws, data, _ = trained
    train = ("--workspace", ws, "supernet", "train", "--space", "tiny", "--dataset", data, "--epochs", 2,
             "--warmup-epochs", 1)
    res = invoke(*train, "--name", "duo", "--members", 2, "--json")
    assert res.exit_code == 0, res.output
    card = json.loads(res.stdout)
    assert card["members"] == 2 and card["format"] == 2 and set(card["files"]) == {"weights.pt", "weights-1.pt"}
    folder = ws / "supernets" / "duo"
    first = torch.load(folder / "weights.pt", weights_only=True)
    other = torch.load(folder / "weights-1.pt", weights_only=True)
    single = torch.load(ws / "supernets" / "sn" / "weights.pt", weights_only=True)
    assert all(torch.equal(first[k], single[k]) for k in single)  # member 0 is the one-member supernet
    assert not all(torch.equal(first[k], other[k]) for k in first)
    listed = json.loads(invoke("--workspace", ws, "supernet", "list", "--json").stdout)
    members = {r["name"]: r["members"] for r in listed}
    assert members["sn"] == 1 and members["duo"] == 2

    run_dir = tmp_path / "run"
    res = invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data, "--accuracy", "supernet:duo",
                 "--strategy", "random", "--budget", 4, "--run-dir", run_dir, "--keep-weights", "all", "--json")
    assert res.exit_code == 0, res.output
    workspace.set_workspace(ws)
    d = load_dataset(str(data), 0)
    nets, _ = store.load_members("duo", _space(), d)
    cal = calibration_inputs(d, 0)
    for row in load_run(str(run_dir)).trials:
        arch = json.loads(row["arch"])
        each = [score(net, arch, d, TrainSettings(threads=1), cal)[0] for net in nets]
        assert row["accuracy"] == pytest.approx(np.mean([r.accuracy for r in each]), abs=1e-3)
        assert row["exit_rate_final"] == pytest.approx(np.mean([r.exit_rates[-1] for r in each]), abs=1e-6)
        meta = kept.read_meta(kept.folder_of(run_dir, row["arch"]))
        assert meta["figures"]["accuracy"] == pytest.approx(each[0].accuracy, abs=1e-9)
        assert meta["supernet"]["members"] == 2 and meta["supernet"]["member"] == 0
        mean, _, own = score_members(nets, arch, d, TrainSettings(threads=1), cal)
        assert own.accuracy == each[0].accuracy and mean.accuracy == pytest.approx(row["accuracy"], abs=1e-3)

    def stop_at(epoch):
        def stop(done, loss):
            if done == epoch:  # Ctrl-C after this epoch (counted over the members)
                raise KeyboardInterrupt
        return stop

    with pytest.raises(KeyboardInterrupt):  # after the first epoch of the second member
        train_and_save("tiny", str(data), "duo2", SupernetSettings(epochs=2, warmup_epochs=1), 0, members=2,
                       on_epoch=stop_at(3))
    half = ws / "supernets" / "duo2"
    assert (half / "member-0.pending.pt").is_file() and not (half / "card.yaml").exists()
    assert json.loads((half / "checkpoint.json").read_text())["member"] == 1
    one_line_error(invoke(*train, "--name", "duo2", "--members", 3, "--resume"), 2,
                   "another members 3 than its checkpoint's (2)")
    one_line_error(invoke(*train[:-4], "--epochs", 3, "--warmup-epochs", 1, "--name", "duo2", "--resume"), 2,
                   "--epochs 3, but its members before member 1 trained 2 epochs")
    res = invoke(*train, "--name", "duo2", "--resume")  # its own 2 members
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in half.iterdir()) == ["card.yaml", "weights-1.pt", "weights.pt"]
    for file in ("weights.pt", "weights-1.pt"):
        a, b = torch.load(half / file, weights_only=True), torch.load(folder / file, weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in b)

    # a --force training stopped midway leaves the supernet it replaces whole; once done, only its own files
    with pytest.raises(KeyboardInterrupt):
        train_and_save("tiny", str(data), "duo2", SupernetSettings(epochs=2, warmup_epochs=1), 1, members=2,
                       force=True, on_epoch=stop_at(3))
    assert (half / "member-0.pending.pt").is_file()
    nets, card = store.load_members("duo2", _space())
    assert card["members"] == 2 and all(torch.equal(nets[1].full.state_dict()[k], other[k]) for k in other)
    res = invoke(*train, "--name", "duo2", "--force", "--seed", 1)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in half.iterdir()) == ["card.yaml", "weights.pt"]

    broken = tmp_path / "broken"
    shutil.copytree(ws, broken)
    card_file = broken / "supernets" / "duo" / "card.yaml"
    doc = yaml.safe_load(card_file.read_text())
    card_file.write_text(yaml.safe_dump({**doc, "members": 0}))
    search = ("--workspace", broken, "search", "--space", "tiny", "--dataset", data, "--accuracy", "supernet:duo",
              "--budget", 2)
    one_line_error(invoke(*search), 2, "members: 0 is not a whole number")
    card_file.write_text(yaml.safe_dump({**doc, "files": {"weights.pt": doc["files"]["weights.pt"]}}))
    one_line_error(invoke(*search), 2, "files: no SHA-256 of weights-1.pt (the card has 2 members)")


def test_local_workers_find_the_supernet_in_the_workspace(trained, tmp_path):
    """--workers N with --workspace: every worker process resolves `supernet:NAME` where the
    first one did; a worker that stopped would be named in the run's notes."""
    ws, data, _ = trained
    res = invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data, "--accuracy", "supernet:sn",
                 "--strategy", "random", "--budget", 12, "--workers", 2, "--run-dir", tmp_path / "run", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["timings"]["trials"] >= 12 and doc["failed"] == 0
    assert not [n for n in doc["notes"] if "stopped early" in n], doc["notes"]


def test_a_vit_supernet_trains_scores_candidates_in_a_search_and_reloads_identically(tmp_path):
    """A vit space's supernet: trained by the CLI, a search scores candidates (with and
    without stem, both patch sizes) on inherited weights, the supernet reloaded from its
    folder scores each the same, it is refused for an mbv2 space, and a candidate exports
    with its inherited weights."""
    from nasctl import workspace
    from nasctl.evaluation.datasets import load_dataset
    from nasctl.evaluation.train import TrainSettings
    from nasctl.runs import load as load_run
    from nasctl.supernet import store
    from nasctl.supernet.score import calibration_inputs, score

    ws = _workspace(_workspace(tmp_path / "ws", TINY_VIT), TINY)
    data = _small_digits(ws / "digits.npz")
    res = invoke("--workspace", ws, "supernet", "train", "--space", "small-vit", "--dataset", data, "--epochs", 2,
                 "--name", "vsn", "--warmup-epochs", 1, "--json")
    assert res.exit_code == 0, res.output
    card = json.loads(res.stdout)
    assert card["space"] == "small-vit" and (ws / "supernets" / "vsn" / "weights.pt").is_file()
    run_dir = tmp_path / "run"
    res = invoke("--workspace", ws, "search", "--space", "small-vit", "--dataset", data, "--accuracy", "supernet:vsn",
                 "--strategy", "random", "--budget", 8, "--run-dir", run_dir, "--json")
    assert res.exit_code == 0, res.output
    rows = load_run(str(run_dir)).trials
    archs = [json.loads(r["arch"]) for r in rows]
    assert len(rows) == 8 and {a["patch"] for a in archs} == {2, 4} and {a["conv_stem"] for a in archs} == {0, 1}
    workspace.set_workspace(ws)
    d = load_dataset(str(data), 0)
    net, _ = store.load("vsn", _space(TINY_VIT), d)
    for row, arch in zip(rows, archs):
        assert abs(sum(row[f"exit_rate_{e}"] for e in ("g1", "final")) - 1) < 1e-6
        r, _ = score(net, arch, d, TrainSettings(threads=1), calibration_inputs(d, 0))
        assert r.accuracy == pytest.approx(row["accuracy"], abs=1e-3)
    one_line_error(invoke("--workspace", ws, "search", "--space", "tiny", "--dataset", data,
                          "--accuracy", "supernet:vsn", "--budget", 2), 2, "trained for space 'small-vit', not 'tiny'")
    # without --epochs, a supernet trains for its space kind's default: 60 epochs for a vit, 10 for mbv2
    from nasctl.supernet import train_and_save
    from nasctl.supernet.train import SupernetSettings

    told = {}

    def stop(total, done):
        told["total"] = total
        raise KeyboardInterrupt

    for space_name, epochs in (("small-vit", 60), ("tiny", 10)):
        with pytest.raises(KeyboardInterrupt):
            train_and_save(space_name, str(data), f"d-{space_name}", SupernetSettings(epochs=None), 0, on_start=stop)
        assert told["total"] == epochs
    # a candidate exports with the weights it inherited, and onnxruntime answers as it was scored
    row = max(rows, key=lambda r: r["accuracy"])
    res = invoke("--workspace", ws, "export", run_dir, "--trial", row["trial"], "--out", tmp_path / "exp", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["figures"]["model"]["weights"] == \
        "inherited from supernet 'vsn', batch norm recalibrated"
    res = invoke("eval", tmp_path / "exp", "--dataset", data, "--rounds", 2, "--json")
    assert res.exit_code == 0, res.output
    if json.loads(row["arch"])["attn_bits"] != 4:  # (4-bit attention: see test_export)
        assert abs(json.loads(res.stdout)["accuracy"] - row["accuracy"]) <= 1.0
