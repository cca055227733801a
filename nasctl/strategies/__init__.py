"""Search strategies: they propose architectures; the engine evaluates them."""

from ..registry import Registry

STRATEGIES = Registry("strategy")
STRATEGIES.register("nsga2", "nasctl.strategies.evolutionary:NSGA2Strategy")
STRATEGIES.register("random", "nasctl.strategies.random:RandomStrategy")
