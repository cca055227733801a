"""`kind: tcn1d` - a 1-D convolutional network for sequences (a small temporal conv net).

An input of C x H x W is read as a sequence of T = H x W steps of C channels (an 8 x 8
digit: 64 steps of one channel; a time series stored as C x 1 x T: T steps).  The network:
`depth` blocks, each a 1-D conv of `width` channels, kernel `kernel`, dilation
`dilation` ** block and stride `stride` (BN and ReLU fused), then global average pooling
over time and a linear classifier.  No early exits.

Layers (`to_layers`): a sequence of T steps is T x 1, so a 1-D conv of kernel k is a conv
layer of kernel k x 1; dilation changes the receptive field, not the work.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nasctl.hardware.layers import LayerSpec
from nasctl.spaces.base import Arch, SearchSpace, Variable

KNOBS = ("depth", "width", "kernel", "dilation", "stride")


class Tcn1dSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    description: str = ""
    depth: list[int] = Field(default=[1, 2, 3], min_length=1)
    width: list[int] = Field(default=[8, 16, 32], min_length=1)
    kernel: list[int] = Field(default=[3, 5, 7], min_length=1)     # odd: "same" padding
    dilation: list[int] = Field(default=[1, 2], min_length=1)      # block b dilates by dilation ** b
    stride: list[int] = Field(default=[1, 2], min_length=1)
    input_shape: tuple[int, int, int] = (1, 8, 8)
    classes: int = Field(default=10, gt=0)


class Tcn1dSpace(SearchSpace):
    def __init__(self, spec: Tcn1dSpec):
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self._variables = tuple(Variable(k, tuple(getattr(spec, k))) for k in KNOBS)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tcn1dSpace:
        return cls(Tcn1dSpec.model_validate(data))

    def variables(self):
        return self._variables

    def default_input(self):
        return tuple(self.spec.input_shape), self.spec.classes

    def blocks(self, arch: Arch, input_shape) -> list[tuple[int, int, int, int, int, int, int]]:
        """Per block: (in channels, out channels, kernel, dilation, stride, in length, out length)."""
        arch = self.validate(arch)
        ch, h, w = input_shape
        steps = h * w
        out = []
        for b in range(arch["depth"]):
            s = arch["stride"]
            after = (steps - 1) // s + 1  # "same" padding: ceil(T / s)
            out.append((ch, arch["width"], arch["kernel"], arch["dilation"] ** b, s, steps, after))
            ch, steps = arch["width"], after
        return out

    def to_layers(self, arch: Arch, input_shape, classes) -> list[LayerSpec]:
        layers = []
        blocks = self.blocks(arch, input_shape)
        for b, (cin, cout, k, _dil, s, t_in, t_out) in enumerate(blocks):
            layers.append(LayerSpec("conv", cin, cout, (t_in, 1), (t_out, 1), (k, 1), s, fn="relu",
                                    name=f"block{b}"))
        c, t = blocks[-1][1], blocks[-1][6]
        layers.append(LayerSpec("pool", c, c, (t, 1), (1, 1), (t, 1), 1, fn="avg", name="global_pool"))
        layers.append(LayerSpec("linear", c, classes, (1, 1), (1, 1), name="classifier"))
        return layers

    def build(self, arch: Arch, input_shape, classes):
        from .tcn_torch import Tcn1d

        return Tcn1d(self.blocks(arch, input_shape), classes)
