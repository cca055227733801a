"""Trained candidates a search keeps, so that a front point can be exported and deployed.

Each trained architecture of a run has a folder `models/<digest>/` in the run folder
(digest: the first 16 hex digits of the SHA-256 of its architecture key):

    model.pt       the network's torch `state_dict` (loads with `torch.load(weights_only=True)`):
                   weights, batch-norm statistics and the activation ranges QAT learned
    trained.json   everything needed to run it as it was evaluated: the architecture, input
                   shape, normalisation and classes, the active exits (final last), the exit
                   policy and calibrated thresholds, the figures of this training (test
                   accuracy, exit rates and exit accuracies), the training settings and seed,
                   the dataset and its split seed, and model.pt's SHA-256

A folder is written whole (into a temporary folder, then renamed), so a worker that is
killed leaves none half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..hardware.measure.runner import sha256_of

MODELS = "models"
WEIGHTS = "model.pt"
META = "trained.json"
FORMAT = 1


def digest(arch_key: str) -> str:
    return hashlib.sha256(arch_key.encode()).hexdigest()[:16]


def folder_of(run_dir: Path, arch_key: str) -> Path:
    return Path(run_dir) / MODELS / digest(arch_key)


# a file's SHA-256: the profiling bundle's runner (which needs nasctl for nothing) holds the one implementation
sha256 = sha256_of


def save(folder: Path, state_dict: dict, meta: dict[str, Any]) -> Path:
    """Write `state_dict` and `meta` as the kept model in `folder` (replacing one there)."""
    import torch

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    tmp.chmod(0o755)  # as a folder made by mkdir (mkdtemp makes it private)
    try:
        torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, tmp / WEIGHTS)
        doc = {"format": FORMAT, **meta, "weights_sha256": sha256(tmp / WEIGHTS)}
        (tmp / META).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def read_meta(folder: Path) -> dict:
    path = Path(folder) / META
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist: the model was not kept") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not a kept model's description: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{path}: format {doc.get('format') if isinstance(doc, dict) else '?'} is not "
                         f"supported; allowed: {FORMAT}")
    return doc


def load_weights(path: Path, expected_sha256: str | None = None) -> dict:
    """The state_dict in `path`, checked against its recorded hash; one-line errors for a
    missing, changed or corrupt file."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist")
    if expected_sha256 is not None and sha256(path) != expected_sha256:
        raise UsageError(f"{path} has changed since it was written (its SHA-256 differs from the recorded one)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        reason = " ".join(str(e).split())
        reason = f"{type(e).__name__}: {reason}" if reason and len(reason) > 8 else type(e).__name__
        raise UsageError(f"{path} is not a readable torch state_dict ({reason[:200]})") from None
    if not isinstance(state, dict):
        raise UsageError(f"{path} holds a {type(state).__name__}, not a state_dict")
    return state


def prune(run_dir: Path, keep_keys: set[str]) -> int:
    """Remove the kept models of architectures not in `keep_keys`; how many were removed."""
    base = Path(run_dir) / MODELS
    if not base.is_dir():
        return 0
    wanted = {digest(k) for k in keep_keys}
    removed = 0
    for folder in base.iterdir():
        if folder.is_dir() and folder.name not in wanted:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
