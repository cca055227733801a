"""`kind: mbv2` - a MobileNetV2-style macro space with early exits and quantization.

Per stage: depth, output channels, expansion ratio, kernel size.  Early exits: whether
an exit head follows a stage, and its width; optionally the accuracy points the exits may
cost (`exits.tolerance`, the knob `exit_tolerance` their thresholds are calibrated to).
Quantization: bit width of the backbone and of the exit heads, or, with
`quantization.per_stage`, of each backbone stage (the stem takes stage 1's width, the final
classifier the last stage's).  A list in the spec is a knob; a scalar is fixed.

Sizes a machine can hold.  A stage's depth is at most 64, a kernel 31, a stride 8
(`MAXIMA`).  Channels, widths and expansions are bounded by memory: the space's largest
architecture (every knob at its largest choice) must be trainable here - its parameters at
16 bytes each (float32 weights, gradients and two AdamW moments) within this machine's
physical memory when the spec is loaded (the error names the key to lower and how far),
and, once the dataset gives the input, its activations for one training batch too (float32,
~3 tensors kept per conv for the backward pass; `check_fits`).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..errors import ConfigError
from ..hardware.layers import SUM, LayerSpec
from .base import Arch, SearchSpace, Variable, machine_memory
from .spec_parts import BitKnobs, Choice, ExitKnobs, idle_exit_knobs
from .spec_parts import Strict as _Strict
from .spec_parts import choices as _choices
from .spec_parts import positive as _positive

MAXIMA = {"depth": 64, "kernel": 31, "stride": 8}  # channels, widths, expansions: bounded by memory
TRAIN_BYTES_PER_PARAM = 16  # float32 weight, its gradient, AdamW's two moments
SAVED_PER_CONV = 3          # activations a conv unit keeps for the backward pass: conv, BN, quantized act
LOAD_INPUT = (3, 10)        # input channels and classes assumed when a spec is loaded (no dataset yet)


def _at_most(name: str):
    """A validator refusing values beyond MAXIMA[name]."""
    limit = MAXIMA[name]

    def check(cls, v):
        big = [x for x in _choices(v) if x > limit]
        if big:
            raise ValueError(f"{max(big)} is too large; allowed: 1 … {limit}")
        return v

    return field_validator(name)(classmethod(check))


class StemSpec(_Strict):
    channels: int = Field(gt=0)
    kernel: int = Field(default=3, gt=0, le=MAXIMA["kernel"])
    stride: int = Field(default=1, gt=0, le=MAXIMA["stride"])


class StageSpec(_Strict):
    depth: Choice
    channels: Choice
    expand: Choice = 6
    kernel: Choice = 3
    stride: int = Field(default=1, gt=0, le=MAXIMA["stride"])

    _positive = field_validator("depth", "channels", "expand", "kernel")(classmethod(lambda cls, v: _positive(v)))

    _depth_limit = _at_most("depth")
    _kernel_limit = _at_most("kernel")

    @field_validator("kernel")
    @classmethod
    def _odd(cls, v: Choice) -> Choice:
        if any(k % 2 == 0 for k in _choices(v)):
            raise ValueError("kernel sizes must be odd (3, 5, 7, ...)")
        return v


class HeadSpec(_Strict):
    channels: int = Field(gt=0)


class ExitSpec(ExitKnobs):
    after_stages: list[int] = []


class QuantSpec(BitKnobs):
    per_stage: bool = False  # a backbone_bits knob per stage (s{i}_bits) instead of one for all


class Mbv2Spec(_Strict):
    name: str
    kind: str
    description: str = ""
    stem: StemSpec
    stages: list[StageSpec] = Field(min_length=1)
    head: HeadSpec
    exits: ExitSpec = ExitSpec()
    quantization: QuantSpec = QuantSpec()

    @model_validator(mode="after")
    def _exit_stages(self) -> "Mbv2Spec":
        n = len(self.stages)
        for s in self.exits.after_stages:
            if not 1 <= s < n:
                raise ValueError(f"exits.after_stages: stage {s} must be between 1 and {n - 1} "
                                 "(the last stage is followed by the final classifier)")
        return self


class Mbv2Space(SearchSpace):
    """Knob names: s{i}_depth, s{i}_channels, s{i}_expand, s{i}_kernel (stages 1-based),
    exit_s{i} (0/1) and exit_s{i}_width for each stage an exit may follow, exit_tolerance
    (with `exits.tolerance`), backbone_bits (or s{i}_bits per stage) and exit_bits."""

    def __init__(self, spec: Mbv2Spec):
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        vs: list[Variable] = []
        for i, st in enumerate(spec.stages, 1):
            for knob in ("depth", "channels", "expand", "kernel"):
                vs.append(Variable(f"s{i}_{knob}", _choices(getattr(st, knob))))
        for i in spec.exits.after_stages:
            vs.append(Variable(f"exit_s{i}", (0, 1)))
            vs.append(Variable(f"exit_s{i}_width", _choices(spec.exits.width)))
        if spec.exits.tolerance is not None:
            vs.append(Variable("exit_tolerance", tuple(spec.exits.tolerance)))
        for knob in dict.fromkeys(self._bits_knob(i) for i in range(1, len(spec.stages) + 1)):
            vs.append(Variable(knob, _choices(spec.quantization.backbone_bits)))
        vs.append(Variable("exit_bits", _choices(spec.quantization.exit_bits)))
        self._variables = tuple(vs)
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> cost tables

    def _bits_knob(self, stage: int) -> str:
        """The knob holding the bit width of backbone stage `stage` (1-based)."""
        return f"s{stage}_bits" if self.spec.quantization.per_stage else "backbone_bits"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mbv2Space":
        space = cls(Mbv2Spec.model_validate(data))
        space._check_weights()
        return space

    # -- sizes this machine can hold ---------------------------------------------------
    def largest(self) -> dict:
        """The architecture with every knob at its largest choice (exits on): the most
        parameters and activations the space holds."""
        return {v.name: max(v.choices) for v in self._variables}

    def _check_weights(self, memory: Optional[int] = None) -> None:
        """Refuse a spec whose largest architecture's training state (TRAIN_BYTES_PER_PARAM
        a parameter) exceeds this machine's memory: a pydantic error at the key to lower."""
        memory = memory or machine_memory()
        if memory is None:
            return
        in_ch, classes = LOAD_INPUT
        params = lambda sp: sum(l.params for l in sp.to_layers(sp.largest(), (in_ch, 1, 1), classes))  # noqa: E731
        need = params(self) * TRAIN_BYTES_PER_PARAM
        if need <= memory:
            return
        # the key whose lowering to 1 saves the most, and how far it may go
        data = self.spec.model_dump()
        keys = [("stem", "channels"), ("head", "channels"), ("exits", "width")]
        keys += [("stages", i, k) for i in range(len(self.spec.stages)) for k in ("channels", "expand", "depth", "kernel")]

        def with_max(key, value) -> "Mbv2Space":
            d = {**data, "stages": [dict(st) for st in data["stages"]], "stem": dict(data["stem"]),
                 "head": dict(data["head"]), "exits": dict(data["exits"])}
            node = d[key[0]][key[1]] if key[0] == "stages" else d[key[0]]
            node[key[-1]] = value
            return Mbv2Space(Mbv2Spec.model_validate(d))

        def values(key):
            node = data[key[0]][key[1]] if key[0] == "stages" else data[key[0]]
            return _choices(node[key[-1]])

        key = min(keys, key=lambda k: params(with_max(k, 1)))
        lo, hi = 0, max(values(key))  # the largest value of `key` that fits: lo
        step = 2 if key[-1] == "kernel" else 1
        while hi - lo > step:
            mid = (lo + hi) // 2
            mid += step == 2 and mid % 2 == 0
            lo, hi = (mid, hi) if params(with_max(key, mid)) * TRAIN_BYTES_PER_PARAM <= memory else (lo, mid)
        allowed = (f"allowed on this machine: up to {lo} (with the other keys as they are)" if lo
                   else "lower the other keys' largest choices too")
        raise ValidationError.from_exception_data("Mbv2Spec", [InitErrorDetails(
            type=PydanticCustomError("too_large", "{msg}", {"msg": (
                f"{max(values(key))} makes the largest architecture {_count(params(self))} parameters, "
                f"{_gib(need)} to train (float32 weights, gradients and AdamW moments), more than this "
                f"machine's {_gib(memory)} of memory; {allowed}")}),
            loc=tuple(key), input=max(values(key)))])

    def check_fits(self, input_shape: tuple[int, int, int], classes: int, batch_size: int,
                   memory: Optional[int] = None) -> None:
        """Refuse a space whose largest architecture cannot be trained here: its parameters'
        training state and one batch's activations (SAVED_PER_CONV tensors per conv,
        float32) within this machine's memory.  A one-line ConfigError naming the stage."""
        memory = memory or machine_memory()
        if memory is None:
            return
        layers = self.to_layers(self.largest(), tuple(input_shape), classes)
        weights = sum(l.params for l in layers) * TRAIN_BYTES_PER_PARAM
        per_block: dict[str, int] = {}
        for l in layers:
            block = l.name.split(".")[0]
            per_block[block] = per_block.get(block, 0) + l.out_elems * (SAVED_PER_CONV if l.op == "conv" else 1)
        acts = 4 * batch_size * (sum(per_block.values()) + int(np.prod(input_shape)))
        if weights + acts <= memory:
            return
        # the stage whose activations are the most
        stage_of, n = {}, 1  # plan block index -> stage (1-based; 0 the stem, None heads)
        for i, st in enumerate(self.spec.stages, 1):
            for _ in range(max(_choices(st.depth))):
                stage_of[f"b{n}"] = i
                n += 1
            if i in self.spec.exits.after_stages:
                n += 1
        by_stage: dict[int, int] = {}
        for block, elems in per_block.items():
            if block in stage_of:
                by_stage[stage_of[block]] = by_stage.get(stage_of[block], 0) + elems
        worst = max(by_stage, key=by_stage.get) if by_stage else None
        where = "" if worst is None else (
            f"; most of them in stages.{worst - 1} (s{worst}: channels up to "
            f"{max(_choices(self.spec.stages[worst - 1].channels))}, expand up to "
            f"{max(_choices(self.spec.stages[worst - 1].expand))}): lower those, or the batch size")
        shape = "x".join(map(str, input_shape))
        raise ConfigError(f"search space '{self.name}': its largest architecture needs {_gib(weights + acts)} to "
                          f"train ({_gib(acts)} of activations for a batch of {batch_size} at input {shape}, "
                          f"{_gib(weights)} of weights and optimiser state), more than this machine's "
                          f"{_gib(memory)} of memory{where}")

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    def exit_names(self) -> list[str]:
        return [f"s{i}" for i in self.spec.exits.after_stages] + ["final"]

    def active_exits(self, arch: Arch) -> list[str]:
        return [f"s{i}" for i in self.spec.exits.after_stages if arch[f"exit_s{i}"]] + ["final"]

    def idle_knobs(self, arch: Arch) -> list[str]:
        return idle_exit_knobs(arch, [f"exit_s{i}" for i in self.spec.exits.after_stages])

    def plan(self, arch: Arch) -> list[dict]:
        """The network as an ordered list of blocks, shared by `to_layers` and `build`.

        Blocks: {"type": "stem", out, kernel, stride, bits}
                {"type": "mbconv", in, out, expand, kernel, stride, bits}
                {"type": "exit", name, in, width, bits, in_bits}  (an exit head; in_bits: the
                                                   bit width of the backbone activations it reads)
                {"type": "head", in, width, bits}          (the final classifier)
        """
        arch = self.validate(arch)
        eb = arch["exit_bits"]
        stem = self.spec.stem
        blocks: list[dict] = [{"type": "stem", "out": stem.channels, "kernel": stem.kernel,
                               "stride": stem.stride, "bits": arch[self._bits_knob(1)]}]
        c = stem.channels
        for i, st in enumerate(self.spec.stages, 1):
            out, bb = arch[f"s{i}_channels"], arch[self._bits_knob(i)]
            for d in range(arch[f"s{i}_depth"]):
                blocks.append({"type": "mbconv", "in": c, "out": out, "expand": arch[f"s{i}_expand"],
                               "kernel": arch[f"s{i}_kernel"], "stride": st.stride if d == 0 else 1,
                               "bits": bb})
                c = out
            if i in self.spec.exits.after_stages and arch[f"exit_s{i}"]:
                blocks.append({"type": "exit", "name": f"s{i}", "in": c,
                               "width": arch[f"exit_s{i}_width"], "bits": eb, "in_bits": bb})
        blocks.append({"type": "head", "in": c, "width": self.spec.head.channels, "bits": bb})
        return blocks

    def to_layers(self, arch: Arch, input_shape: tuple[int, int, int], classes: int) -> list[LayerSpec]:
        ch, h, w = input_shape
        layers: list[LayerSpec] = []
        segment = 0
        for n, block in enumerate(self.plan(arch)):
            new, h, w = _block_layers(block, ch, h, w, classes, segment, f"b{n}")
            layers += new
            ch = block.get("out", ch)
            segment += block["type"] == "exit"
        return layers

    def path_costs(self, device, archs, input_shape, classes):
        """Vectorised over the batch (`archs`: architectures, or a matrix of knob indices as
        `to_indices` gives): each stage's cost is looked up in a table over the knobs it depends on (the previous stage's width and its own knobs), built once per
        device and input shape from the device's per-layer prices.  A device that prices
        a model as a whole as well (`CostModel.additive` false: a profiled CPU's run
        overhead and working set) prices each architecture's layers in one list."""
        if not getattr(device, "additive", False):  # a device without the property: priced whole
            if isinstance(archs, np.ndarray):
                archs = [self.from_indices(row) for row in archs]
            return SearchSpace.path_costs(self, device, archs, input_shape, classes)
        X = archs if isinstance(archs, np.ndarray) else np.array(
            [self.to_indices(a) for a in archs], dtype=np.int64).reshape(len(archs), -1)
        t = self._cost_tables(device, tuple(input_shape), classes)
        col = {v.name: i for i, v in enumerate(self._variables)}
        exit_bits = X[:, col["exit_bits"]]
        total = t["stem"][:, X[:, col[self._bits_knob(1)]]]  # (2, n): latency, energy
        reach: dict[str, np.ndarray] = {}
        prev = np.zeros(len(X), dtype=np.int64)
        for i in range(1, len(self.spec.stages) + 1):
            knobs = [X[:, col[f"s{i}_{k}"]] for k in ("channels", "expand", "kernel", "depth")]
            bits = X[:, col[self._bits_knob(i)]]
            total = total + t[f"s{i}"][:, prev, *knobs, bits]
            prev = knobs[0]
            if i in self.spec.exits.after_stages:
                active = X[:, col[f"exit_s{i}"]] == 1
                head = t[f"exit_s{i}"][:, prev, X[:, col[f"exit_s{i}_width"]], exit_bits, bits]
                total = total + np.where(active, head, 0.0)
                reach[f"s{i}"] = np.where(active, total, np.nan)
        reach["final"] = total + t["head"][:, prev, bits]
        out = np.stack([reach[e] for e in self.exit_names()], axis=-1)  # (2, n, exits)
        return out[0], (out[1] if device.models_energy else None)

    def _cost_tables(self, device, input_shape, classes) -> dict[str, np.ndarray]:
        per_device = self._tables.setdefault(device, {})
        if (input_shape, classes) not in per_device:
            per_device[input_shape, classes] = self._build_cost_tables(device, input_shape, classes)
        return per_device[input_shape, classes]

    def _build_cost_tables(self, device, input_shape, classes) -> dict[str, np.ndarray]:
        ch, h, w = input_shape
        var = {v.name: v.choices for v in self._variables}
        bb = var[self._bits_knob(1)]  # every stage's bits knob offers the same widths

        def price(blocks, cin, h, w):
            layers = []
            for block in blocks:
                new, h, w = _block_layers(block, cin, h, w, classes, 0, "")
                layers += new
                cin = block.get("out", cin)
            report = device.estimate(layers)
            return report.latency_ms, report.energy_mj or 0.0

        stem = self.spec.stem
        stem_block = {"type": "stem", "out": stem.channels, "kernel": stem.kernel, "stride": stem.stride}
        tables = {"stem": np.array([price([{**stem_block, "bits": b}], ch, h, w) for b in bb]).T}
        h, w = _conv_out(h, w, stem.kernel, stem.stride)
        prev_choices: tuple[int, ...] = (stem.channels,)
        for i, st in enumerate(self.spec.stages, 1):
            cs, es, ks, ds = (var[f"s{i}_{k}"] for k in ("channels", "expand", "kernel", "depth"))
            table = np.zeros((2, len(prev_choices), len(cs), len(es), len(ks), len(ds), len(bb)))
            for idx in np.ndindex(table.shape[1:]):
                p, c, e, k, d, b = (choices[j] for choices, j in zip(
                    (prev_choices, cs, es, ks, ds, bb), idx))
                blocks = [{"type": "mbconv", "in": p if n == 0 else c, "out": c, "expand": e, "kernel": k,
                           "stride": st.stride if n == 0 else 1, "bits": b} for n in range(d)]
                table[(slice(None), *idx)] = price(blocks, p, h, w)
            tables[f"s{i}"] = table
            h, w = _conv_out(h, w, 3, st.stride)  # kernels are odd: the size depends on the stride only
            if i in self.spec.exits.after_stages:
                ws, ebs = var[f"exit_s{i}_width"], var["exit_bits"]
                tables[f"exit_s{i}"] = np.zeros((2, len(cs), len(ws), len(ebs), len(bb)))
                for idx in np.ndindex(len(cs), len(ws), len(ebs), len(bb)):
                    c, wd, eb, b = cs[idx[0]], ws[idx[1]], ebs[idx[2]], bb[idx[3]]
                    tables[f"exit_s{i}"][(slice(None), *idx)] = price(
                        [{"type": "exit", "name": "", "in": c, "width": wd, "bits": eb, "in_bits": b}], c, h, w)
            prev_choices = cs
        head = self.spec.head.channels
        tables["head"] = np.zeros((2, len(prev_choices), len(bb)))
        for idx in np.ndindex(len(prev_choices), len(bb)):
            c, b = prev_choices[idx[0]], bb[idx[1]]
            tables["head"][(slice(None), *idx)] = price([{"type": "head", "in": c, "width": head, "bits": b}], c, h, w)
        return tables

    def build(self, arch: Arch, input_shape: tuple[int, int, int], classes: int):
        from .mbv2_torch import build_mbv2

        return build_mbv2(self.plan(arch), input_shape, classes)


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


def _gib(n: float) -> str:
    g = n / 2**30
    return f"{g:.3g} GiB" if g < 100 or g >= 10**9 else f"{g:,.0f} GiB"


def _conv_out(h: int, w: int, k: int, s: int) -> tuple[int, int]:
    p = k // 2
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


def _block_layers(block: dict, cin: int, h: int, w: int, classes: int, segment: int,
                  prefix: str) -> tuple[list[LayerSpec], int, int]:
    """The layers of one plan block on an input of `cin` x (h, w), and the output size."""
    layers: list[LayerSpec] = []
    bits = block["bits"]

    def conv(ci, co, k, s, groups, role="backbone", name="", a_bits=bits):
        nonlocal h, w
        oh, ow = _conv_out(h, w, k, s)
        layers.append(LayerSpec("conv", ci, co, (h, w), (oh, ow), (k, k), s, groups,
                                bits, a_bits, segment, role, name=name))
        h, w = oh, ow

    def classifier(width, role, name):
        # its first conv reads the backbone's activations, at the backbone's bit width
        conv(cin, width, 1, 1, 1, role, f"{name}.conv", a_bits=block.get("in_bits", bits))
        layers.append(LayerSpec("pool", width, width, (h, w), (1, 1), (h, w), 1, 1,
                                bits, bits, segment, role, name=f"{name}.pool"))
        layers.append(LayerSpec("linear", width, classes, (1, 1), (1, 1), (1, 1), 1, 1,
                                bits, bits, segment, role, name=f"{name}.fc"))

    kind = block["type"]
    if kind == "stem":
        conv(cin, block["out"], block["kernel"], block["stride"], 1, name="stem")
    elif kind == "mbconv":
        hid = block["in"] * block["expand"]
        if block["expand"] != 1:
            conv(block["in"], hid, 1, 1, 1, name=f"{prefix}.expand")
        conv(hid, hid, block["kernel"], block["stride"], hid, name=f"{prefix}.dw")
        conv(hid, block["out"], 1, 1, 1, name=f"{prefix}.project")
        if block["stride"] == 1 and block["in"] == block["out"]:
            # the projection has no activation: a float one accumulates the residual (SUM)
            layers.append(LayerSpec("add", block["out"], block["out"], (h, w), (h, w), (1, 1), 1, 1,
                                    bits, bits, segment, "backbone", fn=SUM if bits == 32 else "",
                                    name=f"{prefix}.add"))
    elif kind == "exit":
        saved = h, w
        classifier(block["width"], "exit", f"exit_{block['name']}")
        h, w = saved
    else:
        classifier(block["width"], "backbone", "head")
    return layers, h, w
