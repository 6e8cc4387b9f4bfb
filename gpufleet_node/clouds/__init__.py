"""The node's clouds: one module per cloud in this folder, each registering its class
(``base.register``). The list of clouds is the list of modules here: this package imports
every ``*.py`` beside it (but ``base``), so adding a cloud is adding its module, and nothing
else on the node names one.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from . import base

for _module in sorted(Path(__file__).resolve().parent.glob("*.py")):
    if _module.stem not in ("__init__", "base"):
        importlib.import_module(f"{__name__}.{_module.stem}")

# Provider name -> its class, as the cloud modules registered themselves.
CLOUDS: dict[str, type[base.NodeCloud]] = base.registered()


def node_cloud(
    provider: str, region: str, endpoint_url: str = "", metadata_url: str = ""
) -> base.NodeCloud:
    """The class for ``provider`` (a ValueError naming the known ones for any other)."""
    try:
        cls = CLOUDS[provider]
    except KeyError:
        raise ValueError(f"provider must be {' or '.join(CLOUDS)}, got {provider!r}") from None
    return cls(region, endpoint_url=endpoint_url, metadata_url=metadata_url)
