"""AWS's preflight against moto (STS, EC2 DescribeRegions, offerings, RunInstances DryRun,
IAM) and a local fake of Service Quotas and SSM's public parameters (tests/preflight/aws_fake.py),
all on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest

from infra import preflight
from infra.clouds.aws import preflight as aws
from infra.clouds.aws.program import DLAMI_PARAM
from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Need
from tests.preflight.aws_fake import AwsFake, parameter_answer, quota_answer
from tests.support.moto_server import moto_server

ROOT = Path(__file__).resolve().parents[2]
CLOSED = "http://127.0.0.1:9"  # nothing listens: a request fails at once, on loopback


def need(**kw: Any) -> Need:
    base = Need(
        stack="t4x1",
        provider="aws",
        region="us-east-1",
        zone=None,
        instance_type="g4dn.xlarge",
        nodes=1,
        vcpus=4,
        gpus=1,
        billing="on-demand",
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("sts", "ec2")) as url:
        yield url


@pytest.fixture()
def fake(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsFake]:
    with AwsFake() as f:
        f.parameters[DLAMI_PARAM] = "ami-0abcdef1234567890"
        f.quotas.update({"L-DB2E81BA": 8, "L-3819A6DF": 8})
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", f.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", f.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", CLOSED)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield f


def by_name(report: preflight.Report) -> dict[str, preflight.Check]:
    return {c.name: c for c in report.checks}


def test_the_fake_answers_only_members_of_botocore_s_own_shapes():
    session = botocore.session.get_session()
    quota = session.get_service_model("service-quotas").operation_model("GetServiceQuota")
    assert set(quota_answer("L-DB2E81BA", 4)["Quota"]) <= set(
        quota.output_shape.members["Quota"].members
    )
    param = session.get_service_model("ssm").operation_model("GetParameter")
    assert set(parameter_answer("/x", "ami-1")["Parameter"]) <= set(
        param.output_shape.members["Parameter"].members
    )


def test_moto_has_no_ec2_service_quotas_so_the_fake_is_needed(moto_url: str):
    sq = boto3.client("service-quotas", endpoint_url=moto_url, region_name="us-east-1")
    with pytest.raises(sq.exceptions.NoSuchResourceException):
        sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")


def test_an_account_with_quota_and_permission_passes_with_one_line_per_check(fake):
    report = preflight.run(need())
    got = by_name(report)
    assert got["identity"].state == OK and "123456789012" in got["identity"].detail
    assert got["region"].state == OK
    assert got["quota on-demand"].state == OK
    assert "8 vCPUs, the stack needs 4" in got["quota on-demand"].detail
    assert got["quota spot"].state == INFO  # the stack bills on-demand: spot is only said
    assert got["image"].state == OK and "ami-0abcdef1234567890" in got["image"].detail
    assert got["launch"].state == OK and "(DryRun)" in got["launch"].detail
    # moto 5.2.5 answers SimulatePrincipalPolicy with an HTML 500: not checked, listed
    assert got["permissions"].state == NOT_CHECKED
    assert got["offered"].state == OK and "us-east-1a" in got["offered"].detail
    assert got["price"].state == INFO  # no price source reachable: not a blocker
    assert report.status == 0
    assert "ServiceQuotasV20190624.GetServiceQuota" in fake.requests
    lines = preflight.render(report)
    assert all(len(ln) <= 80 for ln in lines)
    assert lines[-1].startswith("nothing stands in the way of `pulumi up`")


def test_a_short_on_demand_quota_fails_with_the_exact_request_to_raise_it(fake):
    fake.quotas["L-DB2E81BA"] = 0
    report = preflight.run(need(nodes=2))
    q = by_name(report)["quota on-demand"]
    assert q.state == FAIL
    assert "0 vCPUs, the stack needs 8 (2 x 4)" in q.detail
    assert (
        "`aws service-quotas request-service-quota-increase --service-code ec2 "
        "--quota-code L-DB2E81BA --desired-value 8 --region us-east-1`" in q.fix
    )
    assert report.status == 1
    text = "\n".join(preflight.render(report))
    assert "[FAIL] quota on-demand:" in text and "\n  fix:\n" in text
    # the command is never split mid-word: a shell reads its continued lines as one
    assert "aws service-quotas request-service-quota-increase --service-code ec2 \\\n" in text


def test_a_spot_stack_is_judged_on_its_spot_quota_and_only_told_the_on_demand_one(fake):
    fake.quotas["L-DB2E81BA"] = 0
    fake.quotas["L-3819A6DF"] = 2
    got = by_name(preflight.run(need(billing="spot")))
    assert got["quota spot"].state == FAIL and "L-3819A6DF" in got["quota spot"].fix
    assert got["quota on-demand"].state == INFO
    assert got["quota on-demand"].detail.endswith("only for on-demand billing")


def test_a_p_family_type_reads_the_p_quotas(fake):
    fake.quotas["L-417A185B"] = 96
    got = by_name(preflight.run(need(instance_type="p4d.24xlarge", vcpus=96, gpus=8)))
    assert got["quota on-demand"].state == OK
    assert "Running On-Demand P instances" in got["quota on-demand"].detail


def test_a_zone_that_does_not_offer_the_type_is_told_with_the_zones_that_do(fake):
    # moto's offerings: g4dn.xlarge in us-east-1a/b/c/d/f, not e
    got = by_name(preflight.run(need(zone="us-east-1e")))
    offered = got["offered"]
    assert offered.state == FAIL and "not offered in us-east-1 us-east-1e" in offered.detail
    assert offered.fix.startswith("set gpufleet:zone to one of us-east-1a")


def test_an_image_the_region_does_not_publish_fails_and_the_dry_run_is_not_attempted(fake):
    fake.parameters.clear()
    got = by_name(preflight.run(need()))
    assert got["image"].state == FAIL and "ParameterNotFound" in got["image"].detail
    assert got["launch"].state == NOT_CHECKED


def test_without_credentials_each_check_says_so_in_one_line(fake, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    report = preflight.run(need())
    got = by_name(report)
    assert got["identity"].state == UNKNOWN and got["identity"].detail == "no AWS credentials"
    assert all(got[n].detail == "not asked: no identity" for n in ("region", "quota", "launch"))
    assert report.status == 1 and fake.requests == []
    assert report.calls == ()


def test_without_network_the_identity_line_says_so_and_nothing_raises(fake, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", CLOSED)
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN
    assert got["identity"].detail.startswith("STS GetCallerIdentity: EndpointConnectionError")


def test_a_check_module_that_raises_is_one_line_not_a_traceback(fake):
    def broken(need, calls):
        raise KeyError("Quota")

    report = preflight.run(need(), cloud_checks=broken)
    assert report.checks[0].state == UNKNOWN
    assert report.checks[0].detail == "stopped: KeyError: 'Quota'"


def test_the_quota_family_of_each_catalog_gpu_type_is_known():
    from infra.catalog import load_catalog

    names = [n for (p, n) in load_catalog().instances if p == "aws"]
    assert names and all(aws.quota_codes(n) is not None for n in names), names


def test_an_assumed_role_is_simulated_as_its_role():
    assert (
        aws.role_arn("arn:aws:sts::123456789012:assumed-role/Dev/alice")
        == "arn:aws:iam::123456789012:role/Dev"
    )
    assert aws.role_arn("arn:aws:iam::1:user/bob") == "arn:aws:iam::1:user/bob"


# --- a denied permission: moto with IAM authorization on ---------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def moto_with_auth() -> Iterator[str]:
    """A moto server that authorizes every request after the first 3 (the setup below)."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):  # bounded: 10 s
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_a_caller_without_run_instances_is_told_by_the_dry_run(moto_with_auth, monkeypatch):
    iam = boto3.client("iam", endpoint_url=moto_with_auth, region_name="us-east-1")
    iam.create_user(UserName="alice")
    iam.put_user_policy(
        UserName="alice",
        PolicyName="read-only",
        PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": '
            '["sts:GetCallerIdentity", "ec2:Describe*"], "Resource": "*"}]}'
        ),
    )
    key = iam.create_access_key(UserName="alice")["AccessKey"]
    with AwsFake() as f:
        f.parameters[DLAMI_PARAM] = "ami-0abcdef1234567890"
        f.quotas.update({"L-DB2E81BA": 8, "L-3819A6DF": 8})
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_with_auth)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", f.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", f.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", CLOSED)
        report = preflight.run(need())
    got = by_name(report)
    assert got["identity"].state == OK and "user/alice" in got["identity"].detail
    assert got["launch"].state == FAIL, got["launch"]
    assert "ec2:RunInstances denied" in got["launch"].detail
    assert got["launch"].fix.startswith("grant ec2:RunInstances")
    assert report.status == 1


# -- --request-quota: Service Quotas RequestServiceQuotaIncrease, only after a yes


def test_the_fake_s_request_answer_is_botocore_s_own_shape():
    session = botocore.session.get_session()
    op = session.get_service_model("service-quotas").operation_model("RequestServiceQuotaIncrease")
    shape = op.output_shape.members["RequestedQuota"]
    with AwsFake() as f:
        _, doc = f.request_increase(
            {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "DesiredValue": 8}
        )
    assert set(doc["RequestedQuota"]) <= set(shape.members)
    assert doc["RequestedQuota"]["Status"] in shape.members["Status"].enum


def test_moto_cannot_take_a_quota_request_so_the_fake_does(moto_url: str):
    from botocore.config import Config
    from botocore.exceptions import ClientError

    once = Config(retries={"max_attempts": 1})
    sq = boto3.client("service-quotas", endpoint_url=moto_url, region_name="us-east-1", config=once)
    with pytest.raises(ClientError, match=r"\(500\)"):  # moto 5.2.5: no such operation
        sq.request_service_quota_increase(
            ServiceCode="ec2", QuotaCode="L-DB2E81BA", DesiredValue=8.0
        )


def test_a_short_quota_is_filed_after_a_yes_and_its_request_id_shown(fake):
    fake.quotas["L-DB2E81BA"] = 0
    report = preflight.run(need(nodes=2))
    asked: list[str] = []
    said: list[str] = []

    def yes(question: str) -> bool:
        asked.append(question)
        return True

    assert preflight.file_requests(report, yes, said.append) == 0
    assert asked == [
        "file a request for 8 vCPUs of Running On-Demand G and VT instances in us-east-1? [y/N] "
    ]
    assert fake.filed == [{"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "DesiredValue": 8}]
    assert said == [
        "quota on-demand: filed: request d187537d15254312a9609aa51bbf7621, status PENDING"
    ]
    # a second time: AWS's own refusal, in one line, exit 1
    said.clear()
    assert preflight.file_requests(report, yes, said.append) == 1
    assert said[0].startswith("quota on-demand: not filed: Service Quotas: ResourceAlreadyExists")


def test_a_no_files_nothing(fake):
    fake.quotas["L-DB2E81BA"] = 0
    report = preflight.run(need())
    said: list[str] = []
    assert preflight.file_requests(report, lambda q: False, said.append) == 0
    assert fake.filed == [] and said == ["quota on-demand: not filed"]
    assert not [r for r in fake.requests if r.endswith("RequestServiceQuotaIncrease")]


def test_enough_quota_asks_nothing(fake):
    said: list[str] = []
    report = preflight.run(need())
    assert preflight.file_requests(report, lambda q: True, said.append) == 0
    assert said == ["--request-quota: no short quota to request"] and fake.filed == []
