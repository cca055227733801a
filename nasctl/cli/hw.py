"""`nasctl hw list|show`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .. import workspace
from ..hardware.loader import load_device
from .render import out, print_json

app = typer.Typer(no_args_is_help=True, help="Devices: list them, show one.")


@app.command("list")
def list_devices(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List the devices and where each comes from."""
    rows = [{"name": e.name, "origin": e.origin, "path": str(e.path)} for e in workspace.entries("hardware")]
    if as_json:
        return print_json(rows)
    table = Table("name", "origin", "path")
    for r in rows:
        table.add_row(r["name"], r["origin"], r["path"])
    out.print(table)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Device name or YAML path.")],
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Show a device: its parameters and their sources."""
    doc = load_device(name).describe()
    if as_json:
        return print_json(doc)
    out.print_json(data=doc)
