"""The node watchdog's idle stop on Alibaba Cloud: ECS StopInstance in economical mode
(StoppedMode=StopCharging), signed with the node's RAM role credentials, against the
RPC fake whose parameters are the SDK's StopInstanceRequest's (watchdog_fakes.FakeEcs);
its bounded retry, and the OS power-off it falls back to when the API refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.alicloud.program import lease_policy, node_policy
from infra.reaper import tags as T
from tests.gpufleet_node.test_watchdog import Timeline, alicloud_node, make_dog, nodebase, wd
from tests.gpufleet_node.watchdog_fakes import INSTANCE_ID, FakeEcs, FakeIMDS, serve
from tests.infra.alicloud_ram import Request, allowed

STACK = "a100x4"
OWN_TAGS = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK}


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeIMDS, FakeEcs, str, str]]:
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)  # the RAM role's keys
    meta, ecs = FakeIMDS(provider="alicloud"), FakeEcs()
    with serve(meta.handler()) as meta_url, serve(ecs.handler()) as api_url:
        yield meta, ecs, meta_url, api_url


def node(meta_url: str, api_url: str, naps: list[float] | None = None) -> Any:
    sleep = (naps if naps is not None else []).append
    return alicloud_node.AlicloudNode("cn-shanghai", api_url, meta_url, sleep=sleep)


@pytest.fixture
def os_poweroffs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(alicloud_node, "system_poweroff", lambda: calls.append(1))
    return calls


def test_poweroff_is_stop_instance_in_economical_mode_for_this_instance(
    clouds: tuple[FakeIMDS, FakeEcs, str, str], os_poweroffs: list[int]
) -> None:
    _meta, ecs, meta_url, api_url = clouds
    node(meta_url, api_url).poweroff()
    assert ecs.stopped == {INSTANCE_ID: "StopCharging"}
    assert ecs.bad_signatures == 0
    call = ecs.calls[-1]
    assert (call["Action"], call["SecurityToken"], call["ForceStop"]) == (
        "StopInstance",
        "st",
        "false",
    )
    assert "RegionId" not in call  # StopInstanceRequest has none; the fake refuses one
    assert not os_poweroffs


def test_throttling_and_5xx_are_retried_then_raised_for_the_next_run(
    clouds: tuple[FakeIMDS, FakeEcs, str, str], os_poweroffs: list[int]
) -> None:
    _meta, ecs, meta_url, api_url = clouds
    naps: list[float] = []
    ecs.stop_errors = [(400, "Throttling.User"), (503, "ServiceUnavailable")]
    node(meta_url, api_url, naps).poweroff()
    assert ecs.stopped == {INSTANCE_ID: "StopCharging"} and naps == [2.0, 4.0]
    ecs.stopped.clear()
    ecs.stop_errors = [(503, "ServiceUnavailable")] * 10
    with pytest.raises(alicloud_node.AlicloudApiError, match="503"):
        node(meta_url, api_url, naps).poweroff()
    assert not ecs.stopped and not os_poweroffs  # still running: the next run tries again
    assert len(ecs.stop_errors) == 10 - nodebase.LEASE_TAG_ATTEMPTS  # bounded


def test_a_refusal_falls_back_to_the_os_poweroff_once(
    clouds: tuple[FakeIMDS, FakeEcs, str, str], os_poweroffs: list[int]
) -> None:
    _meta, ecs, meta_url, api_url = clouds
    ecs.stop_errors = [(403, "Forbidden.RAM")]
    node(meta_url, api_url).poweroff()
    assert os_poweroffs == [1] and not ecs.stopped
    assert [c["Action"] for c in ecs.calls] == ["StopInstance"]  # a refusal is final


def test_without_role_credentials_the_node_powers_off_from_the_os(
    clouds: tuple[FakeIMDS, FakeEcs, str, str], os_poweroffs: list[int]
) -> None:
    meta, ecs, meta_url, api_url = clouds
    meta.credentials = False
    node(meta_url, api_url).poweroff()
    assert os_poweroffs == [1] and not ecs.calls


def test_the_idle_stop_saves_scratch_first_then_stops_in_economical_mode(
    tmp_path: Path, clouds: tuple[FakeIMDS, FakeEcs, str, str], os_poweroffs: list[int]
) -> None:
    _meta, ecs, meta_url, api_url = clouds
    dog, probe, rec = make_dog(tmp_path, Timeline(), provider="alicloud", region="cn-shanghai")
    cloud = node(meta_url, api_url)

    def stop() -> None:
        rec.events.append(("poweroff", probe.minutes))
        cloud.poweroff()

    dog.poweroff = stop
    for _ in range(60):  # bounded: the idle limit is reached well inside an hour
        if dog.run_once().stop:
            break
        probe.clock += wd.dt.timedelta(minutes=1)
    kinds = [e for e, _ in rec.events if e.startswith(("sync", "poweroff"))]
    assert kinds[-2].startswith("sync") and kinds[-1] == "poweroff"
    assert ecs.stopped == {INSTANCE_ID: "StopCharging"} and not os_poweroffs


# ---------------------------------------------------------------- RAM


def _node_documents(instance: str = "i-own") -> list[dict[str, Any]]:
    return [
        json.loads(node_policy("gpufleet-a100x4-abc", STACK)),
        json.loads(lease_policy(instance, STACK)),
    ]


def _arn(iid: str) -> str:
    return f"acs:ecs:cn-shanghai:123456789012:instance/{iid}"


def _tags(tags: dict[str, str]) -> dict[str, str]:
    return {f"acs:ResourceTag/{k}": v for k, v in tags.items()}


def test_the_node_role_may_stop_its_own_instance() -> None:
    assert allowed(_node_documents(), Request("ecs:StopInstance", _arn("i-own"), _tags(OWN_TAGS)))


def test_the_node_role_may_not_stop_a_sibling_another_stack_or_terminate_itself() -> None:
    own = _tags(OWN_TAGS)
    docs = _node_documents()
    assert not allowed(docs, Request("ecs:StopInstance", _arn("i-sibling"), own))
    other = _tags({**OWN_TAGS, T.STACK: "other"})
    assert not allowed(docs, Request("ecs:StopInstance", _arn("i-own"), other))
    for action in ("ecs:DeleteInstance", "ecs:DeleteInstances", "ecs:StopInstances"):
        assert not allowed(docs, Request(action, _arn("i-own"), own)), action
    assert not allowed(docs, Request("ecs:StartInstance", _arn("i-own"), own))


def test_a_node_of_another_stack_may_not_stop_ours() -> None:
    theirs = [
        json.loads(node_policy("gpufleet-other-abc", "other")),
        json.loads(lease_policy("i-theirs", "other")),
    ]
    ours = Request("ecs:StopInstance", _arn("i-own"), _tags(OWN_TAGS))
    assert not allowed(theirs, ours)


def test_the_fakes_refuse_a_field_the_sdks_list_item_model_does_not_define() -> None:
    from alibabacloud_cms20190101 import models

    from tests.support.alicloud_models import unknown_params

    sent = {"RegionId": "cn-shanghai", "MetricList.1.Values": "{}", "MetricList.1.GroupId": "0"}
    assert unknown_params(models.PutCustomMetricRequest, sent) == []
    misspelt = {**sent, "MetricList.1.Value": "{}", "MetricsList.1.Values": "{}"}
    assert unknown_params(models.PutCustomMetricRequest, misspelt) == [
        "MetricList.1.Value",
        "MetricsList.1.Values",
    ]


def test_a_lease_tag_answered_by_something_other_than_the_api_is_not_written(
    tmp_path: Path,
) -> None:
    from tests.gpufleet_node.watchdog_fakes import _Quiet

    class Portal(_Quiet):
        def do_POST(self) -> None:
            self._send(200, "<html>welcome</html>", "text/html")

    creds = {"access_key_id": "ak", "secret": "secret", "token": "st"}
    with serve(Portal) as url:
        cloud = alicloud_node.AlicloudNode("cn-shanghai", url)
        with pytest.raises(ValueError, match="not an API answer"):
            cloud.write_tag(INSTANCE_ID, wd.names.KEEP_ALIVE_UNTIL, "2026-12-01T12:00:00Z", creds)
    ecs = FakeEcs()
    with serve(ecs.handler()) as url:
        alicloud_node.AlicloudNode("cn-shanghai", url).write_tag(INSTANCE_ID, "k", "v", creds)
    assert ecs.tags == {INSTANCE_ID: {"k": "v"}}
