"""AWS's preflight (infra/preflight.py): the user's own account, read only, through boto3.

Calls, in order (each counted): STS GetCallerIdentity; EC2 DescribeRegions (the region
enabled for the account); Service Quotas GetServiceQuota for the type's family, on-demand
and spot; SSM GetParameter (the node image the program resolves); EC2 RunInstances with
DryRun (the one permission AWS can prove without creating anything: DryRunOperation means
it would have succeeded, UnauthorizedOperation that it would not); IAM
SimulatePrincipalPolicy for the other actions `pulumi up` needs (where the caller may
simulate; else they are listed as not checked). The bucket needs no check: the program
names it with a random suffix (bucket_prefix), so no name can be taken.

The endpoints follow boto3's own settings (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_<SERVICE>):
tests point them at moto and a local fake on 127.0.0.1. The SDK is imported inside.
"""

from __future__ import annotations

import re
from typing import Any

from infra.preflight import (
    FAIL,
    INFO,
    NOT_CHECKED,
    OK,
    UNKNOWN,
    Calls,
    Check,
    Filed,
    Need,
    QuotaAsk,
)

# EC2 vCPU quotas by family (Service Quotas, service code ec2). The quota names are those of
# AWS's "Spot Instance quotas" page
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html, read
# 2026-12-05) and of the Service Quotas console for EC2; the codes are the ones
# `aws service-quotas list-service-quotas --service-code ec2` answers with those names
# (cross-read in public repositories' quota scripts, 2026-12-05; a code AWS ever renames
# shows as NoSuchResourceException in the quota line, never a wrong answer).
# family letters -> (on-demand (code, name), spot (code, name))
QUOTAS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "p": (
        ("L-417A185B", "Running On-Demand P instances"),
        ("L-7212CCBC", "All P Spot Instance Requests"),
    ),
    "g": (
        ("L-DB2E81BA", "Running On-Demand G and VT instances"),
        ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ),
    "vt": (
        ("L-DB2E81BA", "Running On-Demand G and VT instances"),
        ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ),
}

# What `pulumi up` asks of EC2, S3, IAM, Lambda, EventBridge and CloudWatch for one stack
# (the resource types infra/clouds/aws/program.py declares, by the IAM actions their
# Create calls need: the Service Authorization Reference's action names).
ACTIONS = (
    "ec2:CreateVpc",
    "ec2:CreateSubnet",
    "ec2:CreateSecurityGroup",
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateTags",
    "s3:CreateBucket",
    "s3:PutBucketPolicy",
    "iam:CreateRole",
    "iam:PutRolePolicy",
    "iam:CreateInstanceProfile",
    "iam:PassRole",
    "lambda:CreateFunction",
    "events:PutRule",
    "events:PutTargets",
    "cloudwatch:PutMetricAlarm",
)
CREDENTIALS_HINT = "set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
QUOTA_SCOPE = "region"  # Service Quotas' EC2 vCPU quotas are per region (`make up --quota`)


def family(instance_type: str) -> str:
    """The quota family's letters of an instance type: p4d.24xlarge -> p, g6e.xlarge -> g."""
    m = re.match(r"([a-z]+?)\d", instance_type)
    letters = m.group(1) if m else instance_type.split(".")[0]
    return "vt" if letters.startswith("vt") else letters[:1]


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code") or type(exc).__name__)


def _first(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0]


def role_arn(caller_arn: str) -> str:
    """The IAM ARN a policy simulation takes for a caller: an assumed role's session ARN
    (arn:aws:sts::1:assumed-role/R/s) becomes the role's (arn:aws:iam::1:role/R)."""
    m = re.fullmatch(r"arn:(aws[\w-]*):sts::(\d+):assumed-role/([^/]+)/.+", caller_arn)
    return f"arn:{m[1]}:iam::{m[2]}:role/{m[3]}" if m else caller_arn


def _unasked(why: str, fix: str) -> list[Check]:
    """The checks when the account cannot be asked at all: the reason once, then one line
    each saying it was not asked."""
    rest = ("region", "quota", "image", "launch", "permissions")
    return [Check("identity", UNKNOWN, why, fix)] + [
        Check(n, UNKNOWN, "not asked: no identity") for n in rest
    ]


def _counted_session(calls: Calls) -> Any:
    import boto3

    session = boto3.session.Session()

    def count(model: Any, **_: Any) -> None:
        calls.add(f"{model.service_model.service_id}:{model.name}")

    session.events.register("before-call", count)
    return session


def _problems() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    return (BotoCoreError, ClientError, ResponseParserError)


def _once() -> Any:
    from botocore.config import Config

    # one try each, short timeouts: a preflight answers in seconds or says it could not
    return Config(
        retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=20
    )


def quota(need: Need, calls: Calls) -> list[Check]:
    """The quota checks alone, for one place (``make up --quota`` asks each region)."""
    session = _counted_session(calls)
    if session.get_credentials() is None:
        return [Check("quota", UNKNOWN, "no AWS credentials", CREDENTIALS_HINT)]
    sq = session.client("service-quotas", region_name=need.region, config=_once())
    return _quotas(sq, need, _problems())


def checks(need: Need, calls: Calls) -> list[Check]:
    problems = _problems()
    session = _counted_session(calls)
    if session.get_credentials() is None:
        return _unasked("no AWS credentials", CREDENTIALS_HINT)
    once = _once()

    def client(name: str) -> Any:
        return session.client(name, region_name=need.region, config=once)

    out: list[Check] = []
    try:
        me = client("sts").get_caller_identity()
    except problems as exc:
        why = f"STS GetCallerIdentity: {_code(exc)}: {_first(exc)}"
        return _unasked(why, "check the credentials and the network")
    arn = str(me.get("Arn", ""))
    out.append(Check("identity", OK, f"account {me.get('Account')} as {arn}"))
    ec2 = client("ec2")
    out.append(_region(ec2, need, problems))
    out.extend(_quotas(client("service-quotas"), need, problems))
    image, image_check = _image(client("ssm"), need, problems)
    out.append(image_check)
    out.append(_dry_run(ec2, need, image, problems))
    out.append(_simulate(client("iam"), arn, problems))
    out.append(
        Check(
            "bucket",
            OK,
            f"named at `pulumi up` with a random suffix (gpufleet-{need.stack}-...): "
            "no name to be taken",
        )
    )
    return out


def _region(ec2: Any, need: Need, problems: tuple[type[Exception], ...]) -> Check:
    try:
        regions = ec2.describe_regions(RegionNames=[need.region], AllRegions=True)["Regions"]
    except problems as exc:
        return Check("region", UNKNOWN, f"EC2 DescribeRegions: {_code(exc)}: {_first(exc)}")
    status = str((regions or [{}])[0].get("OptInStatus", ""))
    if status == "not-opted-in":
        return Check(
            "region",
            FAIL,
            f"{need.region} is not enabled for this account",
            f"`aws account enable-region --region-name {need.region}` (takes minutes)",
        )
    return Check("region", OK, f"{need.region} enabled ({status or 'no opt-in status'})")


def quota_codes(instance_type: str) -> tuple[tuple[str, str], tuple[str, str]] | None:
    return QUOTAS.get(family(instance_type))


def _quotas(sq: Any, need: Need, problems: tuple[type[Exception], ...]) -> list[Check]:
    codes = quota_codes(need.instance_type)
    if codes is None:
        why = f"no vCPU quota known for the family of {need.instance_type}"
        return [Check("quota", NOT_CHECKED, why)]
    out = []
    for mode, (code, name) in zip(("on-demand", "spot"), codes, strict=True):
        label = f"quota {mode}"
        try:
            value = float(sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except problems as exc:
            why = f"Service Quotas {code} ({name}): {_code(exc)}: {_first(exc)}"
            out.append(Check(label, UNKNOWN if mode == need.billing else INFO, why))
            continue
        need_v = need.total_vcpus
        said = f"{name}: {value:g} vCPUs, the stack needs {need_v} ({need.nodes} x {need.vcpus})"
        if value >= need_v:
            out.append(Check(label, OK if mode == need.billing else INFO, said))
            continue
        fix = (
            f"`aws service-quotas request-service-quota-increase --service-code ec2 "
            f"--quota-code {code} --desired-value {need_v} --region {need.region}` "
            "(running instances of the family count against it too)"
        )
        if mode == need.billing:
            where = (("service", "ec2"), ("quota", code), ("region", need.region))
            ask = QuotaAsk(f"vCPUs of {name}", need_v, need.region, where)
            out.append(Check(label, FAIL, said, fix, ask))
        else:
            out.append(Check(label, INFO, said + f"; only for {mode} billing"))
    return out


def request_quota(ask: QuotaAsk, calls: Calls) -> Filed:
    """Service Quotas RequestServiceQuotaIncrease for one short quota (``--request-quota``,
    after the person said yes): the request's Id and Status as AWS answered them
    (RequestedServiceQuotaChange; Status PENDING, CASE_OPENED, APPROVED, ...). Raises the
    SDK's error (said in one line by the caller) when AWS refuses."""
    session = _counted_session(calls)
    if session.get_credentials() is None:
        raise LookupError(f"no AWS credentials: {CREDENTIALS_HINT}")
    sq = session.client("service-quotas", region_name=ask.get("region"), config=_once())
    try:
        answer = sq.request_service_quota_increase(
            ServiceCode=ask.get("service"), QuotaCode=ask.get("quota"), DesiredValue=ask.value
        )
    except _problems() as exc:
        raise LookupError(f"Service Quotas: {_code(exc)}: {_first(exc)}") from None
    asked = answer.get("RequestedQuota") or {}
    case = str(asked.get("CaseId") or "")
    return Filed(
        str(asked.get("Id") or "?"),
        str(asked.get("Status") or "?"),
        f"support case {case}" if case else "",
    )


def _image(ssm: Any, need: Need, problems: tuple[type[Exception], ...]) -> tuple[str, Check]:
    from infra.catalog import load_catalog
    from infra.clouds.aws.program import ami_parameter

    catalog = load_catalog()
    arch = catalog.gpu_for(catalog.instance("aws", need.instance_type)).arch
    param = ami_parameter(arch)
    try:
        ami = str(ssm.get_parameter(Name=param)["Parameter"]["Value"])
    except problems as exc:
        code = _code(exc)
        state = FAIL if code == "ParameterNotFound" else UNKNOWN
        return "", Check(
            "image",
            state,
            f"SSM {param}: {code}",
            "the region publishes no such image: pick another region" if state == FAIL else "",
        )
    return ami, Check("image", OK, f"{ami} ({param.rsplit('/', 3)[-3]})")


def _dry_run(ec2: Any, need: Need, image: str, problems: tuple[type[Exception], ...]) -> Check:
    if not image:
        return Check("launch", NOT_CHECKED, "RunInstances DryRun needs the image, not resolved")
    kwargs: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": need.instance_type,
        "MinCount": need.nodes,
        "MaxCount": need.nodes,
        "DryRun": True,
    }
    if need.zone:
        kwargs["Placement"] = {"AvailabilityZone": need.zone}
    if need.billing == "spot":
        kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
    try:
        ec2.run_instances(**kwargs)
    except problems as exc:
        code = _code(exc)
        if code == "DryRunOperation":
            return Check("launch", OK, f"ec2:RunInstances of {need.instance_type} (DryRun)")
        # EC2 answers a dry run the caller may not make with UnauthorizedOperation (EC2 API
        # reference, "Common client error codes"); moto's IAM layer with AccessDenied
        if code in ("UnauthorizedOperation", "AccessDenied"):
            return Check(
                "launch",
                FAIL,
                f"ec2:RunInstances denied (DryRun): {_first(exc)[:120]}",
                "grant ec2:RunInstances (and iam:PassRole for the node role) to this caller",
            )
        return Check("launch", FAIL, f"RunInstances DryRun: {code}: {_first(exc)[:160]}")
    return Check("launch", UNKNOWN, "RunInstances DryRun answered without DryRunOperation")


def _simulate(iam: Any, arn: str, problems: tuple[type[Exception], ...]) -> Check:
    try:
        answer = iam.simulate_principal_policy(
            PolicySourceArn=role_arn(arn), ActionNames=list(ACTIONS)
        )
    except problems as exc:
        return Check(
            "permissions",
            NOT_CHECKED,
            f"{len(ACTIONS)} actions `pulumi up` needs (IAM SimulatePrincipalPolicy: {_code(exc)})",
            "grant iam:SimulatePrincipalPolicy to have them checked",
        )
    denied = [
        str(r["EvalActionName"])
        for r in answer.get("EvaluationResults", [])
        if r.get("EvalDecision") != "allowed"
    ]
    if denied:
        return Check(
            "permissions",
            FAIL,
            f"{len(denied)} of {len(ACTIONS)} actions denied: {', '.join(denied)}",
            "add them to the caller's policy",
        )
    return Check("permissions", OK, f"all {len(ACTIONS)} actions allowed (simulated)")
