"""Resolve a device name (or YAML path) to a CostModel."""

from __future__ import annotations

from .. import specs, workspace
from ..registry import Registry
from .base import CostModel

DEVICE_KINDS = Registry("device kind", group="nasctl.device_kinds")
DEVICE_KINDS.register("analytical", "nasctl.hardware.accelerator:AnalyticalAccelerator")
DEVICE_KINDS.register("gpu", "nasctl.hardware.gpu:GpuRoofline")
DEVICE_KINDS.register("lut", "nasctl.hardware.lut:LutDevice")


def load_device(name: str) -> CostModel:
    return specs.build(workspace.find("hardware", name, "device"), DEVICE_KINDS, "device")
