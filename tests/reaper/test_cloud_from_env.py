"""Each cloud's client is made by its own module's ``from_env`` (the registry in handler.py
names only the module): the same parameters everywhere, each reading its own settings."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from infra.clouds.alicloud.reaper import AlicloudCloud
from infra.clouds.azure.reaper import AzureCloud
from infra.clouds.tencent.reaper import TencentCloud
from infra.reaper.core import Invocation
from infra.reaper.handler import CLOUDS, ConfigError, make_cloud


def made(cls: type[Any], provider: str, env: dict[str, str], **kwargs: Any) -> Any:
    """make_cloud's client, checked to be that cloud's own class (and typed as it)."""
    cloud = make_cloud(provider, env, **kwargs)
    assert isinstance(cloud, cls), type(cloud)
    return cloud


@pytest.mark.parametrize("provider", sorted(CLOUDS))
def test_every_registered_cloud_module_has_a_from_env_taking_region_env_and_invocation(
    provider: str,
) -> None:
    module = importlib.import_module(CLOUDS[provider].module)
    params = inspect.signature(module.from_env).parameters
    assert list(params) == ["region", "env", "given"]
    assert params["given"].annotation in (Invocation, "Invocation")
    assert CLOUDS[provider].from_env() is module.from_env


def test_alicloud_prefers_the_account_setting_to_the_context_and_takes_context_keys() -> None:
    env = {"GPUFLEET_REGION": "cn-hangzhou", "GPUFLEET_ALICLOUD_ACCOUNT_ID": "111"}
    creds = {"access_key_id": "id", "access_key_secret": "secret", "security_token": "tok"}
    cloud: AlicloudCloud = made(AlicloudCloud, "alicloud", env, credentials=creds, account_id="222")
    assert (cloud.account_id, cloud.access_key_id, cloud.security_token) == ("111", "id", "tok")
    del env["GPUFLEET_ALICLOUD_ACCOUNT_ID"]
    again: AlicloudCloud = made(AlicloudCloud, "alicloud", env, credentials=creds, account_id="222")
    assert again.account_id == "222"


@pytest.mark.parametrize(
    ("provider", "region", "default"),
    [("aws", "us-east-1", 6), ("alicloud", "cn-hangzhou", 5), ("tencent", "ap-guangzhou", 5)],
)
def test_max_attempts_defaults_per_cloud_and_is_read_from_the_setting(
    provider: str, region: str, default: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.setenv("GPUFLEET_ALICLOUD_ACCOUNT_ID", "1234567890")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "fake-id")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-key")
    env = {"GPUFLEET_REGION": region}

    def attempts(cloud: Any) -> int:
        retry = getattr(cloud, "_retry", None)  # botocore's config on AWS
        return int(retry["total_max_attempts"] if retry else cloud.max_attempts)

    assert attempts(make_cloud(provider, env)) == default
    assert attempts(make_cloud(provider, {**env, "GPUFLEET_MAX_ATTEMPTS": "2"})) == 2


def test_tencent_reads_the_keys_from_the_function_environment() -> None:
    env = {
        "GPUFLEET_REGION": "ap-guangzhou",
        "TENCENTCLOUD_SECRETID": "sid",
        "TENCENTCLOUD_SECRETKEY": "skey",
        "TENCENTCLOUD_SESSIONTOKEN": "tok",
    }
    cloud: TencentCloud = made(TencentCloud, "tencent", env)
    assert (cloud.secret_id, cloud.secret_key, cloud.token) == ("sid", "skey", "tok")


def test_aws_refuses_an_unknown_retry_mode_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GPUFLEET_RETRY_MODE must be standard or adaptive"):
        make_cloud("aws", {"GPUFLEET_REGION": "us-east-1", "GPUFLEET_RETRY_MODE": "legacy"})


def test_azure_checks_the_attempts_setting_before_the_missing_subscription() -> None:
    with pytest.raises(ConfigError, match="GPUFLEET_MAX_ATTEMPTS"):
        make_cloud("azure", {"GPUFLEET_REGION": "eastus", "GPUFLEET_MAX_ATTEMPTS": "0"})


def test_azure_polls_a_deallocation_every_ten_seconds_unless_the_setting_says() -> None:
    env = {
        "GPUFLEET_REGION": "eastus",
        "GPUFLEET_AZURE_SUBSCRIPTION_ID": "sub",
        "GPUFLEET_AZURE_RESOURCE_GROUP": "rg",
        "GPUFLEET_AZURE_ACCESS_TOKEN": "token",
    }
    default: AzureCloud = made(AzureCloud, "azure", env)
    assert default.polling_interval_s == 10.0
    faster: AzureCloud = made(AzureCloud, "azure", {**env, "GPUFLEET_AZURE_POLL_S": "2"})
    assert faster.polling_interval_s == 2.0
    for bad in ("0", "0.5", "soon"):
        with pytest.raises(ConfigError, match="GPUFLEET_AZURE_POLL_S"):
            make_cloud("azure", {**env, "GPUFLEET_AZURE_POLL_S": bad})


def test_the_reaper_and_every_clouds_reaper_module_import_no_pulumi() -> None:
    # The reaper runs in a cloud function and as scripts/teardown.py: no Pulumi, even now
    # that each cloud's module lives in infra/clouds/<name>/ beside its Pulumi program.
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, importlib\n"
        "from infra.reaper.handler import CLOUDS\n"
        "for entry in CLOUDS.values():\n"
        "    importlib.import_module(entry.module)\n"
        "print(len(CLOUDS), [m for m in sys.modules if m.split('.')[0].startswith('pulumi')])\n"
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(repo)!r})\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.split(None, 1) == [str(len(CLOUDS)), "[]\n"]
