"""The resolved settings of a search: validated, written to the run folder as config.yaml."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError
from .objectives import check_objectives
from .specs import validation_message


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    space: str = "ee-mbv2"
    device: str = "edge-quad"
    dataset: str = "digits"
    strategy: str = "nsga2"
    objectives: list[str] = ["accuracy", "edp"]
    budget: int = Field(default=40, ge=1)
    epochs: int = Field(default=5, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=5e-3, gt=0)
    exit_tolerance: float = Field(default=1.0, ge=0)
    seed: int = Field(default=0, ge=0)
    train_device: Literal["auto", "cpu", "cuda"] = "auto"
    max_latency_ms: Optional[float] = Field(default=None, gt=0)
    max_energy_mj: Optional[float] = Field(default=None, gt=0)
    max_params: Optional[int] = Field(default=None, gt=0)

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: list[str]) -> list[str]:
        return check_objectives(v)


def make_config(**values) -> SearchConfig:
    """Validate settings; a bad value raises a one-line ConfigError naming the key."""
    try:
        return SearchConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        raise ConfigError(f"invalid setting {validation_message(e)}") from None
