"""Neural predictors in torch: an MLP ensemble on a vector encoding and a graph
convolutional network (GCN) ensemble on a cell space's op-on-node graph.

Each member of an ensemble is trained from its own seed (weights and batch order) with
AdamW on the mean squared error; the prediction is the members' mean and the spread
their standard deviation.  The GCN follows Wen et al., "Neural Predictor for Neural
Architecture Search" (ECCV 2020): node features are one-hot ops, each layer mixes a
node's predecessors and successors (row-normalised adjacency with self loops, both
directions), the graph embedding is the mean over nodes; zero-cost proxies, when asked
for, join the embedding before the regression head.  Weights are saved as a torch
`state_dict`."""

from __future__ import annotations

from abc import abstractmethod
from contextlib import contextmanager
from typing import Sequence

import numpy as np

from ..spaces.base import Arch
from .base import Predictor
from .encodings import cell_graph


@contextmanager
def _one_thread():
    """Tiny tensors: one torch thread is many times faster than a pool of them, above
    all where other work keeps the cores busy (the pool's threads wait on each other)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Ensemble(Predictor):
    """Training, averaging and saving shared by the torch models."""

    has_spread = True
    uses_torch = True
    min_rows = 10

    @abstractmethod
    def _network(self, dims: dict):
        """One member network for inputs and outputs of sizes `dims`."""

    @abstractmethod
    def _dims(self, inputs, targets: int) -> dict:
        """The sizes `_network` needs, from the training inputs (saved with the weights)."""

    def _fit(self, inputs, Y: np.ndarray) -> None:
        import torch

        p = self.params
        self._shape = self._dims(inputs, Y.shape[1])
        tensors = [torch.as_tensor(a, dtype=torch.float32) for a in inputs]
        target = torch.as_tensor(Y, dtype=torch.float32)
        n = len(target)
        members = []
        with torch.random.fork_rng(devices=[]), _one_thread():
            for k in range(p["members"]):
                torch.manual_seed(self.seed * 1009 + k)
                order = torch.Generator().manual_seed(self.seed * 1009 + k)
                net = self._network(self._shape)
                opt = torch.optim.AdamW(net.parameters(), lr=p["lr"], weight_decay=p["weight_decay"])
                steps = p["epochs"] * -(-n // p["batch_size"])
                sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
                net.train()
                for _ in range(p["epochs"]):
                    for batch in torch.randperm(n, generator=order).split(p["batch_size"]):
                        loss = torch.nn.functional.mse_loss(net(*(t[batch] for t in tensors)), target[batch])
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                        sched.step()
                members.append(net.eval())
        self._members = torch.nn.ModuleList(members)

    def _predict(self, inputs):
        import torch

        tensors = [torch.as_tensor(a, dtype=torch.float32) for a in inputs]
        with torch.no_grad(), _one_thread():
            out = torch.stack([net(*tensors) for net in self._members]).double().numpy()
        return out.mean(axis=0), out.std(axis=0)

    def _state(self) -> dict:
        return {"shape": self._shape}

    def _tensors(self) -> dict:
        return self._members.state_dict()

    def _restore(self, state: dict, tensors: dict) -> None:
        import torch

        self._shape = state["shape"]
        self._members = torch.nn.ModuleList(self._network(self._shape) for _ in range(self.params["members"]))
        self._members.load_state_dict(tensors)
        self._members.eval()


class MLPEnsemble(_Ensemble):
    kind = "mlp"
    defaults = {"members": 5, "hidden": 128, "layers": 2, "epochs": 100, "batch_size": 32, "lr": 1e-3,
                "weight_decay": 1e-3}

    def _inputs(self, archs: Sequence[Arch], proxies):
        return (super()._inputs(archs, proxies),)

    def _dims(self, inputs, targets: int) -> dict:
        return {"features": inputs[0].shape[1], "targets": targets}

    def _network(self, dims: dict):
        from torch import nn

        h, layers = self.params["hidden"], []
        width = dims["features"]
        for _ in range(self.params["layers"]):
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return nn.Sequential(*layers, nn.Linear(width, dims["targets"]))


class GCNEnsemble(_Ensemble):
    kind = "gcn"
    accepts = ("graph",)
    defaults = {"members": 3, "hidden": 64, "layers": 3, "epochs": 150, "batch_size": 32, "lr": 2e-3,
                "weight_decay": 1e-3}

    def _inputs(self, archs: Sequence[Arch], proxies):
        cell = cell_graph(self.space)
        graphs = [cell.graph(a) for a in archs]
        adjacency = np.array([g[0] for g in graphs])
        labels = np.array([g[1] for g in graphs])
        nodes = np.zeros((*labels.shape, len(cell.labels)))
        rows, cols = np.nonzero(labels >= 0)
        nodes[rows, cols, labels[rows, cols]] = 1
        eye = np.eye(adjacency.shape[1])
        forward = adjacency.transpose(0, 2, 1) + eye  # row v: v and the nodes feeding it
        backward = adjacency + eye                    # row v: v and the nodes it feeds
        extra = np.zeros((len(archs), 0)) if proxies is None else (proxies - self._zc_mean) / self._zc_scale
        return (forward / forward.sum(-1, keepdims=True), backward / backward.sum(-1, keepdims=True), nodes, extra)

    def _dims(self, inputs, targets: int) -> dict:
        return {"labels": inputs[2].shape[2], "extra": inputs[3].shape[1], "targets": targets}

    def _network(self, dims: dict):
        return _GCN(dims["labels"], dims["extra"], dims["targets"], self.params["hidden"], self.params["layers"])


def _GCN(labels: int, extra: int, targets: int, hidden: int, layers: int):
    import torch
    from torch import nn

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(labels, hidden)
            self.fwd = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
            self.bwd = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
            self.head = nn.Sequential(nn.Linear(hidden + extra, hidden), nn.ReLU(), nn.Linear(hidden, targets))

        def forward(self, forward, backward, nodes, proxies):
            h = torch.relu(self.embed(nodes))
            for f, b in zip(self.fwd, self.bwd):
                h = torch.relu((f(forward @ h) + b(backward @ h)) / 2)
            return self.head(torch.cat([h.mean(dim=1), proxies], dim=1))

    return GCN()
