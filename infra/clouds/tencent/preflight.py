"""Tencent Cloud's preflight (infra/preflight.py): the user's own account, read only.

Calls through the official SDK's CommonClient (tencentcloud-sdk-python-common; the same
signing and transport as the typed clients), each counted:

- STS GetCallerIdentity (2018-08-13): the account (AccountId, Arn, Type);
- CVM DescribeAccountQuota (2017-03-12), filtered to the stack's zone: PostPaidQuotaSet
  (pay-as-you-go), SpotPaidQuotaSet (spot) and PrePaidQuotaSet (monthly), each per zone
  with UsedQuota / RemainingQuota / TotalQuota in instances (the SDK's AccountQuota,
  PostPaidQuota, SpotPaidQuota and PrePaidQuota models, cvm 3.1.178);
- CVM DescribeImages: the public Ubuntu 22.04 image the program picks for the type;
- CVM RunInstances with DryRun true: per the SDK's RunInstancesRequest.DryRun ("checks the
  required parameters, the request format, business limits and CVM stock; a failed check
  returns its error code, a passed one returns a RequestId"), nothing is created.

- COS HEAD Bucket (the official COS SDK, cos-python-sdk-v5 1.9.44, CosS3Client.head_bucket)
  for the bucket name drawn as the program draws it, with the APPID DescribeAccountQuota
  answers: 200 is a bucket of this account (its x-cos-bucket-region header the region it
  lives in), 404 a free name (the SDK's own bucket_exists reads 404 so), 403 a bucket
  another account holds.

--request-quota: CVM has no quota request API (the quota line's fix is the console's
quota page or a ticket): the step is printed.

Credentials: TENCENTCLOUD_SECRET_ID / TENCENTCLOUD_SECRET_KEY. TENCENTCLOUD_CVM_ENDPOINT
and TENCENTCLOUD_STS_ENDPOINT point the clients elsewhere (tests: a local fake on
127.0.0.1); TENCENTCLOUD_COS_DOMAIN sends the COS client to that host instead of
<bucket>.cos.<region>.myqcloud.com. The SDKs are imported inside.
"""

from __future__ import annotations

import os
import re
import secrets
from typing import Any

from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Calls, Check, Need, QuotaAsk

# billing mode -> the quota set of DescribeAccountQuota that counts it, and the charge type
QUOTA_SETS = {
    "on-demand": ("PostPaidQuotaSet", "POSTPAID_BY_HOUR"),
    "spot": ("SpotPaidQuotaSet", "SPOTPAID"),
    "subscription": ("PrePaidQuotaSet", "PREPAID"),
}
CREDENTIALS_HINT = "set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY"
QUOTA_FIX = "ask for more in the CVM console's quota page or by a ticket (no quota API)"
QUOTA_SCOPE = "zone"  # DescribeAccountQuota answers per zone (`make up --quota`)


def _client(service: str, version: str, region: str, key: str, secret: str) -> Any:
    from tencentcloud.common import credential
    from tencentcloud.common.common_client import CommonClient
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    env = f"TENCENTCLOUD_{service.upper()}_ENDPOINT"
    endpoint = os.environ.get(env) or f"{service}.tencentcloudapi.com"
    local = endpoint.startswith(("127.0.0.1", "localhost"))
    http = HttpProfile(endpoint=endpoint, protocol="http" if local else "https", reqTimeout=20)
    return CommonClient(
        service,
        version,
        credential.Credential(key, secret),
        region,
        profile=ClientProfile(httpProfile=http),
    )


def _unasked(why: str, fix: str) -> list[Check]:
    rest = ("quota", "image", "launch", "bucket")
    return [Check("identity", UNKNOWN, why, fix)] + [
        Check(n, UNKNOWN, "not asked: no identity") for n in rest
    ]


def _counted(calls: Calls, clients: dict[str, Any]) -> Any:
    """call(client, action, params) -> the answer's Response, each call counted by name."""
    names = {id(c): n for n, c in clients.items()}

    def call(client: Any, action: str, params: dict[str, Any]) -> dict[str, Any]:
        calls.add(f"{names[id(client)]}:{action}")
        answer = client.call_json(action, params)
        return dict(answer.get("Response", answer))

    return call


def quota(need: Need, calls: Calls) -> list[Check]:
    """The quota checks alone, for one zone (``make up --quota`` asks each place)."""
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
        TencentCloudSDKException,
    )

    key = os.environ.get("TENCENTCLOUD_SECRET_ID", "")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if not key or not secret:
        return [Check("quota", UNKNOWN, "no Tencent Cloud credentials", CREDENTIALS_HINT)]
    cvm = _client("cvm", "2017-03-12", need.region, key, secret)
    call = _counted(calls, {"cvm": cvm})
    return _quotas(call, cvm, need, (TencentCloudSDKException, OSError))


def checks(need: Need, calls: Calls) -> list[Check]:
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
        TencentCloudSDKException,
    )

    key = os.environ.get("TENCENTCLOUD_SECRET_ID", "")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if not key or not secret:
        return _unasked("no Tencent Cloud credentials", CREDENTIALS_HINT)
    problems = (TencentCloudSDKException, OSError)
    sts = _client("sts", "2018-08-13", need.region, key, secret)
    cvm = _client("cvm", "2017-03-12", need.region, key, secret)

    call = _counted(calls, {"sts": sts, "cvm": cvm})
    try:
        me = call(sts, "GetCallerIdentity", {})
    except problems as exc:
        return _unasked(f"STS GetCallerIdentity: {_said(exc)}", "check the credentials")
    out = [Check("identity", OK, f"account {me.get('AccountId')} as {me.get('Arn')}")]
    account: dict[str, Any] = {}
    out.extend(_quotas(call, cvm, need, problems, account))
    image, image_check = _image(call, cvm, need, problems)
    out.append(image_check)
    out.append(_dry_run(call, cvm, need, image, problems))
    out.append(_bucket(key, secret, need, str(account.get("AppId") or ""), calls))
    return out


def _bucket(key: str, secret: str, need: Need, appid: str, calls: Calls) -> Check:
    """The drawn bucket name: free, this account's (in which region), or another's."""
    if not appid:
        return Check("bucket", UNKNOWN, "no APPID in DescribeAccountQuota's answer: not asked")
    from qcloud_cos import CosConfig, CosS3Client
    from qcloud_cos.cos_exception import CosClientError, CosServiceError

    from infra.clouds.tencent.program import BUCKET_SUFFIX_BYTES, bucket_name_for

    name = bucket_name_for(need.stack, secrets.token_hex(BUCKET_SUFFIX_BYTES), appid)
    domain = os.environ.get("TENCENTCLOUD_COS_DOMAIN", "")
    local = domain.startswith(("127.0.0.1", "localhost"))
    config = CosConfig(
        Region=need.region,
        SecretId=key,
        SecretKey=secret,
        Scheme="http" if local else "https",
        Timeout=20,
        **({"Domain": domain} if domain else {}),
    )
    drawn = f"COS bucket {name} (a random suffix drawn as `pulumi up` draws it)"
    try:
        calls.add("cos:HeadBucket")
        headers = CosS3Client(config, retry=1).head_bucket(Bucket=name)
    except CosServiceError as exc:
        status = exc.get_status_code()
        if status == 404:
            return Check("bucket", OK, f"{drawn}: free in {need.region}")
        if status == 403:
            return Check(
                "bucket",
                FAIL,
                f"{drawn}: another account holds it (403)",
                "run the preflight again (a new suffix is drawn); `pulumi up` draws its own",
            )
        return Check("bucket", UNKNOWN, f"COS HEAD Bucket {name}: HTTP {status}")
    except (CosClientError, OSError) as exc:
        first = (str(exc).splitlines() or [""])[0][:120]
        return Check("bucket", UNKNOWN, f"COS HEAD Bucket {name}: {first}")
    where = str(headers.get("x-cos-bucket-region") or "")
    if where and where != need.region:
        return Check(
            "bucket",
            FAIL,
            f"{drawn}: yours already, in {where}, not {need.region}",
            "destroy the old stack's bucket or use another stack name",
        )
    return Check("bucket", OK, f"{drawn}: yours already, in {where or need.region}")


def _said(exc: Exception) -> str:
    code = getattr(exc, "code", None) or type(exc).__name__
    message = getattr(exc, "message", None) or str(exc)
    return f"{code}: {(str(message).splitlines() or [''])[0][:160]}"


def quota_rows(answer: dict[str, Any], set_name: str, zone: str | None) -> list[dict[str, Any]]:
    """The rows of one quota set in a DescribeAccountQuota answer (for the zone, if given)."""
    overview = answer.get("AccountQuotaOverview") or {}
    quota = overview.get("AccountQuota") or {}
    rows = [dict(r) for r in quota.get(set_name) or []]
    return [r for r in rows if zone is None or r.get("Zone") == zone]


def _quotas(
    call: Any,
    cvm: Any,
    need: Need,
    problems: tuple[type[Exception], ...],
    account: dict[str, Any] | None = None,
) -> list[Check]:
    params: dict[str, Any] = {}
    if need.zone:
        params["Filters"] = [{"Name": "zone", "Values": [need.zone]}]
    try:
        answer = call(cvm, "DescribeAccountQuota", params)
    except problems as exc:
        return [Check("quota", UNKNOWN, f"CVM DescribeAccountQuota: {_said(exc)}")]
    if account is not None:
        account["AppId"] = answer.get("AppId")
    out = []
    for mode in ("on-demand", "spot"):
        set_name, _ = QUOTA_SETS[mode]
        rows = quota_rows(answer, set_name, need.zone)
        label = f"quota {mode}"
        judged = mode == need.billing
        if not rows:
            out.append(Check(label, UNKNOWN if judged else INFO, f"{set_name}: no row"))
            continue
        best = max(rows, key=lambda r: int(r.get("RemainingQuota") or 0))
        left = int(best.get("RemainingQuota") or 0)
        said = (
            f"{set_name} in {best.get('Zone')}: {left} instances left of "
            f"{best.get('TotalQuota')}, the stack needs {need.nodes}"
        )
        if left >= need.nodes:
            out.append(Check(label, OK if judged else INFO, said))
        elif judged:
            where = str(best.get("Zone") or need.zone or need.region)
            ask = QuotaAsk(
                f"{set_name} instances",
                int(best.get("UsedQuota") or 0) + need.nodes,
                where,
                step=QUOTA_FIX,
            )
            out.append(Check(label, FAIL, said, QUOTA_FIX, ask))
        else:
            out.append(Check(label, INFO, said + f"; only for {mode} billing"))
    return out


def _image(
    call: Any, cvm: Any, need: Need, problems: tuple[type[Exception], ...]
) -> tuple[str, Check]:
    from infra.clouds.tencent.program import UBUNTU_IMAGE_REGEX

    params = {
        "Filters": [{"Name": "image-type", "Values": ["PUBLIC_IMAGE"]}],
        "InstanceType": need.instance_type,
        "Limit": 100,
    }
    try:
        answer = call(cvm, "DescribeImages", params)
    except problems as exc:
        return "", Check("image", UNKNOWN, f"CVM DescribeImages: {_said(exc)}")
    for image in answer.get("ImageSet") or []:
        if re.search(UBUNTU_IMAGE_REGEX, str(image.get("ImageName", ""))):
            return str(image["ImageId"]), Check(
                "image", OK, f"{image['ImageId']} ({image.get('ImageName')})"
            )
    return "", Check(
        "image",
        FAIL,
        f"no public image matching {UBUNTU_IMAGE_REGEX!r} for {need.instance_type}",
        "pick another region or type",
    )


def _dry_run(
    call: Any, cvm: Any, need: Need, image: str, problems: tuple[type[Exception], ...]
) -> Check:
    if not image:
        return Check("launch", NOT_CHECKED, "RunInstances DryRun needs the image, not resolved")
    _, charge = QUOTA_SETS.get(need.billing, QUOTA_SETS["on-demand"])
    params: dict[str, Any] = {
        "InstanceChargeType": charge,
        "InstanceType": need.instance_type,
        "ImageId": image,
        "InstanceCount": need.nodes,
        "DryRun": True,
    }
    if need.zone:
        params["Placement"] = {"Zone": need.zone}
    try:
        call(cvm, "RunInstances", params)
    except problems as exc:
        code = str(getattr(exc, "code", "") or "")
        if code.startswith(("UnauthorizedOperation", "AuthFailure.UnauthorizedOperation")):
            return Check(
                "launch",
                FAIL,
                f"cvm:RunInstances denied (DryRun): {_said(exc)}",
                "grant cvm:RunInstances (QcloudCVMFullAccess or a policy with it) in CAM",
            )
        return Check("launch", FAIL, f"RunInstances DryRun: {_said(exc)}")
    return Check("launch", OK, f"cvm:RunInstances of {need.instance_type} (DryRun, stock)")
