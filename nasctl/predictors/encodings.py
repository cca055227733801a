"""Feature encodings of architectures, for accuracy predictors.

Every space:
  onehot     one indicator per knob choice (`SearchSpace.encode`)
  ordinal    each knob's choice index scaled to [0, 1] (`SearchSpace.encode`)

Cell spaces (kind `nb201`), after White et al., "A Study on Encodings for Neural
Architecture Search" (NeurIPS 2020):
  adjacency  the cell as an op-on-node graph - the cell input, one node per edge, the
             cell output - as the upper triangle of its adjacency matrix (edges that
             are `none` have no connections) followed by each edge node's one-hot op
  path       how often each sequence of ops occurs along the paths from the cell input
             to its output (paths through a `none` edge carry nothing): the BANANAS
             path encoding, 4 + 4² + 4³ = 84 features for NB201's ops
  wl         Weisfeiler-Lehman subtree features (Shervashidze et al., JMLR 2011; as a
             NAS kernel, Ru et al., "Interpretable Neural Architecture Search via
             Bayesian Optimisation with Weisfeiler-Lehman Kernels", ICLR 2021) of the
             cell's live op-on-node graph - only the nodes on a path from the cell input
             to its output, so that cells computing the same function encode alike:
             how often each node label occurs, and each label together with the sorted
             labels of the node's live predecessors and successors (one WL iteration).
             The features are those that occur anywhere in the space (NB201: 254)
  graph      the op-on-node graph as matrices, for the graph network (`gcn`)
"""

from __future__ import annotations

from itertools import combinations, product
from typing import Sequence

import numpy as np

from ..errors import UsageError
from ..spaces.base import Arch, SearchSpace

VECTOR = ("onehot", "ordinal", "adjacency", "path", "wl")
CELL_ONLY = ("adjacency", "path", "wl", "graph")


class CellGraph:
    """The cell DAG of a cell space: nodes 0..N-1 (0 the input, N-1 the output); each
    edge (j, i), j > i, carries the op its knob names, `none` meaning no connection."""

    def __init__(self, nodes: int, edges: Sequence[tuple[int, int]], knobs: Sequence[str], ops: Sequence[str]):
        self.nodes, self.edges, self.knobs, self.choices = nodes, list(edges), list(knobs), list(ops)
        self.ops = [op for op in ops if op != "none"]  # the ops that carry data
        # Op-on-node graph: node 0 the cell input, 1..E the edges, E+1 the cell output.
        self.size = len(self.edges) + 2
        links = np.zeros((self.size, self.size))
        for a, (j, i) in enumerate(self.edges, 1):
            if i == 0:
                links[0, a] = 1
            if j == nodes - 1:
                links[a, self.size - 1] = 1
            for b, (jj, _) in enumerate(self.edges, 1):
                if jj == i:  # edge b ends where edge a starts
                    links[b, a] = 1
        self._links = links
        self.paths = [p for n in range(2, nodes + 1) for p in _node_paths(nodes, n)]
        self._path_offsets = np.cumsum([0] + [len(self.ops) ** length for length in range(1, nodes)])

    @property
    def labels(self) -> list[str]:
        """Node labels of the graph encoding: input, output, then every op."""
        return ["input", "output", *self.ops]

    def graph(self, arch: Arch) -> tuple[np.ndarray, np.ndarray]:
        """Adjacency matrix (size × size) of the op-on-node graph and each node's label index;
        an edge node of op `none` keeps no connections and the label of its op index -1."""
        ops = [arch[k] for k in self.knobs]
        keep = np.array([1.0] + [op != "none" for op in ops] + [1.0])
        adjacency = self._links * keep[:, None] * keep[None, :]
        labels = np.array([0] + [2 + self.ops.index(op) if op != "none" else -1 for op in ops] + [1])
        return adjacency, labels

    def adjacency(self, arch: Arch) -> np.ndarray:
        adjacency, labels = self.graph(arch)
        onehot = np.zeros((len(self.edges), len(self.ops)))
        for a, label in enumerate(labels[1:-1]):
            if label >= 0:
                onehot[a, label - 2] = 1
        return np.concatenate([adjacency[np.triu_indices(self.size, 1)], onehot.ravel()])

    def path(self, arch: Arch) -> np.ndarray:
        out = np.zeros(self._path_offsets[-1])
        r = len(self.ops)
        for p in self.paths:
            ops = [arch[self.knobs[self.edges.index((j, i))]] for i, j in zip(p, p[1:])]
            if "none" in ops:
                continue
            index = 0
            for op in ops:
                index = index * r + self.ops.index(op)
            out[self._path_offsets[len(ops) - 1] + index] += 1
        return out

    def live(self, arch: Arch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`graph(arch)` and a mask of its live nodes: those on a path from the cell input
        to its output (none in a degenerate cell)."""
        adjacency, labels = self.graph(arch)
        reach = np.eye(self.size, dtype=bool) | (adjacency > 0)
        for _ in range(self.size.bit_length()):  # transitive closure by squaring
            reach = reach | ((reach.astype(int) @ reach.astype(int)) > 0)
        return adjacency, labels, reach[0] & reach[:, -1]

    def wl_labels(self, arch: Arch) -> list[tuple]:
        """The WL subtree labels of the live op-on-node graph, one of each kind per live
        node: (label,) and (label, predecessors' labels, successors' labels)."""
        adjacency, labels, live = self.live(arch)
        nodes = np.flatnonzero(live)
        out = [(int(labels[v]),) for v in nodes]
        for v in nodes:
            before = tuple(sorted(int(labels[u]) for u in nodes if adjacency[u, v]))
            after = tuple(sorted(int(labels[w]) for w in nodes if adjacency[v, w]))
            out.append((int(labels[v]), before, after))
        return out

    def wl(self, arch: Arch) -> np.ndarray:
        vocabulary = _wl_vocabulary(self)
        out = np.zeros(len(vocabulary))
        for label in self.wl_labels(arch):
            out[vocabulary[label]] += 1
        return out


_WL_VOCABULARIES: dict[tuple, dict[tuple, int]] = {}


def _wl_vocabulary(cell: CellGraph) -> dict[tuple, int]:
    """Index of every WL label that occurs in some cell of this shape (sorted: the order
    does not depend on what was encoded first); built once per process."""
    key = (cell.nodes, tuple(cell.edges), tuple(cell.choices))
    if key not in _WL_VOCABULARIES:
        seen = {label for ops in product(cell.choices, repeat=len(cell.edges))
                for label in cell.wl_labels(dict(zip(cell.knobs, ops)))}
        _WL_VOCABULARIES[key] = {label: i for i, label in enumerate(sorted(seen))}
    return _WL_VOCABULARIES[key]


def _node_paths(nodes: int, length: int) -> list[tuple[int, ...]]:
    """Increasing node sequences of `length` from node 0 to node nodes-1."""
    return [(0, *middle, nodes - 1) for middle in combinations(range(1, nodes - 1), length - 2)]


def cell_graph(space: SearchSpace) -> CellGraph | None:
    """The cell DAG of `space`, or None when it is not a cell space."""
    from ..spaces.nb201 import EDGES, NODES, Nb201Space, edge_knob

    if isinstance(space, Nb201Space):
        return CellGraph(NODES, EDGES, [edge_knob(j, i) for j, i in EDGES], space.spec.ops)
    return None


def allowed(space: SearchSpace) -> tuple[str, ...]:
    """The encodings `space` offers."""
    return ("onehot", "ordinal", *CELL_ONLY) if cell_graph(space) is not None else ("onehot", "ordinal")


def default(space: SearchSpace) -> str:
    """WL features for cell spaces (they rank best there), one-hot elsewhere."""
    return "wl" if cell_graph(space) is not None else "onehot"


def check(space: SearchSpace, kind: str, accepted: Sequence[str], model: str) -> None:
    """Raise a one-line error unless `space` offers encoding `kind` and `model` accepts it."""
    offered = [k for k in allowed(space) if k in accepted]
    if not offered:
        raise UsageError(f"model '{model}' works on cell spaces (kind nb201) only; space '{space.name}' is not one")
    if kind not in offered:
        raise UsageError(f"encoding '{kind}' is not available for this model on space '{space.name}'; "
                         f"allowed: {', '.join(offered)}")


# Graph features of cells encoded before, per cell shape and encoding: a search screening
# thousands of candidates per refit encodes the same cells again at every refit.
_CELL_FEATURES: dict[tuple, dict[tuple, np.ndarray]] = {}


def encode(space: SearchSpace, archs: Sequence[Arch], kind: str) -> np.ndarray:
    """Feature matrix (len(archs) × features) of a vector encoding."""
    if kind in ("onehot", "ordinal"):
        rows = [space.encode(a, kind) for a in archs]
    else:
        cell = cell_graph(space)
        cache = _CELL_FEATURES.setdefault((cell.nodes, tuple(cell.edges), tuple(cell.choices), kind), {})
        rows = []
        for a in archs:
            ops = tuple(a[k] for k in cell.knobs)
            if ops not in cache:
                cache[ops] = getattr(cell, kind)(a)
            rows.append(cache[ops])
    return np.array(rows, dtype=float).reshape(len(archs), -1)
