"""Torch modules for `kind: nb201` networks: NAS-Bench-201's TinyNetwork.

Matches `Nb201Space.to_layers` conv for conv, and NB201's own modules parameter for
parameter (convs without bias, each followed by an affine batch norm, except the
reduction shortcut's 1×1 conv).  The cell computes the edges `Nb201Space.cell_edges`
lists: a `none` edge is left out of its node's sum, a node with no input is zero, and
with `unused_ops: drop` (or `lone-convs`, but for the lone convs it keeps) a node that
feeds the output only through `none` edges is not computed.  `forward(x)` returns a one-element list: the logits.

The space gives the network everything it needs (the cell's edges, each with the name of
its module, and the space's sizes), so this module does not import `nasctl.spaces.nb201`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

# A cell edge: (module name, target node j, source node i, op).
Edge = tuple[str, int, int, str]


def relu_conv_bn(cin: int, cout: int, k: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


def _edge_op(op: str, c: int) -> nn.Module:
    if op == "nor_conv_1x1":
        return relu_conv_bn(c, c, 1, 1)
    if op == "nor_conv_3x3":
        return relu_conv_bn(c, c, 3, 1)
    if op == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    return nn.Identity()  # skip_connect


class Cell(nn.Module):
    """A cell of `nodes` nodes (node 0 its input, the last its output) computing `edges`."""

    def __init__(self, edges: Sequence[Edge], nodes: int, c: int):
        super().__init__()
        self.inputs = [[(name, i) for name, jj, i, _ in edges if jj == j] for j in range(nodes)]
        self.edges = nn.ModuleDict({name: _edge_op(op, c) for name, _, _, op in edges})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for j in range(1, len(self.inputs)):
            terms = [self.edges[name](nodes[i]) for name, i in self.inputs[j]]
            nodes.append(sum(terms[1:], terms[0]) if terms else torch.zeros_like(x))
        return nodes[-1]


class ReductionBlock(nn.Module):
    """ResNet basic block, stride 2: two ReLU-conv-BN units plus an avg-pool + 1×1 conv shortcut."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.body = nn.Sequential(relu_conv_bn(cin, cout, 3, 2), relu_conv_bn(cout, cout, 3, 1))
        self.shortcut = nn.Sequential(nn.AvgPool2d(2, stride=2), nn.Conv2d(cin, cout, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class Nb201Net(nn.Module):
    """A stem conv of `channels`, then `stages` stages of `cells_per_stage` cells (each
    computing `edges` over `nodes` nodes) with a reduction block doubling the channels
    between stages, then global pooling and the classifier."""

    def __init__(self, edges: Sequence[Edge], nodes: int, input_shape: tuple[int, int, int], classes: int, *,
                 channels: int, stages: int, cells_per_stage: int):
        super().__init__()
        c = channels
        blocks: list[nn.Module] = [nn.Conv2d(input_shape[0], c, 3, padding=1, bias=False), nn.BatchNorm2d(c)]
        for s in range(stages):
            if s:
                blocks.append(ReductionBlock(c, 2 * c))
                c *= 2
            blocks += [Cell(edges, nodes, c) for _ in range(cells_per_stage)]
        blocks += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.classifier(self.features(x))]
