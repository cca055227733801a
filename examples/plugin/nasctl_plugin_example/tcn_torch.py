"""The torch network of a `tcn1d` architecture (imported only to build one)."""

from __future__ import annotations

import torch
from torch import nn


class Tcn1d(nn.Module):
    def __init__(self, blocks, classes: int):
        super().__init__()
        layers = []
        for cin, cout, k, dil, s, _t_in, _t_out in blocks:
            layers += [nn.Conv1d(cin, cout, k, stride=s, dilation=dil, padding=dil * (k - 1) // 2, bias=False),
                       nn.BatchNorm1d(cout), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(blocks[-1][1], classes)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.body(x.reshape(x.shape[0], x.shape[1], -1))  # C x H x W -> C x T
        return [self.classifier(x.mean(dim=2))]               # one output: the final classifier
