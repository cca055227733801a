"""The plugin's space and device pass nasctl's conformance kit."""

from pathlib import Path

import yaml

from nasctl.testing import check_device, check_space
from nasctl_plugin_example.roofline import McuRoofline
from nasctl_plugin_example.tcn import Tcn1dSpace

PACKAGE = Path(__file__).resolve().parents[1] / "nasctl_plugin_example"


def spec(path):
    return yaml.safe_load((PACKAGE / path).read_text())


def test_space_conforms():
    space = Tcn1dSpace.from_dict(spec("search_spaces/tcn-digits.yaml"))
    check_space(space, (1, 8, 8), 10, samples=6)
    check_space(space, (3, 1, 50), 4, samples=3)  # a 3-channel time series of 50 steps


def test_device_conforms():
    check_device(McuRoofline.from_dict(spec("hardware/m4-roofline.yaml")), bits=(32, 8))
