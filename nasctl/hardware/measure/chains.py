"""Kernels too short for onnxruntime's profiler, timed end to end in chains.

onnxruntime's profiler records whole microseconds and costs about 2 µs a node itself, so
the in-context time `hw profile` gives a kernel of a fraction of a microsecond to a couple
is either floored or a microsecond off, by where the machine's per-node cost falls that
hour.  The token kernels of small transformers are such kernels: a linear layer over 4
tokens of width 32 took 0.76 µs a kernel end to end on a 2-vCPU EPYC, where its profiled
rows priced it at 0.31 µs, and transformers of 4 tokens were priced 8-20% low.

So `hw profile` times them without the profiler: a tiny token network (an 8x8 input
patched to CHAIN_TOKENS tokens) with the kernel chained CHAIN_LENGTHS times, end to end;
the slope of its time over the chain lengths is the kernel's cost (`chained_ms`).  A
linear layer that widens the tokens is chained with its way back, and each of the pair is
given half the pair's slope; an add is chained as a tensor added to itself.  The kernels
(`chain_kernels`): linear layers of each width of CHAIN_WIDTHS to itself and, with a GELU,
to CHAIN_RATIOS times it (and back), layer norms and adds, over each token count.  Wider
or longer kernels take several microseconds, which the profiler resolves.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ..layers import LayerSpec
from .context import NetBuilder

CHAIN_LENGTHS = (2, 8, 14)
CHAIN_PASSES = 2  # each kernel's chains timed this many times (`measure_chains`)
CHAIN_TOKENS = (4, 16, 64)  # an 8x8 input patched by 4, 2 and 1
CHAIN_WIDTHS = (16, 24, 32, 48, 64, 96)
CHAIN_RATIOS = (2, 4)  # the MLP widenings chained, with a GELU
CHAIN_INPUT = 8  # the side of the chains' one-channel input


def token_layer(op: str, cin: int, cout: int, tokens: int, fn: str = "") -> LayerSpec:
    """A float kernel over `tokens` tokens, as the importer reads a token-layout one."""
    return LayerSpec(op, cin, cout, (tokens, 1), (tokens, 1), (1, 1), 1, 1, 32, 32, fn=fn)


def chain_kernels(tokens: Sequence[int] = CHAIN_TOKENS, widths: Sequence[int] = CHAIN_WIDTHS,
                  ratios: Sequence[int] = CHAIN_RATIOS) -> list[LayerSpec]:
    """The kernels a profile chains: per token count and width, a linear layer to the same
    width, one with a GELU to each ratio of it, a layer norm and an add."""
    kernels = []
    for t in tokens:
        for w in widths:
            kernels.append(token_layer("linear", w, w, t))
            kernels += [token_layer("linear", w, r * w, t, fn="gelu") for r in ratios]
            kernels += [token_layer("norm", w, w, t, fn="layer"), token_layer("add", w, w, t)]
    return kernels


def way_back(layer: LayerSpec) -> Optional[LayerSpec]:
    """The linear layer a widening one is chained with (back to its width), or None."""
    if layer.op != "linear" or layer.out_ch == layer.in_ch:
        return None
    return token_layer("linear", layer.out_ch, layer.in_ch, layer.in_hw[0])


def chain_network(layer: LayerSpec, k: int, seed: int = 0):
    """An onnx model of `layer` chained `k` times (with its way back for a linear layer that
    widens) between a patch conv and a classifier."""
    tokens = layer.in_hw[0]
    side = int(round(np.sqrt(tokens)))
    if side * side != tokens or CHAIN_INPUT % side:
        raise ValueError(f"cannot chain a kernel of {tokens} tokens: the {CHAIN_INPUT}x{CHAIN_INPUT} input patches "
                         f"to {', '.join(str((CHAIN_INPUT // p) ** 2) for p in (4, 2, 1))}")
    b = NetBuilder(np.random.default_rng(seed), (1, 1, CHAIN_INPUT, CHAIN_INPUT))
    x = b.conv("input", layer.in_ch, CHAIN_INPUT // side, CHAIN_INPUT // side, pad=0)
    tag = b._tag()
    x = b.transpose(b.reshape(x, (1, layer.in_ch, tokens), tag), (0, 2, 1), tag)
    back = way_back(layer)
    for _ in range(k):
        if layer.op == "linear":
            x = b.linear(x, layer.out_ch, act=layer.fn)
            if back is not None:
                x = b.linear(x, back.out_ch, act=back.fn)
        elif layer.op == "norm":
            x = b.layer_norm(x)
        else:
            x = b.add(x, x)
    return b.model(b.classifier(b.token_mean(b.layer_norm(x)), 10))


def measure_chains(kernels: Sequence[LayerSpec], protocol, seed: int = 0,
                   on_kernel: Optional[Callable[[], None]] = None) -> list[dict]:
    """Each kernel's chains timed end to end, the lengths of one kernel together (the
    protocol's interleaved rounds, minimum, the median session), in CHAIN_PASSES passes
    over the kernels (the second in reverse order), the least time of each chain kept: per
    kernel, its row (`lut.row_from_layer`) and the times of its chains.  (In one pass, 6 of
    90 kernels' slopes came out 0.4-1.8x those of two: a spell of a slower machine over
    some of a kernel's chains.)"""
    from ..lut import row_from_layer
    from .timing import measure_models

    models = [[chain_network(layer, k, seed).SerializeToString() for k in CHAIN_LENGTHS] for layer in kernels]
    best = np.full((len(kernels), len(CHAIN_LENGTHS)), np.inf)
    for p in range(CHAIN_PASSES):
        for i in (range(len(kernels)) if p % 2 == 0 else reversed(range(len(kernels)))):
            best[i] = np.minimum(best[i], measure_models(models[i], protocol, seed=seed + i + p * len(kernels)))
            if on_kernel is not None:
                on_kernel()
    return [{"row": row_from_layer(layer, 0.0), "lengths": list(CHAIN_LENGTHS),
             "ms": [round(float(t), 7) for t in times]} for layer, times in zip(kernels, best)]


def chained_ms(entry: dict) -> float:
    """A chained kernel's cost: the least-squares slope of its chains' times over their
    lengths (half of it each for a widening linear layer and its way back)."""
    from ..lut import layer_from_row

    slope = float(np.polyfit(entry["lengths"], entry["ms"], 1)[0])
    return slope / (2 if way_back(layer_from_row(entry["row"])) is not None else 1)


def chained_rows(chains: Sequence[dict]) -> list[dict]:
    """The table rows the chained kernels give (a widening linear layer's way back too, at
    the same cost), at least `attribution.FLOOR_MS` each."""
    from ..lut import layer_from_row, row_from_layer
    from .attribution import FLOOR_MS

    rows = []
    for entry in chains:
        layer = layer_from_row(entry["row"])
        ms = max(chained_ms(entry), FLOOR_MS)
        rows.append(row_from_layer(layer, ms))
        back = way_back(layer)
        if back is not None:
            rows.append(row_from_layer(back, ms))
    return rows
