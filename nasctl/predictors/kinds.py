"""The registry of predictor model kinds (`nasctl predictor models`)."""

from ..registry import Registry

PREDICTORS = Registry("predictor model", group="nasctl.predictors")
PREDICTORS.register("ridge", "nasctl.predictors.ridge:RidgePredictor")
PREDICTORS.register("gbt", "nasctl.predictors.gbt:GBTPredictor")
PREDICTORS.register("gp", "nasctl.predictors.gp:GPPredictor")
PREDICTORS.register("mlp", "nasctl.predictors.torch_models:MLPEnsemble")
PREDICTORS.register("gcn", "nasctl.predictors.torch_models:GCNEnsemble")
