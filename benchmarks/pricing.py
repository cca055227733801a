"""How many ee-mbv2 candidates per second a device prices.

Prints, side by side in one run: layer-by-layer pricing (to_layers + estimate, with the
device's per-layer cache warm) and the vectorised `path_costs` (per-stage tables), from
architecture dicts and from a matrix of knob indices, at the input shapes of digits and
CIFAR-10.

    python benchmarks/pricing.py [--device edge-quad] [--n 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nasctl.hardware.loader import load_device
from nasctl.spaces.base import SearchSpace
from nasctl.spaces.loader import load_space


def rate(fn, n: int, repeats: int = 3) -> float:
    best = min(_timed(fn) for _ in range(repeats))
    return n / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="edge-quad")
    ap.add_argument("--space", default="ee-mbv2")
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    space, device = load_space(args.space), load_device(args.device)
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(args.n)]
    X = np.array([space.to_indices(a) for a in archs])
    small = archs[: max(args.n // 10, 1)]
    print(f"{args.space} on {args.device}, {args.n} random candidates (best of 3)")
    if not device.additive:
        print(f"{args.device} prices a model as a whole as well (run overhead, working set): "
              "path_costs prices each candidate's layers in one list, as layer by layer does")
    print(f"{'input':>10} {'layer by layer/s':>18} {'vectorised/s':>14} {'from indices/s':>16} {'ratio':>7}")
    for shape in [(1, 8, 8), (3, 32, 32)]:
        SearchSpace.path_costs(space, device, small, shape, 10)  # warm the per-layer cache
        t0 = time.perf_counter()
        space.path_costs(device, archs[:1], shape, 10)          # builds the stage tables once
        build_s = time.perf_counter() - t0
        generic = rate(lambda: SearchSpace.path_costs(space, device, small, shape, 10), len(small))
        vec = rate(lambda: space.path_costs(device, archs, shape, 10), len(archs))
        idx = rate(lambda: space.path_costs(device, X, shape, 10), len(archs))
        print(f"{'x'.join(map(str, shape)):>10} {generic:18,.0f} {vec:14,.0f} {idx:16,.0f} {idx / generic:6.0f}x"
              f"   (tables built in {build_s * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
