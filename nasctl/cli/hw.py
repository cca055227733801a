"""`nasctl hw list|show|profile|fit|validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .. import workspace
from ..errors import UsageError
from ..hardware.loader import load_device
from ..hardware.lut import DEQUANTIZED_COLUMN, ENERGY_COLUMN, LUT_COLUMNS
from .render import err, out, print_json

# The most kernels `hw profile` and `hw bundle` measure: every context network is built in
# memory first (about 0.2 MB a kernel on disk), and 100,000 kernels take hours here.
MAX_KERNELS = 100_000

app = typer.Typer(no_args_is_help=True,
                  help="Devices: list them, show one, profile this machine, fit one from measurements, "
                       "validate one against measured models.")

LOCAL = "cpu-local"  # the device `hw profile` measures by default
# When the machine's speed moved too much for close figures: `hw profile` warns when its
# slowest chunk of networks took more than UNSTEADY times its fastest's time, `hw validate`
# when the machine runs more than UNSTEADY_SPEED times slower or faster than profiled.  On a
# shared 2-vCPU VM the chunks of one profile ran 0.84x-1.12x the median chunk's time, and the
# machine ran 0.92x and then 1.07x its profiled time in two measurements a minute apart.
UNSTEADY = 1.15
UNSTEADY_SPEED = 1.075


@app.command("list")
def list_devices(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
                 kinds: Annotated[bool, typer.Option("--kinds", help="List only the kinds (built-in or "
                                                     "from plugins) devices are made of.")] = False):
    """List the devices and where each comes from, then the device kinds and theirs."""
    from ..hardware.loader import DEVICE_KINDS
    from .space import print_listing

    def known_kind(path):  # a light check (building every device would read every table)
        from ..errors import ConfigError
        from ..specs import read_yaml

        kind = read_yaml(path).get("kind")
        if not isinstance(kind, str) or kind not in DEVICE_KINDS:
            raise ConfigError(f"{path}: kind: {kind!r} is not a device kind; allowed: {', '.join(DEVICE_KINDS.names())}")

    print_listing(workspace.entries("hardware"), DEVICE_KINDS, "device", as_json, kinds, check=known_kind)


def _device(name: str):
    """load_device, telling the user to profile this machine where its device is missing."""
    if name == LOCAL and LOCAL not in {e.name for e in workspace.entries("hardware")}:
        raise UsageError(f"device '{LOCAL}' has not been profiled on this machine yet; run "
                         f"`nasctl hw profile --device {LOCAL}` (in a workspace) first")
    return load_device(name)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Device name or YAML path.")],
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Show a device: its parameters and their sources."""
    doc = _device(name).describe()
    if as_json:
        return print_json(doc)
    out.print_json(data=doc)


def _hides(name: str) -> str:
    """What a device just written hides: others of its name further down the search path."""
    hidden = [o for e in workspace.entries("hardware") if e.name == name for o in e.hides]
    return "".join(f"; it hides the {o} device of that name" for o in hidden)


class _Bar:
    """A rich progress bar on stderr (terminals only)."""

    def __init__(self, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"), console=err, disable=not err.is_terminal)
        self.task = None

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def update(self, done: int, total: int, note: str = "") -> None:
        if self.task is None:
            self.task = self.progress.add_task(note, total=total)
        self.progress.update(self.task, completed=done, total=total, description=note)


@app.command("profile")
def profile(
    device: Annotated[str, typer.Option(help="Name of the device to write (hardware/NAME/ in the workspace).")]
    = LOCAL,
    threads: Annotated[int, typer.Option(min=1, help="onnxruntime intra-op threads (recorded in the spec).")] = 1,
    kernels: Annotated[int, typer.Option(min=20, max=MAX_KERNELS,
                                         help="Kernels to measure (in context networks).")] = 15000,
    quick: Annotated[bool, typer.Option("--quick", help="A small, fast profile: 150 kernels, 5 rounds.")] = False,
    rounds: Annotated[int, typer.Option(min=2, help="Interleaved timing rounds.")] = 15,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions each context network is timed end to end in; "
                                                      "its time is the median one's.")] = 3,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the random context networks.")] = 0,
    refit: Annotated[bool, typer.Option("--refit", help=(
        "Measure nothing: fit the device again from the context networks its profile saved beside its table "
        "(measurements.json), read as this version of nasctl reads them."))] = False,
    add_chains: Annotated[bool, typer.Option("--add-chains", help=(
        "Time only the chained token and attention kernels (ten minutes or more) and fit the device again from "
        "its saved context networks with them: for a profile made before they were part of it, or to time them "
        "again."))] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Measure this machine's onnxruntime CPU kernels in context and write a `kind: lut` device.

    Builds random networks of the blocks real models are made of, profiles every kernel
    inside them and times them end to end (interleaved rounds, minimum; the median of
    --sessions sessions), then fits the per-kernel regressors and the per-model overhead.
    From 5,000 kernels on, every tenth network is a large one (0.1-1 GMAC), timed to fit
    how much slower kernels run in models of that size, and every tenth of the others has
    channel counts of any integer (depthwise convs of channels not a multiple of 4 run
    channel by channel) and every tenth the blocks of conv-attention hybrids (MobileViT,
    ConvNeXt-V2, EdgeNeXt), whose transposes and reductions run without contiguous blocks,
    and every tenth 2-40 MB of weights, most in a linear head (where a classifier's
    weights stop fitting in the caches), and every twentieth the wide dense convs of
    ResNet-style stages (64-512 channels), two thirds of them int8, and every twentieth an
    int8 one whose stages end in a max pool on a concatenation or a residual sum (SqueezeNet),
    and every fortieth an int8 RegNet (grouped convs of tens of groups).
    Fifteen to fifty minutes with the defaults on two cores, by the machine (three
    sessions take about 40% longer than one).
    A full profile also times the token kernels of small transformers (linear layers, layer
    norms and adds over 4-64 tokens, 16-96 wide; attention's products, softmax and
    transposes of 1-4 heads, 16-64 wide), which take too little time for onnxruntime's
    profiler, end to end in chains of 2, 8 and 14 (ten minutes or more).
    --refit fits a profiled device again without measuring (minutes), e.g. after an
    upgrade that tells more kernels apart; --add-chains times the chains and fits again."""
    from ..hardware.fit import write_device
    from ..hardware.measure.profile import profile_machine, refit_profile
    from ..hardware.measure.timing import Protocol

    folder = workspace.new_entry("hardware", device, "device")
    if refit and add_chains:
        raise UsageError("--refit and --add-chains: give one (--add-chains fits the device again too)")
    if add_chains:
        from ..hardware.measure.chains import CHAIN_PASSES, chain_kernels, measure_chains
        from ..hardware.measure.profile import chain_protocol

        refit = True
        if not (folder / "spec.yaml").is_file():
            raise UsageError(f"no device '{device}' in {folder.parent} to add chains to: profile it first "
                             f"(`nasctl hw profile --device {device}`)")
        kernels = chain_kernels()
        protocol = Protocol(threads=threads, rounds=rounds, repeats=3, sessions=sessions)
        with _Bar("chaining") as bar:
            steps = CHAIN_PASSES * len(kernels)
            done = iter(range(1, steps + 1))
            chains = measure_chains(kernels, chain_protocol(protocol), seed=seed,
                                    on_kernel=lambda: bar.update(next(done), steps, "chained kernels"))
        with _Bar("fitting") as bar:
            bar.update(0, 1, "fitting")
            fitted = refit_profile(device, folder, chains=chains)
            bar.update(1, 1, "fitting")
    elif refit:
        if not (folder / "spec.yaml").is_file():
            raise UsageError(f"no device '{device}' in {folder.parent} to fit again: profile it first "
                             f"(`nasctl hw profile --device {device}`)")
        with _Bar("fitting") as bar:
            bar.update(0, 1, "fitting")
            fitted = refit_profile(device, folder)
            bar.update(1, 1, "fitting")
    else:
        protocol = Protocol(threads=threads, rounds=5 if quick else rounds, repeats=2 if quick else 3,
                            sessions=sessions)
        with _Bar("profiling") as bar:
            fitted = profile_machine(device, protocol, kernels=150 if quick else kernels, seed=seed,
                                     on_progress=bar.update)
    spec_path = write_device(folder, fitted)
    doc = {"device": device, "spec": str(spec_path), "kernels": len(fitted.rows), **fitted.report}
    if as_json:
        return print_json(doc)
    r = fitted.report
    if refit:
        chained = fitted.spec["measurement"].get("chained_kernels")
        out.print(f"Fitted again from {r['networks']} measured context networks ({r['layers']} kernels, "
                  f"{len(fitted.rows)} distinct)" + (f" and {chained} chained kernels" if chained else "")
                  + f" in {r['fitting_seconds']:.0f} s.")
    else:
        out.print(f"Profiled {r['networks']} context networks ({r['layers']} kernels, {len(fitted.rows)} distinct) "
                  f"in {r['seconds']:.0f} s with {threads} thread(s).")
    slow = fitted.spec["measurement"].get("chunk_slowdown_corrected") or [1.0]
    if max(slow) / min(slow) > UNSTEADY:
        typer.echo(f"warning: the machine's speed moved while it was profiled: its chunks of networks ran at "
                   f"{min(slow):.2f}x-{max(slow):.2f}x the median chunk's time, by the reference networks timed in "
                   f"each (each chunk is scaled to the median); a model's time moves about as much between "
                   f"measurements on a machine this busy - profile again on a quieter machine for closer prices",
                   err=True)
    out.print(f"The device reproduces those networks' end-to-end times with an RMS error of "
              f"{r['networks_rms_error_pct']:.1f}% ({r['networks_within_10pct'] * 100:.0f}% within ±10%); "
              f"check it on your own models with `nasctl hw validate --device {device} MODEL.onnx ...`.")
    out.print(fitted.spec["energy"])
    out.print(f"Device '{device}' written to {spec_path.parent}" + _hides(device))


@app.command("fit", help=(
    "Fit a `kind: lut` device from measurements and write it to hardware/NAME/ in the workspace.\n\n"
    f"--lut FILE: a per-kernel table, one row per measured kernel, with the columns {', '.join(LUT_COLUMNS)} "
    f"and optionally {DEQUANTIZED_COLUMN} and {ENERGY_COLUMN}. They mirror LayerSpec: op is its op kind; a token "
    "sequence of length T is T x 1; groups == in_ch for a depthwise conv; fn is the fused activation, pooling "
    "mode or norm kind, or sum for an add that is a conv's residual sum (may be empty); "
    f"{DEQUANTIZED_COLUMN} is 1 for a quantized kernel that ran as dequantize, float op, quantize; latency_ms "
    "and energy_mj are the kernel's measured cost.\n\n"
    "--models FILE: end-to-end latencies, a CSV with latency_ms and either arch (an architecture of --space as "
    "JSON, or an NB201 string for nb201) or onnx (a model path, relative to the CSV). Per-kernel costs are "
    "solved by non-negative least squares over the kernels each model contains, plus a per-model overhead.\n\n"
    "Both: the table is calibrated against the end-to-end latencies.\n\n"
    "--bundle-results FILE: the results CSV a profiling bundle's runner wrote on the target (`nasctl hw bundle`), "
    "beside the bundle's bundle.json: the device is fitted as `hw profile` fits its own measurements.\n\n"
    "--prior DEV1,DEV2 (with --models): devices already known (lut, analytical, gpu or a plugin's kind: any "
    "that prices the models' layers) as a prior: each kernel's cost a non-negative mix of theirs plus a "
    "penalised correction; how far to trust them (prior only, a "
    "correction's strength, or no prior) is chosen by cross-validation on the measured models."))
def fit(
    device: Annotated[str, typer.Option(help="Name of the device to write.", show_default=False)],
    lut: Annotated[Optional[Path], typer.Option(help="Per-kernel table (CSV).", show_default=False)] = None,
    models: Annotated[Optional[Path], typer.Option(help="End-to-end measurements (CSV).", show_default=False)]
    = None,
    space: Annotated[Optional[str], typer.Option(help="Search space of the arch column.", show_default=False)]
    = None,
    input_shape: Annotated[Optional[str], typer.Option(
        help="Input C,H,W for the arch column (default: the space's).", show_default=False)] = None,
    classes: Annotated[Optional[int], typer.Option(
        min=1, help="Classes for the arch column (default: the space's).", show_default=False)] = None,
    grouping: Annotated[Optional[str], typer.Option(
        help="Kernel grouping for --models: kernels, types or types-shared (default: the best by cross-validation).",
        show_default=False)] = None,
    bundle_results: Annotated[Optional[Path], typer.Option(
        help="Results CSV of a profiling bundle's runner (alone).", show_default=False)] = None,
    prior: Annotated[Optional[str], typer.Option(
        help="Comma-separated devices whose kernel costs are the prior (with --models).", show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a device of this name in the workspace.")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    from ..hardware.fit import fit_from_lut, fit_from_models, read_models_csv, write_device
    from ..hardware.lut import read_lut
    from ..spaces.loader import load_space

    if prior is not None and models is None:
        raise UsageError("--prior DEV1,DEV2 needs --models FILE: the measured models the new device is fitted to")
    if lut is None and models is None and bundle_results is None:
        raise UsageError("give --lut FILE (a per-kernel table), --models FILE (end-to-end latencies), or both; "
                         "or --bundle-results FILE")
    if bundle_results is not None and (lut is not None or models is not None):
        raise UsageError("--bundle-results FILE goes alone, not with --lut or --models")
    if prior is not None and (models is None or lut is not None or bundle_results is not None):
        raise UsageError("--prior DEV1,DEV2 goes with --models FILE alone (not --lut or --bundle-results)")
    from ..hardware.fit import GROUPINGS

    if grouping is not None and grouping not in GROUPINGS:
        raise UsageError(f"--grouping '{grouping}' is not one of: {', '.join(GROUPINGS)}")
    if grouping is not None and (models is None or lut is not None):
        raise UsageError("--grouping goes with --models FILE (without --lut): the kernel grouping its latencies are "
                         "fitted in")
    given = [flag for flag, value in (("--space", space), ("--input-shape", input_shape), ("--classes", classes))
             if value is not None]
    if given and models is None:
        raise UsageError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} the arch column of --models "
                         "FILE; without --models there is nothing to read them for")
    names = [n.strip() for n in prior.split(",")] if prior is not None else []
    if not all(names):
        raise UsageError(f"--prior '{prior}': expected comma-separated device names, e.g. pixel3,raspi4")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--prior '{prior}' names {twice[0]} twice; name each prior device once")
    if device in names:
        raise UsageError(f"--device '{device}' is also a prior device; the fitted device needs a name of its own")
    priors = [_device(n) for n in names] if prior is not None else None
    folder = workspace.new_entry("hardware", device, "device")
    if (folder / "spec.yaml").exists() and not overwrite:
        raise UsageError(f"device '{device}' already exists in {folder}; pass --overwrite to replace it, or choose "
                         "another --device name")
    measured = None
    if bundle_results is not None:
        from ..hardware.measure.bundle import fit_bundle_results

        fitted = fit_bundle_results(device, bundle_results)
    elif models is not None:
        measured = read_models_csv(models, load_space(space) if space else None,
                                   _parse_shape(input_shape) if input_shape else None, classes)
    if lut is not None:
        fitted = fit_from_lut(device, read_lut(lut), measured)
    elif priors is not None:
        from ..hardware.prior import fit_with_prior

        fitted = fit_with_prior(device, *measured, priors, grouping=grouping)
    elif bundle_results is None:
        fitted = fit_from_models(device, *measured, grouping=grouping)
    spec_path = write_device(folder, fitted)
    doc = {"device": device, "spec": str(spec_path), "kernels": len(fitted.rows),
           "regressors": fitted.spec["regressors"], "overhead": fitted.spec["overhead"], "fit": fitted.spec["fit"]}
    if as_json:
        return print_json(doc)
    f = fitted.spec["fit"]
    if "grouping" in f:
        out.print(f"Fitted {len(fitted.rows)} kernel costs from {f['models']} models ({f['grouping']} grouping; "
                  f"cross-validated RMS error by grouping: {f['cv_rms_error_pct_by_grouping'] or 'n/a'}).")
    elif "prior" not in f:
        out.print(f"Read {len(fitted.rows)} distinct kernels.")
    if "prior" in f:
        p = f["prior"]
        out.print(f"Prior {', '.join(p['devices'])}: chose {p['trust']} by {p['cv']} cross-validation on {f['models']} "
                  f"models (RMS error {p['cv_rms_error_pct'][p['trust']]:.1f}%); weights "
                  + ", ".join(f"{n} {w:.3g}" for n, w in p["weights"].items()) + ".")
    if bundle_results is not None:
        r, where = fitted.report, fitted.spec["measurement"]["machine"].get("cpu")
        out.print(f"Measured on {where}: {r['networks']} context networks, reproduced with an RMS error of "
                  f"{r['networks_rms_error_pct']:.1f}% ({r['networks_within_10pct'] * 100:.0f}% within ±10%).")
        q = fitted.spec["measurement"].get("int8_fusion")
        if q:
            out.print(f"int8 kernels fused or dequantized as onnxruntime {q['onnxruntime']} ran them there: "
                      f"{q['told_by_target']} of {q['int8_kernels']} told by its profile, "
                      f"{q['changed_by_target']} labelled otherwise than in the bundle.")
    if "calibration" in f:
        out.print(f"Calibrated against {f['calibration']['models']} models: RMS error "
                  f"{f['calibration']['rms_error_pct']:.1f}%.")
    out.print(f"Overhead: {fitted.spec['overhead']['per_model_ms']:.4g} ms per model, "
              f"{fitted.spec['overhead']['per_layer_ms']:.4g} ms per layer.")
    out.print(f"Device '{device}' written to {spec_path.parent}" + _hides(device))


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise UsageError(f"--input-shape '{text}': expected three positive sizes C,H,W, e.g. 3,32,32")
    return dims  # type: ignore[return-value]


@app.command("validate")
def validate(
    models: Annotated[list[Path], typer.Argument(help="ONNX models to measure and predict.", show_default=False)],
    device: Annotated[str, typer.Option(help="Device name or YAML path.")] = LOCAL,
    rounds: Annotated[int, typer.Option(min=2, help="Interleaved timing rounds.")] = 15,
    spread: Annotated[float, typer.Option(min=0, max=600, help="Seconds the rounds are spread over (a pause after a "
                                                      "round that ends early), so that a busy spell of the "
                                                      "machine shorter than that cannot reach every round.")] = 3.0,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions each model is opened in; its time is the "
                                                      "median one's (one session's buffers can run slower "
                                                      "than another's on a shared machine).")] = 3,
    by_kernel: Annotated[bool, typer.Option("--by-kernel", help="Also profile each model in onnxruntime and "
                                                                "set each kernel type's measured in-context time "
                                                                "beside its price: where the errors come from.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
):
    """Measure ONNX models end to end on this machine and compare with a device's predictions.

    Every model is timed with onnxruntime by the device's protocol (its threads;
    interleaved rounds spread over --spread seconds, minimum over rounds, median over
    --sessions sessions) and priced by the device;
    prints each model's error and the share of models within ±5% and ±10%, and the RMS
    percentage error.  With --by-kernel, each model is also profiled: its layers'
    in-context times, summed per kernel type over the models, beside the device's prices
    of them, and the layers priced furthest from what they took."""
    from ..hardware.measure.profile import kernel_breakdown, validate_models
    from ..hardware.measure.runner import Protocol

    dev = _device(device)
    with _Bar("measuring") as bar:
        doc = validate_models(dev, models, rounds=rounds, on_progress=bar.update, spread_s=spread,
                              sessions=sessions)
    if by_kernel:
        threads = int((getattr(getattr(dev, "spec", None), "measurement", None) or {}).get("threads", 1))
        with _Bar("profiling") as bar:
            done = iter(range(1, 2 * rounds + 1))
            try:
                doc["by_kernel"] = kernel_breakdown(dev, models, Protocol(threads=threads, rounds=rounds,
                                                                          sessions=sessions),
                                                    on_round=lambda: bar.update(next(done, 2 * rounds),
                                                                                2 * rounds, "rounds"))
            except ValueError as e:
                raise UsageError(f"--by-kernel: {e}") from None
    if as_json:
        return print_json(doc)
    table = Table("model", "predicted ms", "measured ms", "error")
    for r in doc["models"]:
        table.add_row(r["model"], f"{r['predicted_ms']:.4g}", f"{r['measured_ms']:.4g}",
                      f"{r['error_pct']:+.1f}%" + (" (ops not priced)" if r["unsupported"] else ""))
    out.print(table)
    for r in doc["models"]:
        if r["unsupported"]:
            typer.echo(f"warning: {r['model']}: not priced, so its prediction leaves them out: "
                       + ", ".join(f"{op} x{n}" for op, n in r["unsupported"].items()), err=True)
    s = doc["summary"]
    out.print(f"{s['models']} models on {doc['device']}: {s['within_5pct'] * 100:.0f}% within ±5%, "
              f"{s['within_10pct'] * 100:.0f}% within ±10%, RMS error {s['rms_error_pct']:.1f}%.")
    if "machine_vs_profile" in s:
        out.print(f"The machine runs at {s['machine_vs_profile']:.2f}x its profiled time now, by "
                  f"{s['machine_vs_profile_from']} timed beside the models "
                  f"(above 1: it is slower or busier now than when it was profiled).")
    a = s.get("load_adjusted")
    if a:
        out.print(f"With the predictions scaled by that speed (x{a['factor']:.3f}): {a['within_5pct'] * 100:.0f}% "
                  f"within ±5%, {a['within_10pct'] * 100:.0f}% within ±10%, RMS error {a['rms_error_pct']:.1f}% - the "
                  f"device's error apart from the machine's load now.")
        if max(a["factor"], 1 / a["factor"]) > UNSTEADY_SPEED:
            typer.echo(f"warning: the machine runs at {a['factor']:.2f}x the time it was profiled at: the raw errors "
                       f"above carry that much of its load; validate again when it is as busy as then, or profile "
                       f"it again", err=True)
    if by_kernel:
        _print_breakdown(doc["by_kernel"])


def _print_breakdown(b: dict, shown: int = 12) -> None:
    """`hw validate --by-kernel`: the kernel types and layers priced furthest from their times."""
    table = Table("kernel type", "layers", "priced ms", "measured ms", "difference", title="By kernel type "
                  f"(in-context times, {len(b['models'])} models, largest differences first)")
    for r in b["kernels"][:shown]:
        table.add_row(r["kernel"], str(r["layers"]), f"{r['predicted_ms']:.4g}", f"{r['measured_ms']:.4g}",
                      f"{r['predicted_ms'] - r['measured_ms']:+.3g} ms")
    out.print(table)
    table = Table("model", "layer", "kernel type", "shape", "priced ms", "measured ms", title="Layers priced "
                  "furthest from their in-context time")
    for r in b["worst_layers"]:
        shape = (f"{r['in_ch']}x{r['in_hw'][0]}x{r['in_hw'][1]} -> {r['out_ch']}x{r['out_hw'][0]}x{r['out_hw'][1]}"
                 f" k{r['kernel_size'][0]}x{r['kernel_size'][1]} g{r['groups']}" + (f" {r['fn']}" if r["fn"] else ""))
        table.add_row(r["model"], r["layer"], r["kernel"], shape, f"{r['predicted_ms']:.4g}", f"{r['measured_ms']:.4g}")
    out.print(table)
