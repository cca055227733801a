"""Work on an ONNX model started before it is needed, to run beside the rest.

`nasctl predict` on a quantized model waits on onnxruntime: which QDQ groups it fuses is
read from the graph its CPU provider optimizes the model into (`onnx_import._in_runtime`),
a session build that releases the GIL.  `nasctl predict` starts that on a thread
(`in_thread`) as soon as it starts, for a model `quantized` says holds QDQ nodes: before the
device loads and before onnx and numpy import, where `import_onnx` would start it only once
the model is parsed.  This module imports nothing heavy itself.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Callable

_MARK = b"DequantizeLinear"  # an op type is stored as plain bytes in the model's file
# The graph's nodes are written before its weights, and a QDQ model's first DequantizeLinear
# comes early among them (within 19 KB of the file in five published int8 models of 2-26 MB):
# only the file's start is read, so a large model's weights are not paged in for this.
_SCANNED = 4 << 20


def quantized(path: Path) -> bool:
    """Whether the first 4 MB of the file at `path` hold a DequantizeLinear node (its bytes
    name the op type; a file that merely mentions it reads as quantized, one that cannot be
    read as not).  Where this misses one, `import_onnx` starts the reading itself."""
    import mmap

    try:
        with open(path, "rb") as f:
            if not f.seek(0, 2):
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return mapped.find(_MARK, 0, _SCANNED) >= 0
    except (OSError, ValueError):
        return False


def in_thread(fn: Callable, *args) -> Future:
    """`fn(*args)` running on a thread of its own; its result or error from the future."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future
