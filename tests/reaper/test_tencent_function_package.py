"""The Tencent SCF package as SCF runs it: unzipped into an empty folder, ``main_handler``
called by a clean interpreter (``-S -E -I``, nothing of this repository or the venv on the
path) against the local signed fake on 127.0.0.1, on this Python and on CPython 3.10 (the
runtime infra/clouds/tencent/reaper.py names)."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpufleet_node.fleet_names import HEARTBEAT_OBJECT_PREFIX
from gpufleet_node.idle_rules import UTC
from infra.clouds.tencent.entry import HANDLER as SCF_HANDLER
from infra.clouds.tencent.reaper import BUCKET_ENV, COS_ENDPOINT_ENV, SCF_RUNTIME
from infra.reaper import tags as T
from infra.reaper.handler import build_function_zip
from tests.reaper.tencent_fake import SECRET_ID, SECRET_KEY, FakeCvm, FakeTencent
from tests.reaper.test_function_package import PY310, clean_run, unzip

pytestmark = pytest.mark.integration

CODE = """
import json, handler
print("RESULT " + handler.main_handler({"Type": "Timer"}, None))
import tencentcloud.cvm as cvm, requests, gpufleet_reaper as pkg
print("FROM " + cvm.__file__ + " " + requests.__file__ + " " + pkg.__file__)
"""


@pytest.fixture(scope="module")
def tencent_zip() -> bytes:
    return build_function_zip(provider="tencent")


def test_tencent_zip_is_deterministic_and_carries_only_the_per_product_sdks(
    tencent_zip: bytes,
) -> None:
    assert build_function_zip(provider="tencent") == tencent_zip
    names = zipfile.ZipFile(io.BytesIO(tencent_zip)).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {"handler.py", "gpufleet_reaper", "tencentcloud", "requests", "urllib3"} <= tops
    products = {
        n.split("/")[1] for n in names if n.startswith("tencentcloud/") and n.count("/") > 1
    }
    assert products == {"common", "cvm", "monitor"}
    assert not tops & {"boto3", "botocore", "alibabacloud_ecs20140526", "pulumi", "pytest"}
    assert not [n for n in names if n.endswith((".so", ".pyc")) or "__pycache__" in n]
    assert len(tencent_zip) < 2_000_000


def test_the_contract_names_the_scf_entry_point() -> None:
    assert SCF_HANDLER == "handler.main_handler"
    assert SCF_RUNTIME == "Python3.10"


def _fleet(now: datetime) -> FakeTencent:
    fake = FakeTencent()
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "pkg", T.TIER: "a100x4"}
    created = (now - timedelta(hours=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fresh = (now - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.instances += [
        FakeCvm("ins-ttl", dict(base), created, instance_type="GT4.20XLARGE474"),
        FakeCvm("ins-busy", dict(base), fresh, instance_type="GT4.20XLARGE474"),
        FakeCvm("ins-kept", {**base, T.PROTECTED: "true"}, created),
    ]
    at = int(now.timestamp())
    # The monitoring agent reports on both running nodes; ins-busy's watchdog beats too
    # (its heartbeat object, read through the zip's own bucket client).
    fake.gpu["ins-busy"] = [(at - 120, 97.0)]
    fake.gpu["ins-ttl"] = [(at - 120, 0.0)]
    fake.objects[f"{HEARTBEAT_OBJECT_PREFIX}ins-busy"] = at - 60
    return fake


@pytest.mark.parametrize("python", ["current", "3.10"])
def test_tencent_zip_runs_main_handler_in_a_clean_interpreter_against_the_fake(
    tmp_path: Path, tencent_zip: bytes, python: str
) -> None:
    if python == "3.10" and not PY310.exists():
        pytest.skip(f"{PY310} is not installed on this machine")
    folder = unzip(tencent_zip, tmp_path / "scf")
    fake = _fleet(datetime.now(UTC))
    with fake.running() as url:
        env = {
            "GPUFLEET_PROVIDER": "tencent",
            "GPUFLEET_STACK": "pkg",
            "GPUFLEET_REGION": "ap-guangzhou",
            "GPUFLEET_APPLY": "true",
            "GPUFLEET_ENDPOINT_URL": url,
            BUCKET_ENV: FakeTencent.bucket,
            COS_ENDPOINT_ENV: url,
            "TENCENTCLOUD_SECRETID": SECRET_ID,
            "TENCENTCLOUD_SECRETKEY": SECRET_KEY,
            "TENCENTCLOUD_SESSIONTOKEN": "role-token",
        }
        done = clean_run(
            [folder], CODE, env, python=str(PY310) if python == "3.10" else sys.executable
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [s["instance_id"] for s in result["stops"]] == ["ins-ttl"]
    assert {i.instance_id: i.state for i in fake.instances} == {
        "ins-ttl": "STOPPED",
        "ins-busy": "RUNNING",
        "ins-kept": "RUNNING",
    }
    assert not fake.rejected  # signed with the role's keys, and valid
    assert ("HeadObject", {"path": f"/{fake.bucket}/{HEARTBEAT_OBJECT_PREFIX}ins-busy"}) in (
        fake.calls
    )
    where = done.stdout.split("FROM ", 1)[1].split()
    assert where and all(str(folder) in p for p in where)
