"""Timing ONNX models on this machine's onnxruntime CPU, and reading its energy counters.

Timing protocol (both for kernels and end to end): sessions run with the requested
number of intra-op threads (default 1) and sequential execution; items are timed
round-robin - each round runs every item a few times and keeps its fastest run - and an
item's time is its minimum over all rounds.  Plain medians drift by ~8% between runs
minutes apart on a shared machine; the interleaved minimum repeats within ~1%.  With one
thread onnxruntime computes on the calling thread, so the clock is that thread's CPU
time: the same as wall-clock latency on an idle core, and blind to time the OS gives to
other processes.  With more threads the clock is wall-clock time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ...errors import UsageError


@dataclass(frozen=True)
class Protocol:
    """How items are timed; recorded in the device spec's `measurement:` section."""

    threads: int = 1
    rounds: int = 15
    repeats: int = 3
    warmup: int = 2

    @property
    def clock(self) -> str:
        return "thread_cpu" if self.threads == 1 else "wall"

    def describe(self) -> dict:
        return {"threads": self.threads, "rounds": self.rounds, "repeats_per_round": self.repeats,
                "warmup_runs": self.warmup, "clock": self.clock,
                "statistic": "minimum over rounds of the fastest run per round, items interleaved round-robin",
                "clock_note": ("CPU time of the calling thread (onnxruntime computes on it with one thread): "
                               "wall-clock latency on an idle core, blind to other processes"
                               if self.clock == "thread_cpu" else "wall-clock time")}


def session_options(threads: int, profile_prefix: Optional[str] = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model, threads: int, profile_prefix: Optional[str] = None):
    """An onnxruntime CPU session for a model (a path or serialized bytes)."""
    import onnxruntime as ort

    src = str(model) if isinstance(model, (str, Path)) else model
    return ort.InferenceSession(src, session_options(threads, profile_prefix), providers=["CPUExecutionProvider"])


_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
                "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
                "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def random_feed(session, rng: np.random.Generator) -> dict:
    """Seeded inputs for every graph input (a dynamic dim taken as 1)."""
    feed = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = _NUMPY_TYPES.get(inp.type)
        if dtype is None:
            raise UsageError(f"model input '{inp.name}' has type {inp.type}; nasctl feeds numeric tensors only")
        values = rng.standard_normal(shape)
        feed[inp.name] = (values if np.issubdtype(dtype, np.floating) else np.clip(values, 0, 1)).astype(dtype)
    return feed


def interleaved_min(runs: Sequence[Callable[[], object]], protocol: Protocol,
                    on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """Each run's time (ms) by the protocol: round-robin rounds, fastest of a few repeats
    per round, minimum over rounds."""
    now = time.thread_time_ns if protocol.clock == "thread_cpu" else time.perf_counter_ns
    for run in runs:
        for _ in range(protocol.warmup):
            run()
    best = np.full(len(runs), np.inf)
    for _ in range(protocol.rounds):
        for i, run in enumerate(runs):
            for _ in range(protocol.repeats):
                t0 = now()
                run()
                best[i] = min(best[i], now() - t0)
        if on_round is not None:
            on_round()
    return best / 1e6


def measure_models(models: Sequence, protocol: Protocol, seed: int = 0,
                   on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """End-to-end latency (ms) of each ONNX model (paths or bytes), measured together."""
    rng = np.random.default_rng(seed)
    runs = []
    for model in models:
        sess = make_session(model, protocol.threads)
        feed = random_feed(sess, rng)
        runs.append(lambda s=sess, f=feed: s.run(None, f))
    return interleaved_min(runs, protocol, on_round)


# --- energy ----------------------------------------------------------------------------

def energy_counters() -> list[Path]:
    """Readable RAPL package energy counters (µJ), if the machine exposes any."""
    return [p for p in sorted(Path("/sys/class/powercap").glob("intel-rapl*/energy_uj")) if os.access(p, os.R_OK)]


def read_energy_uj() -> float:
    """The sum of the package energy counters (µJ)."""
    return float(sum(int(p.read_text()) for p in energy_counters()))


def _counter_range_uj() -> float:
    ranges = [p.parent / "max_energy_range_uj" for p in energy_counters()]
    return float(sum(int(r.read_text()) for r in ranges if r.is_file()))


def energy_per_run_mj(run: Callable[[], object], seconds: float = 0.2) -> float:
    """Package energy of one run (mJ): the counters' increase over repeated runs lasting at
    least `seconds` (RAPL updates about every millisecond), per run."""
    start, t0, n = read_energy_uj(), time.perf_counter(), 0
    while n == 0 or time.perf_counter() - t0 < seconds:
        run()
        n += 1
    used = read_energy_uj() - start
    if used < 0:  # a counter wrapped around
        used += _counter_range_uj()
    return used / n / 1e3
