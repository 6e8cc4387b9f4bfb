"""The node's clouds: one module per cloud, each registering its class (``base.register``).

A cloud's node module is written in its own folder, ``infra/clouds/<name>/node.py``, beside
everything else that knows that cloud; fab ships it into this folder as ``<name>.py``
(bootstrap/fleet/node_package.py). So the list of clouds is the list of those files: on a
node the modules beside this one (but ``base``), in a checkout each folder of :data:`HOMES`
that has a ``node.py``. Either way each is imported as ``gpufleet_node.clouds.<name>``, and
nothing on the node names a cloud.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from . import base

HERE = Path(__file__).resolve().parent
NODE_FILE = "node.py"  # a cloud's node module in its folder
# Where a checkout keeps its clouds' folders (<home>/<name>/node.py); none on a node, where
# the modules were shipped beside this file. A test may add a folder of its own.
HOMES: list[Path] = [home for home in (HERE.parents[1] / "infra" / "clouds",) if home.is_dir()]

# Provider name -> its class, as the cloud modules registered themselves (:func:`load`).
CLOUDS: dict[str, type[base.NodeCloud]] = {}


def sources() -> dict[str, Path]:
    """Each cloud's node module by name: the modules shipped beside this file, then each
    home's ``<name>/node.py``; the first of a name wins."""
    found: dict[str, Path] = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem not in ("__init__", "base"):
            found.setdefault(path.stem, path)
    for home in HOMES:
        for path in sorted(Path(home).glob(f"*/{NODE_FILE}")):
            found.setdefault(path.parent.name, path)
    return found


def _import(name: str, path: Path) -> ModuleType:
    """``gpufleet_node.clouds.<name>`` from ``path`` (once: the module registers its class)."""
    dotted = f"{__name__}.{name}"
    if dotted in sys.modules:
        return sys.modules[dotted]
    if path.parent == HERE:
        return importlib.import_module(dotted)
    spec = importlib.util.spec_from_file_location(dotted, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the node module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[dotted] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[dotted]
        raise
    return module


def load() -> dict[str, type[base.NodeCloud]]:
    """Import every cloud's node module not imported yet; :data:`CLOUDS` afterwards."""
    for name, path in sources().items():
        _import(name, path)
    CLOUDS.clear()
    CLOUDS.update(base.registered())
    return CLOUDS


load()


def node_cloud(
    provider: str, region: str, endpoint_url: str = "", metadata_url: str = ""
) -> base.NodeCloud:
    """The class for ``provider`` (a ValueError naming the known ones for any other)."""
    if provider not in CLOUDS:
        load()  # a cloud whose module appeared since (a test's folder in HOMES)
    try:
        cls = CLOUDS[provider]
    except KeyError:
        raise ValueError(f"provider must be {' or '.join(CLOUDS)}, got {provider!r}") from None
    return cls(region, endpoint_url=endpoint_url, metadata_url=metadata_url)
