"""`nasctl predict`: price an ONNX model on a device."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import UsageError
from .render import out, print_json


def predict(
    model: Annotated[Path, typer.Argument(help="The ONNX model file.", show_default=False)],
    device: Annotated[str, typer.Option(help="Device name or YAML path.", show_default=False)],
    input_shape: Annotated[Optional[list[str]], typer.Option(
        "--input-shape", show_default=False,
        help="Shape of an input with dynamic dims: 1x3x224x224 (the only input) or NAME:1x3x224x224; "
             "repeat the option or separate with commas for several inputs. Only dynamic dims can differ "
             "from the model's; batch must be 1.")] = None,
    per_layer: Annotated[bool, typer.Option("--per-layer", help="Also print a table of every layer.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Price an ONNX model on a device: latency, energy, MACs, parameters, weight bytes."""
    from ..hardware.loader import load_device
    from ..hardware.onnx_import import import_onnx

    shapes = parse_input_shapes(input_shape or [])
    cost_model = load_device(device)
    imported = import_onnx(model, shapes)
    report = cost_model.estimate(imported.layers)
    for note in imported.notes:
        typer.echo(f"note: {note}", err=True)

    report.unsupported.update(imported.unsupported)  # ONNX op types next to the device's layer kinds
    not_priced = [{"op": op, "count": n,
                   "reason": "not imported" if op in imported.unsupported else f"{report.device} cannot price it"}
                  for op, n in sorted(report.unsupported.items())]
    # The share of the model's nodes the totals cover: a node not imported, or imported into
    # a layer the device cannot price, is not covered.
    unpriced_nodes = sum(u["count"] for u in not_priced)
    covered = max(0.0, 1.0 - unpriced_nodes / imported.nodes) if imported.nodes else 1.0
    if not_priced:
        listed = "; ".join(f"{u['op']} x{u['count']} ({u['reason']})" for u in not_priced)
        typer.echo(f"warning: not priced, so the latency and energy totals exclude them: {listed}; the totals "
                   f"cover {covered:.0%} of the model's {imported.nodes} nodes", err=True)

    layers = [_layer_row(layer, cost) for layer, cost in zip(report.layers, report.costs)]
    energy = report.energy_mj if cost_model.models_energy else None
    doc = {"model": str(model), "device": report.device, "nodes": imported.nodes,
           "inputs": {name: list(shape) for name, shape in imported.inputs.items()},
           "latency_ms": report.latency_ms, "energy_mj": energy,
           "macs": sum(layer.macs for layer in report.layers),
           "params": sum(layer.params for layer in report.layers),
           "weight_bytes": sum(layer.weight_bytes for layer in report.layers),
           "layers": layers, "unsupported": not_priced, "covered_nodes_share": covered}
    if as_json:
        return print_json(doc)
    if per_layer:
        out.print(_layer_table(layers))
    _print_totals(doc, cost_model.models_energy)


def parse_input_shapes(values: list[str]) -> dict[Optional[str], tuple[int, ...]]:
    """'1x3x224x224' (key None: the model's only input) or 'NAME:1x3x224x224', each
    option value possibly a comma-separated list of them."""
    shapes: dict[Optional[str], tuple[int, ...]] = {}
    for item in (part.strip() for value in values for part in value.split(",") if part.strip()):
        name, _, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise UsageError(f"--input-shape '{item}': expected positive dims joined by x, e.g. 1x3x224x224 "
                             f"or NAME:1x3x224x224")
        shapes[name or None] = shape
    return shapes


def _layer_row(layer, cost) -> dict:
    priced = cost.mapping != "unsupported"
    return {"name": layer.name, "op": layer.op, "fn": layer.fn,
            "shapes": {"in": [layer.in_ch, *layer.in_hw], "out": [layer.out_ch, *layer.out_hw],
                       "kernel": list(layer.kernel), "stride": layer.stride, "groups": layer.groups},
            "bits": {"w": layer.w_bits, "a": layer.a_bits}, "dequantized": layer.dequantized,
            "macs": layer.macs, "params": layer.params,
            "latency_ms": cost.latency_ms if priced else None,
            "energy_mj": cost.energy_mj if priced else None,
            "mapping": cost.mapping}


def _layer_table(rows: list[dict]) -> Table:
    table = Table(title="Layers (shapes: channels x height x width)")
    for col in ("name", "op", "in → out", "k/s/g", "bits w/a", "MACs", "latency µs", "energy µJ", "mapping"):
        table.add_column(col, justify="left" if col in ("name", "op", "in → out", "mapping") else "right",
                         overflow="fold")
    for r in rows:
        s = r["shapes"]
        kernel = "x".join(map(str, s["kernel"]))
        table.add_row(r["name"], f"{r['op']}:{r['fn']}" if r["fn"] else r["op"],
                      f"{'x'.join(map(str, s['in']))} → {'x'.join(map(str, s['out']))}",
                      f"{kernel}/{s['stride']}/{s['groups']}",
                      f"{r['bits']['w']}/{r['bits']['a']}" + (" dq" if r["dequantized"] else ""),
                      f"{r['macs']:,}", _scaled(r["latency_ms"]), _scaled(r["energy_mj"]), r["mapping"])
    return table


def _scaled(value: Optional[float]) -> str:
    """ms -> µs, mJ -> µJ; '-' where the layer was not priced."""
    return "-" if value is None else f"{value * 1e3:.4g}"


def _print_totals(doc: dict, models_energy: bool) -> None:
    if doc["energy_mj"] is not None:
        energy = f"{doc['energy_mj']:.4g} mJ"
    else:
        energy = "n/a (latency only)" if not models_energy else "n/a"
    priced = sum(1 for r in doc["layers"] if r["latency_ms"] is not None)
    lines = [f"{doc['model']} on {doc['device']}: {doc['nodes']} nodes, {len(doc['layers'])} layers, {priced} priced",
             f"  latency       {doc['latency_ms']:.4g} ms",
             f"  energy        {energy}",
             f"  MACs          {doc['macs']:,}",
             f"  params        {doc['params']:,}",
             f"  weight bytes  {doc['weight_bytes']:,.0f}"]
    if doc["unsupported"]:
        lines.append(f"  latency and energy exclude what was not priced (listed on stderr): they cover "
                     f"{doc['covered_nodes_share']:.0%} of the {doc['nodes']} nodes")
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
