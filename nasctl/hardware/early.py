"""Work on an ONNX model started before it is needed, to run beside the rest.

`nasctl predict` on a quantized model waits on onnxruntime: which QDQ groups it fuses is
read from the graph its CPU provider optimizes the model into (`onnx_import._in_runtime`),
a session build that releases the GIL.  `runtime_read(path)` starts that on a thread at
once, before the device loads and before onnx and numpy import, where `import_onnx` would
start it only once the model is parsed.  This module imports nothing heavy itself.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Optional

_MARK = b"DequantizeLinear"  # an op type is stored as plain bytes in the model's file


def quantized(path: Path) -> bool:
    """Whether the file at `path` holds a DequantizeLinear node (its bytes name the op type;
    a file that merely mentions it reads as quantized, one that cannot be read as not)."""
    import mmap

    try:
        with open(path, "rb") as f:
            if not f.seek(0, 2):
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return mapped.find(_MARK) >= 0
    except (OSError, ValueError):
        return False


def runtime_read(path: Path) -> Optional[Future]:
    """`start(path)` for a model with DequantizeLinear nodes; None for one without (nothing
    to read)."""
    return start(Path(path)) if quantized(Path(path)) else None


def start(path: Path) -> Future:
    """`onnx_import._in_runtime(path)` running on a thread of its own, for `import_onnx(...,
    runtime=)`."""
    from concurrent.futures import ThreadPoolExecutor

    def read():
        from .onnx_import import _in_runtime

        return _in_runtime(path)

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(read)
    pool.shutdown(wait=False)
    return future
