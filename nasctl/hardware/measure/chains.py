"""Kernels too short for onnxruntime's profiler, timed end to end in chains.

onnxruntime's profiler records whole microseconds and costs about 2 µs a node itself, so
the in-context time `hw profile` gives a kernel of a fraction of a microsecond to a couple
is either floored or a microsecond off, by where the machine's per-node cost falls that
hour.  The token kernels of small transformers are such kernels: a linear layer over 4
tokens of width 32 took 0.76 µs a kernel end to end on a 2-vCPU EPYC, where its profiled
rows priced it at 0.31 µs, and transformers of 4 tokens were priced 8-20% low.

So `hw profile` times them without the profiler: a tiny token network (an 8x8 input
patched to CHAIN_TOKENS tokens) with the kernel chained CHAIN_LENGTHS times, end to end;
the slope of its time over the chain lengths is the cost of one link (`chained_ms`).  A
link holds the kernel and what it cannot run without (`link_layers`): a linear layer that
widens the tokens is chained with its way back; an add is chained as a tensor added to
itself.  The kernels (`chain_kernels`): linear layers of each width of CHAIN_WIDTHS to
itself and, with a GELU, to CHAIN_RATIOS times it (and back), layer norms and adds, over
each token count.  Wider or longer kernels take several microseconds, which the profiler
resolves.

Attention's kernels are chained too (`attention_kernels`), for each token count, head
count of CHAIN_HEADS and width of CHAIN_ATTENTION_WIDTHS: the softmax of the scores alone;
the scores' product, chained with that softmax and the product mixing the values (the
softmax keeps the chain's values bounded); and the split of the tokens into heads,
chained with all of that, the merge of the heads and a linear layer (onnxruntime would
cancel a split and a merge that meet); and the keys' transpose, in a whole attention
(`attention_chain`).  On a 2-vCPU EPYC, whole attentions of 2 or 4 heads were priced
9-17% low over 4 tokens and up to 29% high over 64 from the profiled rows.

Each link's cost is shared out among its kernels (`chained_rows`): those a shorter link
costs already take that cost, and the rest share what is left evenly (the two products
of a head do the same multiply-adds, and a split and a merge move the same data).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ..layers import LayerSpec, chw, transpose_fn
from .context import NetBuilder

CHAIN_LENGTHS = (2, 8, 14)
CHAIN_PASSES = 2  # each kernel's chains timed this many times (`measure_chains`)
CHAIN_TOKENS = (4, 16, 64)  # an 8x8 input patched by 4, 2 and 1
CHAIN_WIDTHS = (16, 24, 32, 48, 64, 96)
CHAIN_RATIOS = (2, 4)  # the MLP widenings chained, with a GELU
CHAIN_INPUT = 8  # the side of the chains' one-channel input
CHAIN_HEADS = (1, 2, 4)
CHAIN_ATTENTION_WIDTHS = (16, 32, 48, 64)  # (each of CHAIN_WIDTHS: a split's chain holds a linear layer)
SPLIT = (0, 2, 1, 3)  # [1, T, heads, d] -> [1, heads, T, d], and back (the merge)
KEYS = (0, 2, 3, 1)  # [1, T, heads, d] -> [1, heads, d, T]: the keys, transposed for the scores' product


def token_layer(op: str, cin: int, cout: int, tokens: int, fn: str = "") -> LayerSpec:
    """A float kernel over `tokens` tokens, as the importer reads a token-layout one."""
    return LayerSpec(op, cin, cout, (tokens, 1), (tokens, 1), (1, 1), 1, 1, 32, 32, fn=fn)


def chain_kernels(tokens: Sequence[int] = CHAIN_TOKENS, widths: Sequence[int] = CHAIN_WIDTHS,
                  ratios: Sequence[int] = CHAIN_RATIOS) -> list[LayerSpec]:
    """The kernels a profile chains: per token count and width, a linear layer to the same
    width, one with a GELU to each ratio of it, a layer norm and an add; then attention's
    (`attention_kernels`)."""
    kernels = []
    for t in tokens:
        for w in widths:
            kernels.append(token_layer("linear", w, w, t))
            kernels += [token_layer("linear", w, r * w, t, fn="gelu") for r in ratios]
            kernels += [token_layer("norm", w, w, t, fn="layer"), token_layer("add", w, w, t)]
    return kernels + attention_kernels(tokens)


def attention_kernels(tokens: Sequence[int] = CHAIN_TOKENS, widths: Sequence[int] = CHAIN_ATTENTION_WIDTHS,
                      heads: Sequence[int] = CHAIN_HEADS) -> list[LayerSpec]:
    """The attention kernels a profile chains: per token count and head count, the scores'
    softmax, and per width too, the scores' product, the split into heads and the keys'
    transpose."""
    kernels = []
    for t in tokens:
        for h in heads:
            kernels.append(LayerSpec("softmax", h, h, (t, t), (t, t), w_bits=32, a_bits=32))
            for w in widths:
                if w % h == 0:
                    kernels += [LayerSpec("matmul", w // h, t, (t, h), (t, h), w_bits=32, a_bits=32, bias=False),
                                heads_transpose(t, h, w // h, SPLIT), heads_transpose(t, h, w // h, KEYS)]
    return kernels


def heads_transpose(tokens: int, heads: int, d: int, perm: Sequence[int]) -> LayerSpec:
    """The transpose of [1, tokens, heads, d] by `perm` (SPLIT or KEYS), as the importer reads it."""
    shape = (1, tokens, heads, d)
    (cin, in_hw), (cout, out_hw) = chw(shape), chw(tuple(shape[a] for a in perm))
    return LayerSpec("data", cin, cout, in_hw, out_hw, w_bits=32, a_bits=32, fn=transpose_fn(shape, perm))


def way_back(layer: LayerSpec) -> Optional[LayerSpec]:
    """The linear layer a widening one is chained with (back to its width), or None."""
    if layer.op != "linear" or layer.out_ch == layer.in_ch:
        return None
    return token_layer("linear", layer.out_ch, layer.in_ch, layer.in_hw[0])


def chain_network(layer: LayerSpec, k: int, seed: int = 0):
    """An onnx model of `layer` chained `k` times (with its way back for a linear layer that
    widens; an attention kernel with what it runs with: `attention_chain`) between a patch
    conv and a classifier."""
    if layer.op == "softmax":
        return attention_chain("softmax", layer.in_hw[0], layer.in_ch, 8, k, seed)
    if layer.op == "matmul":
        return attention_chain("scores", layer.out_ch, layer.in_hw[1], layer.in_ch, k, seed)
    if layer.op == "data":
        tokens, (heads, d) = layer.in_ch, layer.in_hw
        split = layer.shape_key() == heads_transpose(tokens, heads, d, SPLIT).shape_key()
        return attention_chain("split" if split else "keys", tokens, heads, d, k, seed)
    tokens = layer.in_hw[0]
    b, x = _token_input(tokens, layer.in_ch, seed)
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


def _token_input(tokens: int, width: int, seed: int) -> tuple[NetBuilder, str]:
    """A chain's builder and its first tokens: the CHAIN_INPUT-square input patched to
    `tokens` tokens of `width`."""
    side = int(round(np.sqrt(tokens)))
    if side * side != tokens or CHAIN_INPUT % side:
        raise ValueError(f"cannot chain a kernel of {tokens} tokens: the {CHAIN_INPUT}x{CHAIN_INPUT} input patches "
                         f"to {', '.join(str((CHAIN_INPUT // p) ** 2) for p in (4, 2, 1))}")
    b = NetBuilder(np.random.default_rng(seed), (1, 1, CHAIN_INPUT, CHAIN_INPUT))
    x = b.conv("input", width, CHAIN_INPUT // side, CHAIN_INPUT // side, pad=0)
    tag = b._tag()
    return b, b.transpose(b.reshape(x, (1, width, tokens), tag), (0, 2, 1), tag)


ATTENTION_CHAINS = ("softmax", "scores", "split", "keys")


def attention_chain(kind: str, tokens: int, heads: int, d: int, k: int, seed: int = 0):
    """An onnx model of an attention chain of `k` links over `tokens` tokens in `heads`
    heads of `d`: "softmax", the scores' softmax alone; "scores", their product, softmax
    and the product mixing the values; "split", the split into heads, all that, the merge
    and a linear layer; "keys", a whole attention (the projections of the queries, keys,
    values and output, the keys' transpose among them).  Keys and values are taken from the
    chain's input once, outside the links, but in "keys"."""
    width = heads * d
    b, x = _token_input(tokens, width, seed)

    def split(y):
        tag = b._tag()
        return b.transpose(b.reshape(y, (1, tokens, heads, d), tag), SPLIT, tag)

    def merge(y):
        tag = b._tag()
        return b.reshape(b.transpose(y, SPLIT, tag), (1, tokens, width), tag)

    def keys_of(y):
        tag = b._tag()
        return b.transpose(b.reshape(y, (1, tokens, heads, d), tag), KEYS, tag)

    def attend(q, kt, v):
        return b.matmul(b.softmax(b.scale(b.matmul(q, kt), d ** -0.5)), v)

    keys, values = keys_of(x), split(x)
    if kind == "softmax":
        y = b.softmax(b.scale(b.matmul(values, keys), d ** -0.5))
        for _ in range(k):
            y = b.softmax(y)
        y = merge(b.matmul(y, values))
    elif kind == "scores":
        y = values
        for _ in range(k):
            y = attend(y, keys, values)
        y = merge(y)
    elif kind == "split":
        y = x
        for _ in range(k):
            y = b.linear(merge(attend(split(y), keys, values)), width)
    elif kind == "keys":
        y = x
        for _ in range(k):
            y = b.linear(merge(attend(split(b.linear(y, width)), keys_of(b.linear(y, width)),
                                      split(b.linear(y, width)))), width)
    else:
        raise ValueError(f"unknown attention chain '{kind}': one of {', '.join(ATTENTION_CHAINS)}")
    return b.model(b.classifier(b.token_mean(b.layer_norm(y)), 10))


def link_layers(layer: LayerSpec) -> list[LayerSpec]:
    """The kernels one link of `layer`'s chain adds, as the importer reads the chain (each
    as often as a link holds it)."""
    import tempfile
    from pathlib import Path

    from ..onnx_import import import_onnx

    with tempfile.TemporaryDirectory(prefix="nasctl-chain-") as tmp:
        read = []
        for k in (2, 3):
            path = Path(tmp) / f"chain{k}.onnx"
            path.write_bytes(chain_network(layer, k).SerializeToString())
            read.append(import_onnx(path).layers)
    shorter = [lay.shape_key() for lay in read[0]]
    link = []
    for lay in read[1]:
        key = lay.shape_key()
        if key in shorter:
            shorter.remove(key)
        else:
            link.append(lay)
    return link


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
    """The cost of one link of a kernel's chain: the least-squares slope of its chains'
    times over their lengths."""
    return float(np.polyfit(entry["lengths"], entry["ms"], 1)[0])


def chain_link(entry: dict) -> list[LayerSpec]:
    """The kernels of one link of a chain, as this version's importer reads the chain
    (`link_layers`: a refit reads the chains again, as it reads the context networks)."""
    from ..lut import layer_from_row

    return link_layers(layer_from_row(entry["row"]))


def chained_rows(chains: Sequence[dict]) -> list[dict]:
    """The table rows the chained kernels give, at least `attribution.FLOOR_MS` each.  A
    link's cost is shared out among its kernels, links of fewer kernels first: a kernel a
    link before costs already takes that cost, and the rest share what is left evenly (a
    widening linear layer and its way back take half of their link each)."""
    from ..lut import row_from_layer
    from .attribution import FLOOR_MS

    links = [chain_link(entry) for entry in chains]
    known: dict[tuple, float] = {}
    given: dict[int, list[dict]] = {}  # (each entry's rows, in the order of the chains)
    for j in sorted(range(len(chains)), key=lambda j: len(links[j])):
        keys = [lay.shape_key() for lay in links[j]]
        new = [i for i, key in enumerate(keys) if key not in known]
        if not new:
            continue
        share = (chained_ms(chains[j]) - sum(known[key] for key in keys if key in known)) / len(new)
        for i in new:
            if keys[i] not in known:
                known[keys[i]] = max(share, FLOOR_MS)
                given.setdefault(j, []).append(row_from_layer(links[j][i], known[keys[i]]))
    return [row for j in sorted(given) for row in given[j]]
