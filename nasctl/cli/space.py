"""`nasctl space list|show`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .. import workspace
from ..spaces.loader import load_space
from .render import out, print_json

app = typer.Typer(no_args_is_help=True, help="Search spaces: list them, show one.")


@app.command("list")
def list_spaces(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List the search spaces and where each comes from."""
    rows = [{"name": e.name, "origin": e.origin, "path": str(e.path)} for e in workspace.entries("search_spaces")]
    if as_json:
        return print_json(rows)
    table = Table("name", "origin", "path")
    for r in rows:
        table.add_row(r["name"], r["origin"], r["path"])
    out.print(table)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Space name or YAML path.")],
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Show a search space: its knobs and their choices."""
    doc = load_space(name).describe()
    if as_json:
        return print_json(doc)
    out.print(f"[bold]{doc['name']}[/bold]: {doc['description']}")
    out.print(f"{doc['size']:,} architectures")
    table = Table("knob", "choices")
    for knob, choices in doc["knobs"].items():
        table.add_row(knob, ", ".join(map(str, choices)))
    out.print(table)
