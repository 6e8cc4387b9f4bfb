"""The function packages as the clouds run them: unzipped into an empty folder and run by a
clean interpreter (``-S -E -I``: no site-packages, no PYTHON* variables, nothing of this
repository importable) against the local fakes on 127.0.0.1."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpufleet_node.idle_rules import UTC
from infra.catalog import load_catalog
from infra.reaper import tags as T
from infra.reaper import wheelhouse as wh
from infra.reaper.catalog_data import TABLE_FILE, build_table, family_of, parse_table
from infra.reaper.handler import (
    FUNCTION_MODULES,
    NODE_MODULES,
    NODE_PACKAGE,
    PACKAGE,
    build_function_zip,
)
from tests.reaper.alicloud_fake import FakeAlicloud, FakeInstance
from tests.support.real import missing_real_part

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PY310_DEFAULT = Path("/root/.pyenv/versions/3.10.13/bin/python3.10")
PY310 = PY310_DEFAULT  # the name test_tencent_function_package imports
PY310_ENV = "GPUFLEET_PYTHON310"


def python310() -> str:
    """A CPython 3.10 (the runtime both functions are checked on), or skip saying how to get
    one (under GPUFLEET_REQUIRE_REAL=1, as in CI, fail instead)."""
    for candidate in (os.environ.get(PY310_ENV), str(PY310_DEFAULT), shutil.which("python3.10")):
        if candidate and Path(candidate).is_file():
            return candidate
    missing_real_part(
        f"no CPython 3.10 (FC's python3.10 runtime) here: `pyenv install 3.10.13` puts it at "
        f"{PY310_DEFAULT}, or set {PY310_ENV} to a python3.10"
    )


def unzip(data: bytes, into: Path) -> Path:
    zipfile.ZipFile(io.BytesIO(data)).extractall(into)
    return into


def clean_run(
    folders: list[Path], code: str, env: dict[str, str], python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """``code`` in an isolated interpreter whose sys.path is the stdlib plus ``folders``."""
    prelude = (
        "import sys\n"
        f"sys.path[:0] = {[str(f) for f in folders]!r}\n"
        "try:\n    import infra\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('the repository is importable: not a clean interpreter')\n"
    )
    return subprocess.run(
        [python, "-S", "-E", "-I", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(folders[0]),
        env={"PATH": os.environ.get("PATH", ""), **env},
    )


@pytest.fixture(scope="module")
def alicloud_zip() -> bytes:
    return build_function_zip(provider="alicloud")


@pytest.fixture(scope="module")
def aws_zip() -> bytes:
    return build_function_zip(provider="aws")


def test_function_zips_are_byte_for_byte_deterministic(alicloud_zip: bytes, aws_zip: bytes) -> None:
    assert build_function_zip(provider="alicloud") == alicloud_zip
    assert build_function_zip(provider="aws") == aws_zip


def test_aws_zip_carries_the_code_and_the_catalog_table_and_no_sdk(aws_zip: bytes) -> None:
    zf = zipfile.ZipFile(io.BytesIO(aws_zip))
    names = set(zf.namelist())
    assert names == {"handler.py", f"{PACKAGE}/{TABLE_FILE}"} | {
        f"{PACKAGE}/{m}" for m in FUNCTION_MODULES
    } | {f"{NODE_PACKAGE}/{m}" for m in NODE_MODULES}  # the shared idle rules, names, bucket
    # Only text: no wheel, no compiled module, no dist-info (Lambda's runtime has boto3).
    for name in names:
        zf.read(name).decode("utf-8")
    assert len(aws_zip) < 100_000


def test_alicloud_zip_vendors_the_sdks_and_stays_small(alicloud_zip: bytes) -> None:
    names = zipfile.ZipFile(io.BytesIO(alicloud_zip)).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {"alibabacloud_ecs20140526", "alibabacloud_cms20190101", "darabonba"} <= tops
    # Only the SDKs' closure: nothing of boto3, pulumi or the test tools.
    assert not tops & {"boto3", "botocore", "pulumi", "pulumi_alicloud", "moto", "pytest"}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert len(alicloud_zip) < 12_000_000


def test_alicloud_zip_vendors_exactly_the_locks_pins(alicloud_zip: bytes) -> None:
    names = zipfile.ZipFile(io.BytesIO(alicloud_zip)).namelist()
    dist_infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    shipped = {}
    for folder in dist_infos:
        name, version = folder[: -len(".dist-info")].rsplit("-", 1)
        shipped[canonicalize_name(name)] = version
    assert shipped == {k: str(v) for k, v in wh.read_lock(wh.target("alicloud").lock).items()}


def test_alicloud_zip_binaries_are_all_built_for_cpython_3_10_on_linux_x86_64(
    alicloud_zip: bytes,
) -> None:
    names = zipfile.ZipFile(io.BytesIO(alicloud_zip)).namelist()
    binaries = [n for n in names if n.endswith((".so", ".pyd", ".dylib")) or ".so." in n]
    assert binaries  # cryptography, cffi, aiohttp... ship compiled modules
    wrong = [n for n in binaries if not re.search(r"\.(cpython-310-x86_64-linux-gnu|abi3)\.so$", n)]
    assert wrong == []
    assert "cryptography/hazmat/bindings/_rust.abi3.so" in names
    assert "_cffi_backend.cpython-310-x86_64-linux-gnu.so" in names
    assert not [n for n in names if "cpython-311" in n or "cp311" in n]


def test_alicloud_stack_declares_the_runtime_its_wheels_are_built_for() -> None:
    from infra.config import load_stack_file
    from infra.offline import PLACEHOLDER_SSH_KEY, evaluate

    cfg = load_stack_file(
        REPO / "stacks" / "Pulumi.a100x4.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY}
    )
    (fn,) = evaluate(cfg).of_type("alicloud:fc/v3Function:V3Function")
    target = wh.target("alicloud")
    assert fn.inputs["runtime"] == target.runtime == "python3.10"
    assert target.python == (3, 10)


def test_function_code_parses_as_python_3_10(aws_zip: bytes) -> None:
    zf = zipfile.ZipFile(io.BytesIO(aws_zip))
    for name in zf.namelist():
        if name.endswith(".py"):
            ast.parse(zf.read(name).decode(), filename=name, feature_version=(3, 10))


def test_the_packaged_table_gives_every_catalog_instance_type_the_catalog_limits(
    aws_zip: bytes,
) -> None:
    catalog = load_catalog()
    packaged = parse_table(
        json.loads(zipfile.ZipFile(io.BytesIO(aws_zip)).read(f"{PACKAGE}/{TABLE_FILE}")), "zip"
    )
    for (provider, name), it in catalog.instances.items():
        tiers = [t for t in catalog.tiers.values() if name in t.offers.get(provider, {}).values()]
        tiers = tiers or [t for t in catalog.tiers.values() if it.gpu in t.gpus_allowed]
        want = max((t.idle_minutes for t in tiers), default=None)
        got = packaged.limits(None, name)
        assert (name, got.idle_minutes, got.gpu) == (name, want, it.gpu)


def test_bare_metal_a100_types_get_15_minutes_and_g6e_is_not_an_l4() -> None:
    table = parse_table(build_table(load_catalog()), "catalog")
    assert table.limits(None, "ecs.ebmgn7.26xlarge").idle_minutes == 15
    assert table.limits(None, "ecs.ebmgn7e.32xlarge").idle_minutes == 15
    assert table.limits(None, "g6e.xlarge").gpu == "L40S"
    assert family_of("g6e.12xlarge") == "g6e"
    assert table.limits(None, "g6e.12xlarge").gpu == "L40S"  # a size the catalog lacks


ALI_CODE = """
import json, sys, handler
class Creds:
    access_key_id = "fake-id"; access_key_secret = "fake-secret"; security_token = "tok"
class Context:
    credentials = Creds(); region = "cn-beijing"; account_id = "1234567890"
print("RESULT " + handler.fc_handler(b"{}", Context()))
import gpufleet_reaper, alibabacloud_ecs20140526, alibabacloud_cms20190101.client
# The compiled modules of the closure, imported explicitly: multidict, yarl and friends would
# fall back to pure Python silently if theirs failed to load.
import _cffi_backend, cryptography.hazmat.bindings._rust as rust
import aiohttp._http_parser, multidict._multidict, yarl._quoting_c, frozenlist._frozenlist
import propcache._helpers_c
mods = [gpufleet_reaper, alibabacloud_ecs20140526, _cffi_backend, rust, aiohttp._http_parser,
        multidict._multidict, yarl._quoting_c, frozenlist._frozenlist, propcache._helpers_c]
print("PYTHON %d.%d" % sys.version_info[:2])
print("FROM " + " ".join(m.__file__ for m in mods))
"""


def _ali_fleet(now: datetime) -> FakeAlicloud:
    fake = FakeAlicloud()
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "ali", T.TIER: "a100x8"}
    start = (now - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%MZ")
    for iid, beat, util in (("i-busy", 1, 95.0), ("i-idle", 45, 0.0), ("i-silent", None, None)):
        fake.instances.append(
            FakeInstance(iid, dict(base), start, instance_type="ecs.ebmgn7.26xlarge")
        )
        if beat is not None:
            at = now - timedelta(minutes=beat)
            ms = int(at.timestamp() * 1000)
            fake.datapoints[("Heartbeat", iid)] = [(ms, float(int(at.timestamp())))]
            fake.datapoints[("GPUUtilization", iid)] = [(ms, util or 0.0)]
    return fake


def test_alicloud_zip_runs_under_python_3_10_stopping_the_idle_node_and_keeping_the_busy_one(
    tmp_path: Path, alicloud_zip: bytes
) -> None:
    """What FC's python3.10 runtime does with the zip: only its contents on sys.path, a real
    CPython 3.10, the SDKs against the local Alicloud fake on 127.0.0.1."""
    exe = python310()
    folder = unzip(alicloud_zip, tmp_path / "fc310")
    fake = _ali_fleet(datetime.now(UTC))
    with fake.running() as url:
        env = {"GPUFLEET_STACK": "ali", "GPUFLEET_APPLY": "true", "GPUFLEET_ENDPOINT_URL": url}
        done = clean_run([folder], ALI_CODE, env, python=exe)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PYTHON 3.10" in done.stdout
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [s["instance_id"] for s in result["stops"]] == ["i-idle"]
    assert {i.instance_id: i.status for i in fake.instances} == {
        "i-busy": "Running",
        "i-idle": "Stopped",
        "i-silent": "Running",  # no heartbeat ever: unknown, kept
    }
    assert result["summary"]["unknown"] == 1
    assert "GPUFLEET_ENDPOINT_URL" in done.stdout  # the override is logged
    where = done.stdout.split("FROM ", 1)[1].split()
    assert len(where) == 9 and all(p.startswith(str(folder)) for p in where)


def _installed_closure(root: str) -> list[metadata.Distribution]:
    """This venv's distributions that ``root`` needs (Requires-Dist, extras not followed;
    a marker-gated one not installed here is not needed here)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen[name] = dist = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and "extra" in str(req.marker):
                continue
            try:
                metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                assert req.marker is not None, f"{name} needs {req}, not installed"
                continue
            todo.append(req.name)
    return [seen[k] for k in sorted(seen)]


def _boto3_runtime(into: Path) -> Path:
    """What Lambda's Python runtime provides beside the zip: boto3 and its closure (pure
    Python, so this venv's copies stand in for the runtime's)."""
    for dist in _installed_closure("boto3"):
        for f in dist.files or []:
            parts = Path(str(f)).parts
            if not parts or parts[0] == ".." or "__pycache__" in parts:
                continue
            source = Path(str(dist.locate_file(f)))
            if source.is_file():
                path = into / Path(*parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(source.read_bytes())
    return into


AWS_CODE = """
import json, handler
print("RESULT " + json.dumps(handler.handler({}, None)))
"""


def _aws_fleet(url: str, now: datetime) -> dict[str, str]:
    from tests.reaper.fleet import AMI, age, client

    ec2, cw = client("ec2", url), client("cloudwatch", url)
    ids = {}
    for name, beat, util in (("busy", 1, 97.0), ("idle", 45, 0.0), ("silent", None, None)):
        tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "pkg", T.TIER: "a100x8", "Name": name}
        iid = ec2.run_instances(
            ImageId=AMI,
            InstanceType="p4d.24xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
        )["Instances"][0]["InstanceId"]
        age([iid], 180, now)
        ids[name] = iid
        if beat is not None:
            at = now - timedelta(minutes=beat)
            dims = [{"Name": "InstanceId", "Value": iid}]
            cw.put_metric_data(
                Namespace="gpufleet",
                MetricData=[
                    {"MetricName": "Heartbeat", "Dimensions": dims, "Timestamp": at, "Value": 1.0},
                    {
                        "MetricName": "GPUUtilization",
                        "Dimensions": dims,
                        "Timestamp": at,
                        "Value": util,
                    },
                ],
            )
    return ids


@pytest.mark.parametrize("python", ["current", "3.10"])
def test_aws_zip_runs_in_a_clean_interpreter_against_moto(
    tmp_path: Path, aws_zip: bytes, moto_url: str, python: str
) -> None:
    import urllib.request

    exe = python310() if python == "3.10" else sys.executable
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"))
    now = datetime.now(UTC)
    ids = _aws_fleet(moto_url, now)
    folder = unzip(aws_zip, tmp_path / "lambda")
    runtime = _boto3_runtime(tmp_path / "runtime")
    env = {
        "GPUFLEET_STACK": "pkg",
        "GPUFLEET_APPLY": "true",
        "GPUFLEET_REGION": "us-east-1",
        "GPUFLEET_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    done = clean_run([folder, runtime], AWS_CODE, env, python=exe)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [s["instance_id"] for s in result["stops"]] == [ids["idle"]]
    assert result["summary"]["unknown"] == 1  # the node that never sent a heartbeat
