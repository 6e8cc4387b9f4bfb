"""The pack as the Pulumi engine uses it, through pulumi_policy's own types and gRPC server.

The CLI starts `policy/__main__.py` and talks to it over gRPC (pulumirpc.Analyzer). The engine
is not installed here, so the tests play its part: they start the very same process, read the
port it prints, and send the requests a preview sends: GetAnalyzerInfo, Analyze per resource
(inputs, with unknowns), AnalyzeStack (all resources with their property dependencies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2 as pb
from pulumi.runtime.proto import analyzer_pb2_grpc
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from infra.clouds.alicloud import rules as ali
from infra.clouds.aws import rules as aws
from policy import pack as P
from policy import rules as R
from policy.resources import UNKNOWN, Resource
from tests.policy.conftest import Planned, planned

ROOT = Path(__file__).resolve().parents[2]
CEILING = 100  # the stack config the engine hands the pack in these tests (USD/h)


def urn(stack: str, r: Resource) -> str:
    return f"urn:pulumi:{stack}::gpufleet::{r.type}::{r.name}"


def jsonable(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs as the engine serialises them (the Lambda code archive is irrelevant here)."""
    return json.loads(json.dumps(inputs, default=lambda _: None))


def preview_view(p: Planned) -> list[tuple[Resource, dict[str, Any], dict[str, list[str]]]]:
    """Each resource as a preview shows it: every input computed from another resource's id,
    ARN or name is unknown, and the engine says which resource it depends on."""
    out = []
    for r in p.resources:
        props = jsonable(r.inputs)
        deps: dict[str, list[str]] = {}
        for key, value in props.items():
            if not isinstance(value, str):
                continue
            for t in p.resources:
                # An id given as is, or inside a JSON document built from it (a policy).
                if t is not r and (
                    value in t.ids or (value.startswith("{") and any(i in value for i in t.ids))
                ):
                    deps.setdefault(key, []).append(urn(p.cfg.stack, t))
            if key in deps:
                props[key] = UNKNOWN_STRING_VALUE
        out.append((r, props, deps))
    return out


def struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(dict(props))
    return s


def analyzer_resource(
    stack: str, r: Resource, props: dict[str, Any], deps: dict[str, list[str]]
) -> pb.AnalyzerResource:
    return pb.AnalyzerResource(
        type=r.type,
        name=r.name,
        urn=urn(stack, r),
        properties=struct(props),
        propertyDependencies={k: pb.AnalyzerPropertyDependencies(urns=v) for k, v in deps.items()},
    )


# --- in process: the adapter against pulumi_policy's argument types ---------------------------


def test_plain_turns_the_sdk_proxies_into_data_with_unknowns_marked() -> None:
    node = planned("a10x1").one(ali.INSTANCE, "-0")
    props = jsonable(node.inputs)
    props["vswitchId"] = UNKNOWN_STRING_VALUE
    proxied = unknown_checking_proxy(props)
    data = P.plain(proxied)
    assert data["vswitchId"] is UNKNOWN
    assert data["dataDisks"][0]["encrypted"] is True
    assert data["tags"] == node.inputs["tags"]


def test_every_rule_becomes_a_policy_of_its_kind_and_level() -> None:
    policies = P.build_policies()
    assert [p.name for p in policies] == [r.name for r in R.RULES]
    for policy, rule in zip(policies, R.RULES, strict=True):
        kind = ResourceValidationPolicy if rule.scope == "resource" else StackValidationPolicy
        assert isinstance(policy, kind)
        expected = (
            EnforcementLevel.MANDATORY if rule.level == R.MANDATORY else EnforcementLevel.ADVISORY
        )
        assert policy.enforcement_level == expected


def _options() -> PolicyResourceOptions:
    from pulumi_policy import PolicyCustomTimeouts

    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None)


def test_a_resource_policy_reports_through_the_sdk_callback() -> None:
    p = planned("t4x1")
    node = p.one(aws.INSTANCE, "-0")
    props = jsonable(node.inputs)
    props["metadataOptions"]["httpTokens"] = "optional"
    policy = P.resource_policy(next(r for r in R.RULES if r.name == "imdsv2-required"))
    reported: list[tuple[str, str | None]] = []
    args = ResourceValidationArgs(
        node.type, unknown_checking_proxy(props), urn("t4x1", node), node.name, _options(), None
    )

    def report(message: str, u: str | None = None) -> None:
        reported.append((message, u))

    policy.validate(args, report)
    assert len(reported) == 1 and "t4x1-0" in reported[0][0] and "http_tokens" in reported[0][0]


def test_a_stack_policy_links_by_property_dependencies_when_ids_are_unknown() -> None:
    p = planned("a100x8")
    view = [(r, props, deps) for r, props, deps in preview_view(p) if r.type != aws.BUCKET_PAB]
    by_urn: dict[str, PolicyResource] = {}
    for r, props, _ in view:
        by_urn[urn("a100x8", r)] = PolicyResource(
            r.type,
            unknown_checking_proxy(props),
            urn("a100x8", r),
            r.name,
            _options(),
            None,
            None,
            [],
            {},
        )
    for r, _, deps in view:
        by_urn[urn("a100x8", r)].property_dependencies.update(
            {k: [by_urn[u] for u in us if u in by_urn] for k, us in deps.items()}
        )
    policy = P.stack_policy(next(r for r in R.RULES if r.name == "buckets-private-tls-only"))
    reported: list[tuple[str, str | None]] = []

    def report(message: str, u: str | None = None) -> None:
        reported.append((message, u))

    policy.validate(StackValidationArgs(list(by_urn.values())), report)
    bucket = p.one(aws.BUCKETS[0], "-bucket")
    assert [u for _, u in reported] == [urn("a100x8", bucket)]
    assert "no public access block" in reported[0][0]


# --- over gRPC: the pack process the CLI would start -------------------------------------------


@pytest.fixture(scope="module")
def analyzer() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # How the CLI hands the stack's config to a policy pack.
        "PULUMI_CONFIG": json.dumps({"gpufleet:maxHourlyCost": str(CEILING)}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "policy" / "__main__.py")],
        cwd=ROOT / "policy",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit(), (
            f"the pack did not start: {proc.stderr.read() if proc.stderr else ''}"
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_pack_describes_its_policies_to_the_engine(analyzer: Any) -> None:
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == R.PACK_NAME
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert levels == {
        r.name: (pb.MANDATORY if r.level == R.MANDATORY else pb.ADVISORY) for r in R.RULES
    }
    cost = next(p for p in info.policies if p.name == "cost-ceiling")
    assert "maxHourlyCost" in cost.configSchema.properties


def test_a_shipped_stack_passes_resource_by_resource(analyzer: Any) -> None:
    p = planned("t4x1")
    for r, props, _ in preview_view(p):
        request = pb.AnalyzeRequest(
            type=r.type, name=r.name, urn=urn("t4x1", r), properties=struct(props)
        )
        response = analyzer.Analyze(request, timeout=30)
        assert list(response.diagnostics) == [], r.name


def test_an_open_ssh_rule_is_a_mandatory_diagnostic(analyzer: Any) -> None:
    p = planned("a10x1")
    rule = p.one(ali.SG_RULE, "-ssh-0")
    props = {
        **jsonable(rule.inputs),
        "cidrIp": "0.0.0.0/0",
        "securityGroupId": UNKNOWN_STRING_VALUE,
    }
    response = analyzer.Analyze(
        pb.AnalyzeRequest(
            type=rule.type, name=rule.name, urn=urn("a10x1", rule), properties=struct(props)
        ),
        timeout=30,
    )
    [d] = response.diagnostics
    assert d.policyName == "ssh-not-open-to-world" and d.enforcementLevel == pb.MANDATORY
    assert "a10x1-ssh-0" in d.message and "gpufleet:sshCidrs" in d.message


def test_a_previewed_stack_passes_the_stack_policies(analyzer: Any) -> None:
    p = planned("t4x1")
    request = pb.AnalyzeStackRequest(
        resources=[analyzer_resource("t4x1", r, props, deps) for r, props, deps in preview_view(p)]
    )
    assert list(analyzer.AnalyzeStack(request, timeout=60).diagnostics) == []


def test_a_missing_schedule_is_reported_against_the_node(analyzer: Any) -> None:
    p = planned("t4x1")
    view = [v for v in preview_view(p) if v[0].type != aws.EVENT_TARGET]
    request = pb.AnalyzeStackRequest(resources=[analyzer_resource("t4x1", *v) for v in view])
    [d] = analyzer.AnalyzeStack(request, timeout=60).diagnostics
    assert d.policyName == "gpu-instances-idle-guarded"
    assert d.urn == urn("t4x1", p.one(aws.INSTANCE, "-0"))


def test_the_stack_config_ceiling_reaches_the_pack(analyzer: Any) -> None:
    p = planned("h100x8x2")  # 110.08 USD/h against the engine-provided ceiling of 100
    request = pb.AnalyzeStackRequest(
        resources=[analyzer_resource("h100x8x2", *v) for v in preview_view(p)]
    )
    [d] = analyzer.AnalyzeStack(request, timeout=60).diagnostics
    assert d.policyName == "cost-ceiling" and d.urn == ""
    assert "110.08 USD/h" in d.message and f"maxHourlyCost={CEILING}" in d.message


def test_the_pack_project_file_matches_the_code_and_uses_the_project_venv() -> None:
    import yaml

    doc = yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert doc["version"] == R.PACK_VERSION
    assert doc["runtime"]["name"] == "python"
    venv = (ROOT / "policy" / doc["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == (ROOT / ".venv").resolve()
