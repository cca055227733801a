"""`nasctl hw bundle`: a profiling bundle, for a machine nasctl does not run on to measure
itself (`nasctl hw fit --bundle-results` makes the device of what it measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .hw import MAX_KERNELS, _Bar, app
from .render import out, print_json


@app.command("bundle")
def bundle(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write the bundle into (new or empty).",
                                          show_default=False)],
    kernels: Annotated[int, typer.Option(min=20, max=MAX_KERNELS, help="Kernels to measure (in context networks), as "
                                         "`hw profile --kernels`; about 0.2 MB a kernel.")] = 5000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the random context networks (as `hw profile --seed`).")]
    = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Write a profiling bundle: the context networks `hw profile` measures, as ONNX files, and
    a runner that measures them on another machine (a phone, a Jetson, a Raspberry Pi, an
    accelerator board) with only Python, numpy and onnxruntime.

    There: `python runner.py [--threads T] [--rounds R]` writes results.csv (the protocol of
    `hw profile`: interleaved rounds, minimum, in-context kernel times). Back here:
    `nasctl hw fit --device NAME --bundle-results DIR/results.csv` writes the device."""
    from ..hardware.measure.bundle import write_bundle

    with _Bar("bundling") as bar:
        doc = write_bundle(out_dir, kernels=kernels, seed=seed, on_progress=bar.update)
    if as_json:
        return print_json(doc)
    out.print(f"Wrote bundle {doc['id']} to {out_dir}: {doc['networks']} context networks ({doc['kernels']} kernels) "
              f"and {doc['references']} reference networks, {doc['megabytes']:.0f} MB.")
    out.print(f"On the target (Python with numpy and onnxruntime): python {out_dir / 'runner.py'} [--threads T]")
    out.print(f"Then here: nasctl hw fit --device NAME --bundle-results {out_dir / 'results.csv'}")
