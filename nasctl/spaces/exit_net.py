"""The torch network of a macro space with early exits: blocks in plan order, where a head
block (an exit head or the final classifier) emits logits from the stream it reads and
the backbone goes on from the same stream."""

from __future__ import annotations

import torch
from torch import nn


class ExitNet(nn.Module):
    """`forward(x)` returns one logits tensor per head block, in plan order (final last).
    Subclasses name their head block type (`head_type`)."""

    head_type: type = nn.Module

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs = []
        for block in self.blocks:
            if isinstance(block, self.head_type):
                outputs.append(block(x))
            else:
                x = block(x)
        return outputs
