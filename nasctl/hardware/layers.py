"""`LayerSpec`: the one intermediate representation between networks and devices.

Search spaces emit it, the ONNX importer emits it, and every cost model prices it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Op kinds a cost model may be asked to price.
#   conv    - 2-D convolution (groups == in_ch for depthwise); batch-norm and the
#             activation that follows are fused into it, as runtimes do.
#   linear  - fully connected layer (in_hw == out_hw == (1, 1)).
#   pool    - pooling (global average pooling when out_hw == (1, 1)).
#   add     - element-wise sum of two tensors of the output shape (residuals).
MAC_OPS = frozenset({"conv", "linear"})
OPS = MAC_OPS | {"pool", "add"}


@dataclass(frozen=True, slots=True)
class LayerSpec:
    op: str
    in_ch: int
    out_ch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int] = (1, 1)
    stride: int = 1
    groups: int = 1
    w_bits: int = 32
    a_bits: int = 32
    # Early exits: `segment` is the index (0-based, over the network's active exits,
    # the final classifier last) of the first exit this layer lies before.  Exit-head
    # layers carry their own exit's index and role "exit".  Reaching exit k costs every
    # layer whose segment is <= k.
    segment: int = 0
    role: str = "backbone"
    name: str = field(default="", compare=False)

    @property
    def macs(self) -> int:
        """Multiply-accumulates for one input."""
        if self.op == "conv":
            kh, kw = self.kernel
            return self.out_hw[0] * self.out_hw[1] * self.out_ch * (self.in_ch // self.groups) * kh * kw
        if self.op == "linear":
            return self.in_ch * self.out_ch
        return 0

    @property
    def params(self) -> int:
        """Weights and biases (batch-norm folded into the conv bias)."""
        if self.op == "conv":
            kh, kw = self.kernel
            return self.out_ch * (self.in_ch // self.groups) * kh * kw + self.out_ch
        if self.op == "linear":
            return self.in_ch * self.out_ch + self.out_ch
        return 0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.w_bits / 8

    @property
    def in_elems(self) -> int:
        n = self.in_ch * self.in_hw[0] * self.in_hw[1]
        return 2 * n if self.op == "add" else n

    @property
    def out_elems(self) -> int:
        return self.out_ch * self.out_hw[0] * self.out_hw[1]

    @property
    def in_bytes(self) -> float:
        return self.in_elems * self.a_bits / 8

    @property
    def out_bytes(self) -> float:
        return self.out_elems * self.a_bits / 8

    def shape_key(self) -> tuple:
        """What determines this layer's cost (everything but its place in the network)."""
        return (self.op, self.in_ch, self.out_ch, self.in_hw, self.out_hw, self.kernel,
                self.stride, self.groups, self.w_bits, self.a_bits)
