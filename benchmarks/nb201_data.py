"""Where the NAS-Bench-201 benchmarks find the public tables: $NASCTL_NB201_DIR, else
../shared/benchmarks/nb201 next to this checkout."""

import os
from pathlib import Path

DEFAULT_DATA = Path(os.environ.get("NASCTL_NB201_DIR")
                    or Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "nb201")
