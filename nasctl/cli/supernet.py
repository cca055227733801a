"""`nasctl supernet train|list|show`: weight-sharing supernets."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..config import SEED_LIMIT
from .render import err, out, print_json, print_rows

app = typer.Typer(no_args_is_help=True,
                  help="Weight-sharing supernets: train one network holding every architecture of a space, "
                       "then search with --accuracy supernet:NAME.")


@app.command("train")
def train(
    space: Annotated[str, typer.Option(help="Search space (kind mbv2 or vit) name or YAML path.", show_default=False)],
    dataset: Annotated[str, typer.Option(help="'digits', a CIFAR-10 python-batches folder or an .npz file.")]
    = "digits",
    epochs: Annotated[Optional[int], typer.Option(
        min=1, help="Training epochs (each step trains the largest, the smallest and --random-subnets sampled "
                    "sub-networks). [default: 10 for an mbv2 space, 60 for a vit space; with --resume, the "
                    "training's own]", show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option(
        help="Name to save it under (supernets/NAME/ in the workspace). [default: the space's name]",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(min=0, max=SEED_LIMIT - 1,
                                      help="Seed of every random choice, and of the dataset split "
                                           "(a search using it must split by the same --seed).")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Mini-batch size.")] = 64,
    lr: Annotated[float, typer.Option(min=0.0, max=10.0, help="Peak learning rate (AdamW, cosine decay).")] = 5e-3,
    random_subnets: Annotated[int, typer.Option(min=0, help="Sampled sub-networks per step.")] = 2,
    distill: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of a smaller sub-network's loss "
                                                                  "distilled from the largest one.")] = 0.5,
    warmup_epochs: Annotated[int, typer.Option(min=0, help="First epochs training only the largest "
                                                           "sub-network.")] = 2,
    members: Annotated[Optional[int], typer.Option(
        min=1, max=16, help="Supernets to train, each from its own seed, on the same split: a search with it scores "
                            "every candidate on each and records the means (steadier rankings, K times the "
                            "time). [default: 1; with --resume, the training's own]", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the unfinished training saved under NAME.")]
    = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a supernet saved under NAME.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the card as JSON.")] = False,
):
    """Train a supernet of an mbv2- or vit-kind space: elastic depth, width, expansion and kernel
    (mbv2) or depth, width, heads, MLP ratio, patch size and stem (vit), every early exit and
    every searchable bit width; saved with a card and a checkpoint per epoch."""
    from ..supernet import train_and_save
    from ..supernet.store import members as members_of
    from ..supernet.train import SupernetSettings

    settings = SupernetSettings(epochs=epochs, batch_size=batch_size, lr=lr, random_subnets=random_subnets,
                                distill=distill, warmup_epochs=warmup_epochs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("training supernet"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=err, disable=not err.is_terminal)
    task = {}

    def start(total: int, done: int) -> None:
        task["id"] = progress.add_task("", total=total, completed=done)
        progress.start()

    def epoch(done: int, loss: float) -> None:
        progress.update(task["id"], completed=done, description=f"loss {loss:.3f}")

    try:
        folder, card = train_and_save(space, dataset, _space_name(space) if name is None else name, settings, seed,
                                      members=members,
                                      resume=resume, force=force, on_start=start, on_epoch=epoch)
    finally:
        progress.stop()
    if as_json:
        return print_json({"path": str(folder), **card})
    epochs = card["epochs_done"]
    k = members_of(card)
    out.print(f"supernet '{card['name']}' of space '{card['space']}'{f' ({k} members)' if k > 1 else ''} trained "
              f"for {epochs} epoch{'s' * (epochs != 1)}{' each' if k > 1 else ''} in {card['train_seconds']:.0f} s: "
              f"{folder}")
    out.print(f"search with it: nasctl search --space {space} --accuracy supernet:{card['name']} --seed {seed}")


def _space_name(space: str) -> str:
    from pathlib import Path

    p = Path(space)
    return p.stem if p.suffix in (".yaml", ".yml") else space


@app.command("list")
def list_supernets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List the saved supernets and where each comes from (one whose card cannot be read is
    listed with the reason, on stderr)."""
    from ..errors import NasctlError
    from ..supernet.store import members, read_card, saved

    rows = []
    for s in saved():
        try:
            card = read_card(s.path)
        except NasctlError as e:
            err.print(f"warning: supernet '{s.name}' is unreadable: {e}", soft_wrap=True, markup=False)
            rows.append({"name": s.name, "space": "(unreadable)", "dataset": None, "split_seed": None, "epochs": None,
                         "members": None, "origin": s.origin, "path": str(s.path)})
            continue
        rows.append({"name": s.name, "space": card["space"], "dataset": card["dataset"].get("name"),
                     "split_seed": card["dataset"].get("split_seed"), "epochs": card.get("epochs_done"),
                     "members": members(card), "origin": s.origin, "path": str(s.path)})
    print_rows(rows, {"name": "name", "space": "space", "dataset": "dataset", "split_seed": "split seed",
                      "epochs": "epochs", "members": "members", "origin": "origin", "path": "path"}, as_json)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Supernet name or folder.")],
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Show a supernet's card: space and its hash, dataset and split, settings, epochs, versions."""
    from ..supernet.store import find, read_card

    card = read_card(find(name))
    if as_json:
        return print_json(card)
    out.print_json(data=card)
