"""`nasctl hw lut`: a per-kernel latency/energy table of a device, for the layers of a
search space's sampled architectures, priced by the device's own model or by ZigZag."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from .hw import app
from .render import err, out, print_json

BACKENDS = ("analytical", "zigzag")


def _input_shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise UsageError(f"--input-shape '{text}': expected three positive sizes C,H,W, e.g. 3,32,32")
    return dims  # type: ignore[return-value]


@app.command("lut")
def lut(
    device: Annotated[str, typer.Option(help="Device name or YAML path.", show_default=False)],
    space: Annotated[str, typer.Option(help="Search space whose sampled architectures give the layers.",
                                       show_default=False)],
    out_file: Annotated[Path, typer.Option("--out", help="CSV file to write (the lut.csv columns).",
                                           show_default=False)],
    backend: Annotated[str, typer.Option(
        help="Who prices the layers: 'analytical' (the device's own model, every layer) or 'zigzag' "
             "(ZigZag's mapping search, conv layers; needs the zigzag extra).")] = "analytical",
    samples: Annotated[int, typer.Option(min=1, help="Architectures to sample.")] = 20,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the sampling.")] = 0,
    input_shape: Annotated[str, typer.Option(help="Input C,H,W the layers are computed for.")] = "3,32,32",
    classes: Annotated[int, typer.Option(min=1, help="Classes of the classifier layers.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON summary on stdout.")] = False,
):
    """Price the distinct layers of sampled architectures on a device and write them as a table."""
    import numpy as np

    from ..hardware.loader import load_device
    from ..hardware.lut import row_from_layer, write_lut
    from ..spaces.loader import load_space

    if backend not in BACKENDS:
        raise UsageError(f"unknown backend '{backend}'; allowed: {', '.join(BACKENDS)}")
    shape = _input_shape(input_shape)
    if backend == "zigzag":
        from ..hardware.zigzag_backend import zigzag_costs
    dev, sp = load_device(device), load_space(space)
    rng = np.random.default_rng(seed)
    layers: dict[tuple, object] = {}
    for _ in range(samples):
        for layer in sp.to_layers(sp.sample(rng), shape, classes):
            if backend == "analytical" or layer.op == "conv":
                layers.setdefault(layer.shape_key(), layer)
    todo = list(layers.values())
    with err.status(f"pricing {len(todo)} layers on {dev.name} ({backend})"):
        if backend == "zigzag":
            costs = zigzag_costs(dev, todo)
        else:
            costs = dev.estimate(todo).costs
    rows = [row_from_layer(layer, c.latency_ms, c.energy_mj) for layer, c in zip(todo, costs)
            if c.mapping != "unsupported"]
    if not rows:
        raise UsageError(f"{dev.name} ({backend}) prices none of the {len(todo)} distinct layers of {samples} sampled "
                         f"'{sp.name}' architectures; no table written")
    try:
        write_lut(out_file, rows)
    except OSError as e:
        raise UsageError(f"cannot write '{out_file}': {e.strerror}") from None
    doc = {"device": dev.name, "backend": backend, "space": sp.name, "samples": samples, "seed": seed,
           "rows": len(rows), "unpriced": len(todo) - len(rows), "out": str(out_file)}
    if as_json:
        return print_json(doc)
    out.print(f"{len(rows)} kernels of {samples} sampled '{sp.name}' architectures priced on {dev.name} "
              f"({backend}) written to {out_file}" + (f"; {doc['unpriced']} unsupported" if doc["unpriced"] else ""))
