"""`kind: mbv2` - a MobileNetV2-style macro space with early exits and quantization.

Per stage: depth, output channels, expansion ratio, kernel size.  Early exits: whether
an exit head follows a stage, and its width.  Quantization: bit width of the backbone
and of the exit heads.  A list in the spec is a knob; a scalar is fixed.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..hardware.layers import LayerSpec
from .base import Arch, SearchSpace, Variable

Choice = Union[int, list[int]]
BITS = (4, 8, 16, 32)


def _choices(value: Choice) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StemSpec(_Strict):
    channels: int = Field(gt=0)
    kernel: int = Field(default=3, gt=0)
    stride: int = Field(default=1, gt=0)


class StageSpec(_Strict):
    depth: Choice
    channels: Choice
    expand: Choice = 6
    kernel: Choice = 3
    stride: int = Field(default=1, gt=0)

    @field_validator("depth", "channels", "expand", "kernel")
    @classmethod
    def _positive(cls, v: Choice) -> Choice:
        values = _choices(v)
        if not values or any(x <= 0 for x in values):
            raise ValueError("must be a positive integer or a non-empty list of them")
        return v


class HeadSpec(_Strict):
    channels: int = Field(gt=0)


class ExitSpec(_Strict):
    after_stages: list[int] = []
    width: Choice = 32


class QuantSpec(_Strict):
    backbone_bits: Choice = 32
    exit_bits: Choice = 32

    @field_validator("backbone_bits", "exit_bits")
    @classmethod
    def _bits(cls, v: Choice) -> Choice:
        bad = [b for b in _choices(v) if b not in BITS]
        if bad:
            raise ValueError(f"bit widths {bad} not supported; allowed: {list(BITS)}")
        return v


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
    exit_s{i} (0/1) and exit_s{i}_width for each stage an exit may follow,
    backbone_bits and exit_bits."""

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
        vs.append(Variable("backbone_bits", _choices(spec.quantization.backbone_bits)))
        vs.append(Variable("exit_bits", _choices(spec.quantization.exit_bits)))
        self._variables = tuple(vs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mbv2Space":
        return cls(Mbv2Spec.model_validate(data))

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    def exit_names(self) -> list[str]:
        return [f"s{i}" for i in self.spec.exits.after_stages] + ["final"]

    def active_exits(self, arch: Arch) -> list[str]:
        return [f"s{i}" for i in self.spec.exits.after_stages if arch[f"exit_s{i}"]] + ["final"]

    def plan(self, arch: Arch) -> list[dict]:
        """The network as an ordered list of blocks, shared by `to_layers` and `build`.

        Blocks: {"type": "stem", out, kernel, stride, bits}
                {"type": "mbconv", in, out, expand, kernel, stride, bits}
                {"type": "exit", name, in, width, bits}    (an exit head)
                {"type": "head", in, width, bits}          (the final classifier)
        """
        arch = self.validate(arch)
        bb, eb = arch["backbone_bits"], arch["exit_bits"]
        stem = self.spec.stem
        blocks: list[dict] = [{"type": "stem", "out": stem.channels, "kernel": stem.kernel,
                               "stride": stem.stride, "bits": bb}]
        c = stem.channels
        for i, st in enumerate(self.spec.stages, 1):
            out = arch[f"s{i}_channels"]
            for d in range(arch[f"s{i}_depth"]):
                blocks.append({"type": "mbconv", "in": c, "out": out, "expand": arch[f"s{i}_expand"],
                               "kernel": arch[f"s{i}_kernel"], "stride": st.stride if d == 0 else 1,
                               "bits": bb})
                c = out
            if i in self.spec.exits.after_stages and arch[f"exit_s{i}"]:
                blocks.append({"type": "exit", "name": f"s{i}", "in": c,
                               "width": arch[f"exit_s{i}_width"], "bits": eb})
        blocks.append({"type": "head", "in": c, "width": self.spec.head.channels, "bits": bb})
        return blocks

    def to_layers(self, arch: Arch, input_shape: tuple[int, int, int], classes: int) -> list[LayerSpec]:
        ch, h, w = input_shape
        layers: list[LayerSpec] = []
        segment = 0

        def conv(cin, cout, k, s, groups, bits, role="backbone", name=""):
            nonlocal h, w
            p = k // 2
            oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            layers.append(LayerSpec("conv", cin, cout, (h, w), (oh, ow), (k, k), s, groups,
                                    bits, bits, segment, role, name))
            h, w = oh, ow

        def classifier(cin, width, bits, role, name):
            nonlocal h, w
            saved = (h, w)
            conv(cin, width, 1, 1, 1, bits, role, f"{name}.conv")
            layers.append(LayerSpec("pool", width, width, (h, w), (1, 1), (h, w), 1, 1,
                                    bits, bits, segment, role, f"{name}.pool"))
            layers.append(LayerSpec("linear", width, classes, (1, 1), (1, 1), (1, 1), 1, 1,
                                    bits, bits, segment, role, f"{name}.fc"))
            h, w = saved

        for n, b in enumerate(self.plan(arch)):
            if b["type"] == "stem":
                conv(ch, b["out"], b["kernel"], b["stride"], 1, b["bits"], name="stem")
            elif b["type"] == "mbconv":
                hid = b["in"] * b["expand"]
                if b["expand"] != 1:
                    conv(b["in"], hid, 1, 1, 1, b["bits"], name=f"b{n}.expand")
                conv(hid, hid, b["kernel"], b["stride"], hid, b["bits"], name=f"b{n}.dw")
                conv(hid, b["out"], 1, 1, 1, b["bits"], name=f"b{n}.project")
                if b["stride"] == 1 and b["in"] == b["out"]:
                    layers.append(LayerSpec("add", b["out"], b["out"], (h, w), (h, w), (1, 1), 1, 1,
                                            b["bits"], b["bits"], segment, "backbone", f"b{n}.add"))
            elif b["type"] == "exit":
                classifier(b["in"], b["width"], b["bits"], "exit", f"exit_{b['name']}")
                segment += 1
            else:
                classifier(b["in"], b["width"], b["bits"], "backbone", "head")
        return layers

    def build(self, arch: Arch, input_shape: tuple[int, int, int], classes: int):
        from .mbv2_torch import build_mbv2

        return build_mbv2(self.plan(arch), input_shape, classes)
