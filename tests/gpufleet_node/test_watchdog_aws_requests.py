"""The AWS node's hand-signed query requests (watchdog AwsNode: EC2 CreateTags for the
lease, CloudWatch PutMetricData for the heartbeat and GPU metrics), checked parameter by
parameter against botocore's service models: every name must resolve through the
operation's input shape by the protocol's rules, the values must pass botocore's own
validator and be one of an enum's values, and botocore's own serializer, given what was
resolved, must write exactly the request the node sent. A misspelt parameter, a wrong
version or a value of the wrong type fails."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Any

import botocore.session
import pytest
from botocore.serialize import create_serializer
from botocore.validate import ParamValidator

from tests.gpufleet_node.test_watchdog import (
    aws_node,
    wmetrics,
)

# The protocol each service's query requests follow (CloudWatch's model lists
# smithy-rpc-v2-cbor, json and query; the node speaks query).
PROTOCOLS = {"ec2": "ec2", "monitoring": "query"}
MODELS = {"ec2": "ec2", "monitoring": "cloudwatch"}


def _name(member: Any, default: str, protocol: str) -> str:
    """The wire name of a structure member (botocore.serialize's rules)."""
    ser = member.serialization
    if protocol == "ec2":
        if "queryName" in ser:
            return str(ser["queryName"])
        if "name" in ser:
            return str(ser["name"][0].upper() + ser["name"][1:])
        return default
    return str(ser.get("name", default))


def _value(shape: Any, text: str) -> Any:
    kind = shape.type_name
    if kind in ("integer", "long"):
        return int(text)
    if kind in ("double", "float"):
        return float(text)
    if kind == "boolean":
        assert text in ("true", "false"), f"{text!r} is no boolean"
        return text == "true"
    if kind == "timestamp":
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert kind == "string", f"no parsing of {kind} here"
    # botocore's validator does not check enums; the model lists them (StandardUnit).
    if shape.enum and text not in shape.enum:
        raise ValueError(f"{text!r} is not one of {shape.name}'s values")
    return text


def _place(tree: Any, shape: Any, tokens: list[str], text: str, protocol: str) -> Any:
    """Put one wire parameter into the request's parameter tree, following the shape."""
    if not tokens:
        return _value(shape, text)
    if shape.type_name == "structure":
        by_wire = {_name(m, n, protocol): n for n, m in shape.members.items()}
        head, *rest = tokens
        if head not in by_wire:
            raise KeyError(f"{head!r}: not a member of {shape.name} ({sorted(by_wire)})")
        name = by_wire[head]
        tree = tree if isinstance(tree, dict) else {}
        tree[name] = _place(tree.get(name), shape.members[name], rest, text, protocol)
        return tree
    if shape.type_name == "list":
        assert not shape.serialization.get("flattened"), "flattened lists: not needed here"
        if protocol == "query":
            marker, *tokens = tokens
            want = shape.member.serialization.get("name", "member")
            if marker != want:
                raise KeyError(f"{marker!r}: list {shape.name} writes {want!r}.N")
        index, *rest = tokens
        if not index.isdigit() or int(index) < 1:
            raise KeyError(f"{index!r}: list {shape.name} wants an index from 1")
        items = tree if isinstance(tree, list) else []
        while len(items) < int(index):
            items.append(None)
        items[int(index) - 1] = _place(items[int(index) - 1], shape.member, rest, text, protocol)
        return items
    raise KeyError(f"{'.'.join(tokens)}: {shape.name} is a {shape.type_name}")


def problems(service: str, sent: dict[str, str]) -> list[str]:
    """What in a query request botocore's model for ``service`` does not define."""
    protocol = PROTOCOLS[service]
    model = botocore.session.get_session().get_service_model(MODELS[service])
    params = dict(sent)
    found = []
    if params.pop("Version", None) != model.metadata["apiVersion"]:
        found.append(f"Version is not {model.metadata['apiVersion']}")
    action = params.pop("Action", "")
    if action not in model.operation_names:
        return [*found, f"{action!r} is not an operation of {MODELS[service]}"]
    op = model.operation_model(action)
    tree: dict[str, Any] = {}
    for key, text in params.items():
        try:
            tree = _place(tree, op.input_shape, key.split("."), text, protocol)
        except (KeyError, ValueError, AssertionError) as exc:
            found.append(f"{key}: {exc}")
    if found:
        return found
    report = ParamValidator().validate(tree, op.input_shape)
    if report.has_errors():
        return [report.generate_report()]
    body = create_serializer(protocol).serialize_to_request(tree, op)["body"]
    written = {k: str(v) for k, v in body.items()}
    if written != sent:
        return [f"botocore would send {written}, the node sent {sent}"]
    return []


class Sent:
    """Every query request the node sends, captured instead of reaching the network."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request: Any, timeout: float) -> Any:
        host = urllib.parse.urlsplit(request.full_url).hostname or ""
        service = host.split(".")[0]
        body = urllib.parse.parse_qsl(request.data.decode(), keep_blank_values=True)
        self.requests.append((service, dict(body)))

        class Answer:
            def __enter__(self) -> Answer:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def read(self) -> bytes:
                return b""

        return Answer()


CREDS = {"access_key_id": "AKIDEXAMPLE", "secret": "s", "token": "t"}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    capture = Sent()
    monkeypatch.setattr(aws_node.urllib.request, "urlopen", capture)
    return capture


def test_the_lease_write_is_a_create_tags_request_botocore_would_send(sent):
    aws_node.AwsNode("eu-west-1").write_tag(
        "i-0123456789abcdef0", "gpufleet:keep-alive-until", "2026-12-02T10:00:00Z", CREDS
    )
    ((service, body),) = sent.requests
    assert service == "ec2" and body["Action"] == "CreateTags"
    assert problems(service, body) == []


def test_what_the_publisher_sends_is_a_put_metric_data_botocore_would_send(sent):
    # Every metric the watchdog publishes, with its unit (StandardUnit is an enum in the
    # model, so the validator refuses a unit CloudWatch does not define).
    publisher = wmetrics.MetricsPublisher(
        aws_node.AwsNode("eu-west-1"), "i-0123456789abcdef0", lambda: CREDS
    )
    at = dt.datetime(2026, 12, 1, 22, 0, tzinfo=dt.UTC)
    publisher.publish(at=at, gpu_util=87.5, gpu_mem=40.0, unsynced=3)
    ((service, body),) = sent.requests
    assert service == "monitoring" and body["Action"] == "PutMetricData"
    assert body["MetricData.member.4.Unit"] == "Count"
    assert problems(service, body) == []
    assert problems(service, {**body, "MetricData.member.4.Unit": "Counts"}) != []


GOOD_TAG = {
    "Action": "CreateTags",
    "Version": "2016-11-15",
    "ResourceId.1": "i-0123456789abcdef0",
    "Tag.1.Key": "gpufleet:keep-alive-until",
    "Tag.1.Value": "2026-12-02T10:00:00Z",
}


@pytest.mark.parametrize(
    "change",
    [
        {"Tags.1.Key": "k"},  # the model's member name, not its wire name
        {"ResourceIds.1": "i-1"},
        {"Tag.1.Kee": "k"},
        {"Tag.0.Key": "k"},
        {"Tag.Key": "k"},
        {"DryRun": "yes"},  # a boolean is true or false
        {"Version": "2014-10-01"},
        {"Action": "CreateTag"},
    ],
    ids=lambda change: next(iter(change)) + "=" + next(iter(change.values())),
)
def test_a_parameter_the_model_does_not_define_fails(change):
    assert problems("ec2", {**GOOD_TAG, **change}) != []


def test_a_request_missing_a_required_parameter_fails():
    body = {k: v for k, v in GOOD_TAG.items() if not k.startswith("ResourceId")}
    assert problems("ec2", body) != []


def test_a_query_list_without_its_member_marker_fails():
    body = {
        "Action": "PutMetricData",
        "Version": "2010-08-01",
        "Namespace": "gpufleet",
        "MetricData.1.MetricName": "Heartbeat",  # query lists are MetricData.member.N
        "MetricData.1.Value": "1.0",
    }
    assert problems("monitoring", body) != []
