"""What the spec files of the macro spaces (`kind: mbv2`, `kind: vit`) share: knobs given
as one value or a list of choices, their checks, and the exit and bit-width sections."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, StrictInt, field_validator

Choice = Union[StrictInt, list[StrictInt]]  # strict: `true` or "2" is not a choice
BITS = (4, 8, 16, 32)


def choices(value: Choice) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


def distinct(values) -> None:
    """A knob lists each choice once (twice would weigh it double in every sample)."""
    twice = sorted({x for x in values if list(values).count(x) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(map(str, twice))} more than once; give each choice once")


def positive(v: Choice) -> Choice:
    """A knob's choices, checked: one positive integer or a non-empty list of distinct ones."""
    values = choices(v)
    if not values or any(x <= 0 for x in values):
        raise ValueError("must be a positive integer or a non-empty list of them")
    distinct(values)
    return v


def check_bits(v: Optional[Choice]) -> Optional[Choice]:
    if v is None:
        return v
    bad = [b for b in choices(v) if b not in BITS]
    if bad or not choices(v):
        raise ValueError(f"bit widths {bad} not supported; allowed: {list(BITS)}")
    distinct(choices(v))
    return v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not a depth, "16" not a width


class ExitKnobs(Strict):
    """An exits section's knobs: the exit heads' width, and the accuracy points the exits
    may cost on validation data (a list: a knob)."""

    width: Choice = 32
    tolerance: Optional[Union[float, list[float]]] = None

    _width = field_validator("width")(classmethod(lambda cls, v: positive(v)))

    @field_validator("tolerance")
    @classmethod
    def _tolerance(cls, v):
        if v is None:
            return v
        values = v if isinstance(v, list) else [v]
        if not values or any(t < 0 for t in values):
            raise ValueError("must be accuracy points >= 0, or a non-empty list of them")
        distinct([float(t) for t in values])
        return [float(t) for t in values]


def idle_exit_knobs(arch, exits) -> list[str]:
    """The knobs of an `ExitKnobs` space without effect on `arch`, given the on/off knob of
    each exit it may have (`exits`): the width of each exit that is off and, with every
    exit off, the exits' bit width and their accuracy tolerance."""
    idle = [f"{e}_width" for e in exits if not arch[e]]
    if not any(arch[e] for e in exits):
        idle += [k for k in ("exit_bits", "exit_tolerance") if k in arch]
    return idle


class BitKnobs(Strict):
    """A quantization section's knobs: the backbone's and the exit heads' bit widths."""

    backbone_bits: Choice = 32
    exit_bits: Choice = 32

    _bits = field_validator("backbone_bits", "exit_bits")(classmethod(lambda cls, v: check_bits(v)))
