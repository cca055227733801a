"""Timing ONNX models on this machine's onnxruntime CPU, and reading its energy counters.

The protocol and its primitives live in `runner` (which imports only numpy and
onnxruntime, so that `nasctl hw bundle` can copy it onto a target machine as the
bundle's runner); this module gives them to the rest of nasctl, with a model input the
runner cannot feed reported as a `UsageError`.
"""

from __future__ import annotations

import functools

from ...errors import UsageError
from . import runner
from .runner import (Protocol, energy_counters, energy_per_run_mj, interleaved_min, make_session, read_energy_uj,
                     session_options)

__all__ = ["Protocol", "energy_counters", "energy_per_run_mj", "interleaved_min", "make_session", "measure_models",
           "random_feed", "read_energy_uj", "session_options"]


def _as_usage_error(f):
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except runner.InputError as e:
            raise UsageError(str(e)) from None
    return wrapped


random_feed = _as_usage_error(runner.random_feed)
measure_models = _as_usage_error(runner.measure_models)
