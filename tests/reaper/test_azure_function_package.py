"""The Azure function package as the Functions host runs it: unzipped into an empty folder,
``function_app.py`` imported by a clean interpreter (``-S -E -I``: no site-packages, no
PYTHON* variables, nothing of this repository importable) with only the package's own
folders on sys.path, its timer function found and called against the local ARM fake."""

from __future__ import annotations

import ast
import io
import json
import zipfile
from datetime import datetime
from pathlib import Path

import pytest

from gpufleet_node.idle_rules import UTC
from infra.clouds.azure.package import ENTRY, SITE, PackageError, site_files
from infra.reaper.handler import (
    FUNCTION_MODULES,
    NODE_MODULES,
    NODE_PACKAGE,
    PACKAGE,
    build_function_zip,
)
from tests.reaper.azure_fake import RESOURCE_GROUP, SUBSCRIPTION, make_tls
from tests.reaper.azure_identity_fake import identity_endpoint
from tests.reaper.test_azure_reaper import AzScenario, build_scenario
from tests.reaper.test_function_package import clean_run, unzip

pytestmark = pytest.mark.integration

PYTHONS = {
    "3.10": Path("/root/.pyenv/versions/3.10.13/bin/python3.10"),
    "3.12": Path("/root/.pyenv/versions/3.12.1/bin/python3.12"),
}

# What the Functions host does with a v2 app: import function_app, find the registered
# functions on its FunctionApp, call the timer one with a TimerRequest.
CODE = """
import json, function_app
functions = function_app.app.get_functions()
names = [f.get_function_name() for f in functions]
bindings = [json.loads(f.get_function_json()) for f in functions]
print("FUNCTIONS " + json.dumps({"names": names, "bindings": bindings}))
from azure.functions.timer import TimerRequest
try:
    functions[0].get_user_function()(TimerRequest(past_due=False))
except RuntimeError as exc:
    print("FAILED " + str(exc))
import azure.mgmt.compute, gpufleet_reaper
print("FROM " + azure.mgmt.compute.__file__ + " " + gpufleet_reaper.__file__)
"""


@pytest.fixture(scope="module")
def azure_zip() -> bytes:
    return build_function_zip(provider="azure")


def test_azure_zip_is_deterministic_and_has_the_functions_layout(azure_zip: bytes) -> None:
    assert build_function_zip(provider="azure") == azure_zip
    names = zipfile.ZipFile(io.BytesIO(azure_zip)).namelist()
    assert {ENTRY, "host.json", f"{PACKAGE}/azure.py"} <= set(names)
    assert {f"{PACKAGE}/{m}" for m in FUNCTION_MODULES} <= set(names)
    assert {f"{NODE_PACKAGE}/{m}" for m in NODE_MODULES} <= set(names)
    tops = {n[len(SITE) + 1 :].split("/")[0] for n in names if n.startswith(SITE + "/")}
    assert {"azure", "isodate", "requests", "werkzeug"} <= tops
    # No msal, no cryptography, no other cloud's SDK, nothing compiled.
    assert not tops & {"msal", "cryptography", "boto3", "botocore", "alibabacloud_tea"}
    assert not [n for n in names if n.endswith((".so", ".pyd", ".pyc"))]
    host = json.loads(zipfile.ZipFile(io.BytesIO(azure_zip)).read("host.json"))
    assert host["version"] == "2.0"
    assert len(azure_zip) < 12_000_000


def test_azure_function_code_parses_as_python_3_10(azure_zip: bytes) -> None:
    zf = zipfile.ZipFile(io.BytesIO(azure_zip))
    shared = [f"{NODE_PACKAGE}/{m}" for m in NODE_MODULES]
    for name in [ENTRY, *(f"{PACKAGE}/{m}" for m in FUNCTION_MODULES), *shared]:
        ast.parse(zf.read(name).decode(), filename=name, feature_version=(3, 10))


def test_a_compiled_file_without_a_pure_fallback_refuses_the_build() -> None:
    from importlib import metadata

    with pytest.raises(PackageError, match="runtime-matched wheel"):
        site_files([metadata.distribution("cryptography")])


@pytest.mark.parametrize("python", sorted(PYTHONS))
def test_azure_function_app_runs_in_a_clean_interpreter_against_the_fake(
    tmp_path: Path, azure_zip: bytes, python: str
) -> None:
    exe = PYTHONS[python]
    if not exe.exists():
        pytest.skip(f"no Python {python} here")
    folder = unzip(azure_zip, tmp_path / "app")
    tls = make_tls(tmp_path)
    fake, _ = build_scenario(datetime.now(UTC), AzScenario("clean", "no fault"))
    with fake.running(tls) as url, identity_endpoint() as (endpoint, secret, _):
        env = {
            "GPUFLEET_STACK": "sc",
            "GPUFLEET_REGION": "eastus",
            "GPUFLEET_APPLY": "true",
            "GPUFLEET_AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
            "GPUFLEET_AZURE_RESOURCE_GROUP": RESOURCE_GROUP,
            "GPUFLEET_ENDPOINT_URL": url,
            "IDENTITY_ENDPOINT": endpoint,
            "IDENTITY_HEADER": secret,
            "REQUESTS_CA_BUNDLE": str(tls[0]),
            # The fake answers "Retry-After: 0", which azure-core reads as unset: without
            # this, each round of deallocations waits the default 10 s before its poll.
            "GPUFLEET_AZURE_POLL_S": "1",
        }
        # The Python worker puts the app root and .python_packages on the path.
        done = clean_run([folder, folder / SITE], CODE, env, python=str(exe))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout, done.stdout[-2000:]
    found = json.loads(done.stdout.split("FUNCTIONS ", 1)[1].splitlines()[0])
    assert found["names"] == ["gpufleet_reaper"]
    (binding,) = found["bindings"][0]["bindings"]
    assert (binding["type"], binding["schedule"]) == ("timerTrigger", "0 */5 * * * *")
    power = {v.name: v.power for v in fake.vms}
    assert {n for n, p in power.items() if p == "deallocated"} == {
        "dead-idle-1",
        "dead-idle-2",
        "ttl-expired",
    }
    where = done.stdout.split("FROM ", 1)[1]
    assert all(str(folder) in p for p in where.split())
