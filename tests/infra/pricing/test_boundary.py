"""infra.pricing runs with Pulumi and every provider SDK unimportable.

A clean interpreter (-I: no site-packages path hooks from the repo, no PYTHONPATH) gets only a
copy of infra/ on its path and an import hook that refuses Pulumi and the cloud SDKs, then
imports every module of the package and prices a stack and sizes a run, so an import hidden
inside a function fails here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
REFUSED = (
    "pulumi",
    "boto3",
    "botocore",
    "alibabacloud",
    "aliyunsdk",
    "tencentcloud",
    "azure",
    "fabric",
    "torch",
)

PROBE = """
import importlib, pkgutil, sys

sys.path.insert(0, {root!r})

REFUSED = {refused!r}

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0].startswith(REFUSED):
            raise ImportError(f"infra.pricing must not import {{name}}")
        return None

sys.meta_path.insert(0, Refuse())
import infra.pricing
assert infra.pricing.__file__.startswith({root!r}), infra.pricing.__file__
names = sorted(m.name for m in pkgutil.iter_modules(infra.pricing.__path__, "infra.pricing."))
for name in names:
    importlib.import_module(name)
from infra.pricing.cost import CostInputs
from infra.pricing.cost import estimate_cost
from infra.pricing.sizing import size
from infra.pricing.workload import load_models, workload_for_model
estimate_cost(CostInputs(provider="aws", instance_type="p4d.24xlarge", billing="spot"))
size(workload_for_model(load_models()["gpt2"], 1e9))
print(",".join(names))
"""


def test_pricing_imports_no_pulumi_and_no_provider_sdk(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "infra", tmp_path / "infra", ignore=shutil.ignore_patterns("__pycache__")
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PROBE.format(refused=REFUSED, root=str(tmp_path))],
        cwd=tmp_path,
        env={"PYTHONPATH": "", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split(",") == [
        "infra.pricing.billing_modes",
        "infra.pricing.compare",
        "infra.pricing.cost",
        "infra.pricing.memory",
        "infra.pricing.price_sheet",
        "infra.pricing.sizing",
        "infra.pricing.speed",
        "infra.pricing.workload",
    ]
