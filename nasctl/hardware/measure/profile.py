"""The whole profile: measure context networks in chunks and fit a `kind: lut` device to them.

Networks are measured in chunks (which bounds the memory of open sessions); the same few
small reference networks run in every chunk, and a chunk whose references ran slower or
faster than in the median chunk - the machine was busier or quieter - has its times
scaled to the median chunk's.
`nasctl.hardware.fit.fit_from_lut` then makes the device of the kernel times: one row per
distinct kernel (the median of its measurements) and a regressor per kernel type, chosen
by cross-validation over whole networks held out; `spec.yaml` and `lut.csv` are written
by `nasctl.hardware.fit.write_device`.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..fit import MEASUREMENTS_FILE
from .attribution import (FLOOR_MS, MeasuredNetwork, in_context_costs, known_layout, layout_block,
                          measure_networks, measured_network, prepare_networks, reorder_times, tagged_by_kernel)
from .context import (OPSET, TAG, grouped_network, headed_network, joined_network, mobile_network, multiplier_network,
                      narrow_network, odd_width_network, random_network, strided_network, wide_network)
from .chains import CHAIN_PASSES, chain_kernels, chained_rows, measure_chains
from .runner import Protocol, measure_chunks
from .timing import measure_models


def machine() -> dict:
    from .runner import machine as described

    return described(OPSET)


def _slower_by(m: MeasuredNetwork, factor: float) -> MeasuredNetwork:
    """`m` with every time divided by `factor`."""
    return replace(m, layer_ms=[t / factor for t in m.layer_ms], latency_ms=m.latency_ms / factor,
                   alone={j: (ms / factor, before / factor, n) for j, (ms, before, n) in m.alone.items()},
                   nodes=[(name, ms / factor) for name, ms in m.nodes])


def reference_networks(n: int = 3) -> list:
    """The small networks measured beside others to tell how busy the machine is."""
    return [random_network(np.random.default_rng(10_000 + k), max_macs=5e6) for k in range(n)]


# How a profile's context networks are drawn (recorded in its `measurement:` section): each
# from a seed of its own, [seed, index], so that any one of them can be built again alone;
# in a profile of LARGE_FROM kernels or more, every LARGE_EVERY-th a large one.  Since
# odd-width networks were added (SEEDING_ODD), every ODD_EVERY-th of the others from ODD_AT
# on is one, since strided-op networks were (SEEDING_STRIDED), every ODD_EVERY-th from
# STRIDED_AT, and since headed networks were (SEEDING_HEADED), every ODD_EVERY-th from
# HEADED_AT, and since int8 transformers write GELU as torch exports it (SEEDING_ERF), half
# of them do so (`context.random_network`'s erf_gelu), and since networks of depthwise convs
# with a channel multiplier were added (SEEDING_MULTIPLIER), every ODD_EVERY-th from
# MULTIPLIER_AT is one, and since narrow networks were added (SEEDING_NARROW), every
# ODD_EVERY-th from NARROW_AT, and since mobile networks were added (SEEDING_MOBILE), every
# MOBILE_EVERY-th from MOBILE_AT, and since wide residual networks were added (SEEDING_WIDE),
# every WIDE_EVERY-th from WIDE_AT, and since int8 networks of max pools on joins were added
# (SEEDING_JOINED), every JOINED_EVERY-th from JOINED_AT, and since int8 RegNets were added
# (SEEDING_GROUPED), every GROUPED_EVERY-th from GROUPED_AT; profiles drawn before build
# their networks as they were drawn.
SEEDING_PLAIN, SEEDING_LARGE = "per network", "per network, large every 10th"
SEEDING_ODD = "per network, large every 10th, odd widths every 10th"
SEEDING_STRIDED = "per network, large every 10th, odd widths every 10th, strided ops every 10th"
SEEDING_HEADED = "per network, large every 10th, odd widths every 10th, strided ops every 10th, headed every 10th"
SEEDING_ERF = SEEDING_HEADED + ", int8 erf gelus"
SEEDING_MULTIPLIER = SEEDING_ERF + ", channel multipliers every 10th"
SEEDING_NARROW = SEEDING_MULTIPLIER + ", narrow stems every 10th"
SEEDING_MOBILE = SEEDING_NARROW + ", mobile every 20th"
SEEDING_WIDE = SEEDING_MOBILE + ", wide every 20th"
SEEDING_JOINED = SEEDING_WIDE + ", joined every 20th"
SEEDING_GROUPED = SEEDING_JOINED + ", int8 grouped every 40th"
# profiles whose context networks can be built again
SEEDINGS = (SEEDING_PLAIN, SEEDING_LARGE, SEEDING_ODD, SEEDING_STRIDED, SEEDING_HEADED, SEEDING_ERF,
            SEEDING_MULTIPLIER, SEEDING_NARROW, SEEDING_MOBILE, SEEDING_WIDE, SEEDING_JOINED,
            SEEDING_GROUPED)
LARGE_EVERY, LARGE_FROM = 10, 5000
ODD_EVERY, ODD_AT, STRIDED_AT, HEADED_AT, MULTIPLIER_AT, NARROW_AT = 10, 4, 7, 1, 2, 5
MOBILE_EVERY, MOBILE_AT = 20, 8  # half of a slot the random networks held
WIDE_EVERY, WIDE_AT = 20, 18  # the other half of that slot
JOINED_EVERY, JOINED_AT = 20, 16  # half of another slot the random networks held
GROUPED_EVERY, GROUPED_AT = 40, 6  # a quarter of that slot
LARGE_MACS = (1e8, 1e9)
LARGE_PREFIX = "large "  # a large network's description starts so
CHAINED_HOW = ("token and attention kernels of a few microseconds or less (`chains.chain_kernels`) chained 2, 8 and "
               "14 times in tiny token networks timed end to end; the slope over the lengths, shared out among the "
               "kernels of a link (`chains.chained_rows`), in place of their profiled rows")
KNEE_GAIN = 0.02  # the least share of the loss a slope without a working-set knee must take off to be kept
# The float rows are scaled to the reference working set and the device fitted again at most
# SCALING_PASSES times, until the slope moves by less than SCALING_TOLERANCE (`fit_profile`).
SCALING_PASSES, SCALING_TOLERANCE = 3, 0.002


def seeding_for(kernels: int) -> str:
    """How the context networks of a profile of `kernels` kernels are drawn: with large
    networks (`is_large`), odd-width ones (`is_odd_width`), strided-op ones (`is_strided`),
    headed ones (`is_headed`), channel-multiplier ones (`is_multiplier`) and narrow ones
    (`is_narrow`) and mobile ones (`is_mobile`) and wide ones (`is_wide`) and joined ones
    (`is_joined`) and int8 RegNets (`is_grouped`) from LARGE_FROM kernels on (a quick
    profile stays quick)."""
    return SEEDING_GROUPED if kernels >= LARGE_FROM else SEEDING_PLAIN


def _since(seeding: str, first: str) -> bool:
    """Whether `seeding` is `first` or one added after it (each keeps its predecessors' networks)."""
    return seeding in SEEDINGS[SEEDINGS.index(first):]


def is_large(index: int, seeding: str) -> bool:
    """Whether context network `index` is a large one: of published models' size (0.1-1
    GMAC, tens of MB of weights and activations), whose kernels run slower than the same
    kernels in a small network (their tensors have left the caches by the time they run
    again).  Without them the working-set slope (`lut.WorkingSet`) is fitted on small
    networks alone and prices published models low."""
    return _since(seeding, SEEDING_LARGE) and index % LARGE_EVERY == LARGE_EVERY - 1


def is_odd_width(index: int, seeding: str) -> bool:
    """Whether context network `index` is an odd-width conv net (`context.odd_width_network`):
    channel counts not a multiple of 4, whose depthwise convs run channel by channel."""
    return _since(seeding, SEEDING_ODD) and index % ODD_EVERY == ODD_AT


def is_strided(index: int, seeding: str) -> bool:
    """Whether context network `index` is a strided-op one (`context.strided_network`):
    transposes and reductions that run without contiguous blocks, at every size."""
    return _since(seeding, SEEDING_STRIDED) and index % ODD_EVERY == STRIDED_AT


def is_headed(index: int, seeding: str) -> bool:
    """Whether context network `index` is a headed one (`context.headed_network`): 2-40 MB
    of weights, most in a linear head, placing where such layers start to read their
    weights from memory (`lut.WeightStream`)."""
    return _since(seeding, SEEDING_HEADED) and index % ODD_EVERY == HEADED_AT


def is_multiplier(index: int, seeding: str) -> bool:
    """Whether context network `index` is one of depthwise convs with a channel multiplier
    (`context.multiplier_network`), which onnxruntime runs group by group."""
    return _since(seeding, SEEDING_MULTIPLIER) and index % ODD_EVERY == MULTIPLIER_AT


def is_narrow(index: int, seeding: str) -> bool:
    """Whether context network `index` is a narrow one (`context.narrow_network`): an
    8-channel stem at 128-256 px, as small width multipliers make."""
    return _since(seeding, SEEDING_NARROW) and index % ODD_EVERY == NARROW_AT


def is_mobile(index: int, seeding: str) -> bool:
    """Whether context network `index` is a mobile one (`context.mobile_network`): a first
    block of stride 1 at its stem's resolution, half of them int8."""
    return _since(seeding, SEEDING_MOBILE) and index % MOBILE_EVERY == MOBILE_AT


def is_wide(index: int, seeding: str) -> bool:
    """Whether context network `index` is a wide residual one (`context.wide_network`):
    dense convs of 64-512 channels (a bottleneck's 1x1 convs up to 2,048), two thirds int8."""
    return _since(seeding, SEEDING_WIDE) and index % WIDE_EVERY == WIDE_AT


def is_joined(index: int, seeding: str) -> bool:
    """Whether context network `index` is a joined one (`context.joined_network`): int8,
    its stages ending in a max pool on a concatenation or a residual sum, which onnxruntime
    runs in its plain channels-first 8-bit kernel."""
    return _since(seeding, SEEDING_JOINED) and index % JOINED_EVERY == JOINED_AT


def is_grouped(index: int, seeding: str) -> bool:
    """Whether context network `index` is an int8 RegNet (`context.grouped_network`): grouped
    convs of tens of groups, which onnxruntime runs fused or unfused."""
    return _since(seeding, SEEDING_GROUPED) and index % GROUPED_EVERY == GROUPED_AT


def context_network(seed: int, index: int, seeding: str):
    """The context network `index` of the profile of `seed` drawn by `seeding` (an onnx
    model and a description)."""
    rng = np.random.default_rng([seed, index])
    erf = _since(seeding, SEEDING_ERF)
    if is_large(index, seeding):
        model, description = random_network(rng, max_macs=LARGE_MACS[1], min_macs=LARGE_MACS[0], erf_gelu=erf)
        return model, f"{LARGE_PREFIX}{description}"
    if is_odd_width(index, seeding):
        return odd_width_network(rng)
    if is_strided(index, seeding):
        return strided_network(rng)
    if is_headed(index, seeding):
        return headed_network(rng)
    if is_multiplier(index, seeding):
        return multiplier_network(rng)
    if is_narrow(index, seeding):
        return narrow_network(rng)
    if is_mobile(index, seeding):
        return mobile_network(rng)
    if is_wide(index, seeding):
        return wide_network(rng)
    if is_joined(index, seeding):
        return joined_network(rng)
    if is_grouped(index, seeding):
        return grouped_network(rng)
    return random_network(rng, erf_gelu=erf)


def context_networks(kernels: int, seed: int = 0) -> list:
    """Random context networks (onnx models with descriptions) until the small ones hold
    `kernels` kernels, with large ones among them (`seeding_for`, `is_large`; their kernels
    not counted): the same for the same seed, in `hw profile` and in `hw bundle`."""
    seeding = seeding_for(kernels)
    networks, count = [], 0
    while count < kernels:
        index = len(networks)
        networks.append(context_network(seed, index, seeding))
        if not is_large(index, seeding):
            count += len({m.group(1) for n in networks[-1][0].graph.node if (m := TAG.search(n.name))})
    return networks


SPEED_REFERENCES, SPEED_REFERENCE_MAX_MS = 24, 2.0


def layers_digest(layers: Sequence) -> str:
    """A short digest of a network's layers as the importer reads them: whether a context
    network built again is the one a profile measured."""
    import hashlib
    import json

    from ..layers import MAX_NCHW, SUM
    from ..lut import as_general, row_from_layer

    # How the importer labels how onnxruntime runs a layer - a residual sum (`layers.SUM`), an
    # 8-bit max pool's kernel (`MAX_NCHW`) and whether it runs dequantized, a strided
    # transpose or reduction (`layers.STRIDED`), an add fused into a layer norm
    # (`layers.SKIP`) - tells nothing of the network built, and profiles recorded digests
    # before it did: the digest is the same.
    def as_built(layer):
        if (layer.op, layer.fn) == ("add", SUM):
            return replace(layer, fn="")
        if layer.op == "pool" and layer.fn in ("max", MAX_NCHW):
            return replace(layer, fn="max", dequantized=False)
        return as_general(layer)

    rows = [row_from_layer(as_built(layer), 0.0) for layer in layers]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def speed_references(measured: Sequence[MeasuredNetwork], k: int = SPEED_REFERENCES,
                     max_ms: float = SPEED_REFERENCE_MAX_MS) -> list[int]:
    """Which context networks `validate_models` times again to tell how fast the machine runs
    now against the profile: `k` of those under `max_ms`, spread evenly over the profile
    (so over its chunks, whose slowdowns are corrected with some error each)."""
    small = [i for i, m in enumerate(measured) if m.latency_ms <= max_ms]
    if not small:
        return []
    return sorted({small[int(j)] for j in np.linspace(0, len(small) - 1, min(k, len(small))).round()})


def chunk_seeds(networks: int, chunk: int, seed: int) -> list[tuple[int, range]]:
    """The chunks networks are measured in: each chunk's seed (of its inputs) and networks."""
    return [(seed + first, range(first, min(first + chunk, networks))) for first in range(0, networks, chunk)]


def profile_machine(name: str, protocol: Protocol, kernels: int = 15000, seed: int = 0, chunk: int = 80,
                    references: int = 3, on_progress: Optional[Callable[[int, int, str], None]] = None):
    """Build context networks until they hold `kernels` kernels, measure them `chunk` at a
    time (interleaved: a busy spell slows every network of a chunk alike, and the minimum
    over rounds spread over the chunk's minutes avoids it), and fit the device from them.

    The same few small reference networks are measured in every chunk (`fit_profile`
    scales each chunk to the median chunk by them)."""
    start = time.perf_counter()
    networks = context_networks(kernels, seed)
    refs = reference_networks(references)
    chunks = chunk_seeds(len(networks), chunk, seed)
    chain = chain_kernels() if kernels >= LARGE_FROM else []  # (a quick profile stays quick)
    # per chunk: profiled rounds, end-to-end rounds, long kernels alone; then one per chained kernel and pass
    total = 3 * protocol.rounds * len(chunks) + CHAIN_PASSES * len(chain)
    ticks = iter(range(1, 10 ** 9))

    def tick():
        if on_progress is not None:
            on_progress(min(next(ticks), total), total, f"{len(networks)} networks")

    if on_progress is not None:
        on_progress(0, total, f"building {len(networks)} networks")
    measured, chunk_of, ref_ms = [], [], []
    with tempfile.TemporaryDirectory(prefix="nasctl-profile-") as tmp:
        ref_nets, _ = prepare_networks(refs, Path(tmp) / "refs")
        layers: list = []

        def todo():
            for k, (chunk_seed, members) in enumerate(chunks):
                prepared, imported = prepare_networks([networks[i] for i in members], Path(tmp) / f"nets{k}")
                layers.append(imported)
                yield chunk_seed, prepared

        for k, (times, ref_times) in enumerate(measure_chunks(todo(), ref_nets, protocol, Path(tmp), tick)):
            measured += [measured_network(networks[i][1], res.layers, t, layouts=res.layouts)
                         for i, res, t in zip(chunks[k][1], layers[k], times)]
            chunk_of += [k] * len(times)
            ref_ms.append([t.latency_ms for t in ref_times])
    chains = measure_chains(chain, chain_protocol(protocol), seed=seed, on_kernel=tick)
    measurement = {**protocol.describe(), "seed": seed, "seeding": seeding_for(kernels), "references": references,
                   "machine": machine(), "measuring_seconds": round(time.perf_counter() - start, 1)}
    if on_progress is not None:
        on_progress(total, total, "fitting the regressors")
    fitted = fit_profile(name, measured, measurement, chunk_of, ref_ms, chains)
    fitted.report["seconds"] = time.perf_counter() - start
    return fitted


CHAIN_SPREAD_S = 1.0  # the seconds each kernel's chains' rounds are spread over


def chain_protocol(protocol: Protocol) -> Protocol:
    """How a profile of `protocol` times the chained kernels: its rounds spread over CHAIN_SPREAD_S."""
    return replace(protocol, spread_s=CHAIN_SPREAD_S)


def fit_profile(name: str, raw: Sequence[MeasuredNetwork], measurement: dict, chunk_of: Sequence[int],
                reference_ms: Sequence[Sequence[float]], chains: Sequence[dict] = ()):
    """The `lut` device of measured context networks (`measurement`: how they were measured,
    recorded in the spec).  `chunk_of` gives each network's chunk, `reference_ms` the times
    of the reference networks measured in each chunk: a chunk whose references ran slower
    or faster than in the median chunk (the machine was busier or quieter) has its times
    scaled to the median chunk's - the device prices the machine in its typical state, not
    its quietest.  The networks travel with it (`FittedDevice.files`, written as
    `measurements.json`), so that the device can be fitted again without measuring
    (`refit_profile`).  `chains` are the token kernels timed end to end in chains
    (`chains.measure_chains`): their rows take the place of the profiled rows of the same
    shape, which the profiler cannot resolve."""
    from ..lut import ENERGY_COLUMN, WorkingSet, layer_from_row, row_from_layer, working_set_factor

    start = time.perf_counter()
    ref = np.array(reference_ms, dtype=float).reshape(len(reference_ms), -1)
    slower = np.median(ref / np.median(ref, axis=0), axis=1) if ref.size else np.ones(max(chunk_of, default=0) + 1)
    measured = [_slower_by(m, slower[k]) for m, k in zip(raw, chunk_of)]
    measurement = {**measurement, "chunk_slowdown_corrected": [round(float(f), 4) for f in slower],
                   "reference_ms": [round(float(v), 5) for v in np.median(ref, axis=0)] if ref.size else []}
    measurement.pop("speed_references", None)
    if measurement.get("seeding") in SEEDINGS and "seed" in measurement:  # networks that can be built again
        picked = speed_references(measured)
        measurement["speed_references"] = {
            "networks": picked, "descriptions": [measured[i].description for i in picked],
            "layers": [layers_digest(measured[i].layers) for i in picked],
            "ms": [round(float(measured[i].latency_ms), 6) for i in picked]}
    done = sum(len(m.layers) for m in measured)
    block, agree = layout_block(measured)
    costs, norm = in_context_costs(measured, block=block)
    run_ms, per_node = norm["run_overhead_ms"], norm["profiler_cost_per_node_ms"]
    reread, reread_how = weight_reread(measured, per_node, run_ms)
    if reread is not None:  # the kernels' costs with their weights in the caches, as the table holds them
        costs, norm = in_context_costs(measured, known=(run_ms, per_node), block=block, reread=reread)
    layout, layout_how = fit_layout_cost(measured, norm["profiler_cost_per_node_ms"], block, agree)
    stream, stream_how = weight_stream(measured, costs)
    if stream is not None:  # the table holds what such layers cost with the weights in the caches
        costs = [resident_costs(stream, m.layers, ts) for m, ts in zip(measured, costs)]
    rows = []
    for i, (m, ts) in enumerate(zip(measured, costs)):
        if m.description.startswith(LARGE_PREFIX):
            # A large network's kernels ran slower than the same kernels in a small model
            # (most of all the memory-bound ones: a classifier's weights read from memory,
            # not the caches) and stay out of the table; the network's end-to-end time
            # fits the working-set slope and the offsets (`kernel_offsets`).
            continue
        # A network's energy goes to its kernels by their share of its time.
        shares = ts / ts.sum() if m.energy_mj is not None else [None] * len(ts)
        # a transpose a reorder runs in place of (no node of its own) is no kernel's row
        replaced = {r.layer for r in known_layout(m, block) if r.replaces}
        rows += [{**row_from_layer(layer, ms, None if share is None else max(m.energy_mj * share, FLOOR_MS)),
                  "group": i} for j, (layer, ms, share) in enumerate(zip(m.layers, ts, shares)) if j not in replaced]
    chained = chained_rows(chains)
    if chained:
        shapes = {layer_from_row(r).shape_key() for r in chained}
        rows = [r for r in rows if layer_from_row(r).shape_key() not in shapes]
        # a chained kernel's energy: its time at the context networks' median power
        power = (float(np.median([m.energy_mj / m.latency_ms for m in measured]))
                 if all(m.energy_mj is not None for m in measured) else None)
        rows += [{**r, **({ENERGY_COLUMN: max(r["latency_ms"] * power, FLOOR_MS)} if power is not None else {}),
                  "group": len(measured) + j} for j, r in enumerate(chained)]
    measurement = {**measurement, "context_networks": len(measured), "kernels_timed": done,
                   "how": "per-node kernel times from onnxruntime profiling inside random context networks, summed "
                          "per kernel (minimum over the profiled runs) less the profiler's own cost per node; "
                          "kernels profiled longer than 0.5 ms timed again alone (thread clock) less the run "
                          "overhead and the layout reorders around them; the other kernels of each network scaled "
                          "so that its kernels and the run overhead add up to its end-to-end time (where long "
                          "kernels take most of it, leaning on the typical scale by their share); the run "
                          "overhead and the profiler's cost per node fitted to the networks' end-to-end times",
                   **norm, **({"chained_kernels": len(chains), "chained_how": CHAINED_HOW} if chains else {})}
    energy = ("RAPL package energy per run of each context network (counters' increase over 0.2 s of runs), "
              "apportioned to its kernels by their share of its time; includes the package's idle and uncore power"
              if all(m.energy_mj is not None for m in measured)
              else "latency only: this machine exposes no readable energy counters (RAPL)")
    threads = measurement.get("threads", 1)
    where, by = "this machine", "`nasctl hw profile`"
    if "bundle" in measurement:  # measured on a target by a bundle's runner (`nasctl hw bundle`)
        where, by = measurement.get("machine", {}).get("cpu") or "the target", "a `nasctl hw bundle` runner"
    extra = {"measurement": measurement, "energy": energy,
             "overhead": {"per_model_ms": norm["run_overhead_ms"], "per_layer_ms": 0.0,
                          **({"weight_stream": stream} if stream is not None else {}),
                          **({"weight_reread": reread} if reread is not None else {}),
                          **({"layout": layout} if layout is not None else {})}}
    description = f"onnxruntime CPU on {where}, {threads} thread(s), measured by {by}"
    fitted, working_set = _fit_table(name, rows, measured, description, extra)
    # Each row is a kernel's time in its own network, faster in a small one and slower in a
    # large one, and the device prices a model's kernels at the reference working set scaled
    # to the model's (`lut.WorkingSet`).  Unscaled, a float kernel of a small network was
    # priced at its own network's speed and scaled down again: a profile's 28 tiny context
    # networks, timed again, 7.4% low (median), and tiny transformers of the ee-vit space,
    # whose kernels are like theirs, 3-8% low.
    # So the float rows are scaled to the reference working set by the fitted slope and the
    # device fitted again, until the slope holds (int8 networks' working sets, a quarter of
    # their float twins', do not tell their kernels' speed: scaled, int8 models were priced
    # 10-19% higher).
    scaled_by = None
    for _ in range(SCALING_PASSES):
        if working_set is None or (scaled_by is not None and abs(working_set["slope"] - scaled_by["slope"]) <
                                   SCALING_TOLERANCE and working_set.get("knee_bytes") == scaled_by.get("knee_bytes")):
            break
        scaled_by = working_set
        # (a chained kernel's row is kept as timed: its chain, of 5-300 KB, lies below most
        # networks the slope was fitted on; scaled by it - 0.82-0.95 there - ee-vit samples
        # were priced 1-6% higher, median, on one profile, and over two profiles fewer sets
        # of them were within ±10%: 82% against 86%)
        factors = [working_set_factor(WorkingSet(**working_set), m.layers) for m in measured] + [1.0] * len(chained)
        table = [{**row, "latency_ms": max(row["latency_ms"] / factors[row["group"]], FLOOR_MS)}
                 if (row["w_bits"], row["a_bits"]) == (32, 32) else row for row in rows]
        fitted, working_set = _fit_table(name, table, measured, description, extra)
    if scaled_by is not None:
        fitted.spec["fit"]["kernel_offsets"]["float_rows_scaled_to_the_reference_working_set_by"] = scaled_by
    fitted.spec["fit"]["weight_stream"] = stream_how
    fitted.spec["fit"]["weight_reread"] = reread_how
    fitted.spec["fit"]["layout"] = layout_how
    device = fitted.device()
    error = np.array([device.with_layout(device.estimate(m.layers), {block: known_layout(m, block)}).latency_ms /
                      m.latency_ms - 1 for m in measured])
    fitted.report = {"networks": len(measured), "layers": done, "fitting_seconds": time.perf_counter() - start,
                     "networks_rms_error_pct": float(np.sqrt(np.mean(error ** 2)) * 100),
                     "networks_within_10pct": float(np.mean(np.abs(error) <= 0.10))}
    fitted.spec["fit"]["context_networks"] = {k: round(v, 4) for k, v in fitted.report.items() if k.startswith("networks_")}
    fitted.files[MEASUREMENTS_FILE] = {"format": 2, "measurement": measurement, "chunk_of": list(chunk_of),
                                       "reference_ms": [list(map(float, r)) for r in reference_ms],
                                       "networks": [m.to_dict() for m in raw],
                                       **({"chains": list(chains)} if chains else {})}
    return fitted


def _fit_table(name: str, rows: Sequence[dict], measured: Sequence[MeasuredNetwork], description: str,
               extra: dict):
    """The device of a kernel table and its kernel offsets and working-set slope
    (`kernel_offsets`): (the fitted device, the working set it holds or None)."""
    from ..fit import fit_from_lut

    fitted = fit_from_lut(name, rows, description=description, extra=copy.deepcopy(extra))
    # Each row is one network's in-context time of a kernel, off by its network's noise (two
    # profiles of the same networks differ by 6-15% a row, median): every layer is priced by
    # its type's regressor, fitted to all rows - the offsets below too, on out-of-fold prices.
    fitted.spec["exact_rows"] = False
    offsets, working_set, how = kernel_offsets(name, rows, measured, fitted.spec)
    fitted.spec["overhead"]["per_kernel_ms"] = offsets
    if working_set is not None:
        fitted.spec["overhead"]["working_set"] = working_set
    fitted.spec["fit"]["kernel_offsets"] = how
    return fitted, working_set


LAYOUT_MIN_NETWORKS = 20  # the fewest networks with reorders of a direction a layout cost is fitted to


def fit_layout_cost(measured: Sequence[MeasuredNetwork], per_node: float, block: Optional[int],
                    agree: dict[int, int]) -> tuple[Optional[dict], dict]:
    """What the layout reorders cost on this machine (`lut.LayoutCost`, as `overhead.layout`
    holds it, or None where too few networks tell), and how it was fitted.

    `block` is the vector width whose predicted reorders agree with the profiled ones on the
    most networks (`layout_block`; `agree`: on how many for each).  Each network whose
    reorders are known for it (`known_layout`) gives, per direction, its
    reorders' profiled time (`reorder_times`) against their count and the elements they move
    in tensors under and from a cut; the three costs are fitted by non-negative least squares
    on relative errors, for each cut of `layout.CUTS`, and the cut of the least median error
    is kept.  A reorder copies its tensor into or out of blocks: in the caches it moved 0.09-0.13
    ns an element here, from memory twice that (tensors of a million elements)."""
    from scipy.optimize import nnls

    from ..layout import CUTS, cost_terms

    known = [(known_layout(m, block), reorder_times(m, per_node)) for m in measured]
    known = [(layout, times) for layout, times in known if layout]
    how = {"networks": len(known), "agreeing_by_width": {int(b): int(n) for b, n in agree.items()},
           "min_networks": LAYOUT_MIN_NETWORKS,
           "how": "fixed cost + ms per element under and from the cut, non-negative least squares on relative "
                  "errors of each network's reorders per direction; the cut of the least median error"}
    best = None
    for cut in CUTS:
        fitted, errors = {}, []
        for direction in ("in", "out"):
            pts = [(cost_terms(layout, cut)[direction], times[direction]) for layout, times in known]
            pts = [(terms, t) for terms, t in pts if terms[0] > 0 and t > 0]
            if len(pts) < LAYOUT_MIN_NETWORKS:
                return None, {**how, "note": f"not fitted: {len(pts)} networks with reorders {direction} "
                                             f"(fewer than {LAYOUT_MIN_NETWORKS})"}
            a = np.array([terms for terms, _ in pts], dtype=float)
            t = np.array([ms for _, ms in pts])
            scale = np.maximum(a.max(axis=0), 1.0)
            coef = nnls(a / scale / t[:, None], np.ones(len(t)), maxiter=2000)[0] / scale
            fitted[direction] = [float(c) for c in coef]
            errors += list(np.abs(a @ coef / t - 1))
        error = float(np.median(errors))
        if best is None or error < best[0]:
            best = (error, cut, fitted)
    error, cut, fitted = best
    return ({"block": int(block), "cut_elements": int(cut), "reorder_in": fitted["in"], "reorder_out": fitted["out"]},
            {**how, "median_error_pct": round(error * 100, 2)})


STREAM_MIN_BYTES = 0.8e6  # layers streaming at least this many weight bytes time the rate (`weight_stream`)
STREAM_MAX_SHARE = 0.8  # ... and at most this share of their network's weight bytes
STREAM_SIDE = 5  # the fewest such layers on each side of the change
STREAM_WIDTH = 0.2  # the change's width, in e-folds of a model's weight bytes (`lut.WeightStream`)
STREAM_GRID = 60  # middles of the change tried, between the STREAM_SIDE-th smallest and largest network


def weight_stream(measured: Sequence[MeasuredNetwork], costs: Sequence[np.ndarray]) -> tuple[Optional[dict], dict]:
    """The speed at which layers that stream their weights (`lut.streams_weights`) read
    them, by the weight bytes of the network around them (`lut.WeightStream`, as
    `overhead.weight_stream` holds it, or None where the networks show no change), and how
    it was fitted.

    Such a layer of at least STREAM_MIN_BYTES of weights is timed by their reading: its
    in-context time per megabyte is one rate in networks whose weights stay in the caches
    between runs and a higher one in networks whose weights do not.  A layer that holds
    more than STREAM_MAX_SHARE of its network's weights is left out: what else passes
    through the caches between its runs is then too little for the network's weight
    bytes to tell (such layers of 13-20 MB ran at 0.024-0.031 ms/MB in networks where
    layers of 1-5 MB among others ran at 0.03-0.05).  The change is fitted as
    `lut.WeightStream`'s curve of STREAM_WIDTH e-folds: its middle is tried at STREAM_GRID
    points, evenly in log, between the weight bytes of the networks of the STREAM_SIDE-th
    fewest and most; at each, its two rates by least absolute deviation (`_lad_rates`);
    the middle of the least deviation is kept.
    Seen on a 32 MB-L3 machine: 0.016 ms/MB up to about 6 MB of a network's weights, 0.02-0.03
    at 6-24 MB, 0.035-0.045 beyond; a table that averages the two prices a small model's
    1000-class classifier at twice its time and a large one's at 0.65x.  (Splitting the
    layers in two at the split of least deviation from each side's median, as fits before
    did, placed the middle at 9, 12 and 22 MB in three profiles of the same networks: a
    step jumps between the few networks near the change, the curve does not.)"""
    from ..lut import streams_weights, weight_bytes

    points = []
    for m, ts in zip(measured, costs):
        weights = weight_bytes(m.layers)
        for layer, ms in zip(m.layers, ts):
            size = layer.weight_bytes
            if streams_weights(layer) and STREAM_MIN_BYTES <= size <= STREAM_MAX_SHARE * weights and ms > 0:
                points.append((weights, ms / (size / 1e6)))
    how = {"layers": len(points), "min_weight_bytes": STREAM_MIN_BYTES, "max_share": STREAM_MAX_SHARE,
           "width": STREAM_WIDTH, "how": "curve, least absolute deviation"}
    fitted, note = _stream_curve(points, (STREAM_WIDTH,))
    if fitted is None:
        return None, {**how, "note": note}
    cache, width, low, high = fitted
    size = np.array([p[0] for p in points])
    return ({"cache_bytes": round(cache, 1), "width": width, "resident_ms_per_mb": round(low, 6),
             "streamed_ms_per_mb": round(high, 6), "convs": True},
            {**how, "resident_layers": int(np.sum(size < cache)), "streamed_layers": int(np.sum(size >= cache))})


def _stream_curve(points: Sequence[tuple[float, float]], widths: Sequence[float], grid: int = STREAM_GRID,
                  flat: bool = False):
    """`lut.WeightStream`'s curve through `points` ((a network's weight bytes, a layer's ms
    per MB) pairs): ((middle, width, low rate, high rate), None), or (None, why not).  The
    middle is tried at `grid` points, evenly in log, between the weight bytes of the
    networks of the STREAM_SIDE-th fewest and most, each of `widths`; at each, the two
    rates by least absolute deviation (`_lad_rates`); of the pairs whose rate rises with
    the weights, the one of the least deviation is kept (a curve that falls is no reading
    from memory: a middle among the few largest networks can fit their layers' spread
    that way).  With `flat`, where no curve rises, one rate for all networks (the median)."""
    from ..lut import WeightStream

    if len(points) < 2 * STREAM_SIDE:
        return None, f"not fitted: {len(points)} layers (fewer than {2 * STREAM_SIDE})"
    points = sorted(points)
    size = np.array([p[0] for p in points])
    rate = np.array([p[1] for p in points])
    # middles between the STREAM_SIDE-th smallest and largest networks: each side keeps that many layers
    lo, hi = np.log(size[STREAM_SIDE - 1]), np.log(size[-STREAM_SIDE])
    best, solved = None, False
    for width in widths:
        for middle in np.exp(np.linspace(lo, hi, grid)) if hi > lo else ():
            share = np.array([WeightStream(cache_bytes=float(middle), width=width, resident_ms_per_mb=0.0,
                                           streamed_ms_per_mb=1.0).rate(float(w)) for w in size])
            fitted = _lad_rates(share, rate)
            if fitted is None:  # the solver gave up on this middle: the others still count
                continue
            low, high, loss = fitted
            solved = True
            if high > low and (best is None or loss < best[0] - 1e-12):
                best = (loss, float(middle), float(width), low, high)
    if best is None and flat:
        median = float(np.median(rate))
        return (float(np.exp(np.median(np.log(size)))), float(widths[0]), median, median), None
    if best is None:
        return None, ("not fitted: the layers' networks hold too alike weight bytes" if hi <= lo
                      else "not fitted: the solver found no rates" if not solved
                      else "not fitted: the layers run no slower in networks of more weights")
    return best[1:], None


REREAD_ROWS = 64  # the most output positions of a layer `weight_reread` prices (`lut.rereads_weights`)
REREAD_WIDTHS = (0.2, 0.5, 1.0)  # the widths of its change tried, in e-folds of a model's weight bytes
# the most layer sizes it is tried up to: the largest measured at or under each of as many, even in log
REREAD_CAPS = 24
REREAD_CAP_GRID = 12  # the middles of its change tried while choosing that size (STREAM_GRID once chosen)


def weight_reread(measured: Sequence[MeasuredNetwork], per_node: float,
                  run_ms: float) -> tuple[Optional[list[dict]], dict]:
    """What float convs and linear layers of a few output positions (`lut.rereads_weights`,
    REREAD_ROWS at most) pay for reading their weights from memory in their network
    (`lut.WeightStream`s of `max_rows` REREAD_ROWS, one per `lut.reread_kind`, as
    `overhead.weight_reread` holds them, or None where the networks show none), and how
    they were fitted.

    Such a layer, when it profiles long, is timed again alone (`runner.long_kernels`): cut
    out of its network, its weights stay in the caches, so its alone time is its resident
    one and its profiled time in the network less that is what reading them cost there.
    Per megabyte of its weights, that excess is fitted as a curve of the network's weight
    bytes (`_stream_curve`, its width too, of REREAD_WIDTHS, or one rate where none rises),
    on the layers of at least STREAM_MIN_BYTES that hold at most STREAM_MAX_SHARE of their
    network's weights; it prices layers of at least STREAM_MIN_BYTES (what smaller ones
    pay, it did not measure) beyond its resident rate, which the table rows hold (a long
    layer's row: its alone time and that rate, `in_context_costs`).  Spatial convs and the
    other layers get a curve each: in three profiles of a 2-vCPU EPYC VM, spatial convs of
    0.8-8 MB ran 0.034-0.047 ms/MB over their alone time in networks under 30 MB and
    0.049-0.065 in larger ones, pointwise layers 0.013-0.025 in either.  With one curve for both, and long
    layers' rows at their alone time, the spatial convs of ResNet-18-D's and ResNet-10-T's
    last stages (9.4 MB each) were priced 0.69 ms against 1.19 ms in place.
    A layer too large for the caches reads its weights from memory alone too, and shows no
    excess: a curve prices layers of at most `max_bytes`, the layer size (of REREAD_CAPS of
    those measured, spread evenly in log, or none) whose curve, fitted to the layers up to
    it (REREAD_CAP_GRID middles), leaves the least absolute deviation over all of them,
    the larger ones priced nothing (layers of 18-81 MB ran within 0.006 ms/MB of their
    alone time).  Seen on a 2-vCPU cloud VM: without such a curve ViT-B/16 (345 MB) was priced
    24% under its time, its linear layers of 37 tokens 0.03-0.04 ms/MB each; MobileNetV2-1.4
    at 32 px, whose 1x1 convs of 1-3 MB on 2x2 maps took 1.7-1.9x their price, 18-26% low.
    Layers of 256 tokens or more showed none in ConvNeXt-tiny (114 MB), whose 16- and
    64-token ones did."""
    from ..lut import reread_kind, rereads_weights, weight_bytes

    points: dict[str, list] = {kind: [] for kind in REREAD_KINDS}  # (network's weight bytes, layer's, ms per MB)
    for m in measured:
        weights = weight_bytes(m.layers)
        for j, (ms, besides_ms, besides) in m.alone.items():
            layer = m.layers[j]
            size = layer.weight_bytes
            if not (rereads_weights(layer, REREAD_ROWS) and STREAM_MIN_BYTES <= size <= STREAM_MAX_SHARE * weights):
                continue
            in_network = m.layer_ms[j] - per_node * m.layer_nodes[j]
            resident = ms - run_ms - (besides_ms - per_node * besides)
            points[reread_kind(layer)].append((weights, size, (in_network - resident) / (size / 1e6)))
    how: dict = {"max_rows": REREAD_ROWS, "min_weight_bytes": STREAM_MIN_BYTES, "max_share": STREAM_MAX_SHARE,
                 "how": "profiled in the network less timed alone, per MB; curve, least absolute deviation, "
                        "up to the layer size of least deviation; spatial convs and the others apart"}
    # One cap for both kinds: whether a layer's weights stay in the caches when it runs
    # alone is the caches' matter (the spatial convs, a fifth of the layers, placed it at
    # 5.3-10.6 MB on their own, the others at 16.8-18.9 MB, in three profiles)
    every = [p for found in points.values() for p in found]
    sizes = sorted({p[1] for p in every})
    grid = np.exp(np.linspace(np.log(sizes[0]), np.log(sizes[-1]), REREAD_CAPS)) if sizes else []
    best = None
    for cap in sorted({max(s for s in sizes if s <= g * (1 + 1e-9)) for g in grid}):
        curves = {kind: _reread_curve(found, cap, REREAD_CAP_GRID) for kind, found in points.items()}
        if all(c is None for c in curves.values()):
            continue
        loss = sum(_reread_loss(found, curves[kind], cap) for kind, found in points.items())
        if best is None or loss < best[0] - 1e-12:
            best = (loss, cap)
    if best is None:
        return None, {**how, "layers": {kind: len(found) for kind, found in points.items()},
                      "note": f"not fitted: fewer than {2 * STREAM_SIDE} layers of each kind"}
    cap = best[1]
    capped = cap < sizes[-1]
    fits = []
    for kind, found in points.items():
        curve = _reread_curve(found, cap)
        how[kind] = {"layers": len(found), "networks": len({p[0] for p in found}),
                     "layers_over_it": sum(p[1] > cap for p in found)}
        if curve is None:
            how[kind]["note"] = f"not fitted: fewer than {2 * STREAM_SIDE} layers up to the cap"
            continue
        cache, width, low, high = curve
        how[kind]["width"] = width
        fits.append({"cache_bytes": round(cache, 1), "width": width, "resident_ms_per_mb": round(low, 6),
                     "streamed_ms_per_mb": round(high, 6), "convs": True, "max_rows": REREAD_ROWS,
                     "min_bytes": STREAM_MIN_BYTES, **({"max_bytes": cap} if capped else {}), "kernels": kind})
    how["max_weight_bytes"] = cap if capped else None
    return fits or None, how


REREAD_KINDS = ("spatial", "pointwise")  # `lut.reread_kind`, each fitted a curve of its own


def _reread_curve(points: Sequence[tuple[float, float, float]], cap: float, grid: int = STREAM_GRID):
    """`weight_reread`'s curve (middle, width, low rate, high rate) through the `points` (a
    network's weight bytes, a layer's, its excess in ms per MB) of layers up to `cap`
    bytes, or None where they are too few."""
    return _stream_curve([(w, r) for w, s, r in points if s <= cap], REREAD_WIDTHS, grid, flat=True)[0]


def _reread_loss(points: Sequence[tuple[float, float, float]], curve: Optional[tuple], cap: float) -> float:
    """The absolute deviation of `points` from what `curve` up to `cap` prices (none over it)."""
    from ..lut import WeightStream

    model = None if curve is None else WeightStream(cache_bytes=curve[0], width=curve[1],
                                                    resident_ms_per_mb=curve[2], streamed_ms_per_mb=curve[3])
    return sum(abs(r - (model.rate(w) if model is not None and s <= cap else 0.0)) for w, s, r in points)


def _lad_rates(share: np.ndarray, rate: np.ndarray) -> Optional[tuple[float, float, float]]:
    """The rates `low` and `high` (at least 0) minimising the sum of |rate - low - (high -
    low) * share| (a linear program), and that sum; None where the solver finds no solution."""
    from scipy import sparse
    from scipy.optimize import linprog

    n = len(rate)
    # variables: low, high, then each point's deviation above and below the curve
    a_eq = sparse.hstack([sparse.csr_matrix(np.column_stack([1.0 - share, share])), sparse.identity(n),
                          -sparse.identity(n)], format="csr")
    done = linprog(np.r_[0.0, 0.0, np.ones(2 * n)], A_eq=a_eq, b_eq=rate,
                   bounds=[(0, None), (0, None)] + [(0, None)] * (2 * n), method="highs")
    if not done.success:
        return None
    return float(done.x[0]), float(done.x[1]), float(done.fun)


def resident_costs(stream: dict, layers: Sequence, ms: np.ndarray) -> np.ndarray:
    """In-context times `ms` of a network's `layers` with what its layers that stream their
    weights (`lut.streams_weights`) paid for reading them from memory taken off (at most
    four fifths of one's time): what they cost with the weights in the caches."""
    from ..lut import WeightStream, weight_bytes

    model, weights = WeightStream(**stream), weight_bytes(layers)
    extra = np.array([model.extra_ms(layer, weights) for layer in layers])
    return np.maximum(np.asarray(ms, dtype=float) - extra, 0.2 * np.asarray(ms, dtype=float))


def kernel_offsets(name: str, rows: Sequence[dict], measured: Sequence[MeasuredNetwork], spec: dict,
                   folds: int = 5, seed: int = 0, penalty: float = 0.001, group_penalty: float = 1.0,
                   slope_penalty: float = 0.01, bounds_ms: tuple[float, float] = (-0.002, 0.01),
                   slope_bounds: tuple[float, float] = (-0.2, 0.2)) -> tuple[dict[str, float], Optional[dict], dict]:
    """Per kernel group (`lut.kernel_group`), a fixed cost added to each of its layers, and
    the working-set slope (`lut.WorkingSet`, about the context networks' median working
    set, with the knee past which it stops unless a slope without one fits them clearly
    better), fitted so that the context networks' prices add up to their end-to-end times:
    (offsets, working set as `overhead.working_set` holds it or None where not fitted,
    how it was fitted).

    A kernel's in-context time depends on the network around it: in a network whose
    weights and activations stay in the caches it runs faster than in one whose tensors
    have left them by the time it runs again.  The table holds kernels of small and large
    networks alike, so without the slope a small model is priced with some of the large
    networks' cache misses and a large one without them.

    In-context kernel times are each network's profiled node times, scaled alike to its
    end-to-end time.  What the profile does not see - the executor's cost per node, the
    reshapes onnxruntime puts around a fused kernel, timed with the kernel before them -
    is spread over a network's kernels by their time instead of by their count, so the
    regressors price a network of many small kernels low and one of few large ones high.
    The offsets are fitted on out-of-fold prices (the device fitted again without a
    network's fold prices it: a table hit would repeat its own network's times), by
    robust least squares on relative errors with penalties (per microsecond of the offset
    all kernels share, a thousand times more per microsecond of a group's deviation from
    it - a deviation stays only where many networks ask for it - and per hundredth of the
    slope)."""
    from scipy.optimize import least_squares

    from ..fit import FittedDevice, _median_rows
    from ..lut import ENERGY_COLUMN, REPLACED_BY_REORDER, kernel_group, working_set_bytes

    n = len(measured)
    if n < 4 * folds:
        return {}, None, {"note": f"not fitted: {n} context networks (fewer than {4 * folds})"}
    fold = np.random.default_rng(seed).permutation(n) % folds
    names = sorted({kernel_group(layer) for m in measured for layer in m.layers})
    col = {g: j for j, g in enumerate(names)}
    targets = ["latency_ms"] + ([ENERGY_COLUMN] if all(ENERGY_COLUMN in r for r in rows) else [])
    base = {**spec, "overhead": {**spec["overhead"], "per_kernel_ms": {}}}
    block = (spec["overhead"].get("layout") or {}).get("block")
    price, count, layout = np.zeros(n), np.zeros((n, len(names))), np.zeros(n)
    for k in range(folds):
        # (rows of no context network, a chained kernel's, are in every fold's table)
        device = FittedDevice(name, base, _median_rows([r for r in rows if r["group"] >= n or fold[r["group"]] != k],
                                                       targets)).device()
        for i in np.flatnonzero(fold == k):
            report = device.estimate(measured[i].layers)
            price[i] = report.latency_ms
            full = device.with_layout(report, {block: known_layout(measured[i], block)})
            layout[i] = full.latency_ms - price[i]
            for layer, cost in zip(full.layers, full.costs):
                if cost.mapping not in ("unsupported", REPLACED_BY_REORDER):
                    count[i, col[kernel_group(layer)]] += 1
    y = np.array([m.latency_ms for m in measured])
    run = float(spec["overhead"].get("per_model_ms", 0.0))
    size = np.array([max(working_set_bytes(m.layers), 1.0) for m in measured])
    ref = float(np.median(size))
    # One offset shared by every kernel plus each group's own deviation from it, and the
    # kernels' price (the run overhead left out) times ln(W / ref) for the slope.  A group's
    # deviation is penalised far more than the shared offset: fitted freely, the groups'
    # offsets traded microseconds between groups that occur together and changed sign from
    # one profile of the same machine to the next (add +1.9 -> -0.2 us, mul +4.0 -> -0.8),
    # which moved the price of a network of a hundred tiny kernels by a third.
    k = len(names)
    lower = np.r_[bounds_ms[0], [bounds_ms[0]] * k, slope_bounds[0]]
    upper = np.r_[bounds_ms[1], [bounds_ms[1]] * k, slope_bounds[1]]
    # the penalties per microsecond of the shared offset and of a deviation, per hundredth of the slope
    weight = np.r_[penalty * 1e3, [group_penalty * 1e3] * k, slope_penalty * 1e2]
    # (the layout reorders' cost, `lut.LayoutCost`, is neither a kernel's nor scaled by the slope)
    price = price + layout

    def fit(knee: Optional[float]):
        scaled = np.log(np.minimum(size, np.inf if knee is None else knee) / ref)
        columns = np.column_stack([count.sum(axis=1), count, (price - run) * scaled])
        return least_squares(lambda c: np.r_[(price + columns @ c) / y - 1, weight * c], np.zeros(k + 2),
                             loss="soft_l1", f_scale=0.05, bounds=(lower, upper)), columns

    # Kernels slow down as the working set outgrows the inner caches and stop slowing once
    # it has (the context networks of 2-64 MB on a Xeon of 2 MB of L2 a core ran alike; a
    # slope through all sizes priced the 16-64 MB ones 2-10% high): the knee past which the
    # slowdown stops is the one of a grid (halves of an e-fold from the median network's
    # working set, the reference, to the 90th percentile) whose fit has the least loss.  It
    # is kept unless a slope without a knee lowers that loss by more than KNEE_GAIN: caches
    # are finite, and a slope that goes on growing is extrapolated to published models of
    # 40-150 MB from a tenth of the networks.  (Kept only where it lowered the loss by
    # KNEE_GAIN, a profile kept none - its best knee lowers the loss by 1.6% - and priced
    # the published float models 5% high: `benchmarks/README.md`, "A fresh measurement of
    # `x16`".)
    grid = [float(g) for g in np.exp(np.arange(np.log(ref), np.log(np.percentile(size, 90)), 0.5))]
    fits = {knee: fit(knee) for knee in [None, *grid]}
    knee = min(grid, key=lambda kn: fits[kn][0].cost, default=None)
    no_knee_cost = float(fits[None][0].cost)
    if knee is None or no_knee_cost < fits[knee][0].cost * (1 - KNEE_GAIN):
        knee = None
    best, columns = fits[knee]
    x = best.x
    offsets = {g: round(float(x[0] + x[1 + j]), 7) for j, g in enumerate(names) if count[:, col[g]].any()}
    before, after = price / y - 1, (price + columns @ x) / y - 1
    within = lambda e: round(float(np.mean(np.abs(e) <= 0.10)), 4)  # noqa: E731
    working_set = {"ref_bytes": ref, "slope": round(float(x[-1]), 6)}
    if knee is not None:
        working_set["knee_bytes"] = round(knee)
    return offsets, working_set, {
        "folds": folds, "networks": n, "penalty_per_us": {"shared": penalty, "group": group_penalty},
        "penalty_per_hundredth_of_slope": slope_penalty,
        "shared_ms": round(float(x[0]), 7),
        "loss": {"without_a_knee": round(no_knee_cost, 6), "fitted": round(float(best.cost), 6)},
        "out_of_fold_within_10pct": {"without_offsets": within(before), "with_offsets_fitted_on_all": within(after)}}


def refit_profile(name: str, folder: Path, chains: Optional[Sequence[dict]] = None):
    """Fit the device again from the context networks a profile saved in `folder`
    (`measurements.json`), without measuring anything; with `chains`, those chained kernels
    (`chains.measure_chains`) in place of the ones it saved."""
    import json

    from ...errors import UsageError

    path = Path(folder) / MEASUREMENTS_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != 2:
            raise ValueError("format")
        measured = [MeasuredNetwork.from_dict(d) for d in doc["networks"]]
        chunk_of, reference_ms = doc["chunk_of"], doc["reference_ms"]
        chains = list(doc.get("chains") or []) if chains is None else list(chains)
        chained_rows(chains)  # (readable)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: cannot read the measured context networks ({type(e).__name__}); profile the "
                         f"machine again with `nasctl hw profile`") from None
    measurement = {k: v for k, v in doc.get("measurement", {}).items()
                   if k not in ("chunk_slowdown_corrected", "reference_ms", "speed_references")}
    return fit_profile(name, read_again(measured, measurement), measurement, chunk_of, reference_ms, chains)


def read_again(measured: Sequence[MeasuredNetwork], measurement: dict) -> list[MeasuredNetwork]:
    """The measured context networks with their layers as the importer reads them now: each
    network built again from its seed (profiles whose networks can be, `SEEDINGS`) and
    read again, so that a refit prices what the importer now tells apart (a residual sum
    from a stand-alone add, say) from the same measurements.  A network whose layers
    differ in more than how they are labelled (their count, order, names, shapes or bit
    widths) keeps the layers it was measured with; the others' times are attributed again
    from their profiled nodes, where the profile kept them.  Which int8 kernels ran dequantized is
    read again too, but not of results a bundle's runner measured on another machine whose
    profile told them (`int8_fusion` in the measurement)."""
    from ..onnx_import import import_onnx

    seeding, seed = measurement.get("seeding"), measurement.get("seed")
    if seeding not in SEEDINGS or seed is None:
        return list(measured)
    relabel = "int8_fusion" not in measurement

    def kernel(layer) -> tuple:
        key = layer.shape_key()
        return (layer.name, *key[:10]) + (() if relabel else (key[11],))  # all but the labels

    out = []
    with tempfile.TemporaryDirectory(prefix="nasctl-refit-") as tmp:
        path = Path(tmp) / "net.onnx"
        for i, m in enumerate(measured):
            model, description = context_network(seed, i, seeding)
            if description != m.description:
                out.append(m)
                continue
            path.write_bytes(model.SerializeToString())
            result = import_onnx(path)
            layers = result.layers
            same = len(layers) == len(m.layers) and all(kernel(a) == kernel(b) for a, b in zip(layers, m.layers))
            out.append(replace(m, layers=layers, layouts=result.layouts).reattributed() if same else m)
    return out


def validate_models(device, paths: Sequence[Path], rounds: int = 15, seed: int = 0,
                    on_progress: Optional[Callable[[int, int, str], None]] = None, compare: Sequence = (),
                    spread_s: float = 3.0, sessions: int = 3) -> dict:
    """Predicted vs measured end-to-end latency of ONNX models on this machine: each model
    the median of `sessions` sessions, the rounds spread over `spread_s` seconds
    (`Protocol`).  The devices in `compare` are priced against the same measurements
    (`compared`, one document each): the measuring noise is then the same for all."""
    from ..onnx_import import import_onnx

    def measurement(dev) -> dict:
        return getattr(getattr(dev, "spec", None), "measurement", None) or {}

    def recorded(dev) -> list:
        return list(measurement(dev).get("reference_ms", []))

    def speed(dev) -> list:
        """The device's speed references: ((seed, index, seeding), description, layers' digest, ms) each."""
        m = measurement(dev)
        s = m.get("speed_references") or {}
        if m.get("seeding") not in SEEDINGS or "seed" not in m:
            return []
        return [((int(m["seed"]), int(i), str(m["seeding"])), d, str(digest), float(ms))
                for i, d, digest, ms in zip(s.get("networks", []), s.get("descriptions", []), s.get("layers", []),
                                            s.get("ms", []))]

    threads = int(measurement(device).get("threads", 1))
    protocol = Protocol(threads=threads, rounds=rounds, spread_s=spread_s, sessions=sessions)
    imported = [import_onnx(Path(path)) for path in paths]
    for path, model in zip(paths, imported):  # a model priced at nothing is no comparison: refused before timing
        report = device.estimate(model.layers)
        if not any(cost.mapping != "unsupported" for cost in report.costs):
            from ...errors import UsageError

            ops = ", ".join(f"{op} x{n}" for op, n in (model.unsupported + report.unsupported).items())
            raise UsageError(f"{path}: no op of it can be priced on '{device.name}' (not priced: {ops or 'none'}); "
                             "it cannot be compared")
    # The profile's reference networks, measured beside the models where the device records
    # their times: how much slower (or faster) the machine runs now than when profiled.
    count = max((len(recorded(d)) for d in (device, *compare)), default=0)
    refs = [m.SerializeToString() for m, _ in reference_networks(count)] if count else []
    # Better, where the profile names some of its context networks for it: those, built
    # again (each one that still builds as it was measured).
    again = {}
    with tempfile.TemporaryDirectory(prefix="nasctl-validate-") as tmp:
        for key, description, digest, _ in {r[0]: r for d in (device, *compare) for r in speed(d)}.values():
            model, built = context_network(*key)
            data, path = model.SerializeToString(), Path(tmp) / "network.onnx"
            path.write_bytes(data)
            if built == description and layers_digest(import_onnx(path).layers) == digest:
                again[key] = data
    done = iter(range(1, rounds + 1))
    measured = measure_models([*paths, *refs, *again.values()], protocol, seed,
                              on_round=lambda: on_progress and on_progress(next(done), rounds, "rounds"))
    now_of = dict(zip(again, measured[len(paths) + len(refs):]))
    docs = []
    for dev in (device, *compare):
        rows = []
        for path, model, ms in zip(paths, imported, measured):
            report = dev.with_layout(dev.estimate(model.layers), model.layouts)
            rows.append({"model": Path(path).stem, "path": str(path), "predicted_ms": report.latency_ms,
                         "layers": len(model.layers), "unsupported": dict(model.unsupported + report.unsupported),
                         "measured_ms": float(ms), "error_pct": (report.latency_ms / float(ms) - 1) * 100})
        summary = {"models": len(rows), **_error_figures(np.array([r["error_pct"] for r in rows]) / 100)}
        mine = recorded(dev)
        if mine:
            now = measured[len(paths):len(paths) + len(mine)]
            summary["machine_vs_profile"] = float(np.median(now / np.array(mine)))
            summary["machine_vs_profile_from"] = f"{len(mine)} reference networks"
        ratios = [now_of[key] / ms for key, _, _, ms in speed(dev) if key in now_of]
        if ratios:
            summary["machine_vs_profile"] = float(np.median(ratios))
            summary["machine_vs_profile_from"] = f"{len(ratios)} of the profile's context networks"
        if "machine_vs_profile" in summary:
            summary["load_adjusted"] = load_adjusted(rows, summary)
        docs.append({"device": dev.name, "protocol": protocol.describe(), "models": rows, "summary": summary})
    return {**docs[0], **({"compared": docs[1:]} if compare else {})}


def load_adjusted(rows: Sequence[dict], summary: dict) -> Optional[dict]:
    """The errors of `rows` (`validate_models`' models, or some of them) with each prediction
    scaled by how much slower or faster the machine runs now than when it was profiled
    (`summary["machine_vs_profile"]`): the device's error apart from the machine's load at
    the time, a second figure beside the raw one.  None where that was not measured."""
    factor = summary.get("machine_vs_profile")
    if not factor or not rows:
        return None
    err = np.array([r["predicted_ms"] * factor / r["measured_ms"] - 1 for r in rows])
    return {"factor": float(factor), **_error_figures(err), "worst_pct": float(err[np.argmax(np.abs(err))] * 100),
            "median_pct": float(np.median(err) * 100)}


def _error_figures(err: np.ndarray) -> dict:
    """Shares within ±5% and ±10%, and the RMS error (%), of relative errors `err`."""
    return {"within_5pct": float(np.mean(np.abs(err) <= 0.05)), "within_10pct": float(np.mean(np.abs(err) <= 0.10)),
            "rms_error_pct": float(np.sqrt(np.mean(err ** 2)) * 100)}


def kernel_breakdown(device, paths: Sequence[Path], protocol: Protocol, seed: int = 0,
                     on_round: Optional[Callable[[], None]] = None, worst: int = 10) -> dict:
    """Where a device's prices of ONNX models part from this machine: each model profiled
    in onnxruntime (`tagged_by_kernel`), its layers' in-context times obtained as a profile
    obtains them (`in_context_costs`: the profiler's cost per node taken off, scaled to the
    model's end-to-end time) and set beside the device's price of each layer.  Returns the
    sums per kernel type (`lut.kernel_type`) over all the models, largest difference first,
    and the `worst` layers by difference (the device's run overhead is left out of both)."""
    import onnx

    from ..lut import kernel_type

    with tempfile.TemporaryDirectory(prefix="nasctl-breakdown-") as tmp:
        models = [(tagged_by_kernel(onnx.load(str(path))), Path(path).stem) for path in paths]
        measured = measure_networks(models, protocol, Path(tmp), seed, on_round, long_kernel_ms=float("inf"))
    spec = getattr(device, "spec", None)
    cost = getattr(getattr(spec, "overhead", None), "layout", None)
    block = None if cost is None else cost.block  # without a layout cost, reorders shared as it prices them
    recorded = getattr(spec, "measurement", None) or {}
    known = None  # a profile of this machine: its run overhead and profiler cost per node
    if recorded.get("machine") == machine() and {"run_overhead_ms", "profiler_cost_per_node_ms"} <= set(recorded):
        known = (float(recorded["run_overhead_ms"]), float(recorded["profiler_cost_per_node_ms"]))
    costs, how = in_context_costs(measured, known=known, block=block)
    run = float(getattr(getattr(spec, "overhead", None), "per_model_ms", 0.0) or 0.0)
    kinds: dict[str, list[float]] = {}
    layers = []
    for m, measured_ms in zip(measured, costs):
        report = device.estimate(m.layers)
        reorders = known_layout(m, block)
        if reorders:  # the layout reorders, priced on their own, beside their profiled time
            acc = kinds.setdefault("layout reorders", [0, 0.0, 0.0])
            acc[0] += len(reorders)
            acc[1] += device.with_layout(report, {block: reorders}).latency_ms - report.latency_ms
            acc[2] += sum(reorder_times(m, how["profiler_cost_per_node_ms"]).values())
        priced = [c.latency_ms for c in report.costs]
        if priced:
            priced[0] -= run
        for layer, p, ms in zip(m.layers, priced, measured_ms):
            k = kernel_type(layer)
            acc = kinds.setdefault(k, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += p
            acc[2] += float(ms)
            layers.append({"model": m.description, "layer": layer.name, "kernel": k, "op": layer.op, "fn": layer.fn,
                           "in_ch": layer.in_ch, "out_ch": layer.out_ch, "in_hw": list(layer.in_hw),
                           "out_hw": list(layer.out_hw), "kernel_size": list(layer.kernel), "groups": layer.groups,
                           "predicted_ms": p, "measured_ms": float(ms)})
    rows = [{"kernel": k, "layers": n, "predicted_ms": p, "measured_ms": ms} for k, (n, p, ms) in kinds.items()]
    rows.sort(key=lambda r: -abs(r["predicted_ms"] - r["measured_ms"]))
    layers.sort(key=lambda r: -abs(r["predicted_ms"] - r["measured_ms"]))
    return {"device": device.name, "models": [m.description for m in measured],
            "end_to_end_ms": [float(m.latency_ms) for m in measured], "run_overhead_ms": how["run_overhead_ms"],
            "profiler_cost_per_node_ms": how["profiler_cost_per_node_ms"], "kernels": rows,
            "worst_layers": layers[:worst]}
