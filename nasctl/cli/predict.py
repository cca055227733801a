"""`nasctl predict`: price an ONNX model on a device.

A model with early exits (the If-nested graph `nasctl export` writes) is priced per exit
path: the cost of reaching each exit (the backbone up to it and every exit head passed,
its own included), and, given exit rates (`--exit-rates`, else the `card.yaml` beside the
model), the expected latency, energy and EDP over the exits, as the search records them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

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
    exit_rates: Annotated[Optional[str], typer.Option(
        "--exit-rates", show_default=False,
        help="Share of inputs leaving at each exit of an early-exit model, NAME=SHARE,... (e.g. "
             "s1=0.3,s2=0.2,final=0.5; exits not named get 0; the shares sum to 1), for the expected "
             "latency, energy and EDP. Default: the exit rates of the card.yaml beside the model (the trial's; a retrained model's own).")] = None,
):
    """Price an ONNX model on a device: latency, energy, MACs, parameters, weight bytes;
    for a model with early exits, the cost of each exit path and the expected cost."""
    from ..hardware.early import in_thread, quantized

    # onnxruntime's reading of a quantized model runs beside the device's loading and the imports
    runtime = in_thread(_read_in_runtime, Path(model)) if quantized(Path(model)) else None
    from ..hardware.loader import load_device
    from ..hardware.onnx_import import import_onnx

    shapes = parse_input_shapes(input_shape or [])
    given_rates = parse_exit_rates(exit_rates) if exit_rates is not None else None
    cost_model = load_device(device)
    imported = import_onnx(model, shapes, runtime=runtime)
    exits = list(imported.exits)
    if given_rates is not None:
        rates = check_exit_rates(given_rates, exits, "--exit-rates")
    elif len(exits) > 1:
        rates = card_exit_rates(Path(model).parent / "card.yaml", exits)
    else:
        rates = None
    report = cost_model.with_layout(cost_model.estimate(imported.layers), imported.layouts)
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
        if not any(cost.mapping != "unsupported" for cost in report.costs):
            raise UsageError(f"{model}: no op of its {imported.nodes} nodes can be priced on '{report.device}' "
                             f"(not priced: {listed}); there is nothing to price")
        typer.echo(f"warning: not priced, so the latency and energy totals exclude them: {listed}; the totals "
                   f"cover {covered:.0%} of the model's {imported.nodes} nodes", err=True)

    # Layers priced from another kernel's measurements (a table without rows of their own):
    # their prices may be far off (an 8-bit max pool run channels-first takes 30x a
    # channels-last one's time), and the user is told which.
    stand_ins = [{"kernel": own, "priced_as": used, "count": n}
                 for (own, used), n in sorted(cost_model.stand_ins(report.layers).items())]
    if stand_ins:
        listed = "; ".join(f"{s['kernel']} x{s['count']} as {s['priced_as']}" for s in stand_ins)
        n = sum(s["count"] for s in stand_ins)
        typer.echo(f"warning: {n} layer{'s' * (n != 1)} priced from another kernel type's rows, "
                   f"'{report.device}' holding none of their own ({listed}): a profile with such kernels "
                   f"(`nasctl hw profile`) prices them from their own; `nasctl hw validate` measures the model",
                   err=True)

    layers = [_layer_row(layer, cost) for layer, cost in zip(report.layers, report.costs)]
    energy = report.energy_mj if cost_model.models_energy else None
    doc = {"model": str(model), "device": report.device, "nodes": imported.nodes,
           "inputs": {name: list(shape) for name, shape in imported.inputs.items()},
           "latency_ms": report.latency_ms, "energy_mj": energy,
           "macs": sum(layer.macs for layer in report.layers),
           "params": sum(layer.params for layer in report.layers),
           "weight_bytes": sum(layer.weight_bytes for layer in report.layers),
           "layers": layers, "unsupported": not_priced, "covered_nodes_share": covered, "stand_ins": stand_ins}
    if len(exits) > 1 or rates is not None:
        doc.update(_exit_figures(report, exits, rates, cost_model.models_energy))
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


def parse_exit_rates(value: str) -> dict[str, float]:
    """'s1=0.3,s2=0.2,final=0.5' as {name: share} (names checked against the model later)."""
    rates: dict[str, float] = {}
    example = "e.g. s1=0.3,final=0.7"
    for item in (part.strip() for part in value.split(",")):
        name, eq, share = (t.strip() for t in item.partition("="))
        try:
            number = float(share)
        except ValueError:
            number = math.nan
        if not eq or not name or not share:
            raise UsageError(f"--exit-rates '{item}': expected NAME=SHARE, the shares numbers in [0, 1], {example}")
        if not 0.0 <= number <= 1.0:
            raise UsageError(f"--exit-rates '{item}': the share '{share}' is not a number in [0, 1]; {example}")
        if name in rates:
            raise UsageError(f"--exit-rates: exit '{name}' is given twice; give each exit once, {example}")
        rates[name] = number
    return rates


def check_exit_rates(rates: dict[str, Any], exits: list[str], source: str) -> dict[str, float]:
    """The share of each of the model's `exits` (0 where not given); `source` names where
    the rates come from in the one-line error for an unknown exit, a share outside [0, 1]
    or shares not summing to 1."""
    for name, share in rates.items():
        if name not in exits:
            raise UsageError(f"{source}: the model has no exit '{name}'; its exits: {', '.join(exits)}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise UsageError(f"{source}: the share of exit '{name}' is {share!r}, not a number in [0, 1]")
    total = sum(float(v) for v in rates.values())
    if abs(total - 1.0) > 1e-6:
        raise UsageError(f"{source}: the shares sum to {total:.6g}, not 1 (exits not named count 0; the model's "
                         f"exits: {', '.join(exits)})")
    return {name: float(rates.get(name, 0.0)) for name in exits}


def card_exit_rates(card: Path, exits: list[str]) -> Optional[dict[str, float]]:
    """The exit rates of the model card `card` (keys `exits`, the exit names with final
    last, and `figures.run.exit_rates`: the trial's, as the search recorded them; for a
    model retrained after the search, `figures.model.exit_rates`); None where there is no card."""
    if not card.is_file():
        return None
    import yaml

    try:
        doc = yaml.safe_load(card.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        reason = " ".join(str(e).split())[:200]
        raise UsageError(f"{card}: cannot read it as YAML ({reason}); fix it or give --exit-rates") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{card}: not a mapping of keys (a model card has exits and figures.run.exit_rates); "
                         f"fix it or give --exit-rates")
    names = doc.get("exits")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{card}: no key 'exits' listing the exit names (final last); fix it or give --exit-rates")
    if names != exits:
        raise UsageError(f"{card}: its exits [{', '.join(names)}] are not the model's [{', '.join(exits)}]; "
                         f"is it the card of another model? give --exit-rates instead")
    figures = doc.get("figures") if isinstance(doc.get("figures"), dict) else {}
    # a model retrained after the search (`nasctl export --retrain`) has exit rates of its own
    own = figures.get("model") if isinstance(figures.get("model"), dict) else {}
    key = "model" if own.get("trained_on") == "train+validation" else "run"
    part = figures.get(key)
    rates = part.get("exit_rates") if isinstance(part, dict) else None
    if not isinstance(rates, dict) or not rates:
        raise UsageError(f"{card}: no key 'figures.{key}.exit_rates' (a mapping of exit name to share); fix it or "
                         f"give --exit-rates")
    return check_exit_rates({str(k): v for k, v in rates.items()}, exits, f"{card}: figures.{key}.exit_rates")


def _exit_figures(report, exits: list[str], rates: Optional[dict[str, float]], models_energy: bool) -> dict:
    """`exits`: the cost of reaching each exit; `expected`: over the exit rates (given any)."""
    from ..hardware.base import expected_cost

    lat, en = report.exit_path_costs()
    lat = (lat + [lat[-1]] * len(exits))[:len(exits)]  # a segment without priced layers adds nothing
    en = (en + [en[-1]] * len(exits))[:len(exits)] if en is not None and models_energy else None
    doc: dict = {"exits": [{"name": name, "latency_ms": lat[k], "energy_mj": None if en is None else en[k]}
                           for k, name in enumerate(exits)]}
    if rates is not None:
        shares = [rates[name] for name in exits]
        latency = expected_cost(lat, shares)
        energy = None if en is None else expected_cost(en, shares)
        doc["expected"] = {"latency_ms": latency, "energy_mj": energy,
                           "edp": None if energy is None else latency * energy, "exit_rates": dict(rates)}
    return doc


def _read_in_runtime(path: Path):
    """`onnx_import._in_runtime(path)`, onnx and onnxruntime imported on the calling thread."""
    from ..hardware.onnx_import import _in_runtime

    return _in_runtime(path)


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


def _mj(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4g} mJ"


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
    if "exits" in doc:
        width = max(len(e["name"]) for e in doc["exits"])
        lines.append("  exit paths (the backbone up to each exit and the exit heads passed):")
        lines += [f"    {e['name']:<{width}}  {e['latency_ms']:.4g} ms  {_mj(e['energy_mj'])}" for e in doc["exits"]]
    if "expected" in doc:
        x = doc["expected"]
        shares = ", ".join(f"{name} {share:.4g}" for name, share in x["exit_rates"].items())
        edp = "n/a" if x["edp"] is None else f"{x['edp']:.4g} mJ·ms"
        lines += [f"  expected over the exit rates ({shares}):",
                  f"    latency  {x['latency_ms']:.4g} ms", f"    energy   {_mj(x['energy_mj'])}",
                  f"    EDP      {edp}"]
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
