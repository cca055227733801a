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
def list_spaces(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
                kinds: Annotated[bool, typer.Option("--kinds", help="List only the kinds (built-in or "
                                                    "from plugins) spaces are made of.")] = False):
    """List the search spaces and where each comes from, then the space kinds and theirs."""
    from ..spaces.loader import SPACE_KINDS

    print_listing(workspace.entries("search_spaces"), SPACE_KINDS, "space", as_json, kinds,
                  check=lambda path: load_space(str(path)))


def print_listing(entries, registry, what: str, as_json: bool, kinds_only: bool, check=None) -> None:
    """The spec files of a data folder (name, kind, origin, path), then the kinds of
    `registry` and their origins: one table each, or JSON (the spec files as a list, each
    with its kind; with `kinds_only`, the kinds as a list of {name, origin}).  `check(path)`,
    where given, builds a spec: one that fails is listed as invalid, its reason on stderr."""
    failed = registry.check_plugins()  # a plugin that does not load: one warning line each
    kinds = [{"name": k.name, "origin": k.origin, **({"error": failed[k.name]} if k.name in failed else {})}
             for k in registry.entries()]
    if kinds_only:
        if as_json:
            return print_json(kinds)
    else:
        rows = [{"name": e.name, **_kind(e.path, check), "origin": e.origin,
                 **({"hides": list(e.hides)} if e.hides else {}), "path": str(e.path)} for e in entries]
        for r in rows:
            if "error" in r and r["kind"] not in failed:  # a plugin kind that did not load is reported once, above
                typer.echo(f"warning: {what} '{r['name']}' ({r['path']}) cannot be used: {r['error']}", err=True)
        if as_json:
            return print_json(rows)
        table = Table("name", "kind", "origin", "path", title=f"{what}s")
        for r in rows:
            kind = f"{r['kind']} (invalid)" if r["kind"] and "error" in r else r["kind"]
            table.add_row(r["name"], kind or "(spec cannot be read)",
                          r["origin"] + "".join(f" (hides the {o} one)" for o in r.get("hides", ())), r["path"])
        out.print(table)
    table = Table("kind", "origin", title=f"{what} kinds")
    for k in kinds:
        table.add_row(k["name"], k["origin"] + (" (cannot be loaded)" if "error" in k else ""))
    out.print(table)


def _kind(path, check=None) -> dict:
    """{"kind": the `kind:` of a spec file}; with "error" where it cannot be read (kind "")
    or `check(path)` fails."""
    from ..errors import ConfigError
    from ..specs import read_yaml

    try:
        kind = {"kind": str(read_yaml(path).get("kind", ""))}
    except ConfigError as e:
        return {"kind": "", "error": str(e)}
    try:
        if check is not None:
            check(path)
    except Exception as e:  # noqa: BLE001 - a listing reports a spec that does not build, whatever the kind raises
        return {**kind, "error": str(e) or type(e).__name__}
    return kind


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
