"""`--strategy auto`: the search configuration the NB201 search benchmark shows best.

Costs are computed without training on every device nasctl prices (lookup tables,
analytical models, latency tables), so the candidates a strategy proposes can be priced
by the thousand and only their accuracy has to be earned by a real evaluation.  Over
16 NAS-Bench-201 fronts (benchmarks/nb201_search.py: four devices, other accuracy
columns, FLOPs and parameter counts, sums and monotone transforms of latencies, tables
with holes) random proposals screened by a Gaussian process, 600 per real evaluation,
reached the highest hypervolume on every front at 300 queries.  So `auto` is:

- `random` proposals screened by the `gp` surrogate (or the one `--surrogate` names),
  `--screen` 600 unless given, fewer where a refit would price more than
  `MAX_SCREENED` candidates (large budgets: the batch between refits grows with it);
- with a budget too small for the surrogate to have trials to learn from after its
  warm-up (under `2 * surrogate.MIN_WARMUP`), `tpe` without screening.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
SCREEN = 600          # proposals per real evaluation
MAX_SCREENED = 15_000  # candidates priced and predicted per refit, at most
SURROGATE = "gp"
SMALL_BUDGET_STRATEGY = "tpe"


@dataclass(frozen=True)
class Choice:
    strategy: str
    surrogate: str | None
    screen: int
    why: str


def choose(budget: int, surrogate: str | None = None, screen: int | None = None) -> Choice:
    """What `--strategy auto` runs for this budget (and a `--surrogate`/`--screen` given)."""
    from ..surrogate import MIN_WARMUP, Surrogate

    if budget < 2 * MIN_WARMUP:
        return Choice(SMALL_BUDGET_STRATEGY, surrogate, screen or 5,
                      f"budget {budget} is under {2 * MIN_WARMUP}: too small to train a surrogate on")
    batch = Surrogate.batch_size(budget)
    chosen = screen or max(2, min(SCREEN, MAX_SCREENED // batch))
    kind = surrogate or SURROGATE
    return Choice("random", kind, chosen,
                  f"random proposals screened by a '{kind}' surrogate, {chosen} per real evaluation")
