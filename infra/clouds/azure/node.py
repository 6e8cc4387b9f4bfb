"""Azure as the node sees it: IMDS, Scheduled Events, ARM, Azure Monitor, Blob Storage
(registered as "azure")."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet_node import bucket
from gpufleet_node import fleet_names as names
from gpufleet_node.clouds.base import (
    UTC,
    Credentials,
    Metric,
    TagsUnreadable,
    register,
    retry_idempotent,
)

# Scheduled Events (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events): an
# eviction of a Spot VM is an event of type "Preempt" naming this VM; NotBefore is at least
# 30 seconds after it appears.
PREEMPT = "Preempt"
IMDS_API = "2021-02-01"
SCHEDULED_EVENTS_API = "2020-07-01"
ARM_API_COMPUTE = "2024-07-01"
ARM_API_TAGS = "2021-04-01"
ARM = "https://management.azure.com"
AUDIENCES = {
    "token": "https://management.azure.com/",  # ARM: tags, deallocate
    "monitor": "https://monitoring.azure.com/",  # custom metrics
    "storage": "https://storage.azure.com/",  # the blob container
}


def parse_scheduled_events(text: str | None, vm_name: str) -> str | None:
    """The eviction notice in a Scheduled Events answer, or None.

    A notice is a ``Preempt`` event whose Resources name this VM (or name none); its text is
    ``Preempt <EventId> <NotBefore>``, which changes per eviction. An unreadable answer is
    None: a notice only triggers an extra sync, it never stops anything.
    """
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return None
    for event in events:
        if not isinstance(event, dict) or event.get("EventType") != PREEMPT:
            continue
        resources = event.get("Resources")
        if isinstance(resources, list) and resources and vm_name not in resources:
            continue
        return f"{PREEMPT} {event.get('EventId', '?')} {event.get('NotBefore', '')}".strip()
    return None


class AzureImds:
    """Azure's Instance Metadata Service: plain GETs with ``Metadata: true`` (it refuses a
    request without it, and any request carrying X-Forwarded-For)."""

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def get_json(self, path: str, **query: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return json.loads(resp.read().decode() or "null")


@register
@dataclass
class AzureNode:
    """Azure VM: IMDS (169.254.169.254, ``Metadata: true``) for its identity (compute.name,
    resourceId, location) and its own tags (``compute.tagsList``), managed-identity tokens
    from IMDS for ARM, Azure Monitor and Blob Storage; heartbeat + GPU metrics as Azure
    Monitor custom metrics on the regional ``<location>.monitoring.azure.com`` endpoint; the
    lease tag through ARM's Tags - Update At Scope (Merge); the bucket is a Blob container
    (bucket.BlobStore); Spot eviction from Scheduled Events (Preempt).

    Power-off is a deallocation through ARM with the VM's managed identity, never an OS
    shutdown: a VM shut down from inside is "Stopped" and still billed for its compute (and
    its GPUs); only a deallocated VM is not. The watchdog calls it after the scratch sync
    (deallocation erases the local NVMe). Raises when ARM does not accept it (the next run
    tries again); it never falls back to a shutdown that keeps billing.
    """

    region: str
    endpoint_url: str = ""  # ARM and the metrics endpoint (tests: one local fake for both)
    metadata_url: str = ""
    timeout: float = 10.0
    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "azure"
    joined: ClassVar[int] = 4  # the order messages list the clouds in
    # Azure keeps no reason for a deallocation: the watchdog tags its own stops and the
    # eviction notices it sees (gpufleet:stopped-by, through write_tag's Tags Merge, the
    # lease's permission), so the reaper's function starts only an evicted VM again.
    writes_stop_record: ClassVar[bool] = True
    bucket_store: ClassVar[type[bucket.BucketStore]] = bucket.BlobStore

    @property
    def imds(self) -> AzureImds:
        return AzureImds(self.metadata_url or "http://169.254.169.254")

    def compute(self) -> dict[str, Any] | None:
        try:
            doc = self.imds.get_json("/metadata/instance/compute", **{"api-version": IMDS_API})
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def instance_id(self) -> str | None:
        """The VM's name: what the reaper and the stack call the instance."""
        doc = self.compute()
        name = doc.get("name") if doc else None
        return str(name) if name else None

    def resource_id(self) -> str:
        doc = self.compute() or {}
        rid = str(doc.get("resourceId") or "")
        if not rid.startswith("/subscriptions/"):
            raise RuntimeError("IMDS gave no resourceId for this VM")
        return rid

    def env_credentials(self) -> Credentials | None:
        return None  # no key pair exists for a managed identity: the tokens come from IMDS

    def credentials(self) -> Credentials | None:
        """Managed-identity tokens for each audience this node calls (AUDIENCES); None when
        IMDS has no identity to give. ``token`` is ARM's."""
        found: Credentials = {"access_key_id": "managed-identity", "secret": ""}
        for key, resource in AUDIENCES.items():
            try:
                doc = self.imds.get_json(
                    "/metadata/identity/oauth2/token",
                    **{"api-version": "2018-02-01", "resource": resource},
                )
            except (urllib.error.URLError, OSError, ValueError):
                return None
            token = doc.get("access_token") if isinstance(doc, dict) else None
            if not isinstance(token, str) or not token:
                return None
            found[key] = token
        return found

    def spot_notice(self) -> str | None:
        try:
            doc = self.imds.get_json(
                "/metadata/scheduledevents", **{"api-version": SCHEDULED_EVENTS_API}
            )
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return parse_scheduled_events(json.dumps(doc), self.instance_id() or "")

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """From IMDS ``compute.tagsList``: no API call, no token."""
        del instance_id, creds
        try:
            doc = self.imds.get_json("/metadata/instance/compute", **{"api-version": IMDS_API})
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TagsUnreadable(f"metadata service: {exc}") from None
        listed = doc.get("tagsList") if isinstance(doc, dict) else None
        if not isinstance(listed, list):
            raise TagsUnreadable("IMDS compute has no tagsList")
        tags: dict[str, str] = {}
        for item in listed:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise TagsUnreadable(f"tagsList entry {str(item)[:60]!r} is not a tag")
            tags[item["name"]] = str(item.get("value") or "")
        return tags

    def _send(self, method: str, url: str, token: str, body: Any = None) -> int:
        data = json.dumps(body).encode() if body is not None else b""
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            resp.read()
            return int(resp.status)

    def _arm(self) -> str:
        return (self.endpoint_url or ARM).rstrip("/")

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        del instance_id
        url = f"{self._arm()}{self.resource_id()}/providers/Microsoft.Resources/tags/default"
        body = {"operation": "Merge", "properties": {"tags": {key: value}}}
        self._send("PATCH", f"{url}?api-version={ARM_API_TAGS}", creds["token"], body)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        """One POST per metric (the custom metrics API takes one metric per request), on the
        VM's resource id, namespace ``gpufleet``, no dimensions.

        Azure needs the datapoint's ``time`` in the body (it does not stamp it on receipt, as
        CloudWatch and CloudMonitor do) and accepts only times from 20 minutes in the past to
        5 minutes in the future: the node's clock (kept by the Azure host's time sync) is
        bounded by the service, and the reaper reads the minute buckets it stored.
        """
        del instance_id
        base = self.endpoint_url or f"https://{self.region}.monitoring.azure.com"
        url = f"{base.rstrip('/')}{self.resource_id()}/metrics"
        when = dt.datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        token = creds.get("monitor") or ""
        if not token:
            raise RuntimeError("no Azure Monitor token (the VM's managed identity)")
        for name, value, _unit in metrics:
            body = {
                "time": when,
                "data": {
                    "baseData": {
                        "metric": name,
                        "namespace": names.NAMESPACE,
                        "dimNames": [],
                        "series": [
                            {"dimValues": [], "min": value, "max": value, "sum": value, "count": 1}
                        ],
                    }
                },
            }
            self._send("POST", url, token, body)

    def bucket_endpoint(self) -> str:
        # The storage account goes in front of the host (bucket.BlobStore).
        return "https://blob.core.windows.net"

    def poweroff(self) -> None:
        """Deallocate this VM through ARM (202 Accepted: the platform finishes it)."""
        creds = self.credentials()
        if not creds:
            raise RuntimeError("cannot deallocate: no managed-identity token from IMDS")
        url = f"{self._arm()}{self.resource_id()}/deallocate?api-version={ARM_API_COMPUTE}"

        def deallocate() -> None:
            status = self._send("POST", url, creds["token"])
            if status not in (200, 202):
                raise RuntimeError(f"deallocate answered HTTP {status}")

        retry_idempotent(deallocate, sleep=self.sleep)  # bounded; throttling, 5xx retried
