"""Saved supernets: `supernets/NAME/` in the workspace.

    weights.pt       the full network's torch `state_dict` (loads with weights_only=True)
    weights-M.pt     the same of member M (M = 1, 2, ...) of a supernet trained with
                     `--members K`: K supernets of one space and data, initialised and
                     sampled from seeds of their own; a candidate's figures are the means
                     of its figures on each (`nasctl.supernet.score.score_members`)
    card.yaml        what it holds and how it was made: the space's name, file and a hash
                     of its spec (a supernet fits only the space it was trained for), the
                     dataset and its split seed, input shape and classes, the training
                     settings and seed, the number of members, epochs done, wall time,
                     package versions and the SHA-256 of each weights file
    member-M.pending.pt
                     while training: member M's weights once it is done, moved to its
                     weights file when every member is
    checkpoint.pt    while training: the weights and AdamW moments after the last finished
    checkpoint.json  epoch (tensors only) of the member in training, and that member and
                     epoch with the settings, so that `nasctl supernet train --resume`
                     continues it; removed once done
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import workspace
from ..errors import ConfigError, UsageError

FOLDER = "supernets"
CARD = "card.yaml"
WEIGHTS = "weights.pt"
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_META = "checkpoint.json"
FORMAT = 2  # 2: a supernet with members (`--members`); one without is written as format 1


def spec_hash(space) -> str:
    """SHA-256 (16 hex digits) of a space's spec, its description left out: a supernet
    holds the weights of this exact space."""
    from .elastic import base_space

    spec = base_space(space).spec.model_dump(exclude={"description"})
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def saved() -> list:
    """Every saved supernet (a folder with a card) as workspace entries (name, path, origin),
    first workspace root winning."""
    return workspace.card_folders(FOLDER, CARD)


def find(name: str) -> Path:
    return workspace.find_card_folder(FOLDER, CARD, name, "supernet",
                                      none="none (train one with `nasctl supernet train`)")


def read_card(folder: Path) -> dict:
    from ..specs import read_yaml

    card = read_yaml(Path(folder) / CARD)
    if not isinstance(card, dict) or not isinstance(card.get("format"), int):
        raise ConfigError(f"{Path(folder) / CARD}: format: missing or not a whole number")
    if card["format"] > FORMAT:
        raise ConfigError(f"{Path(folder) / CARD}: format {card['format']} was written by a newer nasctl; "
                          f"this one reads format {FORMAT} and older (upgrade nasctl)")
    for key in ("space", "space_hash", "input_shape", "classes", "dataset", "files"):
        if key not in card:
            raise ConfigError(f"{Path(folder) / CARD}: {key}: missing")
    shape, classes, dataset = card["input_shape"], card["classes"], card["dataset"]
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        raise ConfigError(f"{Path(folder) / CARD}: input_shape: {shape!r} is not three positive whole numbers "
                          "(channels, height, width)")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        raise ConfigError(f"{Path(folder) / CARD}: classes: {classes!r} is not a whole number of at least 2")
    if not isinstance(dataset, dict):
        raise ConfigError(f"{Path(folder) / CARD}: dataset: {dataset!r} is not a mapping (name, split_seed, ...)")
    k = card.get("members", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{Path(folder) / CARD}: members: {k!r} is not a whole number of at least 1")
    files = card["files"]
    for file in (weights_file(m) for m in range(k)):
        if not isinstance(files, dict) or not isinstance(files.get(file), str):
            raise ConfigError(f"{Path(folder) / CARD}: files: no SHA-256 of {file} (the card has {k} "
                              f"member{'s' * (k > 1)})")
    return card


def check_fits(card: dict, name: str, space) -> None:
    """One line where the supernet was trained for another space or another version of it."""
    from .elastic import base_space

    base_space(space)  # a space of a kind supernets do not cover: say so, not "train one for it"
    if card["space"] != space.name:
        raise UsageError(f"supernet '{name}' was trained for space '{card['space']}', not '{space.name}'; "
                         f"train one for it with `nasctl supernet train --space {space.name}`")
    if card["space_hash"] != spec_hash(space):
        raise UsageError(f"supernet '{name}' was trained for another version of space '{space.name}' "
                         "(its spec has changed since); train it again")


def data_hash(data) -> str:
    """SHA-256 (16 hex digits) of a dataset's training split: what a supernet learnt from."""
    import numpy as np

    h = hashlib.sha256(np.ascontiguousarray(data.x_train).tobytes())
    h.update(np.ascontiguousarray(data.y_train).tobytes())
    return h.hexdigest()[:16]


def weights_file(member: int) -> str:
    """The weights file of member `member` (0: the supernet itself)."""
    return WEIGHTS if member == 0 else f"weights-{member}.pt"


def members(card: dict) -> int:
    """How many supernets a card's folder holds (cards before `--members`: one)."""
    return int(card.get("members", 1))


def load(name: str, space, dataset=None, split_seed: int | None = None):
    """The supernet `name` (a workspace name or a folder), checked against `space` and,
    where given, the dataset split by `split_seed` (its training split must be the
    supernet's own: else it has seen the validation or test inputs); (Supernet in eval
    mode, card).  Of a supernet with members, the first (`load_members`: all)."""
    nets, card = load_members(name, space, dataset, split_seed, first_only=True)
    return nets[0], card


def load_members(name: str, space, dataset=None, split_seed: int | None = None, first_only: bool = False):
    """As `load`: ([every member's Supernet, in eval mode], card)."""
    from ..evaluation import kept
    from .elastic import Supernet

    folder = find(name)
    card = read_card(folder)
    check_fits(card, name, space)
    if dataset is not None:
        want = card["dataset"]
        if split_seed is not None and want.get("split_seed") != split_seed:
            raise UsageError(f"supernet '{name}' was trained on {want.get('name')} split by seed "
                             f"{want.get('split_seed')}; this search splits it by --seed {split_seed}, so the "
                             f"supernet has seen its test inputs: search with --seed {want.get('split_seed')}, "
                             f"or train a supernet with --seed {split_seed}")
        if want.get("train_sha256") != data_hash(dataset):
            raise UsageError(f"supernet '{name}' was trained on other data ('{want.get('name')}', split by seed "
                             f"{want.get('split_seed')}) than dataset '{dataset.name}'; train one on it")
    nets = []
    for m in range(1 if first_only else members(card)):
        file = weights_file(m)
        state = kept.load_weights(folder / file, card["files"].get(file))
        net = Supernet(space, tuple(card["input_shape"]), int(card["classes"]))
        try:
            net.full.load_state_dict(state)
        except RuntimeError as e:
            raise UsageError(f"{folder / file} does not hold this space's supernet: "
                             f"{' '.join(str(e).split())[:200]}") from None
        nets.append(net.eval())
    return nets, card


def pending_file(member: int) -> str:
    """Where member `member`'s weights wait while later members train."""
    return f"member-{member}.pending.pt"


def remove_pending(folder: Path) -> None:
    """Members' weights left pending by a training that will not be resumed."""
    for stale in Path(folder).glob("member-*.pending.pt"):
        stale.unlink()


def save_weights(folder: Path, net, member: int = 0) -> None:
    """Member `member`'s weights, pending until `save_card` (a supernet being replaced
    stays whole until the new one is done)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    file = pending_file(member)
    tmp = folder / (file + ".tmp")
    torch.save({k: v.detach().cpu().contiguous() for k, v in net.full.state_dict().items()}, tmp)
    os.replace(tmp, folder / file)


def save_card(folder: Path, card: dict) -> Path:
    """Every member's pending weights moved to its weights file (weights.pt, weights-1.pt,
    ...), the weights files of members the card does not have removed, then card.yaml with
    the SHA-256 of each weights file, written last: a folder without one is no supernet."""
    import yaml

    from ..evaluation import kept

    files = [weights_file(m) for m in range(members(card))]
    (folder / CARD).unlink(missing_ok=True)  # the supernet replaced, whose weights change now
    for m, file in enumerate(files):
        os.replace(folder / pending_file(m), folder / file)
    for stale in folder.glob("weights-*.pt"):
        if stale.name not in files:
            stale.unlink()
    remove_pending(folder)
    doc = {"format": 1 if len(files) == 1 else 2, **card, "files": {f: kept.sha256(folder / f) for f in files}}
    (folder / (CARD + ".tmp")).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    os.replace(folder / (CARD + ".tmp"), folder / CARD)
    return folder


def save_checkpoint(folder: Path, net, opt, epoch: int, meta: dict) -> None:
    """The weights and AdamW state after `epoch` epochs, as tensors only."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in net.full.state_dict().items()}
    names = {id(p): n for n, p in net.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                tensors[f"opt.{names[id(p)]}.{k}"] = v.detach().cpu().contiguous()
    torch.save(tensors, folder / (CHECKPOINT + ".tmp"))
    os.replace(folder / (CHECKPOINT + ".tmp"), folder / CHECKPOINT)
    (folder / CHECKPOINT_META).write_text(json.dumps({"epoch": epoch, **meta}, indent=1), encoding="utf-8")


def checkpoint_meta(folder: Path) -> dict:
    """What a folder's checkpoint records: its epoch, settings, seed, space and data; a
    one-line error where the file is not such a record."""
    path = Path(folder) / CHECKPOINT_META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path} is not a readable checkpoint record ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:120]}); --force a new training") from None
    epoch = meta.get("epoch") if isinstance(meta, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise UsageError(f"{path} is not a checkpoint record: "
                         + ("not a JSON object" if not isinstance(meta, dict) else f"epoch: {epoch!r}")
                         + "; --force a new training")
    return meta


def load_checkpoint(folder: Path, net) -> tuple[int, dict, dict]:
    """(epochs done, the optimizer state to load, the checkpoint's meta) from a folder's
    checkpoint into `net`."""
    from ..evaluation import kept

    meta = checkpoint_meta(folder)
    tensors = kept.load_weights(folder / CHECKPOINT)
    try:
        net.full.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    except RuntimeError as e:
        raise UsageError(f"{folder / CHECKPOINT} does not hold this space's supernet "
                         f"({' '.join(str(e).split())[:160]}); --force a new training") from None
    params = [n for n, _ in net.named_parameters()]
    state = {}
    for i, n in enumerate(params):
        entry = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"opt.{n}.")
                 and k.count(".") == n.count(".") + 2}
        if entry:
            state[i] = entry
    return int(meta["epoch"]), state, meta


def remove_checkpoint(folder: Path) -> None:
    for f in (CHECKPOINT, CHECKPOINT_META):
        (folder / f).unlink(missing_ok=True)
