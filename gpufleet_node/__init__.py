"""What runs on a GPU node: one package, standard library only (Python 3.10+), imported
nothing from the rest of the repository.

fab ships this folder whole (``<dir>/gpufleet_node/...``) and runs its tools as modules with
the folder above it on the path: ``python3 -m gpufleet_node.watchdog`` (the idle watchdog,
``watchdog_*.py``, ``scratch_sync.py``), ``python3 -m gpufleet_node.job_runner`` (fab train's
supervisor; torchrun runs ``-m gpufleet_node.job_launch`` per rank, ``job_sync.py`` and
``data_sync.py`` move checkpoints and datasets), ``python3 -m gpufleet_node.verify_node``
(fab verify-gpu's node checks, ``verify_*.py``). ``clouds/`` holds one module per cloud.

Three modules are shared with the reaper's cloud function and the laptop, which import them
from here (the function zip packs them under this same name): ``bucket`` (the object-store
client), ``idle_rules`` (when a node is idle) and ``fleet_names`` (tag and metric names).
"""
