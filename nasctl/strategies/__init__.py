"""Search strategies: they propose architectures; the engine evaluates them."""

from ..registry import Registry

STRATEGIES = Registry("strategy", group="nasctl.strategies")
STRATEGIES.register("nsga2", "nasctl.strategies.evolutionary:NSGA2Strategy")
STRATEGIES.register("nsga3", "nasctl.strategies.evolutionary:NSGA3Strategy")
STRATEGIES.register("agemoea", "nasctl.strategies.evolutionary:AGEMOEAStrategy")
STRATEGIES.register("random", "nasctl.strategies.random:RandomStrategy")
STRATEGIES.register("local", "nasctl.strategies.local:LocalStrategy")
STRATEGIES.register("tpe", "nasctl.strategies.bayesian:TPEStrategy")
STRATEGIES.register("gp", "nasctl.strategies.bayesian:GPStrategy")
STRATEGIES.register("rl", "nasctl.strategies.rl:RLStrategy")
