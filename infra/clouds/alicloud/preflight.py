"""Alibaba Cloud's preflight (infra/preflight.py): the user's own account, read only.

Calls through the official SDK (alibabacloud_ecs20140526 7.11.8 on alibabacloud_tea_openapi
0.4.6), each counted:

- STS GetCallerIdentity (2015-04-01): the account and caller (AccountId, Arn, IdentityType,
  UserId). The STS SDK (alibabacloud_sts20150401) is not a dependency here: the call goes
  through tea_openapi's own ``call_api`` with the very Params that SDK's client builds
  (action GetCallerIdentity, version 2015-04-01, POST /, AK, RPC, formData, json;
  aliyun/alibabacloud-python-sdk sts-20150401/alibabacloud_sts20150401/client.py and
  models/_get_caller_identity_response_body.py at 1d271f4c, read 2026-12-05);
- ECS DescribeAccountAttributes: the region's vCPU quotas, per the SDK's own
  DescribeAccountAttributesRequest.AttributeName: max-postpaid-instance-vcpu-count /
  used-postpaid-instance-vcpu-count (pay-as-you-go) and max-spot-instance-vcpu-count /
  used-spot-instance-vcpu-count (spot), answered as AccountAttributeItems.
  AccountAttributeItem[].AttributeValues.ValueItem[].Value (the response body model). ECS
  keeps no per-GPU quota among these attributes;
- ECS DescribeImages: the public Ubuntu 22.04 image the program picks (owner system);
- ECS RunInstances with DryRun true: per the SDK's RunInstancesRequest.DryRun, "No
  instances are created. The system checks whether required parameters are specified, the
  request format, service limits, and ECS inventory ... If the check succeeds, the
  DryRunOperation error code is returned". A caller without the permission gets HTTP 403
  Forbidden.RAM ("User not authorized to operate on the specified resource, or this API
  doesn't support RAM.": Alibaba's announcement of the ECS authentication change,
  https://www.alibabacloud.com/help/en/ecs/announcement-of-changes-to-the-authentication-
  mechanism-for-alibaba-cloud-ecs-query-type-apis, read 2026-12-05). Any other code is said
  as it came, not judged: the dry run has no network of the stack's yet.

- OSS GetBucketInfo (``GET /<bucket>/?bucketInfo``, the official OSS SDK V2,
  alibabacloud-oss-v2 1.4.1) for the bucket name drawn as the program draws it (a fresh
  random suffix): an answer is a bucket of this account (its BucketInfo.Location is the
  region it lives in); ServiceError NoSuchBucket (HTTP 404) means the name is free, as the
  SDK's own Client.is_bucket_exist reads it; AccessDenied (HTTP 403) is a bucket another
  account holds (OSS answers a caller without rights on it so).

--request-quota: Quota Center's CreateQuotaApplication takes a quota action code, and
none was found here for the ECS vCPU attributes above in the SDK models or docs opened
(2026-12-05): the request is printed (the console's quota page), never guessed.

Credentials: ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET;
ALIBABA_CLOUD_ECS_ENDPOINT and ALIBABA_CLOUD_STS_ENDPOINT point the clients elsewhere
(tests: a local fake on 127.0.0.1), ALIBABA_CLOUD_OSS_ENDPOINT the OSS client's (path-style
there). The SDKs are imported inside.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from typing import Any

from infra.clouds.alicloud.prices import ecs_client, tea_config
from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Calls, Check, Need, QuotaAsk

# billing mode -> (max attribute, used attribute) of DescribeAccountAttributes
QUOTA_ATTRIBUTES = {
    "on-demand": ("max-postpaid-instance-vcpu-count", "used-postpaid-instance-vcpu-count"),
    "spot": ("max-spot-instance-vcpu-count", "used-spot-instance-vcpu-count"),
}
QUOTA_SCOPE = "region"  # DescribeAccountAttributes answers per region (`make up --quota`)
CHARGE_TYPES = {"on-demand": "PostPaid", "spot": "PostPaid", "subscription": "PrePaid"}
DENIED = ("Forbidden.RAM", "Forbidden.RAMSTS", "NoPermission")
CREDENTIALS_HINT = "set ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET"
QUOTA_FIX = (
    "raise {name} to {value} in the ECS console's quota page (Quota Center, "
    "privileges and quotas), region {region}"
)


def _once() -> Any:
    from darabonba.runtime import RuntimeOptions

    # one try each: a preflight answers in seconds or says it could not
    return RuntimeOptions(autoretry=False, max_attempts=1)


def _said(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    text = str(getattr(exc, "message", None) or exc).split(" request id:")[0]
    text = re.sub(r"^code: \d+, ", "", text)  # the Tea SDK's prefix: the code says it
    first = (text.splitlines() or [""])[0][:160]
    return f"{code}: {first}" if code and str(code) not in first else first


def _unasked(why: str, fix: str) -> list[Check]:
    rest = ("quota", "image", "launch", "bucket")
    return [Check("identity", UNKNOWN, why, fix)] + [
        Check(n, UNKNOWN, "not asked: no identity") for n in rest
    ]


def attribute_values(body: Mapping[str, Any]) -> dict[str, str]:
    """AttributeName -> its first ValueItem's Value, from a DescribeAccountAttributes body."""
    out: dict[str, str] = {}
    items = (body.get("AccountAttributeItems") or {}).get("AccountAttributeItem") or []
    for item in items:
        values = (item.get("AttributeValues") or {}).get("ValueItem") or []
        if values and values[0].get("Value") is not None:
            out[str(item.get("AttributeName"))] = str(values[0]["Value"])
    return out


def quota(need: Need, calls: Calls) -> list[Check]:
    """The quota checks alone, for one region (``make up --quota`` asks each place)."""
    key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", "")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "")
    if not key or not secret:
        return [Check("quota", UNKNOWN, "no Alibaba Cloud credentials", CREDENTIALS_HINT)]
    return _quotas(ecs_client(need.region, key, secret), need, calls, (Exception,))


def checks(need: Need, calls: Calls) -> list[Check]:
    key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", "")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "")
    if not key or not secret:
        return _unasked("no Alibaba Cloud credentials", CREDENTIALS_HINT)
    from alibabacloud_tea_openapi.client import Client as OpenApiClient

    sts_endpoint = os.environ.get("ALIBABA_CLOUD_STS_ENDPOINT") or "sts.aliyuncs.com"
    ecs = ecs_client(need.region, key, secret)
    sts = OpenApiClient(tea_config(key, secret, need.region, sts_endpoint))
    problems = (Exception,)  # the Tea SDK raises its own hierarchy plus transport errors
    try:
        me = _caller(sts, calls)
    except problems as exc:
        return _unasked(f"STS GetCallerIdentity: {_said(exc)}", "check the AccessKey")
    out = [
        Check(
            "identity",
            OK,
            f"account {me.get('AccountId')} as {me.get('Arn')} ({me.get('IdentityType')})",
        )
    ]
    out.extend(_quotas(ecs, need, calls, problems))
    image, image_check = _image(ecs, need, calls, problems)
    out.append(image_check)
    out.append(_dry_run(ecs, need, image, calls))
    out.append(_bucket(key, secret, need, calls))
    return out


def _bucket(key: str, secret: str, need: Need, calls: Calls) -> Check:
    """The drawn bucket name: free, this account's (in which region), or another's."""
    import alibabacloud_oss_v2 as oss

    from infra.clouds.alicloud.program import BUCKET_SUFFIX_BYTES, bucket_name_for

    name = bucket_name_for(need.stack, secrets.token_hex(BUCKET_SUFFIX_BYTES))
    cfg = oss.config.load_default()
    cfg.credentials_provider = oss.credentials.StaticCredentialsProvider(key, secret)
    cfg.region = need.region
    cfg.retry_max_attempts = 1
    cfg.connect_timeout, cfg.readwrite_timeout = 5, 20
    endpoint = os.environ.get("ALIBABA_CLOUD_OSS_ENDPOINT", "")
    if endpoint:
        cfg.endpoint, cfg.use_path_style = endpoint, True
    drawn = f"OSS bucket {name} (a random suffix drawn as `pulumi up` draws it)"
    try:
        calls.add("oss:GetBucketInfo")
        info = oss.Client(cfg).get_bucket_info(oss.GetBucketInfoRequest(bucket=name)).bucket_info
    except Exception as exc:  # the SDK's OperationError wraps the service's answer
        inner = exc.unwrap() if hasattr(exc, "unwrap") else exc
        code = str(getattr(inner, "code", "") or "")
        if code == "NoSuchBucket":
            return Check("bucket", OK, f"{drawn}: free in oss-{need.region}")
        if code == "AccessDenied":
            return Check(
                "bucket",
                FAIL,
                f"{drawn}: another account holds it (AccessDenied)",
                "run the preflight again (a new suffix is drawn); `pulumi up` draws its own",
            )
        said = f"{code}: " if code else ""
        first = (str(getattr(inner, "message", "") or inner).splitlines() or [""])[0]
        return Check("bucket", UNKNOWN, f"OSS GetBucketInfo {name}: {said}{first[:120]}")
    where = str(getattr(info, "location", "") or "")
    if where and where != f"oss-{need.region}":
        return Check(
            "bucket",
            FAIL,
            f"{drawn}: yours already, in {where}, not oss-{need.region}",
            "destroy the old stack's bucket or use another stack name",
        )
    return Check("bucket", OK, f"{drawn}: yours already, in {where or need.region}")


def _caller(sts: Any, calls: Calls) -> dict[str, Any]:
    from alibabacloud_tea_openapi import utils_models

    params = utils_models.Params(
        action="GetCallerIdentity",
        version="2015-04-01",
        protocol="HTTPS",
        pathname="/",
        method="POST",
        auth_type="AK",
        style="RPC",
        req_body_type="formData",
        body_type="json",
    )
    calls.add("sts:GetCallerIdentity")
    answer = sts.call_api(params, utils_models.OpenApiRequest(), _once())
    return dict(answer.get("body") or {})


def _quotas(
    ecs: Any, need: Need, calls: Calls, problems: tuple[type[Exception], ...]
) -> list[Check]:
    from alibabacloud_ecs20140526 import models

    names = [n for pair in QUOTA_ATTRIBUTES.values() for n in pair]
    request = models.DescribeAccountAttributesRequest(region_id=need.region, attribute_name=names)
    try:
        calls.add("ecs:DescribeAccountAttributes")
        body = ecs.describe_account_attributes_with_options(request, _once()).body.to_map()
    except problems as exc:
        return [Check("quota", UNKNOWN, f"ECS DescribeAccountAttributes: {_said(exc)}")]
    values = attribute_values(body)
    want = need.total_vcpus
    out = []
    for mode, (most, used) in QUOTA_ATTRIBUTES.items():
        label = f"quota {mode}"
        judged = mode == need.billing
        if most not in values:
            out.append(Check(label, UNKNOWN if judged else INFO, f"{most}: not in the answer"))
            continue
        limit, busy = int(values[most]), int(values.get(used) or 0)
        said = (
            f"{most} {limit}, used {busy}: {limit - busy} vCPUs free, the stack needs "
            f"{want} ({need.nodes} x {need.vcpus})"
        )
        if limit - busy >= want:
            out.append(Check(label, OK if judged else INFO, said))
        elif judged:
            fix = QUOTA_FIX.format(name=most, value=busy + want, region=need.region)
            ask = QuotaAsk(f"vCPUs ({most})", busy + want, need.region, step=fix)
            out.append(Check(label, FAIL, said, fix, ask))
        else:
            out.append(Check(label, INFO, said + f"; only for {mode} billing"))
    if need.billing == "subscription":
        out.append(
            Check("quota subscription", NOT_CHECKED, "ECS lists no vCPU quota for subscription")
        )
    return out


def _image(
    ecs: Any, need: Need, calls: Calls, problems: tuple[type[Exception], ...]
) -> tuple[str, Check]:
    from alibabacloud_ecs20140526 import models

    from infra.clouds.alicloud.program import UBUNTU_IMAGE_REGEX

    request = models.DescribeImagesRequest(
        region_id=need.region,
        image_owner_alias="system",
        instance_type=need.instance_type,
        ostype="linux",
        page_size=100,
    )
    try:
        calls.add("ecs:DescribeImages")
        body = ecs.describe_images_with_options(request, _once()).body.to_map()
    except problems as exc:
        return "", Check("image", UNKNOWN, f"ECS DescribeImages: {_said(exc)}")
    images = (body.get("Images") or {}).get("Image") or []
    found = sorted(
        (
            i
            for i in images
            if re.search(UBUNTU_IMAGE_REGEX, str(i.get("ImageName") or i.get("ImageId") or ""))
        ),
        key=lambda i: str(i.get("CreationTime") or i.get("ImageId")),
    )
    if not found:
        return "", Check(
            "image",
            FAIL,
            f"no system image matching {UBUNTU_IMAGE_REGEX!r} for {need.instance_type}",
            "pick another region or type",
        )
    best = found[-1]
    return str(best["ImageId"]), Check(
        "image", OK, f"{best['ImageId']} ({best.get('ImageName') or best.get('OSName')})"
    )


def _dry_run(ecs: Any, need: Need, image: str, calls: Calls) -> Check:
    from alibabacloud_ecs20140526 import models

    if not image:
        return Check("launch", NOT_CHECKED, "RunInstances DryRun needs the image, not resolved")
    request = models.RunInstancesRequest(
        region_id=need.region,
        zone_id=need.zone,
        instance_type=need.instance_type,
        image_id=image,
        amount=need.nodes,
        instance_charge_type=CHARGE_TYPES.get(need.billing, "PostPaid"),
        spot_strategy="SpotAsPriceGo" if need.billing == "spot" else None,
        dry_run=True,
    )
    try:
        calls.add("ecs:RunInstances")
        ecs.run_instances_with_options(request, _once())
    except Exception as exc:
        code = str(getattr(exc, "code", "") or "")
        if code == "DryRunOperation":
            return Check("launch", OK, f"ecs:RunInstances of {need.instance_type} (DryRun)")
        if code in DENIED:
            return Check(
                "launch",
                FAIL,
                f"ecs:RunInstances denied (DryRun): {_said(exc)}",
                "grant ecs:RunInstances to this caller in RAM",
            )
        return Check("launch", UNKNOWN, f"RunInstances DryRun: {_said(exc)}")
    return Check("launch", UNKNOWN, "RunInstances DryRun answered without DryRunOperation")
