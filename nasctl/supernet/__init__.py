"""Weight-sharing supernets: train one network holding every architecture of a space
(`nasctl supernet train`), then measure candidates with the weights they inherit
(`nasctl search --accuracy supernet:NAME`).  torch is imported only where used."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from ..errors import UsageError


def member_seed(seed: int, member: int) -> int:
    """The seed of member `member`'s initial weights and sampling (the first: `seed`)."""
    import numpy as np

    if member == 0:
        return seed
    return int(np.random.SeedSequence([seed, member]).generate_state(1, dtype=np.uint64)[0] & (2**63 - 1))


def train_and_save(space_name: str, dataset_spec: str, name: str, settings, seed: int, *,
                   members: Optional[int] = None,
                   resume: bool = False, force: bool = False,
                   on_start: Optional[Callable[[int, int], None]] = None,
                   on_epoch: Optional[Callable[[int, float], None]] = None) -> tuple[Path, dict]:
    """Train a supernet of space `space_name` on `dataset_spec` (split by `seed`) and save
    it as `supernets/NAME/` in the workspace, a checkpoint after every epoch; with
    `resume`, continue from the folder's checkpoint.  With `members` K > 1, K supernets
    one after the other, each initialised and sampled from its own seed (`member_seed`),
    all on the same split (None: 1, or a resumed training's own); `on_start(total, done)`
    and `on_epoch(done, loss)` count the epochs of all of them.  A finished member's
    weights wait under a name of their own (`store.pending_file`) until every member is
    done, so the supernet a `force`d training replaces stays whole until then.  (The
    folder, its card.)"""
    import torch

    from .. import workspace
    from ..evaluation import kept
    from ..evaluation.datasets import load_dataset
    from ..spaces.loader import load_space
    from . import store
    from .elastic import Supernet, base_space, default_epochs
    from .train import train_supernet

    folder = workspace.new_entry(store.FOLDER, name, "supernet")
    space_file = Path(workspace.find("search_spaces", space_name, "search space"))
    space = load_space(space_file)
    base_space(space)  # a kind supernets cover
    has_checkpoint = (folder / store.CHECKPOINT_META).is_file()
    if settings.epochs is None:  # a resumed training's own, else the space kind's default
        planned = store.checkpoint_meta(folder).get("settings", {}).get("epochs") if resume and has_checkpoint else None
        settings = replace(settings, epochs=planned or default_epochs(space))
    if members is None:  # a resumed training's own, else one
        members = int(store.checkpoint_meta(folder).get("members", 1)) if resume and has_checkpoint else 1
    if resume and not has_checkpoint:
        raise UsageError(f"supernet '{name}' has no checkpoint to resume in {folder}"
                         + ("" if not (folder / store.CARD).is_file() else " (its training finished)"))
    if not resume and not force and ((folder / store.CARD).is_file() or has_checkpoint):
        raise UsageError(f"supernet '{name}' exists in {folder}; give another --name, --resume an unfinished "
                         "training, or --force to replace it")
    data = load_dataset(dataset_spec, seed)
    space.check_fits(data.input_shape, data.classes, min(settings.batch_size, len(data.y_train)))
    card = {"name": name, "space": space.name, "space_hash": store.spec_hash(space),
            "space_file": str(space_file), "space_sha256": kept.sha256(space_file),
            "dataset": {"name": dataset_spec, "split_seed": seed, "train": len(data.y_train),
                        "train_sha256": store.data_hash(data)},
            "input_shape": list(data.input_shape), "classes": data.classes,
            "normalisation": data.normalisation, "seed": seed, "members": members, "settings": settings.as_dict()}
    kept_keys = ("space_hash", "seed", "dataset", "members", "settings")  # checked in this order on --resume
    member, spent = 0, 0.0
    if resume:
        meta = store.checkpoint_meta(folder)
        for key in kept_keys:
            mine = meta.get(key, 1) if key == "members" else meta.get(key)  # checkpoints before --members
            if mine != card[key] and not (key == "settings" and _same_but_epochs(mine, card[key])):
                raise UsageError(f"supernet '{name}': --resume with another {_difference(key, mine, card[key])}; "
                                 "continue with the same settings, or --force a new one")
        member, spent = int(meta.get("member", 0)), float(meta.get("train_seconds", 0.0))
        if settings.epochs < meta["epoch"]:
            raise UsageError(f"supernet '{name}': --resume with --epochs {settings.epochs}, but member {member} has "
                             f"trained {meta['epoch']} epochs already; allowed: --epochs {meta['epoch']} or more")
        planned = meta["settings"].get("epochs")
        if member > 0 and planned != settings.epochs:
            raise UsageError(f"supernet '{name}': --resume with --epochs {settings.epochs}, but its members before "
                             f"member {member} trained {planned} epochs; resume with --epochs {planned}, or --force "
                             "a new one")
        for m in range(member):
            if not (folder / store.pending_file(m)).is_file():
                raise UsageError(f"supernet '{name}': member {m}'s {store.pending_file(m)} is missing from "
                                 f"{folder}; --force a new training")
    else:
        store.remove_pending(folder)  # of a training replaced before it finished
    if on_start:
        on_start(settings.epochs * members, settings.epochs * member + (store.checkpoint_meta(folder)["epoch"]
                                                                         if resume else 0))
    t0 = time.perf_counter()
    for m in range(member, members):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(member_seed(seed, m))
            net = Supernet(space, data.input_shape, data.classes)
        if resume and m == member:
            start, opt_state, _ = store.load_checkpoint(folder, net)
        else:
            start, opt_state = 0, None

        def epoch_done(done: int, loss: float, opt, m=m, net=net) -> None:
            store.save_checkpoint(folder, net, opt, done, {**{k: card[k] for k in kept_keys}, "member": m,
                                                           "train_seconds": spent + time.perf_counter() - t0})
            if on_epoch:
                on_epoch(settings.epochs * m + done, loss)

        train_supernet(net, data, settings, member_seed(seed, m), start_epoch=start, optimizer_state=opt_state,
                       on_epoch=epoch_done)
        store.save_weights(folder, net, m)
    card["epochs_done"] = settings.epochs
    card["train_seconds"] = round(spent + time.perf_counter() - t0, 3)
    card["versions"] = _versions()
    store.save_card(folder, card)
    store.remove_checkpoint(folder)
    return folder, store.read_card(folder)


def _difference(key: str, checkpoint, given) -> str:
    """What a resumed training changes, for the error: "lr 0.01 than its checkpoint's (0.005)",
    settings and dataset field by field."""
    if isinstance(checkpoint, dict) and isinstance(given, dict):
        fields = [k for k in {**checkpoint, **given} if checkpoint.get(k) != given.get(k) and k != "epochs"]
        if fields:
            return ", ".join(f"{'' if key == 'settings' else key + ' '}{k} {given.get(k)!r}" for k in fields) + \
                   " than its checkpoint's (" + ", ".join(f"{checkpoint.get(k)!r}" for k in fields) + ")"
    return f"{key} {given!r} than its checkpoint's ({checkpoint!r})"


def _same_but_epochs(a: dict, b: dict) -> bool:
    """Settings equal but for the epoch count (a resumed training may be given more epochs)."""
    return {k: v for k, v in (a or {}).items() if k != "epochs"} == {k: v for k, v in b.items() if k != "epochs"}


def _versions() -> dict:
    from ..deploy.export import _versions as versions

    return versions()
