"""`kind: lut` - a device priced from a table of measured kernels.

A LUT device is a folder `hardware/NAME/` holding `spec.yaml` and the table `lut.csv`
(`nasctl hw profile` measures one on this machine; `nasctl hw fit` makes one from any
per-kernel table or from end-to-end measurements).  One row of the table is one kernel -
a layer as `LayerSpec` describes it, with its fused batch norm and activation - and its
measured cost in context; the columns (`LUT_COLUMNS`, optionally `energy_mj`) are
documented in `nasctl.hardware.fit` and `nasctl hw fit --help`.

Pricing a layer: a row with the layer's exact shape (`LayerSpec.shape_key`) gives its cost
as stored (unless the spec says `exact_rows: false`, as a profiled device does: its rows
are single in-context measurements, and every layer is priced by its type's regressor,
which the rows are fitted into); any other layer is priced by a regressor fitted (the
first time the device needs it) to the rows of its kernel type (the op; convs split into
dense, grouped and depthwise, and depthwise ones of channels not a multiple of 4 apart
again - onnxruntime runs them channel by channel, each channel a kernel call with its
fixed cost; adds into a conv's residual sums - `fn` sum, accumulated into the conv's
output - and the others; quantized kernels apart from float ones, and those that run
dequantized apart again - priced as fused ones where the table has none, or only kernels
of less than an eighth of the layer's work, and then as float kernels, likewise; grouped
convs as dense ones, channel-by-channel depthwise convs as the others and residual sums as
adds where the table has none of them) on log-scale features - MACs, elements read and
written, weights, channels, positions, kernel area, stride, groups, bit widths, channel
alignment to vector blocks, the activation and a transpose's copies (`_copies`).
Predictions are of log latency, so prices are always positive. The spec names each type's
regressor (`regressors:`, chosen by `nasctl hw fit` / `hw profile` by cross-validated
error):

  additive  latency = a non-negative mix of a fixed cost per kernel call, MACs, elements
            moved, weights, an unfused activation's extra pass and, for a batched product
            of two activations, one fixed cost per product, for a transpose one per copy
            of a contiguous block (few rows, or costs linear in work);
  ridge     a regularised log-log linear model;
  boost     gradient-boosted trees predicting the log of the time per unit of work;
  nearest   the time per unit of work of the 5 most similar measured kernels.

Types the spec does not name get `additive`.  A layer whose kernel type has no rows at
all is reported as unsupported.  Boosted trees take seconds to fit: `nasctl hw profile`
and `hw fit` save them beside the table (`regressors.json`: plain arrays, tied to the
table's SHA-256, with the table's rows as read and checked, which load faster than the
CSV), and a device whose table changed since refits them (and reads the CSV).

Every priced layer also pays `overhead.per_layer_ms` and its kernel group's
`overhead.per_kernel_ms` (its kernel type whatever the bit widths: what a kernel's
in-context time leaves out or holds of its neighbours', fitted by `hw profile` to the
context networks' end-to-end times), and the first layer of a list carries
`overhead.per_model_ms`, the fixed cost of one inference run; these are fitted from
end-to-end measurements (`nasctl.hardware.fit`, `nasctl.hardware.measure.profile`).
`overhead.working_set` (fitted by `hw profile`) scales a model's kernel costs with the
size of its weights and activations (`WorkingSet`): the same kernel runs slower in a
large model, whose tensors have left the caches by the time it runs again, than in a
small one, up to the working set past which it slows no further.
`overhead.weight_stream` (fitted by `hw profile`, `WeightStream`) adds to a
layer that multiplies one row by its weights (a classifier) what reading them from memory
instead of the caches costs in a model of its weight bytes, and `overhead.weight_reread`
the same to a float conv or linear layer of a few output positions (`rereads_weights`) whose
weights stay in the caches when it runs alone (`WeightStream.max_bytes`).  With
no energy column the device models latency only (`models_energy: false`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, NonNegativeFloat, PositiveFloat, PositiveInt

from .. import specs, trees, workspace
from ..errors import ConfigError, UsageError
from .base import CostModel, CostReport, LayerCost
from .layers import LAYER_OPS, MAX_NCHW, MOVES_INNER, OPS, SKIP, STRIDED, SUM, LayerSpec

LUT_COLUMNS = ("op", "in_ch", "out_ch", "in_h", "in_w", "out_h", "out_w", "kernel_h", "kernel_w", "stride",
               "groups", "w_bits", "a_bits", "fn", "latency_ms")
ENERGY_COLUMN = "energy_mj"
DEQUANTIZED_COLUMN = "dequantized"  # optional, 0 or 1 (LayerSpec.dequantized)
OPTIONAL_COLUMNS = (DEQUANTIZED_COLUMN, ENERGY_COLUMN)
_INT_COLUMNS = LUT_COLUMNS[1:13]
# The least cost a measured kernel or model can have: a nanosecond, a femtojoule (a smaller
# positive number is a mistake, and one near the float limits makes the fits overflow).
MIN_COST = {"latency_ms": 1e-6, ENERGY_COLUMN: 1e-12}
REGRESSORS = ("additive", "ridge", "boost", "nearest")
MIN_ROWS = {"additive": 1, "ridge": 12, "boost": 40, "nearest": 5}  # fewest rows each regressor is fitted on
REGRESSORS_FILE = "regressors.json"  # boosted trees fitted to the table, beside it
REGRESSORS_FORMAT = 8  # what save_regressors writes; older files are read with their types taken again
KERNEL_FLOOR_MS = 1e-4  # the least a kernel is priced at after a negative per-kernel offset (0.1 µs)
REPLACED_BY_REORDER = "layout reorder"  # the mapping of a layer a layout reorder runs in place of


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class WorkingSet(_Strict):
    """Kernels run slower in a model whose weights and activations do not stay in the
    caches between them: every kernel's cost (its offsets included, not the run overhead)
    is scaled by 1 + slope * ln(min(W, knee_bytes) / ref_bytes), within WORKING_SET_CLIP,
    where W is the model's working set (`working_set_bytes`).  Past the knee a larger
    working set slows the kernels no further (what they lose once their tensors have left
    the inner caches; reading weights from memory is `WeightStream`'s); without one the
    slowdown goes on growing."""
    ref_bytes: PositiveFloat  # the working set at which the kernels cost what the table says
    slope: float              # relative cost per e-fold of the working set
    knee_bytes: Optional[PositiveFloat] = None  # the working set past which it stops growing


WORKING_SET_CLIP = (0.5, 2.0)


class WeightStream(_Strict):
    """A layer that multiplies one row by a weight matrix (`streams_weights`: a classifier,
    a linear layer at one position, a 1x1 conv on a 1x1 map) does little besides reading
    its weights once per run, so it runs at the speed they arrive: from the caches where
    the model's weights all stay there between runs, from memory where they do not.  Its
    price is the table's (whose rows hold the resident speed, `resident_ms_per_mb`) plus
    its weights' megabytes times `rate(W) - resident_ms_per_mb`, where W is the model's
    weight bytes (`weight_bytes`; its activations live in buffers onnxruntime reuses) and
    the rate moves from `resident_ms_per_mb` to `streamed_ms_per_mb` about `cache_bytes`,
    over `width` e-folds of W."""
    cache_bytes: PositiveFloat         # a model's weight bytes at the middle of the change
    width: PositiveFloat               # the change's width, in e-folds of weight bytes
    resident_ms_per_mb: NonNegativeFloat
    streamed_ms_per_mb: NonNegativeFloat
    # Whether 1x1 convs on 1x1 maps count as such layers (`streams_weights`): fits before they
    # did keep those convs' reading in their table rows, and price them as before.
    convs: bool = False
    # Which layers the curve prices: 1, those of one row (`streams_weights`); more, the
    # float convs and linear layers of 2 to `max_rows` output positions (`rereads_weights`,
    # `overhead.weight_reread`), whose table rows hold their time with the weights in the
    # caches (timed alone) and whose rates are then their time per megabyte beyond it.
    max_rows: PositiveInt = 1
    # The fewest weight bytes of a layer the curve prices (the least its fit measured).
    min_bytes: NonNegativeFloat = 0.0
    # The most (None: no limit): a larger layer's weights leave the caches even when it is
    # timed alone, so what reading them costs is in its table rows already.
    max_bytes: Optional[PositiveFloat] = None
    # Which of those few-row layers it prices (`reread_kind`): "spatial", the convs of a
    # kernel over 1x1, or "pointwise", the others (each has a curve of its own: three
    # profiles of a 2-vCPU EPYC measured 0.034-0.065 ms/MB beyond their alone time for
    # spatial convs of 0.8-8 MB, 0.013-0.020 for pointwise layers); "all": both alike.
    kernels: Literal["all", "spatial", "pointwise"] = "all"

    def rate(self, weights: float) -> float:
        """Milliseconds per megabyte of weights read in a model of `weights` bytes."""
        x = (math.log(max(weights, 1.0)) - math.log(self.cache_bytes)) / self.width
        share = 1.0 / (1.0 + math.exp(-min(max(x, -50.0), 50.0)))
        return self.resident_ms_per_mb + (self.streamed_ms_per_mb - self.resident_ms_per_mb) * share

    def prices(self, layer: LayerSpec) -> bool:
        """Whether the curve prices `layer`."""
        if not (streams_weights(layer, self.convs) if self.max_rows == 1 else
                rereads_weights(layer, self.max_rows) and self.kernels in ("all", reread_kind(layer))):
            return False
        return self.min_bytes <= layer.weight_bytes and (self.max_bytes is None or layer.weight_bytes <= self.max_bytes)

    def extra_ms(self, layer: LayerSpec, weights: float) -> float:
        """What `layer` costs beyond its resident price in a model of `weights` weight bytes
        (0 for a layer that does not stream its weights)."""
        return layer.weight_bytes / 1e6 * (self.rate(weights) - self.resident_ms_per_mb) if self.prices(layer) else 0.0

    def resident_ms(self, layer: LayerSpec) -> float:
        """What `layer` pays for reading its weights at the resident rate (0 for a layer the
        curve does not price)."""
        return layer.weight_bytes / 1e6 * self.resident_ms_per_mb if self.prices(layer) else 0.0


def streams_weights(layer: LayerSpec, convs: bool = True) -> bool:
    """Whether `layer` is a product of one row with a float weight matrix (`WeightStream`): a
    linear layer at one position, or (with `convs`) a 1x1 conv on a 1x1 map (a squeeze-excite
    layer, or the head many models apply after global pooling, which onnxruntime runs as
    that product)."""
    one_row = layer.op == "linear" or (convs and layer.op == "conv" and layer.kernel == (1, 1)
                                       and layer.in_hw == (1, 1))
    return (one_row and layer.out_hw[0] * layer.out_hw[1] == 1 and layer.groups == 1
            and layer.w_bits == 32 and not layer.dequantized)


def rereads_weights(layer: LayerSpec, max_rows: int) -> bool:
    """Whether `layer` is a float conv or linear layer of 2 to `max_rows` output positions
    (tokens, or pixels of its output map), or a conv of one that `streams_weights` leaves
    out (a 3x3 conv on a 1x1 map): it computes a few rows per weight, too few to hide
    reading them from memory where the model's weights do not stay in the caches between
    runs (`overhead.weight_reread`: ViT-B/16's linear layers of 37 tokens, ConvNeXt's of
    16-64 and ResNet's last-stage convs of 25)."""
    rows = layer.out_hw[0] * layer.out_hw[1]
    return (layer.op in ("conv", "linear") and rows <= max_rows and layer.w_bits == 32 and not layer.dequantized
            and layer.params > 0 and not streams_weights(layer, convs=True))


def reread_kind(layer: LayerSpec) -> str:
    """Which curve of `overhead.weight_reread` prices a layer of a few rows: "spatial" for a
    conv of a kernel over 1x1 (it reads its weights again for each row of its output),
    "pointwise" for the others."""
    return "spatial" if layer.op == "conv" and layer.kernel[0] * layer.kernel[1] > 1 else "pointwise"


def weight_bytes(layers: Sequence[LayerSpec]) -> float:
    """A model's weights, in bytes."""
    return sum(layer.params * layer.w_bits for layer in layers) / 8


class LayoutCost(_Strict):
    """What onnxruntime's layout reorders cost (`layout.reorders`: the nodes moving a tensor
    into its blocked channel layout, "in", or out of it, "out"): each reorder a fixed cost,
    plus a time per element moved, one rate for tensors under `cut_elements` elements (in
    the caches) and another for larger ones.  Each direction: [fixed ms, ms per element
    under the cut, ms per element from it].  `block`: the vector width in floats the runtime
    blocks channels by on this machine (`layout.BLOCKS`), whose reorders are priced."""
    block: PositiveInt
    cut_elements: PositiveInt
    reorder_in: tuple[NonNegativeFloat, NonNegativeFloat, NonNegativeFloat]
    reorder_out: tuple[NonNegativeFloat, NonNegativeFloat, NonNegativeFloat]

    def ms(self, direction: str, elements: int) -> float:
        fixed, small, large = self.reorder_in if direction == "in" else self.reorder_out
        return fixed + elements * (small if elements < self.cut_elements else large)


class Overhead(_Strict):
    per_model_ms: NonNegativeFloat = 0.0  # fixed cost of one inference run
    per_layer_ms: float = 0.0             # added to every priced layer
    per_kernel_ms: dict[str, float] = {}  # kernel group (`kernel_group`) -> added to each of its layers
    working_set: Optional[WorkingSet] = None
    weight_stream: Optional[WeightStream] = None
    # for layers of a few rows (`rereads_weights`): one curve, or one per `WeightStream.kernels`
    weight_reread: Optional[WeightStream | list[WeightStream]] = None
    layout: Optional[LayoutCost] = None   # priced where a model's layout reorders are known

    def rereads(self) -> list[WeightStream]:
        """The curves of `weight_reread`, as a list."""
        r = self.weight_reread
        return [] if r is None else list(r) if isinstance(r, list) else [r]


def working_set_bytes(layers: Sequence[LayerSpec]) -> float:
    """A model's working set: its weights and the activations its layers write, in bytes."""
    return weight_bytes(layers) + sum(layer.out_elems * layer.a_bits for layer in layers) / 8  # bits to bytes


def working_set_factor(working_set: Optional[WorkingSet], layers: Sequence[LayerSpec]) -> float:
    """What `working_set` scales the kernels of the model `layers` by (1 without one)."""
    if working_set is None or not layers:
        return 1.0
    size = max(working_set_bytes(layers), 1.0)
    if working_set.knee_bytes is not None:
        size = min(size, working_set.knee_bytes)
    low, high = WORKING_SET_CLIP
    return min(max(1.0 + working_set.slope * math.log(size / working_set.ref_bytes), low), high)


class LutSpec(_Strict):
    name: str
    kind: Literal["lut"]
    description: str = ""
    lut: str = "lut.csv"                  # the table, relative to the spec's folder
    models_energy: bool = False
    energy: str = ""                      # how energy was measured, or why it is not
    overhead: Overhead = Overhead()
    regressors: dict[str, Literal["additive", "ridge", "boost", "nearest"]] = {}  # kernel type -> regressor
    # true: a layer of a row's exact shape costs what the row says; false (profiled devices,
    # whose rows are each one in-context measurement): every layer is priced by its type's
    # regressor, fitted to all the rows, so one row's noise is evened out by its neighbours
    exact_rows: bool = True
    measurement: dict[str, Any] = {}      # how the table was measured (protocol, machine)
    fit: dict[str, Any] = {}              # how the device was fitted, with its errors


# --- rows and features -----------------------------------------------------------------

def layer_from_row(row: dict) -> LayerSpec:
    """The LayerSpec a table row describes (values already converted)."""
    return LayerSpec(row["op"], row["in_ch"], row["out_ch"], (row["in_h"], row["in_w"]),
                     (row["out_h"], row["out_w"]), (row["kernel_h"], row["kernel_w"]), row["stride"],
                     row["groups"], row["w_bits"], row["a_bits"], fn=row["fn"],
                     dequantized=bool(row.get(DEQUANTIZED_COLUMN, 0)))


def _row_key(row: dict) -> tuple:
    """`LayerSpec.shape_key` of the layer a table row describes, without building it."""
    return (row["op"], row["in_ch"], row["out_ch"], (row["in_h"], row["in_w"]), (row["out_h"], row["out_w"]),
            (row["kernel_h"], row["kernel_w"]), row["stride"], row["groups"], row["w_bits"], row["a_bits"], row["fn"],
            bool(row.get(DEQUANTIZED_COLUMN, 0)))


def row_from_layer(layer: LayerSpec, latency_ms: float, energy_mj: Optional[float] = None) -> dict:
    row = {"op": layer.op, "in_ch": layer.in_ch, "out_ch": layer.out_ch, "in_h": layer.in_hw[0],
           "in_w": layer.in_hw[1], "out_h": layer.out_hw[0], "out_w": layer.out_hw[1],
           "kernel_h": layer.kernel[0], "kernel_w": layer.kernel[1], "stride": layer.stride,
           "groups": layer.groups, "w_bits": layer.w_bits, "a_bits": layer.a_bits, "fn": layer.fn,
           DEQUANTIZED_COLUMN: int(layer.dequantized), "latency_ms": latency_ms}
    if energy_mj is not None:
        row[ENERGY_COLUMN] = energy_mj
    return row


def read_lut(path: Path) -> list[dict]:
    """The rows of a kernel table, checked: every documented column present, numbers
    where numbers belong, a known op, a positive latency.  Errors name the file, the
    line and the column."""
    text = specs.read_text(path)
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    specs.unique_columns(path, header)
    missing = [c for c in LUT_COLUMNS if c not in header]
    if missing:
        raise ConfigError(f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                          f"a kernel table needs: "
                          f"{', '.join(LUT_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})")
    reader.fieldnames = header
    has_energy = ENERGY_COLUMN in header
    rows = []
    for line, raw in enumerate(reader, start=2):
        if None in raw or None in raw.values():  # csv's marks of a row longer or shorter than the header
            fields = len(raw) - 1 + len(raw[None]) if None in raw else sum(v is not None for v in raw.values())
            raise ConfigError(f"{path}: line {line}: {fields} fields, the header has {len(header)}")
        row: dict[str, Any] = {"op": (raw["op"] or "").strip(), "fn": (raw["fn"] or "").strip()}
        if row["op"] not in OPS:
            raise ConfigError(f"{path}: line {line}: op '{row['op']}' is not one of {', '.join(sorted(OPS))}")
        for col in _INT_COLUMNS:
            row[col] = _number(raw[col], int, path, line, col)
        if DEQUANTIZED_COLUMN in header:
            flag = (raw[DEQUANTIZED_COLUMN] or "0").strip()
            if flag not in ("0", "1"):
                raise ConfigError(f"{path}: line {line}: {DEQUANTIZED_COLUMN} '{flag}' is not 0 or 1")
            row[DEQUANTIZED_COLUMN] = int(flag)
        for col in ("w_bits", "a_bits"):
            if row[col] > 32:
                raise ConfigError(f"{path}: line {line}: {col} {row[col]} is not a bit width; allowed: 1-32")
        if row["op"] == "conv" and (row["in_ch"] % row["groups"] or row["out_ch"] % row["groups"]):
            raise ConfigError(f"{path}: line {line}: groups {row['groups']} does not divide in_ch {row['in_ch']} "
                              f"and out_ch {row['out_ch']}")
        for col in ("latency_ms", ENERGY_COLUMN) if has_energy else ("latency_ms",):
            row[col] = _number(raw[col], float, path, line, col)
            if not row[col] >= MIN_COST[col]:
                raise ConfigError(f"{path}: line {line}: {col} {raw[col].strip()} is below {MIN_COST[col]:g} "
                                  f"(allowed: a measured cost of at least {MIN_COST[col]:g})" if row[col] > 0 else
                                  f"{path}: line {line}: {col} must be positive, got {raw[col]}")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: the table has no rows")
    return rows


def _number(text, kind, path, line, col):
    if kind is int and text.isdigit():  # the common case, fast: a table has ~100k such cells
        value = int(text)
        if value >= (0 if col in ("in_h", "in_w") else 1):
            return value
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: line {line}: {col} '{text}' is not a number") from None
    if not np.isfinite(value):
        raise ConfigError(f"{path}: line {line}: {col} '{text.strip()}' is not a finite number")
    if kind is int:
        if value != int(value) or value < (0 if col in ("in_h", "in_w") else 1):
            raise ConfigError(f"{path}: line {line}: {col} '{text}' is not a positive whole number")
        return int(value)
    return value


def write_lut(path: Path, rows: Sequence[dict]) -> None:
    columns = list(LUT_COLUMNS) + [DEQUANTIZED_COLUMN] * any(r.get(DEQUANTIZED_COLUMN) for r in rows) \
        + [ENERGY_COLUMN] * bool(rows and ENERGY_COLUMN in rows[0])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, restval=0, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: f"{v:.8g}" if isinstance(v, float) else v for c in columns if (v := row.get(c)) is not None})


# Ops whose sub-kind (`fn`) is the computation itself, not an activation fused into it.
_FN_IS_THE_OP = frozenset({"act", "pool", "norm", "data", "resize"})


def kernel_type(layer: LayerSpec) -> str:
    """What a regressor is fitted per: the op, convs split into dense, grouped, depthwise
    (and depthwise convs run channel by channel, `_plain_depthwise`) and depthwise with a
    channel multiplier (`conv_mult`, `_depthwise`), residual
    sums a conv accumulates (`add` with fn `sum`) apart from other adds, and the bit widths
    where they are not float32 (quantized kernels are other kernels, and those that run
    dequantized others again)."""
    return _type_of(layer.op, layer.groups, layer.in_ch, layer.w_bits, layer.a_bits, layer.dequantized, layer.fn,
                    layer.out_ch)


def kernel_group(layer: LayerSpec) -> str:
    """What a per-kernel offset (`overhead.per_kernel_ms`) is fitted per: the kernel type
    (`kernel_type`), whatever the bit widths."""
    return _name_of(layer.op, layer.groups, layer.in_ch, layer.w_bits, layer.a_bits, layer.dequantized, layer.fn,
                    layer.out_ch)


def _type_of(op: str, groups: int, in_ch: int, w_bits: int, a_bits: int, dequantized: bool, fn: str = "",
             out_ch: Optional[int] = None) -> str:
    name = _name_of(op, groups, in_ch, w_bits, a_bits, dequantized, fn, out_ch)
    if (w_bits, a_bits) == (32, 32):
        return name
    return f"{name}_w{w_bits}a{a_bits}" + ("_dq" if dequantized else "")


# A float depthwise conv runs in a blocked-layout kernel only where its channels are a
# multiple of this; else channel by channel (`_plain_depthwise`).
DEPTHWISE_ALIGN = 4


def _depthwise(groups: int, in_ch: int, out_ch: Optional[int]) -> bool:
    """A depthwise conv: one input and one output channel per group.  A grouped conv of one
    input channel and several outputs per group (a depthwise conv with a channel multiplier:
    FastViT's and MobileOne's downsampling, Xception-style separable convs) is not one for a
    runtime: onnxruntime runs it group by group, at a third of the speed per MAC of a
    depthwise conv of the same input (6 against 12-18 GMAC/s here, `benchmarks/depthwise.py`),
    a kernel type of its own (`conv_mult`; priced as grouped convs where a table has none).
    `out_ch` None: taken as the input's (rows of tables saved before the two were told
    apart)."""
    return groups > 1 and groups == in_ch and (out_ch is None or out_ch == in_ch)


def _plain_depthwise(op: str, groups: int, in_ch: int, w_bits: int, a_bits: int, dequantized: bool,
                     out_ch: Optional[int] = None) -> bool:
    """A float depthwise conv (a dequantized one too: it runs the float kernel) whose
    channels are not a multiple of DEPTHWISE_ALIGN.  onnxruntime runs it in its plain
    channels-first conv, one im2col and GEMM per channel: a fixed cost per channel (about
    0.3 µs here) besides the work, 3x the time of an aligned one at 28x28 (58 channels: 0.10
    ms, against 0.033 ms for 56 or 60; `benchmarks/depthwise.py`)."""
    return (op == "conv" and _depthwise(groups, in_ch, out_ch) and in_ch % DEPTHWISE_ALIGN != 0
            and ((w_bits, a_bits) == (32, 32) or dequantized))


def _name_of(op: str, groups: int, in_ch: int, w_bits: int, a_bits: int, dequantized: bool, fn: str = "",
             out_ch: Optional[int] = None) -> str:
    # A grouped conv (1 < groups < channels: ResNeXt, RegNet) is a kernel of its own: a
    # runtime's blocked-layout conv takes it only where each group holds whole vector
    # blocks, else it runs group by group (onnxruntime: 3x the time per MAC of a dense conv
    # for groups of 8 channels on AVX-512).  So is a depthwise conv run channel by channel
    # (`_plain_depthwise`).  A residual sum that the conv before it accumulates into its
    # output (onnxruntime runs no node of its own for it) is another kernel than a
    # stand-alone add: measured in context it costs next to nothing.
    # An 8-bit max pool run in a plain channels-first kernel (`MAX_NCHW`) is another kernel
    # than one in the integer convs' channels-last layout: about 30x its time per element.
    # A transpose or a reduction run without contiguous blocks (`STRIDED`) is another kernel
    # than one run on them: 4-20x its time per element.  An add fused with the layer norm
    # after it (`SKIP`) holds a share of the fused kernel: 1.3-2.8 ns per element against
    # 0.2-0.4 for other adds.  A layer norm run op by op (`LAYER_OPS`) is nine kernels, each a
    # pass over the tensor: about twice a fused layer norm's time (0.12 ms against 0.06 for
    # a [1, 48, 40, 40] tensor here).
    if op == "conv" and groups != 1:
        if _plain_depthwise(op, groups, in_ch, w_bits, a_bits, dequantized, out_ch):
            return "conv_dw_nchw"
        if _depthwise(groups, in_ch, out_ch):
            return "conv_dw"
        return "conv_mult" if groups == in_ch else "conv_g"
    if op == "add" and fn == SUM:
        return "add_sum"
    if op == "add" and fn == SKIP:
        return "add_skip"
    if op == "pool" and fn == MAX_NCHW:
        return "pool_nchw"
    if op in ("data", "pool") and fn == STRIDED:
        return f"{op}_strided"
    if op == "norm" and fn == LAYER_OPS:
        return "norm_ops"
    return op


# Kernel types a table without rows of their own prices from another's: channel-multiplier
# convs from grouped ones, grouped convs from dense ones, channel-by-channel depthwise convs
# from the others, residual sums from stand-alone adds, plain-kernel 8-bit max pools,
# strided transposes and reductions from the others, layer norms run op by op from fused
# ones (tables made before each was told apart).
_FALLBACK_TYPES = (("conv_mult", "conv_g"), ("conv_g", "conv"), ("conv_dw_nchw", "conv_dw"), ("add_sum", "add"),
                   ("pool_nchw", "pool"), ("data_strided", "data"), ("pool_strided", "pool"), ("add_skip", "add"),
                   ("norm_ops", "norm"))
# What such a layer is for a type that does not tell it apart: (op, fn) -> the general fn.
_GENERAL_FN = {("pool", MAX_NCHW): "max", ("data", STRIDED): "transpose", ("pool", STRIDED): "avg",
               ("add", SKIP): "", ("norm", LAYER_OPS): "layer"}


def as_general(layer: LayerSpec) -> LayerSpec:
    """A layer of a kernel type told apart from its op's others (a plain-kernel 8-bit max
    pool, a strided transpose or reduction, an add fused into a layer norm, a layer norm run
    op by op) as the layer of the general type it also is, for a table without rows of its
    own type; any other layer as it is."""
    fn = _GENERAL_FN.get((layer.op, layer.fn))
    return replace(layer, fn=fn) if fn is not None else layer


def _fallback_types(ktype: str) -> list[str]:
    """The kernel types a table without rows of `ktype` prices it from, nearest first
    (`conv_mult` -> `conv_g` -> `conv`)."""
    chain = [ktype]
    while (general := _fallback_type(chain[-1])) != chain[-1]:
        chain.append(general)
    return chain[1:]


def _fallback_type(ktype: str) -> str:
    """The kernel type a table without rows of `ktype` prices it from (`conv_g...` ->
    `conv...`, `add_sum...` -> `add...`); `ktype` itself where there is none."""
    for special, general in _FALLBACK_TYPES:
        if ktype.startswith(special):
            return general + ktype[len(special):]
    return ktype


# Activations runtimes do not fuse into a conv or linear kernel: an extra pass over the output.
_UNFUSED = frozenset({"hardswish", "swish", "gelu"})
# Sub-kinds the regressors tell apart (others count as none of them).
FN_VOCAB = ("relu", "clip", "sigmoid", "hardsigmoid", "hardswish", "swish", "gelu", "max", "avg", "nearest",
            "linear", "batch", "layer", "transpose", "slice", "gather")
FEATURES = ("log_macs", "log_padded_macs", "log_in", "log_out", "log_params", "log_in_ch", "log_out_ch",
            "log_in_pos", "log_out_pos", "log_kernel", "stride", "log_groups", "log_w_bits", "log_a_bits",
            "out_ch_align", "in_ch_align", "tokens") + tuple(f"fn_{f}" for f in FN_VOCAB) + ("log_copies",)
FEATURES_BEFORE_COPIES = FEATURES.index("log_copies")  # the features regressors saved before it read
# Sub-kinds told apart since (appended, so that regressors saved before read their own features)
FN_LATER = ("erf",)  # a stand-alone Erf: a GELU of a quantized transformer, run op by op
FEATURES += tuple(f"fn_{f}" for f in FN_LATER)
BLOCK = 16  # channel block of vectorised CPU kernels (AVX-512 floats)


def _align(channels):
    """How well a channel count fits vector blocks: log2 of the largest power of two up to
    BLOCK dividing it (element-wise over an integer array).  Runtimes take a blocked-layout
    kernel only for whole blocks (a depthwise conv's channels, a dense conv's input
    channels) and fall back to slower ones, slower still for odd counts."""
    c = np.asarray(channels, dtype=np.int64)
    return np.log2(np.minimum(c & -c, BLOCK).astype(float))


def _padded_macs(layer: LayerSpec) -> int:
    """MACs with the channels of a dense conv rounded up to whole vector blocks."""
    if layer.op != "conv" or layer.groups != 1:
        return layer.macs
    up = lambda c: -(-c // BLOCK) * BLOCK  # noqa: E731
    # Input channels are padded only from a whole block up: onnxruntime runs a conv of fewer
    # on its input as it is, and pads more to whole blocks (`benchmarks/conv_channels.py`:
    # 8 -> 32 channels, 3x3 at 47x47, 0.12 ms against 0.20 ms for 16 -> 32; 20 and 24 input
    # channels cost what 32 do).  8-15 channels counted as 16 before REGRESSORS_FORMAT 8.
    cin = up(layer.in_ch) if layer.in_ch >= BLOCK else layer.in_ch
    return layer.out_hw[0] * layer.out_hw[1] * up(layer.out_ch) * cin * layer.kernel[0] * layer.kernel[1]


def features(layers: Sequence[LayerSpec]) -> np.ndarray:
    """Log-scale size features, channel alignment and the sub-kind, one row per layer
    (each column computed over all layers at once: a device prices and fits thousands)."""
    n = len(layers)
    raw = np.array([(l.macs, _padded_macs(l), l.in_elems, l.out_elems, l.params, l.in_ch, l.out_ch,
                     l.in_hw[0] * l.in_hw[1], l.out_hw[0] * l.out_hw[1], l.kernel[0] * l.kernel[1], l.stride,
                     l.groups, l.w_bits, l.a_bits, _copies(l)) for l in layers], dtype=float).reshape(n, 15)
    channels = np.array([(l.out_ch, l.in_ch // l.groups) for l in layers], dtype=np.int64).reshape(n, 2)
    tokens = np.array([l.in_hw[1] == 1 and l.in_hw[0] > 1 for l in layers], dtype=float)
    fns = [_FEATURE_FN.get(l.fn, l.fn) for l in layers]

    def onehot(vocab: Sequence[str]) -> np.ndarray:
        return np.array([[fn == f for f in vocab] for fn in fns], dtype=float).reshape(n, len(vocab))

    logged = np.log1p(raw)
    return np.column_stack([logged[:, :10], raw[:, 10], logged[:, 11:14], _align(channels), tokens,
                            onehot(FN_VOCAB), logged[:, 14], onehot(FN_LATER)])


# A transpose moving the innermost dim reads as a transpose to the regressors (its copies
# tell it apart); so they price it as before it was labelled so.
_FEATURE_FN = {MOVES_INNER: "transpose"}


def _copies(layer: LayerSpec) -> int:
    """The separate copies a transpose (`data`) makes: its elements over the contiguous
    block each copy moves, the trailing dims it leaves in place (1 where the innermost
    dim moves); 0 for any other op.  onnxruntime's CPU transpose costs about the same for
    blocks of 3 to 24 floats here (5.7-7.3 ns a copy over 1,024 copies) and grows slowly
    beyond (`benchmarks/transposes.py`): a (16, 4, 12) -> (4, 16, 12) transpose (attention
    heads of 12 channels) makes 64 copies, not 768."""
    if layer.op != "data":
        return 0
    if layer.fn == MOVES_INNER:
        return max(layer.in_elems, 1)
    block = 1
    for a, b in zip((layer.in_hw[1], layer.in_hw[0], layer.in_ch), (layer.out_hw[1], layer.out_hw[0], layer.out_ch)):
        if a != b:
            break
        block *= a
    return max(layer.in_elems // block, 1)


def _products(layer: LayerSpec) -> int:
    """The matrix products a layer runs one after another: a product of two activations
    over a batch (`matmul`, e.g. attention scores over heads: positions (M, batch)) is one
    GEMM call per batch item, each with its own fixed cost; any other layer, none."""
    return layer.in_hw[1] if layer.op == "matmul" else 0


TERMS = 7


def _calls(layer: LayerSpec, per_channel: bool = True) -> int:
    """The kernel calls a layer's kernel makes, each with its fixed cost: with
    `per_channel`, one per channel for a depthwise conv run channel by channel
    (`_plain_depthwise`); else one.  A regressor fitted to other kernels (which prices such
    a conv where the table has none) counts one (`_per_channel`)."""
    plain = per_channel and _plain_depthwise(layer.op, layer.groups, layer.in_ch, layer.w_bits, layer.a_bits,
                                             layer.dequantized, layer.out_ch)
    return layer.groups if plain else 1


def _per_channel(layers: Sequence[LayerSpec]) -> bool:
    """Whether a regressor fitted to these layers counts a call per channel (`_calls`)."""
    return any(_calls(l) > 1 for l in layers)


def _terms(layers: Sequence[LayerSpec], per_channel: bool = True) -> np.ndarray:
    """The physical terms of an `additive` regressor: a fixed cost per kernel call
    (`_calls`), MACs, elements moved, weights, the output again for an activation the
    kernel does not fuse, the matrix products of a batched product (`_products`) and the
    copies of a transpose (`_copies`)."""
    rows = [[float(_calls(l, per_channel)), l.macs, l.in_elems + l.out_elems, l.params,
             l.out_elems * (l.fn in _UNFUSED), _products(l), _copies(l)] for l in layers]
    return np.array(rows, dtype=float).reshape(len(layers), TERMS)


# --- regressors (log latency from layers; fitted on first use, nothing pickled) ----

class _Ridge:
    """Regularised linear model of log latency on the log-scale features.  A layer's
    standardised features are held within one standard deviation of the fitted rows'
    range: a feature that barely varied over the rows (and so got a large weight) does not
    send a new layer's price to infinity."""

    def fit(self, layers, y):
        X = features(layers)
        self.mu, self.sd = X.mean(0), X.std(0)
        self.sd[self.sd == 0] = 1.0
        Z = (X - self.mu) / self.sd
        self.lo, self.hi = Z.min(0) - 1.0, Z.max(0) + 1.0
        Z = np.hstack([Z, np.ones((len(X), 1))])
        reg = 1e-2 * len(X) * np.eye(Z.shape[1])
        reg[-1, -1] = 0.0
        self.w = np.linalg.solve(Z.T @ Z + reg, Z.T @ y)
        return self

    @property
    def state(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("mu", "sd", "w", "lo", "hi")}

    def restore(self, state: dict):
        self.mu, self.sd, self.w, self.lo, self.hi = (np.array(state[k], dtype=float)
                                                      for k in ("mu", "sd", "w", "lo", "hi"))
        # a state saved before a feature was added prices without it (weight 0, before the intercept)
        missing = len(FEATURES) - len(self.mu)
        if missing > 0:
            self.mu, self.lo, self.hi = (np.pad(a, (0, missing)) for a in (self.mu, self.lo, self.hi))
            self.sd = np.pad(self.sd, (0, missing), constant_values=1.0)
            self.w = np.r_[self.w[:-1], np.zeros(missing), self.w[-1:]]
        return self

    def predict(self, layers):
        Z = np.clip((features(layers) - self.mu) / self.sd, self.lo, self.hi)
        return np.hstack([Z, np.ones((len(layers), 1))]) @ self.w


class _Additive:
    """latency = non-negative combination of the physical terms (relative least squares)."""

    def fit(self, layers, y):
        from scipy.optimize import nnls

        A, t = _terms(layers), np.exp(y)
        scale = A.max(axis=0)
        scale[scale == 0] = 1.0
        self.w = nnls(A / scale / t[:, None], np.ones(len(t)), maxiter=1000)[0] / scale
        self.per_channel = _per_channel(layers)
        return self

    @property
    def state(self) -> dict:
        return {"w": self.w.tolist(), "per_channel": self.per_channel}

    def restore(self, state: dict):
        # weights saved before a term was added price without it (weight 0)
        self.w = np.pad(np.array(state["w"], dtype=float), (0, max(0, TERMS - len(state["w"]))))
        self.per_channel = bool(state.get("per_channel", False))
        return self

    def predict(self, layers):
        return np.log(np.maximum(_terms(layers, self.per_channel) @ self.w, 1e-9))


BOOST_SEEDS = 5  # boosted models a `boost` regressor averages (`_Boost`)


class _Boost:
    """Gradient-boosted trees on the log-scale features predicting the log of the time per
    unit of work (MACs with channels padded to vector blocks, else elements moved, plus
    the type's fixed cost in units of work - `_fixed_work`): a smooth target, and beyond
    the measured sizes the rate of the nearest ones holds.  Kept as plain arrays
    (`nasctl.trees`): `state` is what `regressors.json` stores.

    It is the mean of BOOST_SEEDS such models grown from seeds 0, 1, ...: a tree takes
    among splits that part the rows alike (features that order them the same way) the one
    a random order of the features comes to first, and which one it took decides the
    price of a kernel unlike the rows.  One model's seed alone moved published models'
    prices by up to 7% (int8 MobileNetV4, RegNetY); five averaged, by up to 2.5%
    (`benchmarks/README.md`)."""

    def fit(self, layers, y):
        fixed = _fixed_work(layers, y)
        target = y - np.log(_work(layers, fixed))
        X = features(layers)
        models = [trees.fit_lad(X, target, n_estimators=300, learning_rate=0.1, max_depth=5, min_samples_leaf=3,
                                seed=seed) for seed in range(BOOST_SEEDS)]
        return self.restore({**trees.pack(trees.average(models)), "fixed_work": fixed,
                             "per_channel": _per_channel(layers)})

    def restore(self, state: dict):
        self.state, self.ensemble = state, trees.Ensemble(state)
        self.fixed = float(state.get("fixed_work", 0.0))  # 0 in regressors saved before it was fitted
        self.per_channel = bool(state.get("per_channel", False))
        return self

    def predict(self, layers):
        return np.log(_work(layers, self.fixed, self.per_channel)) + self.ensemble.predict(features(layers))


class _Nearest:
    """Priced like the most similar measured kernels: the throughput (work per ms) of the k
    nearest rows in the standardised log-feature space, distance-weighted, times this
    kernel's work (MACs with channels padded to vector blocks, else elements moved, plus
    the type's fixed cost in units of work - `_fixed_work`).
    It is the rows themselves, refitted from the table; only the fixed work and how many
    of the features it reads are saved (`state`), which spares pricing the least-squares
    fit and its scipy import; one saved before a feature was added reads the features of
    its day (`FEATURES_BEFORE_COPIES`), so that it finds the same neighbours."""

    k = 5

    def fit(self, layers, y, fixed: Optional[float] = None, width: Optional[int] = None):
        self.width = len(FEATURES) if width is None else int(width)
        X = features(layers)[:, :self.width]
        self.mu, self.sd = X.mean(0), X.std(0)
        self.sd[self.sd == 0] = 1.0
        self.Z = (X - self.mu) / self.sd
        self.fixed = _fixed_work(layers, y) if fixed is None else float(fixed)
        self.rate = y - np.log(_work(layers, self.fixed))
        self.per_channel = _per_channel(layers)
        return self

    @property
    def state(self) -> dict:
        return {"fixed_work": self.fixed, "features": self.width}

    def predict(self, layers):
        Z = (features(layers)[:, :self.width] - self.mu) / self.sd
        d = np.sqrt(((Z[:, None, :] - self.Z[None, :, :]) ** 2).sum(-1))
        k = min(self.k, len(self.Z))
        idx = np.argsort(d, axis=1)[:, :k]
        w = 1.0 / (np.take_along_axis(d, idx, 1) + 1e-3)
        return np.log(_work(layers, self.fixed, self.per_channel)) + (w * self.rate[idx]).sum(1) / w.sum(1)


def _work(layers: Sequence[LayerSpec], fixed: float = 0.0, per_channel: bool = True) -> np.ndarray:
    """Each layer's work (MACs with channels padded to vector blocks, else elements moved),
    plus `fixed` work for each of its kernel calls (`_calls`)."""
    return np.array([max(_padded_macs(l) if l.macs else l.in_elems + l.out_elems, 1) + fixed * _calls(l, per_channel)
                     for l in layers], dtype=float)


def _fixed_work(layers: Sequence[LayerSpec], y: np.ndarray) -> float:
    """A kernel type's fixed cost per kernel call (`_calls`: one per layer but for a
    depthwise conv run channel by channel) in units of its work: `time ≈ a x calls + r x
    work` fitted to the rows (non-negative, least squares on relative errors), `a / r`.

    A small kernel's time is mostly that fixed cost, so its time per unit of work falls
    steeply with its size; trees and neighbours, which hold the rate of similar measured
    kernels, would price a kernel between two measured sizes in proportion to its work -
    a small one at a fraction of what it takes.  The time per unit of (work + fixed work)
    is about flat there, and the same as the time per unit of work for large kernels."""
    from scipy.optimize import nnls

    work, t = _work(layers), np.exp(np.asarray(y, dtype=float))
    if len(t) < 2:
        return 0.0
    calls = np.array([_calls(l) for l in layers], dtype=float)
    scale = np.array([calls.max(), work.max()])
    a, r = nnls(np.c_[calls / scale[0], work / scale[1]] / t[:, None], np.ones(len(t)), maxiter=1000)[0] / scale
    return float(min(a / r, np.median(work))) if r > 0 else float(np.median(work))


_MAKERS = {"ridge": _Ridge, "additive": _Additive, "boost": _Boost, "nearest": _Nearest}


def fit_regressor(kind: str, layers: Sequence[LayerSpec], values: np.ndarray, saved: Optional[dict] = None):
    """A regressor of `kind` fitted to the layers' costs; `saved`: a nearest-neighbour
    regressor's state as saved (its fixed work and the features it reads; else fitted, all)."""
    if saved is None:
        return _MAKERS[kind]().fit(list(layers), np.log(values))
    return _MAKERS[kind]().fit(list(layers), np.log(values), saved["fixed_work"],
                               saved.get("features", FEATURES_BEFORE_COPIES))


def cross_validate(kind: str, layers: Sequence[LayerSpec], values: np.ndarray, groups: Optional[Sequence] = None,
                   folds: int = 5, seed: int = 0) -> float:
    """Cost-weighted mean absolute error (%) of `kind` on held-out rows, k-fold: the
    error in a sum of many such kernels.  With `groups` (e.g. the network each row was
    measured in) whole groups are held out together, as a new model would be."""
    n = len(layers)
    rng = np.random.default_rng(seed)
    if groups is None:
        fold = rng.permutation(n) % folds
    else:
        names = sorted(set(groups), key=str)
        of_group = dict(zip(names, rng.permutation(len(names)) % folds))
        fold = np.array([of_group[g] for g in groups])
    pred = np.full(n, np.nan)
    for k in range(folds):
        test, train = np.flatnonzero(fold == k), np.flatnonzero(fold != k)
        if len(test) and len(train):
            model = fit_regressor(kind, [layers[i] for i in train], values[train])
            pred[test] = np.exp(model.predict([layers[i] for i in test]))
    ok = ~np.isnan(pred)
    return float(np.sum(np.abs(pred[ok] - values[ok])) / np.sum(values[ok]) * 100)


def choose_regressor(layers: Sequence[LayerSpec], values: np.ndarray,
                     groups: Optional[Sequence] = None) -> tuple[str, dict[str, float]]:
    """The regressor with the least cross-validated error for these rows, and each one's error."""
    if len(layers) < 5 or (groups is not None and len(set(groups)) < 2):
        return "additive", {}
    candidates = [k for k in REGRESSORS if len(layers) >= MIN_ROWS[k]]
    errors = {k: round(cross_validate(k, layers, values, groups), 2) for k in candidates}
    return min(errors, key=errors.get), errors


# --- what is saved beside the table ------------------------------------------------------

def _saved_doc(table: Optional[Path]) -> Optional[dict]:
    """`regressors.json` beside the table, if it was written for exactly this table (its
    SHA-256): the fitted regressors and the table's rows as read and checked then."""
    path = None if table is None else Path(table).parent / REGRESSORS_FILE
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        digest = hashlib.sha256(Path(table).read_bytes()).hexdigest()
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") not in (1, 3, 4, 5, 6, 7, 8) or data.get("table") != digest:
        return None
    if data["format"] < 7:  # before grouped (5), channel-by-channel depthwise (6) and
        data = _retyped(data)  # channel-multiplier (7) convs had types of their own
    if data["format"] < 8:
        data = _repadded(data)
    return data


def _repadded(data: dict) -> dict:
    """A `regressors.json` of format 7 or older, read as format 8: the regressors of the
    kernel types holding dense convs of 8-15 input channels, whose padded MACs (a feature,
    and the work of nearest-neighbour regressors) changed, dropped (fitted again when first
    needed)."""
    merged = data.get("merged")
    if not merged:
        return data  # (no merged rows before format 4: `_retyped` dropped every conv type)
    c = merged["columns"]
    changed = {t for t, op, g, cin in zip(merged["types"], c["op"], c["groups"], c["in_ch"])
               if op == "conv" and g == 1 and 8 <= cin < BLOCK}
    return {**data, "types": {k: v for k, v in data.get("types", {}).items() if k not in changed},
            "largest": {k: v for k, v in (data.get("largest") or {}).items() if k not in changed}}


def _retyped(data: dict) -> dict:
    """A `regressors.json` of format 6 or older, read as format 7 (then as 8, `_repadded`):
    its kernels' types taken again (grouped convs were among the dense ones before format
    5, depthwise convs run channel by channel among the others before 6, depthwise convs
    with a channel multiplier among the depthwise ones before 7), and the regressors of the
    types whose rows changed dropped (fitted again when first needed)."""
    merged = data.get("merged")
    if not merged:
        return {**data, "types": {k: v for k, v in data.get("types", {}).items() if not k.startswith("conv")}}
    c = merged["columns"]
    dq = c.get(DEQUANTIZED_COLUMN) or [0] * len(c["op"])
    types = [_type_of(*row) for row in zip(c["op"], c["groups"], c["in_ch"], c["w_bits"], c["a_bits"], map(bool, dq),
                                           c["fn"], c["out_ch"])]
    changed = {t for old, new in zip(merged["types"], types) if old != new for t in (old, new)}  # lost or gained rows
    largest = {k: v for k, v in (data.get("largest") or {}).items() if k not in changed}
    return {**data, "types": {k: v for k, v in data.get("types", {}).items() if k not in changed},
            "largest": largest, "merged": {**merged, "types": types}}


def _rows_of_columns(columns: dict) -> list[dict]:
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(columns[n] for n in names))]


class _TypeRows(Mapping):
    """Kernel type -> its distinct kernels as rows (repeated ones merged to their median),
    built per type when first asked for, from the columns `regressors.json` keeps: pricing
    a model needs the rows of few types, or of none where their regressors are saved."""

    def __init__(self, columns: dict[str, list], types: list[str]):
        self._columns, self._built = columns, {}
        self._index: dict[str, list[int]] = {}
        for i, t in enumerate(types):
            self._index.setdefault(t, []).append(i)

    def __getitem__(self, ktype: str) -> list[dict]:
        if ktype not in self._built:
            idx = self._index[ktype]  # KeyError for a type the table lacks, as a dict's
            names = list(self._columns)
            columns = [[self._columns[n][i] for i in idx] for n in names]  # column by column: fewer steps
            self._built[ktype] = [dict(zip(names, values)) for values in zip(*columns)]
        return self._built[ktype]

    def __contains__(self, ktype) -> bool:
        return ktype in self._index

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def count(self, ktype: str) -> int:
        return len(self._index[ktype])


# --- the device ------------------------------------------------------------------------

class LutDevice(CostModel):
    """Prices layers from a measured kernel table; see the module docstring."""

    def __init__(self, spec: LutSpec, rows: Optional[Sequence[dict]], source: Optional[Path] = None,
                 saved: Optional[dict] = None):
        """`rows`: the table's rows; None to take its distinct kernels from `saved` (a
        `regressors.json` document of format 4 or later, written for this table)."""
        self.spec = spec
        self.name = spec.name
        self.source = source
        doc = saved if saved is not None else _saved_doc(source)
        merged = (doc or {}).get("merged") if rows is None else None
        if rows is None and merged is None:
            raise ValueError("a LutDevice needs the table's rows or a saved document holding its kernels")
        has_energy = (ENERGY_COLUMN in merged["columns"]) if merged is not None else \
            all(ENERGY_COLUMN in r for r in rows)
        if spec.models_energy and not has_energy:
            raise ConfigError(f"{spec.name}: models_energy is true but the table has no {ENERGY_COLUMN} column")
        self.models_energy = spec.models_energy
        self.targets = ["latency_ms"] + ([ENERGY_COLUMN] if self.models_energy else [])
        if merged is not None:
            self._exact, self._rows = self._from_merged(merged)
        else:
            self._exact, self._rows = self._merge(rows)
        count = self._rows.count if isinstance(self._rows, _TypeRows) else (lambda t: len(self._rows[t]))
        self.chosen: dict[str, str] = {}
        for ktype in self._rows:
            kind = spec.regressors.get(ktype, "additive")
            self.chosen[ktype] = kind if count(ktype) >= MIN_ROWS[kind] else "additive"
        self._models: dict[str, list] = {}  # fitted on first use (or restored from regressors.json)
        self._saved = self._saved_types(doc)
        self._cache: dict[tuple, Optional[LayerCost]] = {}
        # shape key -> (the layer's kernel type, the type priced as) where the table has none of its own
        self._stand_in: dict[tuple, tuple[str, str]] = {}
        # kernel type -> the work of its largest kernel (saved with the regressors)
        self._largest: dict[str, float] = {k: float(v) for k, v in ((doc or {}).get("largest") or {}).items()
                                           if k in self._rows}
        self._rate: dict = {}  # kernel type -> `_largest_rate`; (type, sub-kind) -> `_sub_kind_rate`
        self._largest_fn: dict[tuple[str, str], float] = {}  # (kernel type, sub-kind) -> its largest work
        self._row_layers: dict[str, tuple[list[LayerSpec], np.ndarray]] = {}  # `_layers_of`

    def _merge(self, rows: Sequence[dict]) -> tuple[dict, dict]:
        """(shape key -> costs, kernel type -> rows) of the distinct kernels: repeated
        kernels merged to their median."""
        exact: dict[tuple, tuple[float, ...]] = {}
        by_key: dict[tuple, list[dict]] = {}
        by_type: dict[str, list[dict]] = {}
        for row in rows:
            by_key.setdefault(_row_key(row), []).append(row)
        for key, same in by_key.items():
            exact[key] = tuple(float(statistics.median(r[t] for r in same)) for t in self.targets)
            row = same[0]
            ktype = _type_of(row["op"], row["groups"], row["in_ch"], row["w_bits"], row["a_bits"],
                             bool(row.get(DEQUANTIZED_COLUMN, 0)), row["fn"], row["out_ch"])
            by_type.setdefault(ktype, []).append({**row, **dict(zip(self.targets, exact[key]))})
        return exact, by_type

    def _from_merged(self, merged: dict) -> tuple[dict, _TypeRows]:
        c = merged["columns"]
        dq = c.get(DEQUANTIZED_COLUMN) or [0] * len(c["op"])
        keys = [(op, ic, oc, (ih, iw), (oh, ow), (kh, kw), st, g, wb, ab, fn, bool(d)) for
                op, ic, oc, ih, iw, oh, ow, kh, kw, st, g, wb, ab, fn, d in
                zip(c["op"], c["in_ch"], c["out_ch"], c["in_h"], c["in_w"], c["out_h"], c["out_w"], c["kernel_h"],
                    c["kernel_w"], c["stride"], c["groups"], c["w_bits"], c["a_bits"], c["fn"], dq)]
        exact = dict(zip(keys, zip(*(c[t] for t in self.targets))))
        return exact, _TypeRows(c, merged["types"])

    @classmethod
    def from_spec_file(cls, data: dict[str, Any], path: Path) -> LutDevice:
        """Build from the spec read from `path`: its table is found beside it."""
        return cls.from_dict(data, Path(path).parent)

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Optional[Path] = None) -> LutDevice:
        """Build from a parsed spec.  The table's path is relative to the spec's folder -
        `folder`, else the folder of the device of this name in the workspace."""
        spec = LutSpec.model_validate(data)
        path = Path(spec.lut)
        if not path.is_absolute():
            if folder is None:
                try:
                    folder = workspace.find("hardware", spec.name, "device").parent
                except UsageError:
                    raise ConfigError(f"{spec.name}: cannot locate its table '{spec.lut}': load a LUT device by its "
                                      f"name, from a workspace's hardware/{spec.name}/ folder") from None
            path = folder / path
        if not path.is_file():
            raise ConfigError(f"{spec.name}: its kernel table {path} "
                              + ("is a folder, not a CSV file" if path.is_dir() else "does not exist"))
        saved = _saved_doc(path)  # holds the table already read and checked, while the table is unchanged
        if saved and saved.get("merged"):
            device = cls(spec, None, path, saved)
        else:
            rows = _rows_of_columns(saved["rows"]) if saved and saved.get("rows") else read_lut(path)
            device = cls(spec, rows, path, saved or {})
        if saved and saved["format"] < REGRESSORS_FORMAT:
            # Written by an earlier nasctl: the types whose rows changed are fitted once and the
            # file written again, rather than fitted at every start (seconds); a folder that
            # cannot be written keeps the old file.
            try:
                device.save_regressors()
            except OSError:
                pass
        return device

    # -- regressors: fitted when first needed, or restored from regressors.json ---------
    def _table_hash(self) -> Optional[str]:
        return None if self.source is None else hashlib.sha256(Path(self.source).read_bytes()).hexdigest()

    def _saved_types(self, data: Optional[dict]) -> dict:
        """The regressors saved for this table and these targets, by kernel type."""
        if not data or data.get("targets") != self.targets:
            return {}
        return data.get("types", {})

    def _regressors(self, ktype: str) -> list:
        if ktype not in self._models:
            kind, group = self.chosen[ktype], self._rows[ktype]
            saved = self._saved.get(ktype, {})
            if isinstance(saved, str):  # kept as JSON text until a layer of its type is priced
                saved = json.loads(saved)
            # (ridge states saved without their feature bounds, before they had them, are refitted)
            restored = saved.get("kind") == kind and (kind != "ridge" or all("lo" in st for st in saved["states"]))
            if restored and kind != "nearest":
                self._models[ktype] = [_MAKERS[kind]().restore(state) for state in saved["states"]]
            else:  # fitted to the rows (a nearest-neighbour regressor is its rows, its saved fixed work and width)
                layers = self._layers_of(ktype)[0]
                states = saved["states"] if restored else [None] * len(self.targets)
                self._models[ktype] = [fit_regressor(kind, layers, np.array([r[t] for r in group]), st)
                                       for t, st in zip(self.targets, states)]
        return self._models[ktype]

    def save_regressors(self) -> Path:
        """Fit every kernel type and write the regressors beside the table
        (`regressors.json`, tied to the table's hash), so that pricing needs no fitting
        (nearest-neighbour ones keep only their fixed work: they are the rows themselves)."""
        # each type's regressors as JSON text of its own: a device parses only the types it prices
        types = {k: json.dumps({"kind": self.chosen[k], "states": [m.state for m in self._regressors(k)]})
                 for k in self._rows}
        path = Path(self.source).parent / REGRESSORS_FILE
        merged = [(k, r) for k in self._rows for r in self._rows[k]]
        columns = [c for c in (*LUT_COLUMNS, *OPTIONAL_COLUMNS) if all(c in r for _, r in merged)]
        largest = {k: self._largest_work(k) for k in self._rows}
        text = json.dumps({"format": REGRESSORS_FORMAT, "table": self._table_hash(), "targets": self.targets,
                           "types": types, "largest": largest,
                           "merged": {"columns": {c: [r[c] for _, r in merged] for c in columns},
                                      "types": [k for k, _ in merged]}})
        # written whole and then renamed: a device loaded meanwhile reads the old file or the new one
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return path

    def _layer_cost(self, layer: LayerSpec) -> Optional[LayerCost]:
        key = layer.shape_key()
        if key not in self._cache:
            self._price_new([layer])
        return self._cache[key]

    def _price_new(self, layers: Sequence[LayerSpec]) -> None:
        """Price the layers of shapes not priced before: table hits as stored, the others
        by their kernel type's regressors, one batch per type."""
        todo: dict[str, dict[tuple, LayerSpec]] = {}
        for layer in layers:
            key = layer.shape_key()
            if key in self._cache:
                continue
            row = self._exact.get(key)
            if row is None and layer.fn == MOVES_INNER:  # a table made before such transposes were told apart
                row = self._exact.get(replace(layer, fn="transpose").shape_key())
            if row is not None and self.spec.exact_rows:
                self._cache[key] = self._cost(row, "table", layer)
                continue
            # The layer's kernel type; where the table has none of it, or only kernels far
            # smaller than this one (a regressor's rate would be extrapolated from fixed
            # costs), the same kernel fused, then the float kernel - what such a QDQ group runs.
            # Only where the table has none of these is the layer priced as a kernel it is told
            # apart from (`_fallback_types`: a grouped conv of a table without grouped ones from
            # its dense convs): an 8-bit max pool run channels-first, at 30x the time per element
            # of a channels-last one, is priced from its own kernels however small they are.
            variants = [layer, replace(layer, dequantized=False), replace(layer, w_bits=32, a_bits=32, dequantized=False)]
            candidates = [(c, kernel_type(c)) for c in variants]
            own = [(c, t) for c, t in candidates if t in self._rows]
            known = own or [(as_general(c), f) for c, t in candidates for f in _fallback_types(t) if f in self._rows]
            if not known:
                self._cache[key] = None
                continue
            priced, ktype = next(((c, t) for c, t in known if self._covers(t, c)), known[0])
            if not own:
                self._stand_in[key] = (kernel_type(layer), ktype)
            todo.setdefault(ktype, {})[key] = (priced, layer)
        for ktype, batch in todo.items():
            priced = [p for p, _ in batch.values()]
            values = np.exp(np.column_stack([m.predict(priced) for m in self._regressors(ktype)]))
            values *= self._bound_factor(ktype, priced, values[:, 0])[:, None]
            for (key, (_, layer)), v in zip(batch.items(), values):
                how = f"{self.chosen[ktype]} regressor"
                if key in self._stand_in:
                    how += f" of {ktype} (no {self._stand_in[key][0]} rows)"
                self._cache[key] = self._cost(tuple(float(x) for x in v), how, layer)

    def stand_ins(self, layers: Sequence[LayerSpec]) -> Counter:
        """The layers priced as a kernel they are told apart from (`_fallback_types`: an
        8-bit max pool run channels-first as a channels-last one, at a thirtieth of its
        time), the table holding no rows of their own kernel type: (their type, the type
        priced as) -> count."""
        self._price_new(layers)
        return Counter(self._stand_in[key] for key in (layer.shape_key() for layer in layers) if key in self._stand_in)

    COVER = 8.0  # a kernel type prices layers up to this many times the work of its largest kernel
    # Beyond its type's largest kernel, a regressed price is held to at most this many times
    # the largest kernels' time per unit of work (`_bound_factor`).
    BOUND = 2.0

    def _covers(self, ktype: str, layer: LayerSpec) -> bool:
        """Whether the type's kernels reach within COVER of the layer's work; for an op whose
        sub-kind is the computation itself (a sigmoid or a gelu, a max or an average pool),
        its kernels of that sub-kind where it has any (a type measured on tiny sigmoids and
        one large gelu does not cover a large sigmoid).  A type of fewer rows than the
        nearest-neighbour regressor needs (`MIN_ROWS`) covers no layer under a COVER-th of
        its smallest kernel's work either: its additive fit, all it has, can put the whole
        time of one large kernel in its fixed cost (a profile whose one int8 softmax row was
        of 10 million elements priced DeiT's int8 softmaxes of 30,000 at 21 ms each)."""
        largest = self._largest_of(ktype, layer.fn) if layer.op in _FN_IS_THE_OP else 0.0
        work = float(_work([layer])[0])
        if work > self.COVER * (largest or self._largest_work(ktype)):
            return False
        rows = self._rows[ktype]
        return len(rows) >= MIN_ROWS["nearest"] or \
            work * self.COVER >= float(self._layers_of(ktype)[1].min())

    def _largest_of(self, ktype: str, fn: str) -> float:
        if (ktype, fn) not in self._largest_fn:
            layers, work = self._layers_of(ktype)
            mine = [w for layer, w in zip(layers, work) if layer.fn == fn]
            self._largest_fn[ktype, fn] = float(max(mine)) if mine else 0.0
        return self._largest_fn[ktype, fn]

    def _bound_factor(self, ktype: str, layers: Sequence[LayerSpec], ms: np.ndarray) -> np.ndarray:
        """What brings the regressed price of a layer larger than its type's largest kernel
        down to at most BOUND times the time per unit of work of the largest ones, and that
        of a layer of an op whose sub-kind is the computation larger than its sub-kind's
        largest kernel up to at least their time per unit of work (`_sub_kind_rate`), 1
        elsewhere: beyond the measured sizes a kernel's time grows about in proportion to
        its work, where a regressor fitted mostly to small kernels can extrapolate its
        log-linear trend a hundredfold, or another sub-kind's."""
        work = _work(layers)
        factor = np.ones(len(layers))
        beyond = work > self._largest_work(ktype)
        if beyond.any():
            factor[beyond] = np.minimum(ms[beyond], self.BOUND * self._largest_rate(ktype) * work[beyond]) / ms[beyond]
        for i, layer in enumerate(layers):
            if layer.op in _FN_IS_THE_OP and work[i] > self._largest_of(ktype, layer.fn) > 0:
                factor[i] = max(factor[i], self._sub_kind_rate(ktype, layer.fn) * work[i] / ms[i])
        return factor

    # The least time of a sub-kind's largest kernel for its time per unit of work to bound
    # larger ones' prices from below (`_sub_kind_rate`): a kernel's fixed cost, about a
    # microsecond, is then a tenth of it at most.
    FLOOR_MIN_MS = 0.01

    def _sub_kind_rate(self, ktype: str, fn: str) -> float:
        """The median time per unit of work of the type's three largest kernels of the
        sub-kind `fn` (an activation, a pool, a norm, a data movement, a resize: an op
        whose sub-kind is the computation itself), 0 where the largest took under
        FLOOR_MIN_MS.  A layer of such an op beyond its sub-kind's largest kernel is priced
        at least that rate times its work (`_bound_factor`): these kernels move every element
        through memory, and a larger tensor runs no faster per element.  A type's regressor
        prices such a layer from all its sub-kinds' rows, and can put it at a fraction of
        its own kernels' rate: PVT-v2's stand-alone GELUs of 410,000 elements at 0.16 ns
        each, beside the table's largest GELUs (55,000) at 0.64 and their 0.58 in place."""
        if (ktype, fn) not in self._rate:
            rows, (layers, work) = self._rows[ktype], self._layers_of(ktype)
            mine = sorted((w, rows[i]["latency_ms"]) for i, (layer, w) in enumerate(zip(layers, work))
                          if layer.fn == fn and w > 0)[-3:]
            self._rate[ktype, fn] = (float(np.median([ms / w for w, ms in mine]))
                                     if mine and mine[-1][1] >= self.FLOOR_MIN_MS else 0.0)
        return self._rate[ktype, fn]

    def _largest_rate(self, ktype: str) -> float:
        """The median time per unit of work of the type's three largest kernels."""
        if ktype not in self._rate:
            rows, work = self._rows[ktype], self._layers_of(ktype)[1]
            top = np.argsort(work)[-3:]
            self._rate[ktype] = float(np.median([rows[i]["latency_ms"] / work[i] for i in top]))
        return self._rate[ktype]

    def _largest_work(self, ktype: str) -> float:
        if ktype not in self._largest:
            self._largest[ktype] = float(self._layers_of(ktype)[1].max())
        return self._largest[ktype]

    def _layers_of(self, ktype: str) -> tuple[list[LayerSpec], np.ndarray]:
        """The type's kernels as layers and the work of each (`_work`), built once."""
        if ktype not in self._row_layers:
            layers = [layer_from_row(r) for r in self._rows[ktype]]
            self._row_layers[ktype] = layers, _work(layers)
        return self._row_layers[ktype]

    def _cost(self, values: tuple[float, ...], how: str, layer: LayerSpec) -> LayerCost:
        overhead = self.spec.overhead
        group = kernel_group(layer)
        offset = overhead.per_kernel_ms.get(group, overhead.per_kernel_ms.get(_fallback_type(group), 0.0))
        # a negative offset takes a kernel down to the least in-context cost at most
        least = min(values[0], KERNEL_FLOOR_MS) if offset else 0.0
        return LayerCost(max(values[0] + overhead.per_layer_ms + offset, least),
                         values[1] if self.models_energy else None, how)

    @property
    def additive(self) -> bool:
        """False where the spec prices something of a model as a whole: its run overhead,
        working set or the weight bytes its classifiers stream."""
        o = self.spec.overhead
        return not (o.per_model_ms or o.working_set or o.weight_stream or o.weight_reread)

    def estimate(self, layers: Sequence[LayerSpec]) -> CostReport:
        self._price_new(layers)
        report = super().estimate(layers)
        factor = working_set_factor(self.spec.overhead.working_set, layers)
        if factor != 1.0:
            report.costs = [LayerCost(c.latency_ms * factor, c.energy_mj, c.mapping) for c in report.costs]
        weights = weight_bytes(layers)
        for stream in (self.spec.overhead.weight_stream, *self.spec.overhead.rereads()):
            if stream is None:
                continue
            for i, layer in enumerate(layers):
                extra = stream.extra_ms(layer, weights)
                cost = report.costs[i]
                if extra > 0 and cost.mapping != "unsupported":
                    report.costs[i] = LayerCost(cost.latency_ms + extra, cost.energy_mj,
                                                f"{cost.mapping} + weights streamed")
        run = self.spec.overhead.per_model_ms
        if report.costs and run:
            first = report.costs[0]
            report.costs[0] = LayerCost(first.latency_ms + run, first.energy_mj,
                                        f"{first.mapping} + run overhead {run:.4g} ms")
        return report

    def with_layout(self, report: CostReport, layouts: Mapping[int, Sequence]) -> CostReport:
        cost = self.spec.overhead.layout
        layout = layouts.get(cost.block, ()) if cost is not None and layouts else ()
        if not layout or not report.costs:
            return report
        costs = list(report.costs)
        for r in layout:
            i = min(max(r.layer, 0), len(costs) - 1)
            c = costs[i]
            if r.replaces:  # a transpose the reorder runs in place of
                costs[i] = LayerCost(cost.ms(r.direction, r.elements), c.energy_mj, REPLACED_BY_REORDER)
            else:
                costs[i] = LayerCost(c.latency_ms + cost.ms(r.direction, r.elements), c.energy_mj,
                                     c.mapping if "layout" in c.mapping else f"{c.mapping} + layout reorders")
        return CostReport(report.device, report.layers, costs, report.unsupported)

    def describe(self) -> dict:
        s = self.spec
        return {"name": s.name, "kind": s.kind, "description": s.description, "table": str(self.source),
                "kernels": len(self._exact),
                "kernel_types": {k: {"rows": len(self._rows[k]), "regressor": self.chosen[k]} for k in sorted(self._rows)},
                "models_energy": self.models_energy,
                "energy": s.energy or ("modelled" if self.models_energy else "latency only"),
                "overhead": s.overhead.model_dump(), "measurement": s.measurement, "fit": s.fit}
