"""`kind: vit` - a vision-transformer macro space with early exits and quantization.

The network: an optional convolutional stem (a small conv before patchifying: a hybrid),
a patch embedding (a conv with kernel = stride = patch size) plus a learned position
embedding, then groups of pre-norm transformer blocks (multi-head self-attention with
separate q, k and v projections, then a GELU MLP), each block adding its results to the
token stream.  Heads - the early exits and the final classifier - read the mean of the
tokens (no class token): mean over tokens → LayerNorm → linear (an exit head: linear to
its width → GELU → linear to the classes).

Knobs: patch (the patch size; it must divide the input's height and width), width (the
embedding width), heads (attention heads; every choice must divide every width), conv_stem
(0/1), per block group g{i}_depth and g{i}_mlp_ratio (groups 1-based), exit_g{i} (0/1) and
exit_g{i}_width for each group an exit may follow, exit_tolerance (with
`exits.tolerance`), backbone_bits, attn_bits (with `quantization.attn_bits`: the bit width
of the attention - q/k/v/output projections and the two attention products - apart from
the MLP) and exit_bits.  A list in the spec is a knob; a scalar is fixed.
"""

from __future__ import annotations

from math import prod
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from ..errors import ConfigError
from ..hardware.layers import STRIDED, LayerSpec, chw, reduction_is_strided, transpose_fn
from .base import Arch, SearchSpace, Variable, machine_memory
from .spec_parts import BitKnobs, Choice, ExitKnobs, check_bits, idle_exit_knobs
from .spec_parts import Strict as _Strict
from .spec_parts import choices as _choices
from .spec_parts import positive as _positive

MAX_DEPTH = 64
TRAIN_BYTES_PER_PARAM = 16  # float32 weight, its gradient, AdamW's two moments
SAVED_PER_LAYER = 2         # activations a layer keeps for the backward pass (its output, its quantized copy)


class StemSpec(_Strict):
    """The optional convolutional stem: conv k×k stride 1 → BN → ReLU, before patchifying."""

    channels: int = Field(default=16, gt=0)
    kernel: int = Field(default=3, gt=0, le=7)
    use: Choice = 0  # 0/1, or [0, 1]: the knob conv_stem

    @field_validator("use")
    @classmethod
    def _flag(cls, v: Choice) -> Choice:
        values = _choices(v)
        if not values or any(x not in (0, 1) for x in values):
            raise ValueError("must be 0, 1 or [0, 1]")
        return v

    @field_validator("kernel")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError("the stem's kernel size must be odd (1, 3, 5, 7)")
        return v


class GroupSpec(_Strict):
    depth: Choice
    mlp_ratio: Choice = 2

    _positive = field_validator("depth", "mlp_ratio")(classmethod(lambda cls, v: _positive(v)))

    @field_validator("depth")
    @classmethod
    def _depth(cls, v: Choice) -> Choice:
        if max(_choices(v)) > MAX_DEPTH:
            raise ValueError(f"{max(_choices(v))} is too large; allowed: 1 … {MAX_DEPTH}")
        return v


class ExitSpec(ExitKnobs):
    after_groups: list[int] = []


class QuantSpec(BitKnobs):
    attn_bits: Optional[Choice] = None  # the attention's own bit width (a knob); None: the backbone's

    _attn_bits = field_validator("attn_bits")(classmethod(lambda cls, v: check_bits(v)))


class VitSpec(_Strict):
    name: str
    kind: str
    description: str = ""
    patch: Choice
    width: Choice
    heads: Choice = 1
    stem: StemSpec = StemSpec()
    groups: list[GroupSpec] = Field(min_length=1)
    exits: ExitSpec = ExitSpec()
    quantization: QuantSpec = QuantSpec()

    _positive = field_validator("patch", "width", "heads")(classmethod(lambda cls, v: _positive(v)))

    @model_validator(mode="after")
    def _consistent(self) -> "VitSpec":
        n = len(self.groups)
        for g in self.exits.after_groups:
            if not 1 <= g < n:
                raise ValueError(f"exits.after_groups: group {g} must be between 1 and {n - 1} "
                                 "(the last group is followed by the final classifier)")
        bad = [(h, w) for h in _choices(self.heads) for w in _choices(self.width) if w % h]
        if bad:
            h, w = bad[0]
            raise ValueError(f"heads {h} does not divide width {w}: every heads choice must divide "
                             "every width choice")
        return self


class VitSpace(SearchSpace):
    """See the module docstring for the knobs."""

    def __init__(self, spec: VitSpec):
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        q = spec.quantization
        vs = [Variable("patch", _choices(spec.patch)), Variable("width", _choices(spec.width)),
              Variable("heads", _choices(spec.heads)), Variable("conv_stem", _choices(spec.stem.use))]
        for i, g in enumerate(spec.groups, 1):
            vs.append(Variable(f"g{i}_depth", _choices(g.depth)))
            vs.append(Variable(f"g{i}_mlp_ratio", _choices(g.mlp_ratio)))
        for i in spec.exits.after_groups:
            vs.append(Variable(f"exit_g{i}", (0, 1)))
            vs.append(Variable(f"exit_g{i}_width", _choices(spec.exits.width)))
        if spec.exits.tolerance is not None:
            vs.append(Variable("exit_tolerance", tuple(spec.exits.tolerance)))
        vs.append(Variable("backbone_bits", _choices(q.backbone_bits)))
        if q.attn_bits is not None:
            vs.append(Variable("attn_bits", _choices(q.attn_bits)))
        vs.append(Variable("exit_bits", _choices(q.exit_bits)))
        self._variables = tuple(vs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VitSpace":
        return cls(VitSpec.model_validate(data))

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    def exit_names(self) -> list[str]:
        return [f"g{i}" for i in self.spec.exits.after_groups] + ["final"]

    def active_exits(self, arch: Arch) -> list[str]:
        return [f"g{i}" for i in self.spec.exits.after_groups if arch[f"exit_g{i}"]] + ["final"]

    def largest(self) -> dict:
        """Every knob at its largest choice, the smallest patch (the most tokens), exits on."""
        arch = {v.name: max(v.choices) for v in self._variables}
        arch["patch"] = min(self._variables[0].choices)
        return arch

    # -- input checks --------------------------------------------------------------------
    def _check_patches(self, input_shape: tuple[int, int, int], patches=None) -> None:
        _, h, w = input_shape
        for p in patches or _choices(self.spec.patch):
            if h % p or w % p:
                raise ConfigError(f"search space '{self.name}': patch size {p} does not divide the input's "
                                  f"{h}x{w} pixels; choose patch sizes that divide both (key 'patch')")

    def check_fits(self, input_shape: tuple[int, int, int], classes: int, batch_size: int,
                   memory: Optional[int] = None) -> None:
        """Refuse (one line) a patch size that does not divide the input, or a space whose
        largest architecture's training state and one batch's activations exceed memory."""
        input_shape = tuple(input_shape)
        self._check_patches(input_shape)
        memory = memory or machine_memory()
        if memory is None:
            return
        layers = self.to_layers(self.largest(), input_shape, classes)
        weights = sum(l.params for l in layers) * TRAIN_BYTES_PER_PARAM
        acts = 4 * batch_size * (SAVED_PER_LAYER * sum(l.out_elems for l in layers) + prod(input_shape))
        if weights + acts > memory:
            raise ConfigError(f"search space '{self.name}': its largest architecture needs "
                              f"{(weights + acts) / 2**30:.3g} GiB to train at input {'x'.join(map(str, input_shape))} "
                              f"with batches of {batch_size}, more than this machine's {memory / 2**30:.3g} GiB; "
                              "lower the widths, depths or MLP ratios, raise the smallest patch size, or lower "
                              "the batch size")

    # -- the network ---------------------------------------------------------------------
    def idle_knobs(self, arch: Arch) -> list[str]:
        return idle_exit_knobs(arch, [f"exit_g{i}" for i in self.spec.exits.after_groups])

    def plan(self, arch: Arch) -> list[dict]:
        """The network as an ordered list of blocks, shared by `to_layers` and `build`.

        Blocks: {"type": "stem", out, kernel, bits}                  (the optional conv stem)
                {"type": "embed", out, patch, bits}                   (patch embedding + position)
                {"type": "block", width, heads, hidden, bits, attn_bits}  (one transformer block)
                {"type": "exit", name, width, hidden, bits, in_bits}  (an exit head)
                {"type": "head", width, bits}                         (the final classifier)
        """
        arch = self.validate(arch)
        bb, eb = arch["backbone_bits"], arch["exit_bits"]
        ab = arch.get("attn_bits", bb)
        c = arch["width"]
        blocks: list[dict] = []
        if arch["conv_stem"]:
            blocks.append({"type": "stem", "out": self.spec.stem.channels, "kernel": self.spec.stem.kernel,
                           "bits": bb})
        blocks.append({"type": "embed", "out": c, "patch": arch["patch"], "bits": bb})
        for i in range(1, len(self.spec.groups) + 1):
            for _ in range(arch[f"g{i}_depth"]):
                blocks.append({"type": "block", "width": c, "heads": arch["heads"],
                               "hidden": c * arch[f"g{i}_mlp_ratio"], "bits": bb, "attn_bits": ab})
            if i in self.spec.exits.after_groups and arch[f"exit_g{i}"]:
                blocks.append({"type": "exit", "name": f"g{i}", "width": c, "hidden": arch[f"exit_g{i}_width"],
                               "bits": eb, "in_bits": bb})
        blocks.append({"type": "head", "width": c, "bits": bb})
        return blocks

    def to_layers(self, arch: Arch, input_shape: tuple[int, int, int], classes: int) -> list[LayerSpec]:
        plan = self.plan(arch)
        self._check_patches(tuple(input_shape), [arch["patch"]])
        ch, h, w = input_shape
        tokens = 0
        layers: list[LayerSpec] = []
        segment = 0
        for n, block in enumerate(plan):
            new, ch, h, w, tokens = _block_layers(block, ch, h, w, tokens, classes, segment, f"b{n}")
            layers += new
            segment += block["type"] == "exit"
        return layers

    def build(self, arch: Arch, input_shape: tuple[int, int, int], classes: int):
        from .vit_torch import build_vit

        self._check_patches(tuple(input_shape), [self.validate(arch)["patch"]])
        return build_vit(self.plan(arch), input_shape, classes)

    def default_input(self) -> tuple[tuple[int, int, int], int]:
        """Digits' shape: 8x8 grey images, 10 classes."""
        return (1, 8, 8), 10


def _block_layers(block: dict, ch: int, h: int, w: int, tokens: int, classes: int, segment: int,
                  prefix: str) -> tuple[list[LayerSpec], int, int, int, int]:
    """The layers of one plan block, and the size of what follows it: channels, (h, w) of
    the image (before patchifying) and the token count (after)."""
    layers: list[LayerSpec] = []
    kind, bits = block["type"], block["bits"]

    def add(op, in_shape, out_shape, b=bits, role="backbone", name="", **kw):
        (ci, in_hw), (co, out_hw) = chw(in_shape), chw(out_shape)
        layers.append(LayerSpec(op, ci, co, in_hw, out_hw, w_bits=kw.pop("w_bits", b), a_bits=kw.pop("a_bits", b),
                                segment=segment, role=role, name=f"{prefix}.{name}", **kw))

    def transpose(in_shape, perm, b=bits, name=""):
        """A transpose, labelled as the importer labels it (`transpose_fn`)."""
        add("data", in_shape, tuple(in_shape[p] for p in perm), b, name=name, fn=transpose_fn(in_shape, perm))

    def linear(cin, cout, t, b=bits, role="backbone", name="", fn=""):
        layers.append(LayerSpec("linear", cin, cout, (t, 1), (t, 1), w_bits=b, a_bits=b, segment=segment,
                                role=role, fn=fn, bias=True, name=f"{prefix}.{name}"))

    if kind == "stem":
        k = block["kernel"]
        layers.append(LayerSpec("conv", ch, block["out"], (h, w), (h, w), (k, k), 1, 1, bits, bits, segment,
                                "backbone", fn="relu", bias=True, name=f"{prefix}.conv"))
        return layers, block["out"], h, w, tokens
    if kind == "embed":
        p, c = block["patch"], block["out"]
        oh, ow = h // p, w // p
        t = oh * ow
        layers.append(LayerSpec("conv", ch, c, (h, w), (oh, ow), (p, p), p, 1, bits, bits, segment,
                                "backbone", bias=True, name=f"{prefix}.patch"))
        transpose((1, c, t), (0, 2, 1), name="tokens")
        add("add", (1, t, c), (1, t, c), name="position")
        return layers, c, oh, ow, t
    t = tokens
    if kind == "block":
        c, heads, ab = block["width"], block["heads"], block["attn_bits"]
        d = c // heads
        add("norm", (1, t, c), (1, t, c), name="norm1", fn="layer")
        for part, perm in (("q", (0, 2, 1, 3)), ("k", (0, 2, 3, 1)), ("v", (0, 2, 1, 3))):
            linear(c, c, t, ab, name=part)
            transpose((1, t, heads, d), perm, ab, name=f"{part}.heads")
        layers.append(LayerSpec("matmul", d, t, (t, heads), (t, heads), w_bits=ab, a_bits=ab, segment=segment,
                                bias=False, name=f"{prefix}.scores"))
        # (the scores' scaling by 1/sqrt(d) is folded into the product, as onnxruntime runs it)
        add("softmax", (1, heads, t, t), (1, heads, t, t), ab, name="softmax")
        layers.append(LayerSpec("matmul", t, d, (t, heads), (t, heads), w_bits=ab, a_bits=ab, segment=segment,
                                bias=False, name=f"{prefix}.mix"))
        transpose((1, heads, t, d), (0, 2, 1, 3), ab, name="merge")
        linear(c, c, t, ab, name="proj")
        add("add", (1, t, c), (1, t, c), name="add1")
        add("norm", (1, t, c), (1, t, c), name="norm2", fn="layer")
        linear(c, block["hidden"], t, name="fc1", fn="gelu")
        linear(block["hidden"], c, t, name="fc2")
        add("add", (1, t, c), (1, t, c), name="add2")
        return layers, ch, h, w, t
    # exit heads and the final classifier: mean over tokens → LayerNorm → linear(s)
    c = block["width"]
    role = "exit" if kind == "exit" else "backbone"
    ib = block.get("in_bits", bits)
    pooled = STRIDED if reduction_is_strided((1, t, c), (1,), "mean") else "avg"  # tokens are not innermost
    layers.append(LayerSpec("pool", c, c, (t, 1), (1, 1), (t, 1), 1, 1, ib, ib, segment, role, fn=pooled,
                            name=f"{prefix}.pool"))
    add("norm", (1, c), (1, c), role=role, name="norm", fn="layer")
    if kind == "exit":
        linear(c, block["hidden"], 1, role=role, name="fc1", fn="gelu")
        linear(block["hidden"], classes, 1, role=role, name="fc2")
    else:
        linear(c, classes, 1, role=role, name="fc")
    return layers, ch, h, w, t
