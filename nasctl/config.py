"""The settings of a search: validated, read from `--config` files (YAML or TOML) with
flags overriding them, and written to the run folder as config.yaml."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .objectives import check_objectives
from .specs import problem, validation_message

# Keys of config.yaml that describe a run rather than set it.
INFO_KEYS = ("nasctl_version", "created", "resolved")
# A setting `table:PATH:COLUMN` names a benchmark table as the source of accuracy or
# latency (read by nasctl.tables).
TABLE_PREFIX = "table:"


def is_table(spec: str) -> bool:
    return spec.startswith(TABLE_PREFIX)


# How an early exit measures its confidence (see nasctl.evaluation.train.confidence).
EXIT_POLICIES = ("max-softmax", "entropy")
SEED_LIMIT = 2**32  # seeds are 0 ... 2**32 - 1, what every seeded library takes
DEFAULT_DROP = 1.0  # max_accuracy_drop's default, accuracy points


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # The files `space` and `device` name, resolved once per search (see `path`).
    _paths: dict = PrivateAttr(default_factory=dict)

    def path(self, what: str):
        """The file setting `what` ('space' or 'device') names: resolved on first use and
        kept, so a search reads the same files throughout (None: a latency table)."""
        if what not in self._paths:
            from . import workspace

            if what == "device":
                self._paths[what] = None if is_table(self.device) else workspace.find("hardware", self.device, "device")
            else:
                self._paths[what] = workspace.find("search_spaces", self.space, "search space")
        return self._paths[what]

    space: str = "ee-mbv2"
    device: str = "edge-quad"
    dataset: str = "digits"
    accuracy: str = "proxy"
    strategy: str = "auto"  # see nasctl.strategies.auto
    objectives: Optional[list[str]] = None  # default: accuracy and edp, or latency_ms where energy is not
                                            # modelled; and area_mm2 with co_search
    budget: int = Field(default=40, ge=1)
    epochs: int = Field(default=5, ge=1)
    repeats: int = Field(default=1, ge=1)  # trainings per candidate (other seeds): its outcome is their mean
    finetune_epochs: int = Field(default=0, ge=0)  # with accuracy supernet:NAME, epochs each candidate fine-tunes
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=5e-3, gt=0)
    exit_tolerance: float = Field(default=1.0, ge=0, le=100)  # accuracy points
    exit_policy: str = "max-softmax"
    exit_rates: Optional[dict[str, float]] = None  # early exit name -> target share of inputs
    pin: dict[str, Union[int, float, str]] = {}  # knob -> the one value the search may give it
    co_search: bool = False  # search the device's own knobs (its spec's co_search section) too
    seed: int = 0  # 0 <= seed < SEED_LIMIT
    train_device: Literal["auto", "cpu", "cuda"] = "auto"
    max_latency_ms: Optional[float] = Field(default=None, gt=0)
    max_energy_mj: Optional[float] = Field(default=None, gt=0)
    max_params: Optional[int] = Field(default=None, gt=0)
    max_weight_kib: Optional[Union[float, str]] = None  # KiB, or "device": the device's on-chip weight memory
    min_accuracy: Optional[float] = Field(default=None, ge=0, le=100)  # percent
    accuracy_baseline: Optional[str] = None  # a run: accuracy >= its best feasible accuracy - max_accuracy_drop
    max_accuracy_drop: float = Field(default=DEFAULT_DROP, ge=0)  # points, with accuracy_baseline
    storage: Optional[str] = None
    study: Optional[str] = None
    workers: int = Field(default=1, ge=1)
    threads: Optional[int] = Field(default=None, ge=1)  # torch CPU threads per training (default: see
                                                        # nasctl.engine.train_threads)
    surrogate: Optional[str] = None  # a predictor model kind screening the proposals
    keep_weights: Literal["all", "front", "none"] = "all"  # trained networks kept in the run's models/
    screen: Optional[int] = Field(default=None, ge=2)  # candidates proposed per real evaluation with a
                                                       # surrogate (default: 5; strategy auto: its own)

    @field_validator("lr", "exit_tolerance", "max_latency_ms", "max_energy_mj", "max_accuracy_drop")
    @classmethod
    def _finite(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v} is not a finite number")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if not 0 <= v < SEED_LIMIT:
            raise ValueError(f"{v} is out of range; allowed: 0 <= seed < {SEED_LIMIT} (2**32)")
        return v

    @model_validator(mode="after")
    def _worker_seeds(self) -> "SearchConfig":
        if self.seed + self.workers - 1 >= SEED_LIMIT:  # worker k seeds its strategy with seed + k
            raise ValueError(f"seed: {self.seed} with {self.workers} workers is out of range (worker k takes seed + k); "
                             f"allowed: 0 <= seed <= {SEED_LIMIT - self.workers}")
        return self

    @model_validator(mode="after")
    def _finetune_needs_supernet(self) -> "SearchConfig":
        if self.finetune_epochs and not self.accuracy.startswith("supernet:"):
            raise ValueError(f"finetune_epochs: {self.finetune_epochs} fine-tunes weights inherited from a "
                             f"supernet: needs accuracy supernet:NAME, not '{self.accuracy}'")
        return self

    @model_validator(mode="after")
    def _drop_needs_baseline(self) -> "SearchConfig":
        if self.accuracy_baseline is None and self.max_accuracy_drop != DEFAULT_DROP:
            raise ValueError("max_accuracy_drop: needs accuracy_baseline (the run whose accuracy it is "
                             "measured from); give both or neither")
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, values):
        """`budget: true` is not 1, and `co_search: "yes"` is not true: a number or a yes/no
        is given as one (pydantic would turn the one into the other)."""
        if not isinstance(values, dict):
            return values
        for key, value in values.items():
            field = cls.model_fields.get(key)
            if field is None or value is None:
                continue
            wants_bool = field.annotation in (bool, Optional[bool])
            if wants_bool and not isinstance(value, bool):
                raise ValueError(f"{key}: {value!r} is not true or false")
            if not wants_bool and isinstance(value, bool):
                raise ValueError(f"{key}: {value!r} is not a value of this setting (a yes/no was given)")
        return values

    @field_validator("max_weight_kib", mode="before")
    @classmethod
    def _weight_limit(cls, v):
        if v is None or v == "device":
            return v
        try:
            kib = float(v)
        except (TypeError, ValueError):
            kib = float("nan")
        if not 0 < kib < float("inf"):
            raise ValueError(f"'{v}' is not allowed; give a finite KiB > 0, or 'device' for the device's on-chip "
                             "weight memory")
        return kib

    @field_validator("exit_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in EXIT_POLICIES:
            raise ValueError(f"'{v}' is not one of: {', '.join(EXIT_POLICIES)}")
        return v

    @field_validator("exit_rates")
    @classmethod
    def _rates(cls, v: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        if v is not None and (any(not 0 <= r <= 1 for r in v.values()) or sum(v.values()) > 1 + 1e-9):
            raise ValueError(f"{v} is not allowed; give each early exit a share between 0 and 1, "
                             "together at most 1")
        return v

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        return None if v is None else check_objectives(v)


def read_config_file(path: Path) -> dict:
    """Settings from a YAML or TOML file (keys as in config.yaml; run-description keys ignored)."""
    from .specs import read_text, read_yaml

    if not path.is_file():
        raise ConfigError(f"config file '{path}' " + ("is a folder, not a file" if path.is_dir() else "does not exist"))
    if path.suffix.lower() == ".toml":
        import tomllib

        try:
            data = tomllib.loads(read_text(path))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: is not valid TOML: {e}") from None
    else:
        data = read_yaml(path)
    return {k: v for k, v in data.items() if k not in INFO_KEYS}


def read_settings(config: Path | None = None, preset: str | None = None) -> tuple[dict, str]:
    """Settings from a preset (a settings file shipped in a workspace's presets/ folder) and a
    --config file on top of it, and the name of their source for error messages."""
    from . import workspace

    values, sources = {}, []
    for path in (workspace.find("presets", preset, "preset") if preset else None, config):
        if path is not None:
            values.update(read_config_file(path))
            sources.append(str(path))
    return values, " + ".join(sources) or "setting"


def make_config(file_values: dict | None = None, source: str = "setting", **flags) -> SearchConfig:
    """Validate settings: a config file's values, overridden by the flags given (not None).
    A bad value raises a one-line ConfigError naming the flag and its value, or the key
    (and the file)."""
    given = {k: v for k, v in flags.items() if v is not None}
    values = {**(file_values or {}), **given}
    if "max_accuracy_drop" in given and values.get("accuracy_baseline") is None:
        raise ConfigError(f"--max-accuracy-drop {given['max_accuracy_drop']}: needs --accuracy-baseline RUN "
                          "(the run whose best feasible accuracy the drop is measured from)")
    try:
        cfg = SearchConfig(**values)
    except ValidationError as e:
        first = e.errors()[0]
        key = first["loc"][0] if first["loc"] else None
        if key in given:
            value = given[key]
            shown = (",".join(map(str, value)) if isinstance(value, list) else
                     ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value)
            raise ConfigError(f"--{str(key).replace('_', '-')} {shown}: {problem(first)}") from None
        raise ConfigError(f"{source}: {validation_message(e)}") from None
    if cfg.objectives is None:
        cfg.objectives = ["accuracy", "edp"] if _models_energy(cfg) else ["accuracy", "latency_ms"]
        if cfg.co_search:
            cfg.objectives.append("area_mm2")
    return cfg


def _models_energy(cfg: SearchConfig) -> bool:
    from .hardware.loader import load_device

    return not is_table(cfg.device) and load_device(cfg.path("device")).models_energy
