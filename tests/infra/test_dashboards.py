"""Every stack's monitoring view against its cloud's documented structure: the CloudWatch
dashboard body (CloudWatch API Reference, "Dashboard Body Structure and Syntax") and the
Azure Monitor workbook (Microsoft's schema/workbook.json), as summarised and cited in
tests/data/dashboards. The checkers are tested on broken bodies too, so they can fail."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.aws.dashboard import dashboard_body
from infra.clouds.azure.program import workbook_body
from infra.config import read_stack_file
from tests.infra.conftest import STACK_FILES, planned, stack_id
from tests.infra.dashboards import cloudwatch_problems, workbook_problems


def bodies(path: Path, type_: str, key: str) -> list[Any]:
    _, result = planned(path)
    return [json.loads(r.inputs[key]) for r in result.of_type(type_)]


def provider(path: Path) -> str:
    return str(read_stack_file(path).get("gpufleet:provider", ""))


# Chosen by the stack file's provider, not by planning every stack here: this module is
# imported at collection, and 13 plans there cost about 14 s of CPU for any run that only
# collects it (a -k selection, one test of this file). Each test below then demands its
# stack's one dashboard, so a stack of these clouds that lost it fails instead of dropping out.
AWS = [p for p in STACK_FILES if provider(p) == "aws"]
AZURE = [p for p in STACK_FILES if provider(p) == "azure"]


def test_the_stacks_of_both_clouds_are_checked() -> None:
    assert AWS and AZURE


def test_exactly_the_aws_and_azure_stacks_plan_a_dashboard() -> None:
    for path in STACK_FILES:
        has = (
            bool(bodies(path, "aws:cloudwatch/dashboard:Dashboard", "dashboardBody")),
            bool(bodies(path, "azure-native:applicationinsights:Workbook", "serializedData")),
        )
        assert has == (path in AWS, path in AZURE), path.name


@pytest.mark.parametrize("path", AWS, ids=stack_id)
def test_each_aws_stacks_dashboard_body_has_cloudwatchs_documented_structure(path: Path) -> None:
    (body,) = bodies(path, "aws:cloudwatch/dashboard:Dashboard", "dashboardBody")
    assert cloudwatch_problems(body) == []
    assert len(body["widgets"]) == 3


@pytest.mark.parametrize("path", AZURE, ids=stack_id)
def test_each_azure_stacks_workbook_has_the_published_schemas_structure(path: Path) -> None:
    (doc,) = bodies(path, "azure-native:applicationinsights:Workbook", "serializedData")
    assert workbook_problems(doc) == []
    assert [item["type"] for item in doc["items"]] == [1, 10, 10, 10]


def broken(body: dict[str, Any], change: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    change(out)
    return out


GOOD_AWS = dashboard_body("us-east-1", ["i-0123456789abcdef0", "i-0fedcba9876543210"])


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda b: b.pop("widgets"), "missing 'widgets'"),
        (lambda b: b["widgets"][0].update(width=25), "widgets[0].width: 25 is outside 1-24"),
        (lambda b: b["widgets"][0].update(x=12, width=13), "past the 24 columns"),
        (lambda b: b["widgets"][1]["properties"].pop("region"), "missing 'region'"),
        (lambda b: b["widgets"][1]["properties"].update(stat="Max"), "'Max' is not a statistic"),
        (lambda b: b["widgets"][1]["properties"].update(period=90), "period: 90"),
        (lambda b: b["widgets"][1]["properties"].update(view="line"), "view: 'line'"),
        (lambda b: b["widgets"][2]["properties"]["metrics"][0].pop(), "name/value pairs"),
        (lambda b: b["widgets"][0].update(type="graph"), "type: 'graph'"),
        (lambda b: b.update(widget=[]), "body.widget: not in the documented structure"),
    ],
)
def test_the_cloudwatch_checker_refuses_what_the_documented_structure_does(
    change: Any, said: str
) -> None:
    assert cloudwatch_problems(GOOD_AWS) == []
    problems = cloudwatch_problems(broken(GOOD_AWS, change))
    assert any(said in p for p in problems), problems


GOOD_AZURE = workbook_body("azure-a100x1", ["/subscriptions/0/resourceGroups/g/providers/x/vm0"])


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d.pop("version"), "missing 'version'"),
        (lambda d: d.update(isLocked=False), "workbook.isLocked: not in the documented"),
        (lambda d: d["items"][1].pop("content"), "items[1]: missing 'content'"),
        (lambda d: d["items"][1]["content"].update(size="0"), "size: '0' is not a integer"),
        (lambda d: d["items"][1]["content"]["metrics"][0].pop("aggregation"), "'aggregation'"),
        (lambda d: d["items"][1]["content"].update(resourceIds="vm0"), "is not a array"),
        (lambda d: d["items"][0]["content"].update(markdown="x"), "not in the workbook schema"),
        (lambda d: d["items"][1].update(type=12), "items[1].type: 12"),
    ],
)
def test_the_workbook_checker_refuses_what_the_published_schema_does(
    change: Any, said: str
) -> None:
    assert workbook_problems(GOOD_AZURE) == []
    problems = workbook_problems(broken(GOOD_AZURE, change))
    assert any(said in p for p in problems), problems


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_id)
def test_every_stack_says_where_its_monitoring_view_is_or_why_it_has_none(path: Path) -> None:
    cfg, result = planned(path)
    out = result.outputs["dashboard"]
    if cfg.provider == "aws":
        assert out["url"] == (
            f"https://{cfg.region}.console.aws.amazon.com/cloudwatch/home?region={cfg.region}"
            f"#dashboards:name={out['name']}"
        )
        (dash,) = result.of_type("aws:cloudwatch/dashboard:Dashboard")
        assert dash.inputs["dashboardName"] == out["name"]
    elif cfg.provider == "azure":
        (book,) = result.of_type("azure-native:applicationinsights:Workbook")
        assert out["url"] == f"https://portal.azure.com/#resource{book.id}"
        assert out["name"] == book.inputs["displayName"]
    elif cfg.provider == "alicloud":
        (group,) = result.of_type("alicloud:cms/monitorGroup:MonitorGroup")
        (members,) = result.of_type("alicloud:cms/monitorGroupInstances:MonitorGroupInstances")
        nodes = result.of_type("alicloud:ecs/instance:Instance")
        assert members.inputs["groupId"] == group.id
        listed = members.inputs["instances"]
        assert sorted(i["instanceId"] for i in listed) == sorted(n.id for n in nodes)
        assert {(i["category"], i["regionId"]) for i in listed} == {("ecs", cfg.region)}
        assert out["name"] == group.inputs["monitorGroupName"] == f"gpufleet-{cfg.stack}"
        assert out["note"].endswith(f"Application Groups > gpufleet-{cfg.stack}")
    else:
        assert out["name"] is None and out["url"] is None
        assert "no Cloud Monitor dashboard resource" in out["note"]
