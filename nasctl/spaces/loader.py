"""Resolve a search-space name (or YAML path) to a SearchSpace."""

from __future__ import annotations

from .. import specs, workspace
from ..registry import Registry
from .base import SearchSpace

SPACE_KINDS = Registry("search-space kind", group="nasctl.space_kinds")
SPACE_KINDS.register("mbv2", "nasctl.spaces.mbv2:Mbv2Space")
SPACE_KINDS.register("nb201", "nasctl.spaces.nb201:Nb201Space")
SPACE_KINDS.register("vit", "nasctl.spaces.vit:VitSpace")


def load_space(name: str) -> SearchSpace:
    return specs.build(workspace.find("search_spaces", name, "search space"), SPACE_KINDS, "search-space")
