"""Fitting `kind: lut` devices: from a per-kernel table, from end-to-end measurements of
whole models, or from both.

A per-kernel table (`nasctl hw fit --device NAME --lut FILE`) is a CSV with one row per
measured kernel and the columns (they mirror `LayerSpec`):

  op                 LayerSpec op kind: conv, conv_transpose, linear, matmul, pool, add, mul,
                     act, softmax, norm, resize, concat, split, data
  in_ch, out_ch      channels in and out
  in_h, in_w         input height and width (a sequence of T tokens: T, 1)
  out_h, out_w       output height and width
  kernel_h, kernel_w kernel size (1, 1 where the op has none)
  stride, groups     stride; groups (== in_ch for a depthwise conv)
  w_bits, a_bits     weight and activation bit widths (32 for float)
  fn                 the fused activation (relu, clip, hardswish, ...), pooling mode (max,
                     avg), norm kind (batch, layer), data op (transpose, ...), sum for an
                     add that is a conv's residual sum (accumulated into the conv's output),
                     or max_nchw for an 8-bit max pool run in a plain channels-first kernel
                     (see LayerSpec); may be empty
  latency_ms         measured latency of the kernel, > 0
  dequantized        optional, 0 or 1 (default 0): a quantized kernel that ran as
                     dequantize -> float op -> quantize (an onnxruntime QDQ group it could
                     not fuse or drop, see LayerSpec.dequantized)
  energy_mj          optional: its energy, > 0 (the device then models energy)

End-to-end measurements (`nasctl hw fit --device NAME --models FILE`) are a CSV with a
`latency_ms` column and either an `arch` column - an architecture of `--space` as JSON,
or in the space's own notation where it has one (NAS-Bench-201 strings for `nb201`) - or
an `onnx` column, a model file (relative paths from the CSV's folder).  The per-kernel
costs are then solved by non-negative least squares (scipy.optimize.nnls, relative
errors) over the kernels each model contains, plus a per-model overhead, with one of
these kernel groupings:

  kernels       one cost per distinct kernel (`LayerSpec.shape_key`): needs more models
                than distinct kernels;
  types         per kernel type (op; dense, grouped and depthwise convs apart), a cost per unit of
                work (MACs for conv/linear/matmul, elements read and written otherwise)
                plus a cost per layer;
  types-shared  a cost per unit of work per type and one per-layer cost for all types:
                the fewest unknowns, for a handful of models.

Every grouping the number of models supports is scored by 5-fold cross-validation and
the best one kept (`fit.grouping` in the spec records it with the errors).  Both inputs
together (`--lut` and `--models`) calibrate the table against the end-to-end times: a
scale per kernel type, a per-layer and a per-model overhead (`calibrate`) - what
`nasctl hw profile` does with the kernels and networks it measures.

With `--prior DEV1,DEV2` the end-to-end fit starts from devices already known
(`prior.fit_with_prior`): a handful of models then suffice.

The device is written to the workspace as `hardware/NAME/spec.yaml` + `lut.csv`, with the
fitted boosted trees in `regressors.json`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import UsageError
from .layers import MAC_OPS, LayerSpec
from .lut import (ENERGY_COLUMN, MIN_COST, REGRESSORS_FILE, LutDevice, LutSpec, choose_regressor, kernel_type,
                  layer_from_row, row_from_layer, write_lut)

FLOOR_MS = 1e-6  # a kernel a fit finds free is stored at this latency (tables hold positive costs)


@dataclass
class FittedDevice:
    """A device ready to be written: its name, spec (as YAML data, the name left to the
    folder) and table rows."""

    name: str
    spec: dict[str, Any]
    rows: list[dict]
    report: dict[str, Any] = field(default_factory=dict)  # what the fit found, for the CLI
    files: dict[str, Any] = field(default_factory=dict)   # further JSON documents to write beside the table

    def device(self) -> LutDevice:
        return LutDevice(LutSpec.model_validate({"name": self.name, **self.spec}), self.rows)


MEASUREMENTS_FILE = "measurements.json"  # a profile's measured context networks, beside its table
DEVICE_FILES = {"spec.yaml", "lut.csv", REGRESSORS_FILE, MEASUREMENTS_FILE}  # what a fitted device's folder holds


def write_device(folder: Path, fitted: FittedDevice) -> Path:
    """Write `spec.yaml`, `lut.csv` and the fitted boosted trees (`regressors.json`) into
    `folder`, and the fit's own files (a profile's measurements); returns the spec's path.
    The folder is written beside and swapped in whole; files of the user's own in it stay,
    but a measurements file an earlier device left (what `hw profile --refit` would read)
    goes with that device."""
    import os
    import shutil
    import tempfile

    import yaml

    folder.parent.mkdir(parents=True, exist_ok=True)
    # Written beside it first and swapped in whole: a fit that fails leaves the device that
    # was there (or none), never a half-written one.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        write_lut(staging / fitted.spec.get("lut", "lut.csv"), fitted.rows)
        (staging / "spec.yaml").write_text(yaml.safe_dump(fitted.spec, sort_keys=False, width=100), encoding="utf-8")
        LutDevice.from_dict({"name": fitted.name, **fitted.spec}, staging).save_regressors()
        for name, doc in fitted.files.items():
            (staging / name).write_text(json.dumps(doc), encoding="utf-8")
        if folder.exists():
            for item in folder.iterdir():  # the user's own files stay; an earlier profile's measurements go
                if item.name not in DEVICE_FILES and not (staging / item.name).exists():
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, staging / item.name)
            old = folder.with_name(f".{folder.name}.replaced-{os.getpid()}")
            folder.rename(old)
            try:
                staging.rename(folder)
            except BaseException:
                old.rename(folder)  # the device that was there, back where it was
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder / "spec.yaml"


# --- per-kernel costs from end-to-end times --------------------------------------------

def _work(layer: LayerSpec) -> float:
    return float(layer.macs if layer.op in MAC_OPS else layer.in_elems + layer.out_elems)


@dataclass
class _Grouping:
    """A linear model of a model's latency: design-matrix columns from layer lists."""

    name: str
    keys: list  # column keys (intercept last, implicit)

    def columns(self, layers: Sequence[LayerSpec]) -> np.ndarray:
        row = np.zeros(len(self.keys) + 1)
        index = {k: i for i, k in enumerate(self.keys)}
        for layer in layers:
            for key, value in self._terms(layer):
                if key in index:
                    row[index[key]] += value
        row[-1] = 1.0
        return row

    def _terms(self, layer: LayerSpec):
        if self.name == "kernels":
            return [(layer.shape_key(), 1.0)]
        t = kernel_type(layer)
        return [((t, "work"), _work(layer)), ((t, "layer") if self.name == "types" else "layer", 1.0)]

    @classmethod
    def make(cls, name: str, layer_lists: Sequence[Sequence[LayerSpec]]) -> _Grouping:
        g = cls(name, [])
        keys = dict.fromkeys(k for layers in layer_lists for layer in layers for k, _ in g._terms(layer))
        g.keys = list(keys)
        return g

    def layer_cost(self, layer: LayerSpec, x: np.ndarray) -> float:
        index = {k: i for i, k in enumerate(self.keys)}
        return float(sum(x[index[k]] * v for k, v in self._terms(layer) if k in index and k != "layer"))


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative errors, columns scaled for conditioning."""
    from scipy.optimize import nnls

    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale / y[:, None], np.ones(len(y)), maxiter=50 * A.shape[1])
    return x / scale


def cv_rms_error(A: np.ndarray, y: np.ndarray, solve=_nnls, folds: int = 5, seed: int = 0,
                 groups: Optional[np.ndarray] = None) -> float:
    """Cross-validated RMS relative error (%) of `y ≈ A @ solve(A, y)`: `folds` folds of a
    permutation seeded by `seed` (folds == the number of groups: leave one out).  Rows of the
    same `groups` value (a model measured twice) are held out together, so no row is tested
    against its own twin in training; without `groups` every row is its own group."""
    groups = np.arange(len(y)) if groups is None else np.asarray(groups)
    names = np.unique(groups)
    order = names[np.random.default_rng(seed).permutation(len(names))]
    errors = np.empty(len(y))
    for k in range(folds):
        test = np.flatnonzero(np.isin(groups, order[k::folds]))
        train = np.flatnonzero(~np.isin(groups, order[k::folds]))
        x = solve(A[train], y[train])
        errors[test] = A[test] @ x / y[test] - 1.0
    return float(np.sqrt(np.mean(errors ** 2)) * 100)


def model_groups(layer_lists: Sequence[Sequence[LayerSpec]]) -> np.ndarray:
    """One id per row, the same for rows whose layers are the same (a model measured twice)."""
    ids: dict[tuple, int] = {}
    return np.array([ids.setdefault(tuple(layer.shape_key() for layer in layers), len(ids))
                     for layers in layer_lists], dtype=int)


def _cv_error(grouping: _Grouping, layer_lists, y: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    return cv_rms_error(np.array([grouping.columns(layers) for layers in layer_lists]), y, folds=folds, seed=seed,
                        groups=model_groups(layer_lists))


GROUPINGS = ("kernels", "types", "types-shared")


def distinct_layers(layer_lists: Sequence[Sequence[LayerSpec]]) -> list[LayerSpec]:
    """The first layer of each distinct kernel (`LayerSpec.shape_key`), in order of appearance."""
    first: dict[tuple, LayerSpec] = {}
    for layers in layer_lists:
        for layer in layers:
            first.setdefault(layer.shape_key(), layer)
    return list(first.values())


def checked_latencies(layer_lists: Sequence[Sequence[LayerSpec]], latency_ms: Sequence[float]) -> np.ndarray:
    """The measured latencies as an array, refused where empty or not all positive."""
    y = np.asarray(latency_ms, dtype=float)
    if len(layer_lists) != len(y):
        raise ValueError(f"{len(layer_lists)} layer lists but {len(y)} latencies")
    if not len(y):
        raise UsageError("no models to fit from")
    if np.any(~((y > 0) & np.isfinite(y))):
        raise UsageError("every measured latency_ms must be positive and finite")
    if np.any(y < MIN_COST["latency_ms"]):
        raise UsageError(f"a measured latency_ms of {y.min():g} is below {MIN_COST['latency_ms']:g} "
                         f"(a nanosecond): allowed are measured latencies in milliseconds")
    return y


def distinct_models(layer_lists: Sequence[Sequence[LayerSpec]]) -> int:
    """How many of the models differ in their layers (a model measured twice counts once)."""
    return len(np.unique(model_groups(layer_lists)))


def feasible_groupings(layer_lists: Sequence[Sequence[LayerSpec]], models: int) -> list[str]:
    """The groupings `models` measured models can fit without a prior: fewer unknowns than
    4/5 of them."""
    return [g for g in GROUPINGS if len(_Grouping.make(g, layer_lists).keys) + 1 <= 0.8 * models - 1]


def fit_from_models(name: str, layer_lists: Sequence[Sequence[LayerSpec]], latency_ms: Sequence[float],
                    grouping: Optional[str] = None, description: str = "") -> FittedDevice:
    """A device whose kernel costs explain the measured end-to-end latencies.

    `grouping` (one of GROUPINGS) fixes the kernel grouping; by default every grouping
    with fewer unknowns than 4/5 of the models is cross-validated and the best kept."""
    y = checked_latencies(layer_lists, latency_ms)
    candidates = {g: _Grouping.make(g, layer_lists) for g in GROUPINGS}
    unknowns = {g: len(c.keys) + 1 for g, c in candidates.items()}
    if grouping is not None:
        if grouping not in candidates:
            raise UsageError(f"unknown grouping '{grouping}'; allowed: {', '.join(GROUPINGS)}")
        feasible = [grouping]
    distinct = distinct_models(layer_lists)  # cross-validated over distinct models: a model's twin rows go together
    if grouping is None:
        feasible = feasible_groupings(layer_lists, len(y))
        if not feasible:
            need = int(np.ceil((unknowns["types-shared"] + 1) / 0.8))
            counted = f"{len(y)} models" + (f" ({distinct} distinct)" if distinct < len(y) else "")
            raise UsageError(f"{counted} are too few to fit from: their {unknowns['types-shared'] - 2} "
                             f"kernel types need at least {need} measured models")
    errors = {g: round(_cv_error(candidates[g], layer_lists, y, folds=min(5, distinct)), 2)
              for g in feasible} if distinct >= 5 else {}
    chosen = min(errors, key=errors.get) if errors else feasible[0]
    g = candidates[chosen]
    x = _nnls(np.array([g.columns(layers) for layers in layer_lists]), y)
    per_layer = float(x[g.keys.index("layer")]) if "layer" in g.keys else 0.0
    rows = [row_from_layer(layer, max(g.layer_cost(layer, x), FLOOR_MS)) for layer in distinct_layers(layer_lists)]
    fit_error = np.array([g.columns(layers) for layers in layer_lists]) @ x / y - 1.0
    fit = {"from": "end-to-end latencies", "models": len(y), "grouping": chosen,
           "cv_rms_error_pct_by_grouping": errors,
           "train_rms_error_pct": round(float(np.sqrt(np.mean(fit_error ** 2)) * 100), 2)}
    regressors = {t: "additive" for t in {kernel_type(layer_from_row(r)) for r in rows}} if chosen != "kernels" else {}
    spec = _spec(name, description or f"fitted from {len(y)} end-to-end latencies ({chosen} grouping)",
                 per_model_ms=float(x[-1]), per_layer_ms=per_layer, fit=fit, regressors=regressors)
    fitted = FittedDevice(name, spec, rows, fit)
    if chosen == "kernels":
        _choose_regressors(fitted)
    return fitted


# --- per-kernel tables -----------------------------------------------------------------

def _median_rows(rows: Sequence[dict], targets: Sequence[str]) -> list[dict]:
    """One row per distinct kernel, its costs the median over repeated measurements."""
    by_key: dict[tuple, list[dict]] = {}
    for row in rows:
        by_key.setdefault(layer_from_row(row).shape_key(), []).append(row)
    return [{**same[0], **{t: float(np.median([r[t] for r in same])) for t in targets}} for same in by_key.values()]


def _choose_regressors(fitted: FittedDevice) -> None:
    """Each kernel type's regressor, by cross-validation; rows that carry a `group` (the
    model they were measured in) are held out a group at a time."""
    by_type: dict[str, list[dict]] = {}
    for row in fitted.rows:
        by_type.setdefault(kernel_type(layer_from_row(row)), []).append(row)
    chosen, errors = {}, {}
    for t, rows in sorted(by_type.items()):
        groups = [r["group"] for r in rows] if all("group" in r for r in rows) else None
        kind, err = choose_regressor([layer_from_row(r) for r in rows], np.array([r["latency_ms"] for r in rows]),
                                     groups)
        chosen[t] = kind
        errors[t] = {"rows": len(rows), **({"cv_weighted_abs_error_pct": err} if err else {})}
    fitted.spec["regressors"] = chosen
    fitted.spec.setdefault("fit", {})["regressors"] = errors


def calibrate(device: LutDevice, layer_lists: Sequence[Sequence[LayerSpec]],
              latency_ms: Sequence[float]) -> dict[str, Any]:
    """Fit `latency ≈ per_model + Σ (scale[type] · table cost + per_layer)` over the
    models by bounded least squares on relative errors; returns the scales and the two
    overheads."""
    from scipy.optimize import lsq_linear

    y = np.asarray(latency_ms, dtype=float)
    types = sorted({kernel_type(layer) for layers in layer_lists for layer in layers})
    models = distinct_models(layer_lists)
    if models < len(types) + 2:
        raise UsageError(f"calibrating the table against --models fits {len(types)} kernel-type scales and two "
                         f"overheads: it takes at least {len(types) + 2} distinct measured models, the file has "
                         f"{models}")
    A = np.zeros((len(y), len(types) + 2))
    for m, layers in enumerate(layer_lists):
        report = device.estimate(layers)
        if report.unsupported:
            ops = ", ".join(f"{op} x{n}" for op, n in report.unsupported.items())
            raise UsageError(f"--models: model {m + 1} holds layers the table has no kernels to price ({ops}); "
                             "add such kernels to the table, or leave those models out")
        for layer, cost in zip(layers, report.costs):
            A[m, types.index(kernel_type(layer))] += cost.latency_ms
        A[m, -2] = len(layers)
        A[m, -1] = 1.0
    lower = np.r_[np.full(len(types), 0.5), -np.inf, 0.0]
    upper = np.r_[np.full(len(types), 2.0), np.inf, np.inf]
    x = lsq_linear(A / y[:, None], np.ones(len(y)), bounds=(lower, upper)).x
    error = A @ x / y - 1.0
    return {"scale": dict(zip(types, map(float, x[:len(types)]))), "per_layer_ms": float(x[-2]),
            "per_model_ms": float(x[-1]), "rms_error_pct": float(np.sqrt(np.mean(error ** 2)) * 100),
            "within_10pct": float(np.mean(np.abs(error) <= 0.10))}


def fit_from_lut(name: str, rows: Sequence[dict], models: Optional[tuple[Sequence[Sequence[LayerSpec]],
                                                                         Sequence[float]]] = None,
                 description: str = "", extra: Optional[dict] = None) -> FittedDevice:
    """A device from a kernel table (rows as `lut.read_lut` returns them), its regressors
    chosen by cross-validation; with `models` (layer lists and their measured latencies)
    the table is calibrated against them first (`calibrate`)."""
    has_energy = all(ENERGY_COLUMN in r for r in rows)
    targets = ["latency_ms"] + ([ENERGY_COLUMN] if has_energy else [])
    rows = _median_rows(rows, targets)
    spec = _spec(name, description or f"fitted from a table of {len(rows)} kernels", models_energy=has_energy,
                 fit={"from": "kernel table", "kernels": len(rows)}, **(extra or {}))
    fitted = FittedDevice(name, spec, rows)
    _choose_regressors(fitted)
    if models is not None:
        cal = calibrate(fitted.device(), *models)
        for row in fitted.rows:
            row["latency_ms"] = max(row["latency_ms"] * cal["scale"].get(kernel_type(layer_from_row(row)), 1.0),
                                    FLOOR_MS)
        spec["overhead"] = {"per_model_ms": cal["per_model_ms"], "per_layer_ms": cal["per_layer_ms"]}
        spec["fit"]["calibration"] = {"models": len(models[1]),
                                      **{k: (round(v, 6) if isinstance(v, float) else
                                             {t: round(s, 4) for t, s in v.items()}) for k, v in cal.items()}}
        _choose_regressors(fitted)
    return fitted


def _spec(name: str, description: str, *, per_model_ms: float = 0.0, per_layer_ms: float = 0.0,
          models_energy: bool = False, fit: Optional[dict] = None, regressors: Optional[dict] = None,
          **extra) -> dict[str, Any]:
    spec = {"kind": "lut", "description": description, "lut": "lut.csv", "models_energy": models_energy,
            "energy": "" if models_energy else "latency only: the table has no energy_mj column",
            "overhead": {"per_model_ms": per_model_ms, "per_layer_ms": per_layer_ms},
            "regressors": regressors or {}, **extra, "fit": fit or {}}
    LutSpec.model_validate({"name": name, **spec})
    return spec


# --- reading end-to-end measurements ---------------------------------------------------

def read_models_csv(path: Path, space=None, input_shape: Optional[tuple[int, int, int]] = None,
                    classes: Optional[int] = None) -> tuple[list[list[LayerSpec]], list[float]]:
    """Layer lists and latencies from a CSV of measured models (see the module docstring);
    `space` is the search space (a `SearchSpace`) the arch column's architectures are of."""
    from ..specs import read_text, unique_columns

    path = Path(path)
    reader = csv.DictReader(read_text(path).splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    unique_columns(path, header)
    if "latency_ms" not in header:
        raise UsageError(f"{path}: missing column latency_ms; a models table needs latency_ms and arch or onnx")
    if "arch" not in header and "onnx" not in header:
        raise UsageError(f"{path}: missing column arch or onnx; a models table needs latency_ms and arch or onnx")
    to_layers = _arch_reader(path, space, input_shape, classes) if "arch" in header else None
    layer_lists, latency = [], []
    for line, row in enumerate(reader, start=2):
        if row["latency_ms"] is None:
            raise UsageError(f"{path}: line {line}: has fewer fields than the header")
        try:
            value = float(row["latency_ms"])
        except ValueError:
            raise UsageError(f"{path}: line {line}: latency_ms '{row['latency_ms']}' is not a number") from None
        if not (math.isfinite(value) and value >= MIN_COST["latency_ms"]):
            raise UsageError(f"{path}: line {line}: latency_ms '{row['latency_ms']}' must be a finite time in ms, "
                             f"at least {MIN_COST['latency_ms']:g} (a nanosecond)")
        if to_layers is not None and (row.get("arch") or "").strip():
            layers = to_layers(row["arch"].strip(), line)
        else:
            layers = _onnx_layers(path, (row.get("onnx") or "").strip(), line)
        layer_lists.append(layers)
        latency.append(value)
    if not layer_lists:
        raise UsageError(f"{path}: the table has no rows")
    return layer_lists, latency


def _onnx_layers(csv_path: Path, cell: str, line: int) -> list[LayerSpec]:
    from .onnx_import import import_onnx

    if not cell:
        raise UsageError(f"{csv_path}: line {line}: neither arch nor onnx is given")
    model = Path(cell) if Path(cell).is_absolute() else csv_path.parent / cell
    result = import_onnx(model)
    if result.unsupported:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(result.unsupported.items()))
        raise UsageError(f"{csv_path}: line {line}: {cell} has ops nasctl cannot price: {ops}")
    return result.layers


def _arch_reader(csv_path: Path, space, input_shape, classes):
    if space is None:
        raise UsageError(f"{csv_path}: the arch column needs --space, the search space its architectures are of")
    spec = getattr(space, "spec", None)
    shape = input_shape or getattr(spec, "input_shape", None)
    n_classes = classes or getattr(spec, "classes", None)
    if shape is None or n_classes is None:
        raise UsageError(f"space '{space.name}' has no default input shape and classes: give --input-shape "
                         f"CxHxW and --classes N")

    def to_layers(cell: str, line: int) -> list[LayerSpec]:
        try:
            arch = json.loads(cell) if cell.startswith("{") else space.parse_arch(cell)
        except AttributeError:
            raise UsageError(f"{csv_path}: line {line}: arch must be a JSON object of space '{space.name}''s "
                             f"knobs") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"{csv_path}: line {line}: arch is not valid JSON: {e.msg}") from None
        except UsageError as e:
            raise UsageError(f"{csv_path}: line {line}: {e}") from None
        try:
            return space.to_layers(space.validate(arch), tuple(shape), int(n_classes))
        except UsageError as e:
            raise UsageError(f"{csv_path}: line {line}: {e}") from None

    return to_layers

