"""The reaper's parsers on answers shaped like Azure's recorded real ones
(tests/reaper/azure_recorded.py names each recording), read through the SDKs' own
deserializers: a misread field name or nesting fails here, whatever our fakes say."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from azure.mgmt.compute._utils.model_base import _deserialize
from azure.mgmt.compute.models import VirtualMachine
from azure.monitor.query import MetricsQueryResult

from infra.clouds.azure import reaper as reaper
from tests.reaper import azure_recorded as rec


def listed(page: dict[str, Any]) -> list[Any]:
    """The page as Virtual Machines - List hands it to us: the SDK's own extract_data
    deserializes ``value`` as List[VirtualMachine] (azure-mgmt-compute 39.0.0)."""
    return list(_deserialize(list[VirtualMachine], page.get("value", [])))


def test_a_listed_vm_with_its_instance_view_parses_as_azure_sends_it():
    (vm,) = listed(rec.VM_LIST_PAGE)
    inst = reaper.parse_vm(vm)
    assert inst.problem is None
    assert inst.instance_id == rec.VM_NAME
    assert inst.state == "running"
    assert inst.instance_type == "Standard_NC4as_T4_v3"
    assert inst.spot is True
    assert inst.tags["gpufleet:stack"] == "azure-t4x1"
    # the newest of timeCreated and the last succeeded provisioning, seven digits read
    assert inst.launched_at == datetime(2026, 11, 30, 9, 15, 42, 765432, tzinfo=UTC)


def _with_power(code: str) -> dict[str, Any]:
    page = copy.deepcopy(rec.VM_LIST_PAGE)
    statuses = page["value"][0]["properties"]["instanceView"]["statuses"]
    statuses[1] = {"code": code, "level": "Info", "displayStatus": code}
    return page


def test_deallocated_and_stopped_but_allocated_are_told_apart():
    (gone,) = listed(_with_power("PowerState/deallocated"))
    (held,) = listed(_with_power("PowerState/stopped"))
    assert reaper.parse_vm(gone).state == "stopped"
    assert reaper.parse_vm(held).state == "stopped-allocated"  # still billed


def test_a_vm_listed_without_an_instance_view_is_a_problem_not_a_guess():
    page = copy.deepcopy(rec.VM_LIST_PAGE)
    del page["value"][0]["properties"]["instanceView"]
    (vm,) = listed(page)
    assert reaper.parse_vm(vm).problem == "no instance view"


class _Answering:
    """Stands in for the transport only: the answer is the SDK's own deserialization of
    a body in the recorded shape."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.result = MetricsQueryResult._from_generated(body)

    def query_resource(self, *_: Any, **__: Any) -> Any:
        return self.result


def _cloud(body: dict[str, Any]) -> reaper.AzureCloud:
    cloud = reaper.AzureCloud(
        "eastus", subscription_id=rec.SUB, resource_group=rec.GROUP, credential=object()
    )
    cloud._metrics = _Answering(body)
    return cloud


START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
END = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def test_metrics_read_the_last_beat_and_peak_utilisation_from_the_recorded_shape():
    body = rec.metrics_answer(
        beats=[("2026-12-01T09:40:00Z", 2), ("2026-12-01T09:41:00Z", 1)],
        util=[("2026-12-01T09:40:00Z", 3.0), ("2026-12-01T09:41:00Z", 41.5)],
    )
    # Azure lists every minute of the window; an empty one has a timeStamp and no count
    body["value"][0]["timeseries"][0]["data"].append({"timeStamp": "2026-12-01T09:42:00Z"})
    got = _cloud(body).metrics([rec.VM_NAME], start=START, end=END)[rec.VM_NAME]
    assert got.error is None
    assert got.last_heartbeat == datetime(2026, 12, 1, 9, 41, tzinfo=UTC)
    assert got.max_gpu_util == 41.5


def test_a_metric_with_no_timeseries_means_no_beat_not_an_error():
    body = rec.metrics_answer(beats=[], util=[])
    got = _cloud(body).metrics([rec.VM_NAME], start=START, end=END)[rec.VM_NAME]
    assert got.error is None
    assert got.last_heartbeat is None and got.max_gpu_util is None


def test_an_answer_missing_a_metric_is_unreadable_so_the_vm_counts_as_active():
    body = rec.metrics_answer(beats=[("2026-12-01T09:40:00Z", 1)], util=[])
    body["value"] = body["value"][:1]
    got = _cloud(body).metrics([rec.VM_NAME], start=START, end=END)[rec.VM_NAME]
    assert got.error and "GPUUtilization" in got.error
