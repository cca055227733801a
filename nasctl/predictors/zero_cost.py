"""Zero-cost proxies: scores of an untrained network that rank architectures.

Computed on the space's torch network at initialisation (weights seeded), on one batch
of seeded standard-normal inputs with seeded random labels - no data set, no training:
  synflow    Σ |θ · ∂R/∂θ| with every weight replaced by its absolute value and an
             all-ones input, R the sum of the outputs, batch norm at its initial
             statistics (Tanaka et al., 2020; Abdelfattah et al., 2021)
  naswot     log-determinant of the kernel of binary ReLU activation codes over the
             batch (Mellor et al., "NAS without training", 2021)
  grad_norm  Euclidean norm of the cross-entropy loss gradient over every weight
Scores spanning orders of magnitude (synflow, grad_norm) are taken as log(1 + score).
Scores are remembered for the life of the process, so cross-validation and repeated
predictions of the same architectures compute each once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UsageError
from ..spaces.base import Arch, SearchSpace, arch_key, space_fingerprint

PROXIES = ("synflow", "naswot", "grad_norm")
BATCH = 32
_memo: dict[tuple, float] = {}


def check_proxies(names: Sequence[str]) -> None:
    bad = [n for n in names if n not in PROXIES]
    if bad or not names:
        raise UsageError(f"unknown zero-cost proxy '{(bad or [''])[0]}'; allowed: {', '.join(PROXIES)}")


def resolve_input(space: SearchSpace, input_shape, classes) -> tuple[tuple[int, int, int], int]:
    """The input shape and class count the proxies' network is built for: given, else the space's."""
    if input_shape is None or classes is None:
        try:
            default_shape, default_classes = space.default_input()
        except UsageError:
            raise UsageError(f"zero-cost proxies on space '{space.name}' need the input shape and class count "
                             "of its data (--input-shape C,H,W and --classes N)") from None
        input_shape = default_shape if input_shape is None else input_shape
        classes = default_classes if classes is None else classes
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or min(shape) < 1 or int(classes) < 1:
        raise UsageError(f"input shape {list(shape)} / classes {classes}: need C,H,W and N, all positive")
    return shape, int(classes)


def scores(space: SearchSpace, archs: Sequence[Arch], proxies: Sequence[str], input_shape, classes: int,
           seed: int) -> np.ndarray:
    """One row per architecture, one column per proxy."""
    import torch

    out = np.zeros((len(archs), len(proxies)))
    where = (space.name, space_fingerprint(space), tuple(input_shape), classes, seed)
    with torch.random.fork_rng(devices=[]):
        for n, arch in enumerate(archs):
            for p, proxy in enumerate(proxies):
                key = (*where, arch_key(arch), proxy)
                if key not in _memo:
                    torch.manual_seed(seed)
                    generator = torch.Generator().manual_seed(seed)
                    x = torch.randn((BATCH, *input_shape), generator=generator)
                    labels = torch.randint(classes, (BATCH,), generator=generator)
                    _memo[key] = _PROXY[proxy](space.build(arch, input_shape, classes), x, labels)
                out[n, p] = _memo[key]
    return out


def _final(model, x):
    return model(x)[-1]  # spaces' networks return one output per exit, final classifier last


def synflow(model, x, labels) -> float:
    import torch

    # In float64: with every weight made positive the signal grows layer by layer, past
    # float32's range (3.4e38) in deep cells (NAS-Bench-201's reach 1e44).
    model = model.double().eval()  # batch norm uses its initial statistics: a fixed affine map
    with torch.no_grad():
        for p in model.parameters():
            p.abs_()
    _final(model, torch.ones_like(x[:1], dtype=torch.float64)).sum().backward()
    total = sum(float((p.detach() * p.grad).abs().sum()) for p in model.parameters() if p.grad is not None)
    return float(np.log1p(total))


def naswot(model, x, labels) -> float:
    import torch

    codes = []

    def hook(module, inputs, output):
        codes.append((output.detach() > 0).flatten(1).double())

    relus = [m for m in model.modules() if isinstance(m, (torch.nn.ReLU, torch.nn.ReLU6))]
    handles = [m.register_forward_hook(hook) for m in relus]
    try:
        with torch.no_grad():
            _final(model.train(), x)
    finally:
        for h in handles:
            h.remove()
    if not codes:
        return 0.0
    c = torch.cat(codes, dim=1)
    kernel = c @ c.T + (1 - c) @ (1 - c).T
    return float(torch.linalg.slogdet(kernel).logabsdet)


def grad_norm(model, x, labels) -> float:
    import torch.nn.functional as F

    F.cross_entropy(_final(model.train(), x), labels).backward()
    total = sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
    return float(np.log1p(np.sqrt(total)))


_PROXY = {"synflow": synflow, "naswot": naswot, "grad_norm": grad_norm}
