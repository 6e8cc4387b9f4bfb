"""Cloud function entry points (AWS Lambda, Alicloud Function Compute) and their package.

The function reads its settings from environment variables that the stack sets:

  GPUFLEET_PROVIDER   aws | alicloud (default: aws for ``handler``, alicloud for ``fc_handler``)
  GPUFLEET_STACK      only this stack's instances (required: a function never reaps others)
  GPUFLEET_REGION     region to scan (default: the function's own region)
  GPUFLEET_APPLY      "true" to stop; anything else is a dry run that only logs
  GPUFLEET_RETRY_MODE standard | adaptive (AWS, default standard)
  GPUFLEET_MAX_ATTEMPTS         attempts per API call, retries included (default 6)
  GPUFLEET_ALICLOUD_ACCOUNT_ID  Alicloud account id (default: the FC context's)
  GPUFLEET_ENDPOINT_URL         an alternative API endpoint (tests)

A failed stop makes the invocation fail after logging, so the platform's error metric and
any alarm on it see it.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .core import Cloud, Report, reap

LAMBDA_HANDLER = "handler.handler"
FC_HANDLER = "handler.fc_handler"
PACKAGE = "gpufleet_reaper"  # the package name inside the function archive

_SHIM = '''"""Cloud function entry point: see gpufleet_reaper/handler.py."""

from gpufleet_reaper.handler import fc_handler, handler

__all__ = ["fc_handler", "handler"]
'''


class ConfigError(ValueError):
    """The function's environment is incomplete or wrong."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def make_cloud(
    provider: str,
    env: Mapping[str, str],
    *,
    credentials: Mapping[str, str] | None = None,
    account_id: str | None = None,
) -> Cloud:
    region = env.get("GPUFLEET_REGION") or env.get("AWS_REGION") or env.get("FC_REGION") or ""
    if not region:
        raise ConfigError("GPUFLEET_REGION is not set (and the platform gave no region)")
    endpoint = env.get("GPUFLEET_ENDPOINT_URL") or None
    if provider == "aws":
        from .aws import AwsCloud

        return AwsCloud(
            region,
            endpoint_url=endpoint,
            retry_mode=env.get("GPUFLEET_RETRY_MODE", "standard"),
            max_attempts=_int_env(env, "GPUFLEET_MAX_ATTEMPTS", 6),
        )
    if provider == "alicloud":
        from .alicloud import AlicloudCloud

        creds = credentials or {}
        return AlicloudCloud(
            region,
            endpoint=endpoint,
            access_key_id=creds.get("access_key_id"),
            access_key_secret=creds.get("access_key_secret"),
            security_token=creds.get("security_token"),
            account_id=env.get("GPUFLEET_ALICLOUD_ACCOUNT_ID") or account_id,
        )
    raise ConfigError(f"GPUFLEET_PROVIDER must be 'aws' or 'alicloud', got {provider!r}")


def run(
    provider: str,
    env: Mapping[str, str],
    *,
    credentials: Mapping[str, str] | None = None,
    account_id: str | None = None,
) -> dict[str, Any]:
    stack = env.get("GPUFLEET_STACK", "").strip()
    if not stack:
        raise ConfigError("GPUFLEET_STACK is not set: the function only reaps its own stack")
    cloud = make_cloud(provider, env, credentials=credentials, account_id=account_id)
    report = reap(cloud, stack=stack, apply=_truthy(env.get("GPUFLEET_APPLY")))
    return _log_and_check(report)


def _log_and_check(report: Report) -> dict[str, Any]:
    stops = [d.as_json() for d in report.decisions if d.action == "stop"]
    warnings = [d.as_json() for d in report.decisions if d.warning]
    for line in stops + warnings:
        print(json.dumps(line, sort_keys=True))
    out = {"summary": report.summary, "stops": stops, "apply": report.apply}
    print(json.dumps({"summary": report.summary}, sort_keys=True))
    if report.failed:
        ids = ", ".join(d.instance_id for d in report.failed)
        raise RuntimeError(f"gpufleet reaper: {len(report.failed)} stop(s) failed: {ids}")
    return out


def handler(event: Any, context: Any) -> dict[str, Any]:
    """AWS Lambda entry (scheduled by EventBridge); the event is ignored."""
    env = dict(os.environ)
    return run(env.get("GPUFLEET_PROVIDER", "aws"), env)


def fc_handler(event: Any, context: Any) -> str:
    """Alicloud Function Compute entry (timer trigger): credentials come from the context."""
    env = dict(os.environ)
    creds = getattr(context, "credentials", None)
    credentials: dict[str, str] | None = None
    if creds is not None:
        # FC's Python runtimes name these in snake_case; older ones in camelCase.
        credentials = {
            key: str(getattr(creds, key, None) or getattr(creds, camel, "") or "")
            for key, camel in (
                ("access_key_id", "accessKeyId"),
                ("access_key_secret", "accessKeySecret"),
                ("security_token", "securityToken"),
            )
        }
    if not env.get("GPUFLEET_REGION") and getattr(context, "region", None):
        env["GPUFLEET_REGION"] = str(context.region)
    out = run(
        env.get("GPUFLEET_PROVIDER", "alicloud"),
        env,
        credentials=credentials,
        account_id=getattr(context, "account_id", None),
    )
    return json.dumps(out, sort_keys=True)


# A fixed date: zip entries carry timestamps, and the same sources must give the same bytes
# so `pulumi up` sees no change when nothing changed.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def build_function_zip(source_dir: Path | None = None) -> bytes:
    """The function archive: ``handler.py`` at the top, this package as ``gpufleet_reaper/``.

    Deterministic (sorted entries, fixed dates and modes) and pure: reads the sources,
    writes nothing. boto3 is in the Lambda runtime; the Alicloud SDKs are not in FC's, so
    that function needs them as a layer (see the README).
    """
    src = source_dir or Path(__file__).resolve().parent
    files = sorted(p for p in src.glob("*.py") if p.is_file())
    if not any(p.name == "handler.py" for p in files):
        raise FileNotFoundError(f"{src} has no handler.py: not the reaper package")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        entries = [("handler.py", _SHIM.encode())]
        entries += [(f"{PACKAGE}/{p.name}", p.read_bytes()) for p in files]
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, so the mode above is honoured
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return buf.getvalue()
