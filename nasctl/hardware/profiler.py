"""`nasctl hw profile`: measure this machine's onnxruntime CPU kernels into a `kind: lut` device.

What is measured.  Runtimes do not run layers one by one: onnxruntime fuses a conv with
its batch norm and activation (and often the residual add after it) into one kernel,
keeps conv nets in a blocked channel layout (NCHWc) and converts in and out of it where
the layout ends, and wraps 3-D matrix products in reshapes.  A kernel timed alone pays
all of that plus a per-run overhead of tens of microseconds, so summing isolated
kernels overestimates a whole model 1.4-5x.  So kernels are measured *in context*:

1. Random *context networks* are built with `onnx.helper` from the blocks real models
   are made of - conv stacks, residual basic and bottleneck blocks, inverted residuals
   with squeeze-excite, fire modules, dense and shuffle units, U-Net encoder-decoders
   (max pooling, nearest/linear resize or transposed conv, skip concatenation), and
   transformer / mixer blocks (layer norm, linear, attention matmuls, softmax, GELU) -
   over inputs of 32-224 px, 3-1024 channels, kernels 1-7 (and patch embeddings),
   strides 1-2, dense, grouped and depthwise convs, float32 and int8 (conv nets quantized
   by onnxruntime's static quantizer, QDQ, as users quantize models for onnxruntime; it
   runs them as QLinearConv / QGemm where it can).  Resizes are written as exporters write
   them (the coordinate mode decides whether onnxruntime runs them in its blocked layout).
   Every node of a kernel carries the kernel's tag in its name.
2. Each network runs with `SessionOptions.enable_profiling`; the per-node kernel times
   onnxruntime records (minimum over the profiled runs) are summed per tag - a node
   onnxruntime adds, like a layout reorder, counts for the kernel before it, and a node
   it fused from several kernels for those of them that ran no node of their own - and
   go to the layers the ONNX importer (`nasctl.hardware.onnx_import`) reads from the
   network, exactly as `nasctl predict` reads a user's model.
3. Each network is also timed end to end, without profiling.  The run overhead and the
   profiler's own cost per node (about a microsecond and a half) are fitted to those
   times, and the latter is taken off every profiled node.
4. The profiler's clock is the wall clock: on a busy machine a kernel longer than the
   OS's time slice is profiled with time other processes got.  So kernels that profile
   longer than 0.5 ms are cut out of their network and timed again alone, with the
   thread clock, less the run overhead and the layout reorders around them.
5. Networks are measured in chunks (which bounds the memory of open sessions); the same
   few small reference networks run in every chunk, and a chunk whose references ran
   slower than in the fastest chunk - the machine was busier - has its times scaled back.
6. `nasctl.hardware.fit.fit_from_lut` makes the device of the kernel times: one row per
   distinct kernel (the median of its measurements) and a regressor per kernel type,
   chosen by cross-validation over whole networks held out; then `spec.yaml` and
   `lut.csv` are written.

Timing protocol (both for kernels and end to end): sessions run with the requested
number of intra-op threads (default 1) and sequential execution; items are timed
round-robin - each round runs every item a few times and keeps its fastest run - and an
item's time is its minimum over all rounds.  Plain medians drift by ~8% between runs
minutes apart on a shared machine; the interleaved minimum repeats within ~1%.  With one
thread onnxruntime computes on the calling thread, so the clock is that thread's CPU
time: the same as wall-clock latency on an idle core, and blind to time the OS gives to
other processes.  With more threads the clock is wall-clock time.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import UsageError
from .layers import LayerSpec

OPSET = 20
TAG = re.compile(r"k(\d+):")


# --- timing ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Protocol:
    """How items are timed; recorded in the device spec's `measurement:` section."""

    threads: int = 1
    rounds: int = 15
    repeats: int = 3
    warmup: int = 2

    @property
    def clock(self) -> str:
        return "thread_cpu" if self.threads == 1 else "wall"

    def describe(self) -> dict:
        return {"threads": self.threads, "rounds": self.rounds, "repeats_per_round": self.repeats,
                "warmup_runs": self.warmup, "clock": self.clock,
                "statistic": "minimum over rounds of the fastest run per round, items interleaved round-robin",
                "clock_note": ("CPU time of the calling thread (onnxruntime computes on it with one thread): "
                               "wall-clock latency on an idle core, blind to other processes"
                               if self.clock == "thread_cpu" else "wall-clock time")}


def session_options(threads: int, profile_prefix: Optional[str] = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model, threads: int, profile_prefix: Optional[str] = None):
    """An onnxruntime CPU session for a model (a path or serialized bytes)."""
    import onnxruntime as ort

    src = str(model) if isinstance(model, (str, Path)) else model
    return ort.InferenceSession(src, session_options(threads, profile_prefix), providers=["CPUExecutionProvider"])


_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
                "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
                "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def random_feed(session, rng: np.random.Generator) -> dict:
    """Seeded inputs for every graph input (a dynamic dim taken as 1)."""
    feed = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = _NUMPY_TYPES.get(inp.type)
        if dtype is None:
            raise UsageError(f"model input '{inp.name}' has type {inp.type}; nasctl feeds numeric tensors only")
        values = rng.standard_normal(shape)
        feed[inp.name] = (values if np.issubdtype(dtype, np.floating) else np.clip(values, 0, 1)).astype(dtype)
    return feed


def interleaved_min(runs: Sequence[Callable[[], object]], protocol: Protocol,
                    on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """Each run's time (ms) by the protocol: round-robin rounds, fastest of a few repeats
    per round, minimum over rounds."""
    now = time.thread_time_ns if protocol.clock == "thread_cpu" else time.perf_counter_ns
    for run in runs:
        for _ in range(protocol.warmup):
            run()
    best = np.full(len(runs), np.inf)
    for _ in range(protocol.rounds):
        for i, run in enumerate(runs):
            for _ in range(protocol.repeats):
                t0 = now()
                run()
                best[i] = min(best[i], now() - t0)
        if on_round is not None:
            on_round()
    return best / 1e6


def measure_models(models: Sequence, protocol: Protocol, seed: int = 0,
                   on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """End-to-end latency (ms) of each ONNX model (paths or bytes), measured together."""
    rng = np.random.default_rng(seed)
    runs = []
    for model in models:
        sess = make_session(model, protocol.threads)
        feed = random_feed(sess, rng)
        runs.append(lambda s=sess, f=feed: s.run(None, f))
    return interleaved_min(runs, protocol, on_round)


# --- context networks ------------------------------------------------------------------

class NetBuilder:
    """Builds a float32 ONNX graph kernel by kernel.  Each kernel gets a tag `k<n>:` that
    prefixes the names of its nodes and of the tensors they write, so onnxruntime's profile
    (whose node names derive from either) can be attributed back to kernels.  `quantize`
    makes an int8 network of one."""

    def __init__(self, rng: np.random.Generator, input_shape: Sequence[int]):
        self.rng = rng
        self.nodes: list = []
        self.inits: list = []
        self.shapes: dict[str, tuple[int, ...]] = {"input": tuple(input_shape)}
        self.kernels = 0
        self.macs = 0
        self._consts = 0

    # -- plumbing --
    def _tag(self) -> str:
        self.kernels += 1
        return f"k{self.kernels}:"

    def const(self, values, dtype=np.float32) -> str:
        from onnx import numpy_helper

        self._consts += 1
        name = f"c{self._consts}"
        array = np.asarray(values, dtype=dtype)
        self.inits.append(numpy_helper.from_array(array, name))
        self.shapes[name] = array.shape
        return name

    def node(self, op: str, inputs: list[str], tag: str, out: str, shape: tuple[int, ...], **attrs) -> str:
        from onnx import helper

        name = f"{tag}{out}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [name], name=f"{tag}{op.lower()}_{len(self.nodes)}", **attrs))
        self.shapes[name] = tuple(shape)
        return name

    def _weight(self, shape: Sequence[int], fan_in: int) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(max(fan_in, 1)))

    def _act(self, x: str, fn: str, tag: str) -> str:
        shape = self.shapes[x]
        if not fn:
            return x
        if fn == "relu6":
            return self.node("Clip", [x, self.const(0.0), self.const(6.0)], tag, "act", shape)
        if fn == "swish":
            s = self.node("Sigmoid", [x], tag, "sig", shape)
            return self.node("Mul", [x, s], tag, "act", shape)
        op = {"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid", "hardsigmoid": "HardSigmoid",
              "gelu": "Gelu", "tanh": "Tanh", "leakyrelu": "LeakyRelu"}[fn]
        return self.node(op, [x], tag, "act", shape)

    # -- kernels on N, C, H, W tensors --
    def conv(self, x: str, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: str = "",
             pad: Optional[int] = None) -> str:
        tag = self._tag()
        _, cin, h, w = self.shapes[x]
        pad = k // 2 if pad is None else pad
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        weight = self._weight((cout, cin // groups, k, k), cin // groups * k * k)
        y = self.node("Conv", [x, weight, self.const(self.rng.standard_normal(cout) * 0.1)], tag, "conv",
                      (1, cout, oh, ow), kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
        self.macs += oh * ow * cout * (cin // groups) * k * k
        return self._act(y, act, tag)

    def conv_transpose(self, x: str, cout: int, k: int = 2, stride: int = 2) -> str:
        tag = self._tag()
        _, cin, h, w = self.shapes[x]
        weight = self._weight((cin, cout, k, k), cin * k * k)
        shape = (1, cout, (h - 1) * stride + k, (w - 1) * stride + k)
        self.macs += h * w * cin * cout * k * k
        return self.node("ConvTranspose", [x, weight, self.const(np.zeros(cout))], tag, "convt", shape,
                         kernel_shape=[k, k], strides=[stride, stride])

    def pool(self, x: str, kind: str, k: int = 2, stride: int = 2, pad: int = 0) -> str:
        tag = self._tag()
        n, c, h, w = self.shapes[x]
        shape = (n, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        op = "MaxPool" if kind == "max" else "AveragePool"
        return self.node(op, [x], tag, "pool", shape, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def global_pool(self, x: str) -> str:
        tag = self._tag()
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], tag, "gap", (n, c, 1, 1))

    def add(self, a: str, b: str) -> str:
        tag = self._tag()
        return self.node("Add", [a, b], tag, "add", self.shapes[a])

    def mul(self, a: str, b: str) -> str:
        tag = self._tag()
        return self.node("Mul", [a, b], tag, "mul", self.shapes[a])

    def act(self, x: str, fn: str) -> str:
        tag = self._tag()
        return self._act(x, fn, tag)

    def batch_norm(self, x: str) -> str:
        tag = self._tag()
        c = self.shapes[x][1]
        params = [self.const(v) for v in (np.ones(c), np.zeros(c), np.zeros(c), np.ones(c))]
        return self.node("BatchNormalization", [x, *params], tag, "bn", self.shapes[x])

    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        tag = self._tag()
        shape = list(self.shapes[xs[0]])
        shape[axis] = sum(self.shapes[x][axis] for x in xs)
        return self.node("Concat", list(xs), tag, "cat", tuple(shape), axis=axis)

    def split(self, x: str, parts: Sequence[int]) -> list[str]:
        from onnx import helper

        tag = self._tag()
        outs = [f"{tag}split{i}_{len(self.nodes)}" for i in range(len(parts))]
        self.nodes.append(helper.make_node("Split", [x, self.const(list(parts), np.int64)], outs,
                                           name=f"{tag}split_{len(self.nodes)}", axis=1))
        for name, c in zip(outs, parts):
            shape = list(self.shapes[x])
            shape[1] = c
            self.shapes[name] = tuple(shape)
        return outs

    # How exporters write upsampling (torch's `nn.Upsample`, TensorFlow's resize ops); the
    # coordinate mode decides whether onnxruntime runs a Resize in its blocked layout.
    RESIZE_MODES = {"nearest": {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                    "linear": {"coordinate_transformation_mode": "half_pixel"}}

    def resize(self, x: str, mode: str, scale: int = 2) -> str:
        tag = self._tag()
        n, c, h, w = self.shapes[x]
        scales = self.const([1.0, 1.0, float(scale), float(scale)])
        return self.node("Resize", [x, "", scales], tag, "resize", (n, c, h * scale, w * scale), mode=mode,
                         **self.RESIZE_MODES[mode])

    def reshape(self, x: str, shape: Sequence[int], tag: Optional[str] = None) -> str:
        tag = tag or self._tag()
        return self.node("Reshape", [x, self.const(list(shape), np.int64)], tag, "reshape", tuple(shape))

    def transpose(self, x: str, perm: Sequence[int], tag: Optional[str] = None) -> str:
        tag = tag or self._tag()
        shape = tuple(self.shapes[x][p] for p in perm)
        return self.node("Transpose", [x], tag, "transpose", shape, perm=list(perm))

    def channel_shuffle(self, x: str, groups: int = 2) -> str:
        n, c, h, w = self.shapes[x]
        y = self.reshape(x, (n, groups, c // groups, h, w))
        y = self.transpose(y, (0, 2, 1, 3, 4))
        return self.reshape(y, (n, c, h, w))

    # -- kernels on 1, T, C token tensors --
    def linear(self, x: str, cout: int, act: str = "") -> str:
        tag = self._tag()
        shape = self.shapes[x]
        cin = shape[-1]
        y = self.node("MatMul", [x, self._weight((cin, cout), cin)], tag, "mm", (*shape[:-1], cout))
        y = self.node("Add", [y, self.const(self.rng.standard_normal(cout) * 0.1)], tag, "bias", self.shapes[y])
        self.macs += int(np.prod(shape[:-1])) * cin * cout
        return self._act(y, act, tag)

    def classifier(self, x: str, classes: int) -> str:
        tag = self._tag()
        flat = self.node("Flatten", [x], tag, "flat", (1, int(np.prod(self.shapes[x][1:]))))
        cin = self.shapes[flat][1]
        self.macs += cin * classes
        return self.node("Gemm", [flat, self._weight((classes, cin), cin), self.const(np.zeros(classes))], tag, "fc",
                         (1, classes), transB=1)

    def layer_norm(self, x: str) -> str:
        tag = self._tag()
        c = self.shapes[x][-1]
        return self.node("LayerNormalization", [x, self.const(np.ones(c)), self.const(np.zeros(c))],
                         tag, "ln", self.shapes[x], axis=-1)

    def softmax(self, x: str) -> str:
        tag = self._tag()
        return self.node("Softmax", [x], tag, "softmax", self.shapes[x], axis=-1)

    def matmul(self, a: str, b: str) -> str:
        tag = self._tag()
        sa, sb = self.shapes[a], self.shapes[b]
        self.macs += int(np.prod(sa)) * sb[-1]
        return self.node("MatMul", [a, b], tag, "matmul", (*sa[:-1], sb[-1]))

    def scale(self, x: str, value: float) -> str:
        tag = self._tag()
        return self.node("Mul", [x, self.const(value)], tag, "scale", self.shapes[x])

    def token_mean(self, x: str) -> str:
        tag = self._tag()
        n, t, c = self.shapes[x]
        return self.node("ReduceMean", [x, self.const([1], np.int64)], tag, "mean", (n, 1, c), keepdims=1)

    def model(self, output: str):
        """The ONNX model, with the shape of every tensor (so kernels can be cut out of it)."""
        from onnx import TensorProto, helper

        def info(name: str):
            return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(self.shapes[name]))

        inner = [info(o) for n in self.nodes for o in n.output if o != output]
        graph = helper.make_graph(self.nodes, "context", [info("input")], [info(output)], self.inits, value_info=inner)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nasctl")
        model.ir_version = 10
        return model


# Channel counts real models use: multiples of 8 from width multipliers, and ShuffleNetV2's
# 116 / 244 / 488, whose halves (58, 122) are not multiples of 4.
WIDTHS = (8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 116, 120, 128, 144, 160, 176, 192, 200, 232, 240, 244,
          256, 288, 320, 384, 464, 480, 488, 512, 576, 640, 672, 768, 960, 1024)
SIZES = (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224)
CONV_ACTS = ("relu", "relu", "relu6", "hardswish", "swish", "", "gelu", "sigmoid")


def _pick(rng: np.random.Generator, values: Sequence, p=None):
    return values[int(rng.choice(len(values), p=p))]


def _width(rng: np.random.Generator, near: float) -> int:
    """A common channel count near `near`."""
    w = np.asarray(WIDTHS)
    idx = int(np.argmin(np.abs(np.log(w / max(near, 1.0)))))
    return int(w[int(np.clip(idx + rng.integers(-1, 2), 0, len(w) - 1))])


class _Blocks:
    """The blocks of the context networks (each appends its kernels to the builder)."""

    def __init__(self, b: NetBuilder, rng: np.random.Generator):
        self.b, self.rng = b, rng

    def ch(self, x: str) -> int:
        return self.b.shapes[x][1]

    def plain(self, x, cout, stride, act):
        k = _pick(self.rng, (1, 3, 3, 3, 5, 7))
        groups = _pick(self.rng, (1, 1, 1, 1, 2, 4, 8)) if k > 1 else 1
        if self.ch(x) % groups or cout % groups:
            groups = 1
        return self.b.conv(x, cout, k, stride, groups, act)

    def basic(self, x, cout, stride, act):
        b = self.b
        y = b.conv(b.conv(x, cout, 3, stride, act=act), cout, 3)
        short = x if stride == 1 and self.ch(x) == cout else b.conv(x, cout, 1, stride)
        return b.act(b.add(y, short), act or "relu")

    def bottleneck(self, x, cout, stride, act):
        b = self.b
        width = max(8, cout // 4)
        y = b.conv(b.conv(b.conv(x, width, 1, act=act), width, 3, stride, act=act), cout, 1)
        short = x if stride == 1 and self.ch(x) == cout else b.conv(x, cout, 1, stride)
        return b.act(b.add(y, short), act or "relu")

    def mbconv(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        cin = self.ch(x)
        hidden = cin * _pick(rng, (1, 3, 4, 6, 6))
        k = _pick(rng, (3, 3, 5, 7))
        y = b.conv(x, hidden, 1, act=act) if hidden != cin else x
        y = b.conv(y, hidden, k, stride, groups=hidden, act=act)
        if rng.random() < 0.4:
            squeeze = max(8, hidden // 4)
            gate = b.conv(b.conv(b.global_pool(y), squeeze, 1, act=_pick(rng, ("relu", "swish"))), hidden, 1,
                          act=_pick(rng, ("hardsigmoid", "sigmoid")))
            y = b.mul(y, gate)
        y = b.conv(y, cout, 1)
        return b.add(x, y) if stride == 1 and cin == cout else y

    def fire(self, x, cout, stride, act):
        b = self.b
        if stride > 1:
            x = b.pool(x, "max", 3, 2, 1)
        s = b.conv(x, max(8, cout // 8), 1, act="relu")
        return b.concat([b.conv(s, cout // 2, 1, act="relu"), b.conv(s, cout - cout // 2, 3, act="relu")])

    def dense(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        growth = _pick(rng, (8, 12, 16, 24, 32))
        for _ in range(int(rng.integers(1, 4))):
            y = b.act(b.batch_norm(x), "relu")
            y = b.conv(b.conv(y, 4 * growth, 1, act="relu"), growth, 3)
            x = b.concat([x, y])
        if stride > 1:
            x = b.pool(b.conv(b.act(b.batch_norm(x), "relu"), max(8, self.ch(x) // 2), 1), "avg", 2, 2)
        return x

    def shuffle(self, x, cout, stride, act):
        b = self.b
        cin = self.ch(x)
        half = max(8, cout // 2)
        if stride == 1 and cin % 2 == 0:
            left, right = b.split(x, [cin // 2, cin - cin // 2])
            r = b.conv(b.conv(b.conv(right, cin - cin // 2, 1, act="relu"), cin - cin // 2, 3,
                              groups=cin - cin // 2), cin - cin // 2, 1, act="relu")
            return b.channel_shuffle(b.concat([left, r]))
        left = b.conv(b.conv(x, cin, 3, 2, groups=cin), half, 1, act="relu")
        right = b.conv(b.conv(b.conv(x, half, 1, act="relu"), half, 3, 2, groups=half), half, 1, act="relu")
        return b.channel_shuffle(b.concat([left, right]))

    def mixer_conv(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        if stride > 1 or self.ch(x) != cout:
            x = b.conv(x, cout, 1, stride)
        y = b.batch_norm(b.conv(x, cout, _pick(rng, (3, 5, 7)), groups=cout, act="gelu"))
        return b.batch_norm(b.conv(b.add(x, y), cout, 1, act="gelu"))

    # -- token blocks --
    def attention(self, x):
        b, rng = self.b, self.rng
        _, t, c = b.shapes[x]
        heads = max(1, c // _pick(rng, (32, 64)))
        d = c // heads

        def split(y):
            tag = b._tag()
            return b.transpose(b.reshape(y, (1, t, heads, d), tag), (0, 2, 1, 3), tag)

        q, k, v = (split(b.linear(x, c)) for _ in range(3))
        tag = b._tag()
        kt = b.transpose(k, (0, 1, 3, 2), tag)
        att = b.softmax(b.scale(b.matmul(q, kt), d ** -0.5))
        y = b.matmul(att, v)
        tag = b._tag()
        y = b.reshape(b.transpose(y, (0, 2, 1, 3), tag), (1, t, c), tag)
        return b.linear(y, c)

    def transformer(self, x, mixer: bool):
        b, rng = self.b, self.rng
        _, t, c = b.shapes[x]
        if mixer:
            tag = b._tag()
            y = b.transpose(b.layer_norm(x), (0, 2, 1), tag)
            y = b.linear(b.linear(y, max(8, c // 2), act="gelu"), t)
            tag = b._tag()
            x = b.add(x, b.transpose(y, (0, 2, 1), tag))
        else:
            x = b.add(x, self.attention(b.layer_norm(x)))
        y = b.linear(b.linear(b.layer_norm(x), c * _pick(rng, (2, 4)), act="gelu"), c)
        return b.add(x, y)


def random_network(rng: np.random.Generator, max_macs: float = 1e8):
    """A random context network (an onnx.ModelProto) and a short description of it."""
    family = _pick(rng, ("cnn", "cnn", "cnn", "cnn", "int8", "int8", "transformer", "unet"))
    budget = float(np.exp(rng.uniform(np.log(1e6), np.log(max_macs))))
    size = _pick(rng, SIZES)
    if family == "transformer":
        return _transformer_net(rng, size, budget)
    if family == "unet":
        return _unet_net(rng, size, budget)
    if family == "int8":
        model, description = _cnn_net(rng, size, budget, int8=True)
        return quantize(model, rng), f"int8 {description}"
    return _cnn_net(rng, size, budget)


def _cnn_net(rng, size, budget, int8: bool = False):
    """A conv net; with `int8`, one to be quantized: its activations are those static
    quantization folds into a kernel's output range (others would run apart, in float
    between quantization pairs, inside one kernel's tag)."""
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng)
    kinds = ("plain", "basic", "bottleneck", "mbconv", "fire", "dense", "shuffle") + (() if int8 else ("mixer_conv",))
    kind = _pick(rng, kinds)
    act = _pick(rng, ("relu", "relu6", "") if int8 else CONV_ACTS[:-2])
    width = _width(rng, _pick(rng, (16, 24, 32, 48, 64)))
    stride = 2 if size >= 96 or rng.random() < 0.3 else 1
    x = b.conv("input", width, _pick(rng, (3, 3, 5, 7)) if kind != "mixer_conv" else 1, stride, act=act or "relu")
    if size >= 112 and rng.random() < 0.5:
        x = b.pool(x, "max", 3, 2, 1)
    while b.macs < budget and b.shapes[x][2] >= 4 and b.kernels < 120:
        if rng.random() < 0.3:
            kind = _pick(rng, kinds)
        cout = _width(rng, width * _pick(rng, (1.0, 1.5, 2.0)))
        for i in range(int(rng.integers(1, 4))):
            x = getattr(blocks, kind)(x, cout, 2 if i == 0 and b.shapes[x][2] >= 8 else 1, act)
            if b.macs >= budget:
                break
        width = blocks.ch(x)
    if rng.random() < 0.3:
        x = b.conv(x, _width(rng, 4 * width), 1, act=act or "relu")
    if rng.random() < 0.2:
        y = b.global_pool(b.conv(x, _pick(rng, (10, 100, 1000)), 1, act="relu"))
    else:
        y = b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000)))
    return b.model(y), f"{kind} {size}px"


def _transformer_net(rng, size, budget):
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng)
    patch = _pick(rng, tuple(p for p in (2, 4, 8, 16) if size // p >= 4 and (size // p) ** 2 <= 400) or (size // 4,))
    dim = _pick(rng, (64, 96, 128, 192, 256, 384))
    mixer = rng.random() < 0.3
    x = b.conv("input", dim, patch, patch, pad=0)
    g = b.shapes[x][2]
    tag = b._tag()
    x = b.transpose(b.reshape(x, (1, dim, g * g), tag), (0, 2, 1), tag)
    if not mixer:
        x = b.concat([b.const(rng.standard_normal((1, 1, dim)) * 0.02), x], axis=1)
        x = b.add(x, b.const(rng.standard_normal(b.shapes[x]) * 0.02))
    for _ in range(int(rng.integers(1, 9))):
        x = blocks.transformer(x, mixer)
        if b.macs >= budget:
            break
    x = b.layer_norm(x)
    x = b.token_mean(x) if mixer or rng.random() < 0.5 else b.reshape(x, (1, b.shapes[x][1] * dim))
    return b.model(b.classifier(x, _pick(rng, (10, 100, 1000)))), f"{'mixer' if mixer else 'vit'} {size}px"


def _unet_net(rng, size, budget):
    channels = _pick(rng, (1, 3))
    b = NetBuilder(rng, (1, channels, size, size))
    up = _pick(rng, ("nearest", "linear", "transpose"))
    width = _pick(rng, (8, 16, 32))
    levels = int(rng.integers(2, 5))
    x, skips = "input", []
    for i in range(levels):
        if i:
            x = b.pool(x, "max", 2, 2)
        x = b.conv(b.conv(x, width << i, 3, act="relu"), width << i, 3, act="relu")
        skips.append(x)
    for i in reversed(range(levels - 1)):
        x = b.conv_transpose(x, b.shapes[x][1]) if up == "transpose" else b.resize(x, up)
        x = b.concat([x, skips[i]])
        x = b.conv(b.conv(x, width << i, 3, act="relu"), width << i, 3, act="relu")
    return b.model(b.conv(x, _pick(rng, (1, 2, 4)), 1)), f"unet-{up} {size}px"


def quantize_int8(src: Path, dst: Path, inputs: Sequence[dict]) -> None:
    """onnxruntime's static quantization of the ONNX model `src` into `dst`: QDQ format, int8
    weights and activations, per tensor, calibrated on `inputs` (feeds)."""
    import logging

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    feeds = iter(inputs)

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    logging.disable(logging.WARNING)  # the quantizer's advice goes to the root logger
    try:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)


def quantize(model, rng: np.random.Generator, samples: int = 2):
    """The int8 network onnxruntime's static quantizer (`quantize_int8`) makes of a float
    context network - as users quantize models for onnxruntime - calibrated on random
    inputs.  A node the quantizer adds without a kernel's tag (the dequantization of a
    weight or of the input) takes the tag of the kernel it feeds."""
    import onnx

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    with tempfile.TemporaryDirectory(prefix="nasctl-int8-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(model.SerializeToString())
        quantize_int8(src, dst, [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(samples)])
        quantized = onnx.shape_inference.infer_shapes(onnx.load(str(dst)))  # kernels are cut out by shape
    consumers: dict[str, list] = {}
    for n in quantized.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    for n in reversed(quantized.graph.node):  # consumers come later in a graph: tag them first
        if TAG.search(n.name) is None:
            tags = [m.group(0) for c in consumers.get(n.output[0], []) if (m := TAG.search(c.name))]
            if tags:
                n.name = tags[0] + n.name
    return quantized


# --- measuring context networks --------------------------------------------------------

@dataclass
class MeasuredNetwork:
    """One context network: its layers (as the importer reads it), each layer's in-context
    time from the profile, and its end-to-end time."""

    description: str
    layers: list[LayerSpec]
    layer_ms: list[float]
    layer_nodes: list[float]  # onnxruntime nodes each layer's time was summed over
    latency_ms: float
    # Long kernels timed alone: layer index -> (end-to-end ms, profiled ms and count of the
    # nodes onnxruntime ran before the kernel, e.g. a layout reorder of its input).
    alone: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    energy_mj: Optional[float] = None  # energy of one run, where the machine has energy counters


def _node_times(profile_file: str) -> list[tuple[str, float]]:
    """(node name, minimum kernel time in ms over the profiled runs), in execution order."""
    with open(profile_file, encoding="utf-8") as f:
        events = json.load(f)
    best: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            best[name] = min(best.get(name, np.inf), e["dur"] / 1e3)
    return list(best.items())


def attribute(nodes: list[tuple[str, float]], layers: Sequence[LayerSpec]) -> tuple[list[float], list[float]]:
    """Each layer's share of the profiled node times, and of the nodes.

    A node whose name carries a kernel tag counts for that kernel.  An untagged node
    (one onnxruntime made) stands in for the kernels it replaced - the tagged kernels
    between its tagged neighbours that ran no node of their own (e.g. an add and a layer
    norm fused into one SkipLayerNormalization) - or, if there are none, counts for the
    kernel before it (layout reorders and reshapes around a kernel).  A kernel's time
    goes to its layer; a kernel without a layer (a reshape) passes its time to the layer
    before it."""
    tags = [int(m.group(1)) if (m := TAG.search(name)) else None for name, _ in nodes]
    seen = {t for t in tags if t is not None}
    per_tag: dict[int, list[float]] = {}

    def add(tag: int, ms: float, share: float) -> None:
        acc = per_tag.setdefault(tag, [0.0, 0.0])
        acc[0] += ms * share
        acc[1] += share

    for i, ((_, ms), tag) in enumerate(zip(nodes, tags)):
        if tag is None:
            before = next((t for t in reversed(tags[:i]) if t is not None), None)
            after = next((t for t in tags[i + 1:] if t is not None), None)
            lo, hi = (before or 0), (after if after is not None else max(seen, default=0) + 1)
            replaced = [t for t in range(min(lo, hi) + 1, max(lo, hi)) if t not in seen]
            if replaced:
                for t in replaced:
                    add(t, ms, 1 / len(replaced))
                continue
            tag = before if before is not None else after
            if tag is None:
                continue
        add(tag, ms, 1.0)
    layer_tags = [int(m.group(1)) if (m := TAG.search(layer.name)) else None for layer in layers]
    times, counts = [0.0] * len(layers), [0.0] * len(layers)
    owners = sorted((t, i) for i, t in enumerate(layer_tags) if t is not None)
    for tag, (ms, n) in per_tag.items():
        mine = [i for t, i in owners if t == tag]
        if not mine:  # no layer of its own: the nearest layer before it
            earlier = [i for t, i in owners if t < tag]
            mine = [earlier[-1]] if earlier else ([owners[0][1]] if owners else [])
        for i in mine:
            times[i] += ms / len(mine)
            counts[i] += n / len(mine)
    return times, counts


def _time_together(paths: Sequence[Path], protocol: Protocol, workdir: Path, rng: np.random.Generator,
                   on_round: Optional[Callable[[], None]] = None, energy: bool = False):
    """Profile and time models together: each one's node times (profiled sessions) and
    end-to-end time (plain sessions), both by the interleaved protocol; with `energy`,
    also each one's energy per run (mJ) from the RAPL counters, else None."""
    feeds, runs, sessions = [], [], []
    for i, path in enumerate(paths):
        sess = make_session(path, protocol.threads, str(workdir / f"{Path(path).stem}-prof{i}"))
        feeds.append(random_feed(sess, rng))
        sessions.append(sess)
        runs.append(lambda s=sess, f=feeds[-1]: s.run(None, f))
    interleaved_min(runs, protocol, on_round)
    nodes = [_node_times(s.end_profiling()) for s in sessions]
    del sessions[:], runs[:]  # free the profiled sessions before opening the plain ones
    for path, feed in zip(paths, feeds):
        sess = make_session(path, protocol.threads)
        runs.append(lambda s=sess, f=feed: s.run(None, f))
    latency = interleaved_min(runs, protocol, on_round)
    return nodes, latency, ([energy_per_run_mj(run) for run in runs] if energy else None)


def _kernel_alone(model, tag: str):
    """The subgraph of a context network that is one kernel (its tagged nodes), with the
    tensors it reads as inputs."""
    from onnx import utils

    mine = [n for n in model.graph.node if n.name.startswith(tag)]
    made = {o for n in mine for o in n.output}
    consts = {i.name for i in model.graph.initializer}
    inputs = list(dict.fromkeys(i for n in mine for i in n.input if i and i not in made and i not in consts))
    used_outside = {i for n in model.graph.node if not n.name.startswith(tag) for i in n.input}
    used_outside |= {o.name for o in model.graph.output}
    outputs = [o for o in made if o in used_outside] or [mine[-1].output[0]]
    return utils.Extractor(model).extract_model(inputs, outputs)


def measure_networks(networks: Sequence[tuple[object, str]], protocol: Protocol, workdir: Path, seed: int = 0,
                     on_round: Optional[Callable[[], None]] = None, long_kernel_ms: float = 0.5) -> list[MeasuredNetwork]:
    """Profile and time a batch of context networks (onnx models with descriptions).

    Float kernels that profile longer than `long_kernel_ms` are timed again alone with the
    thread clock, for on a busy machine their profiled wall-clock times include time
    slices other processes got (see `in_context_costs`).  Quantized kernels keep their
    profiled times: cut out of their network, onnxruntime no longer fuses their
    quantization into an integer kernel."""
    from .onnx_import import import_onnx

    rng = np.random.default_rng(seed)
    paths, imported = [], []
    for i, (model, _) in enumerate(networks):
        path = workdir / f"net{i}.onnx"
        path.write_bytes(model.SerializeToString())
        paths.append(path)
        imported.append(import_onnx(path).layers)
    nodes, latency, energy = _time_together(paths, protocol, workdir, rng, on_round, bool(energy_counters()))
    measured = [MeasuredNetwork(desc, layers, *attribute(n, layers), float(ms))
                for (_, desc), layers, n, ms in zip(networks, imported, nodes, latency)]
    for m, mj in zip(measured, energy or []):
        m.energy_mj = mj
    todo, alone = [], []
    for i, m in enumerate(measured):
        for j, (layer, ms) in enumerate(zip(m.layers, m.layer_ms)):
            tag = TAG.search(layer.name)
            if ms > long_kernel_ms and tag is not None and layer.w_bits == 32:
                path = workdir / f"net{i}-{tag.group(1)}.onnx"
                path.write_bytes(_kernel_alone(networks[i][0], tag.group(0)).SerializeToString())
                todo.append((i, j))
                alone.append(path)
    if alone:
        nodes, latency, _ = _time_together(alone, protocol, workdir, rng, on_round)
        for (i, j), kernel_nodes, ms in zip(todo, nodes, latency):
            # What the runtime runs before the kernel (a layout reorder of its input) belongs
            # to the kernel before it in a network; what runs after counts for the kernel.
            first = next((k for k, (name, _) in enumerate(kernel_nodes) if TAG.search(name)), 0)
            before = [t for _, t in kernel_nodes[:first]]
            measured[i].alone[j] = (float(ms), float(sum(before)), len(before))
    return measured


# --- the whole profile ------------------------------------------------------------------

def energy_counters() -> list[Path]:
    """Readable RAPL package energy counters (µJ), if the machine exposes any."""
    return [p for p in sorted(Path("/sys/class/powercap").glob("intel-rapl*/energy_uj")) if os.access(p, os.R_OK)]


def read_energy_uj() -> float:
    """The sum of the package energy counters (µJ)."""
    return float(sum(int(p.read_text()) for p in energy_counters()))


def _counter_range_uj() -> float:
    ranges = [p.parent / "max_energy_range_uj" for p in energy_counters()]
    return float(sum(int(r.read_text()) for r in ranges if r.is_file()))


def energy_per_run_mj(run: Callable[[], object], seconds: float = 0.2) -> float:
    """Package energy of one run (mJ): the counters' increase over repeated runs lasting at
    least `seconds` (RAPL updates about every millisecond), per run."""
    start, t0, n = read_energy_uj(), time.perf_counter(), 0
    while n == 0 or time.perf_counter() - t0 < seconds:
        run()
        n += 1
    used = read_energy_uj() - start
    if used < 0:  # a counter wrapped around
        used += _counter_range_uj()
    return used / n / 1e3


def machine() -> dict:
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "system": platform.system(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx_opset": OPSET}


FLOOR_MS = 1e-4  # the least in-context cost a kernel is given (0.1 µs)


def in_context_costs(measured: Sequence[MeasuredNetwork], short_ms: float = 2.0) -> tuple[list[np.ndarray], dict]:
    """Per-layer costs from the profiles and the thread-clock times.

    The profiler adds its own cost to every node it times; fit `end-to-end = run overhead
    + Σ profiled - per-node cost x nodes` robustly (soft L1) over the short networks and
    take the per-node cost off every layer.  A long kernel, timed alone, costs its
    end-to-end time less the run overhead and the nodes onnxruntime ran before it."""
    from scipy.optimize import least_squares

    y = np.array([m.latency_ms for m in measured])
    S = np.array([sum(m.layer_ms) for m in measured])
    N = np.array([sum(m.layer_nodes) for m in measured])
    fit_on = (y < short_ms) & np.array([not m.alone for m in measured])
    if fit_on.sum() < 3:
        fit_on[:] = True
    c0, per_node = least_squares(lambda p: (p[0] + S[fit_on] - p[1] * N[fit_on]) / y[fit_on] - 1, [0.01, 0.001],
                                 loss="soft_l1", f_scale=0.05, bounds=([0, 0], [np.inf, np.inf])).x
    c0 = float(min(c0, 0.5 * y.min()))
    costs = []
    for m in measured:
        t = np.array(m.layer_ms) - per_node * np.array(m.layer_nodes)
        for j, (ms, boundary_ms, boundary_nodes) in m.alone.items():
            t[j] = ms - c0 - (boundary_ms - per_node * boundary_nodes)
        costs.append(np.maximum(t, FLOOR_MS))
    return costs, {"run_overhead_ms": c0, "profiler_cost_per_node_ms": float(per_node),
                   "kernels_timed_alone": sum(len(m.alone) for m in measured)}


def _slower_by(m: MeasuredNetwork, factor: float) -> MeasuredNetwork:
    """`m` with every time divided by `factor`."""
    return MeasuredNetwork(m.description, m.layers, [t / factor for t in m.layer_ms], m.layer_nodes,
                           m.latency_ms / factor,
                           {j: (ms / factor, before / factor, n) for j, (ms, before, n) in m.alone.items()},
                           m.energy_mj)


def profile_machine(name: str, protocol: Protocol, kernels: int = 15000, seed: int = 0, chunk: int = 80,
                    references: int = 3, on_progress: Optional[Callable[[int, int, str], None]] = None):
    """Build context networks until they hold `kernels` kernels, measure them `chunk` at a
    time (interleaved: a busy spell slows every network of a chunk alike, and the minimum
    over rounds spread over the chunk's minutes avoids it), and fit the device from them.

    The same few small reference networks are measured in every chunk; a chunk whose
    references ran slower than in the fastest chunk (the machine was busier) has its
    times scaled back by that factor (the median over the references)."""
    from .fit import fit_from_lut
    from .lut import row_from_layer

    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    networks, count = [], 0
    while count < kernels:
        networks.append(random_network(rng))
        count += len({m.group(1) for n in networks[-1][0].graph.node if (m := TAG.search(n.name))})
    refs = [random_network(np.random.default_rng(10_000 + k), max_macs=5e6) for k in range(references)]
    chunks = -(-len(networks) // chunk)
    total = 3 * protocol.rounds * chunks  # per chunk: profiled rounds, end-to-end rounds, long kernels alone
    ticks = iter(range(1, 10 ** 9))

    def tick():
        if on_progress is not None:
            on_progress(min(next(ticks), total), total, f"{len(networks)} networks")

    if on_progress is not None:
        on_progress(0, total, f"building {len(networks)} networks")
    parts, ref_ms = [], []
    with tempfile.TemporaryDirectory(prefix="nasctl-profile-") as tmp:
        for first in range(0, len(networks), chunk):  # chunks bound the memory of open sessions
            folder = Path(tmp) / f"chunk{first}"
            folder.mkdir()
            part = measure_networks([*networks[first:first + chunk], *refs], protocol, folder, seed=seed + first,
                                    on_round=tick)
            parts.append(part[:len(part) - len(refs)])
            ref_ms.append([m.latency_ms for m in part[len(part) - len(refs):]])
    ref = np.array(ref_ms)
    slower = np.median(ref / ref.min(axis=0), axis=1)
    measured = [_slower_by(m, f) for part, f in zip(parts, slower) for m in part]
    done = sum(len(m.layers) for m in measured)
    if on_progress is not None:
        on_progress(total, total, "fitting the regressors")
    costs, norm = in_context_costs(measured)
    rows = []
    for i, (m, ts) in enumerate(zip(measured, costs)):
        # A network's energy goes to its kernels by their share of its time.
        shares = ts / ts.sum() if m.energy_mj is not None else [None] * len(ts)
        rows += [{**row_from_layer(layer, ms, None if share is None else max(m.energy_mj * share, FLOOR_MS)),
                  "group": i} for layer, ms, share in zip(m.layers, ts, shares)]
    measurement = {**protocol.describe(), "context_networks": len(measured), "kernels_timed": done, "seed": seed,
                   "how": "per-node kernel times from onnxruntime profiling inside random context networks, summed "
                          "per kernel (minimum over the profiled runs) less the profiler's own cost per node; "
                          "kernels profiled longer than 0.5 ms timed again alone (thread clock) less the run "
                          "overhead and the layout reorders around them; the run overhead and the profiler's cost "
                          "per node fitted to the networks' end-to-end times",
                   **norm, "chunk_slowdown_corrected": [round(float(f), 4) for f in slower], "machine": machine()}
    energy = ("RAPL package energy per run of each context network (counters' increase over 0.2 s of runs), "
              "apportioned to its kernels by their share of its time; includes the package's idle and uncore power"
              if all(m.energy_mj is not None for m in measured)
              else "latency only: this machine exposes no readable energy counters (RAPL)")
    fitted = fit_from_lut(name, rows, description=f"onnxruntime CPU on this machine, {protocol.threads} thread(s), "
                                                  f"measured by `nasctl hw profile`",
                          extra={"measurement": measurement, "energy": energy,
                                 "overhead": {"per_model_ms": norm["run_overhead_ms"], "per_layer_ms": 0.0}})
    device = fitted.device()
    error = np.array([device.estimate(m.layers).latency_ms / m.latency_ms - 1 for m in measured])
    fitted.report = {"networks": len(measured), "layers": done, "seconds": time.perf_counter() - start,
                     "networks_rms_error_pct": float(np.sqrt(np.mean(error ** 2)) * 100),
                     "networks_within_10pct": float(np.mean(np.abs(error) <= 0.10))}
    fitted.spec["fit"]["context_networks"] = {k: round(v, 4) for k, v in fitted.report.items() if k.startswith("networks_")}
    return fitted


def validate_models(device, paths: Sequence[Path], rounds: int = 15, seed: int = 0,
                    on_progress: Optional[Callable[[int, int, str], None]] = None) -> dict:
    """Predicted vs measured end-to-end latency of ONNX models on this machine."""
    from .onnx_import import import_onnx

    threads = int(getattr(getattr(device, "spec", None), "measurement", {}).get("threads", 1))
    protocol = Protocol(threads=threads, rounds=rounds)
    rows = []
    for path in paths:
        imported = import_onnx(Path(path))
        report = device.estimate(imported.layers)
        unpriced = imported.unsupported + report.unsupported
        rows.append({"model": Path(path).stem, "path": str(path), "predicted_ms": report.latency_ms,
                     "layers": len(imported.layers), "unsupported": dict(unpriced)})
    done = iter(range(1, rounds + 1))
    measured = measure_models(paths, protocol, seed,
                              on_round=lambda: on_progress and on_progress(next(done), rounds, "rounds"))
    for row, ms in zip(rows, measured):
        row["measured_ms"] = float(ms)
        row["error_pct"] = (row["predicted_ms"] / row["measured_ms"] - 1) * 100
    err = np.array([r["error_pct"] for r in rows]) / 100
    return {"device": device.name, "protocol": protocol.describe(), "models": rows,
            "summary": {"models": len(rows), "within_5pct": float(np.mean(np.abs(err) <= 0.05)),
                        "within_10pct": float(np.mean(np.abs(err) <= 0.10)),
                        "rms_error_pct": float(np.sqrt(np.mean(err ** 2)) * 100)}}
