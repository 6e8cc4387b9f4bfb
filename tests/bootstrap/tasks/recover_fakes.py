"""The engine seam of ``fab recover`` (infra.failover.NodeEngine) over a stack's real URNs.

The state is the offline plan's resources of a real stack file (infra/offline.py runs the
program under Pulumi's mocks, whose URNs are the engine's), so the URNs a test sees targeted
are the ones `pulumi up --target` would get. The cloud is a set of deleted URNs. The answers
follow Pulumi's own rules, read in pulumi/pulumi at 1b59498 (2026-08-21):

- a refresh reports a resource the cloud no longer has as ``delete`` and drops it from the
  state (pkg/resource/deploy/step.go RefreshStep.ResultOp / New; pkg/engine/update.go counts
  that op in the summary); only the targeted URNs are read
  (sdk/python/lib/pulumi/automation/_stack.py refresh/preview_refresh ``target``);
- a targeted update creates the targeted resources missing from the state and, with
  ``target_dependents``, updates the resources that depend on them
  (pkg/resource/deploy/step_generator.go isTargetedForUpdate); the operation names are the
  SDK's OpType values (sdk/python/lib/pulumi/automation/events.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NODE_TYPE = "gpufleet:node:GpuNode"


@functools.lru_cache(maxsize=4)
def _planned(stack: str) -> tuple[str, ...]:
    from infra.config import load_stack_file
    from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
    from infra.stackfiles import STACKS_DIR, find_stack

    cfg = load_stack_file(find_stack(stack, STACKS_DIR), {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    return tuple(
        json.dumps(
            {
                "urn": r.urn,
                "type": r.type,
                "parent": r.parent,
                "dependencies": list(r.dependencies or []),
                "custom": not r.type.startswith("gpufleet:"),
            }
        )
        for r in evaluate(cfg).resources
    )


def stack_state(stack: str) -> list[dict[str, Any]]:
    """The stack's resources as `pulumi stack export` lists them (urn, type, parent ...)."""
    return [json.loads(x) for x in _planned(stack)]


def instance_urn(stack: str, node: str) -> str:
    return next(
        r["urn"]
        for r in stack_state(stack)
        if r["urn"].endswith(f"::{node}") and r["custom"] and r["parent"].endswith(f"::{node}")
    )


@dataclass
class FakeStack:
    """NodeEngine over ``state`` (resource dicts) and a cloud that deleted ``deleted``."""

    state: list[dict[str, Any]]
    outputs_now: dict[str, Any]
    outputs_after: dict[str, Any]
    deleted: set[str] = field(default_factory=set)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    fail_update: str = ""  # the update's error text, when it fails

    def resources(self) -> list[Mapping[str, Any]]:
        self.calls.append(("resources", ()))
        return [dict(r) for r in self.state]

    def outputs(self) -> Mapping[str, Any]:
        self.calls.append(("outputs", ()))
        return json.loads(json.dumps(self.outputs_now))

    def _in_state(self) -> set[str]:
        return {r["urn"] for r in self.state}

    def refresh_would_delete(self, urns: Sequence[str]) -> list[str]:
        self.calls.append(("preview_refresh", tuple(urns)))
        return [u for u in urns if u in self.deleted and u in self._in_state()]

    def refresh_only(self, urns: Sequence[str]) -> dict[str, int]:
        self.calls.append(("refresh", tuple(urns)))
        gone = [u for u in urns if u in self.deleted and u in self._in_state()]
        self.state = [r for r in self.state if r["urn"] not in gone]
        return {"delete": len(gone), "same": len([u for u in urns if u in self._in_state()])}

    def _plan(self, urns: Sequence[str]) -> dict[str, int]:
        have = self._in_state()
        create = [u for u in urns if u not in have]
        dependents = [
            r["urn"]
            for r in self.state
            if r["urn"] not in urns and set(r["dependencies"]) & set(create)
        ]
        return {"create": len(create), "update": len(dependents), "same": len(urns) - len(create)}

    def preview_only(self, urns: Sequence[str]) -> dict[str, int]:
        self.calls.append(("preview", tuple(urns)))
        return self._plan(urns)

    def update_only(self, urns: Sequence[str]) -> dict[str, int]:
        from infra.failover import UpdateFailed

        self.calls.append(("update", tuple(urns)))
        if self.fail_update:
            raise UpdateFailed(self.fail_update)
        plan = self._plan(urns)
        have = self._in_state()
        planned = {r["urn"]: r for r in stack_state(self.stack)}
        self.state += [dict(planned[u]) for u in urns if u not in have and u in planned]
        self.deleted -= set(urns)
        self.outputs_now = self.outputs_after
        return plan

    @property
    def stack(self) -> str:
        return str(self.outputs_now.get("stack"))

    def changed(self) -> list[tuple[str, tuple[str, ...]]]:
        """The calls that change the state or the cloud."""
        return [c for c in self.calls if c[0] in ("refresh", "update")]


def outputs(stack: str, nodes: Sequence[tuple[str, int]], **extra: Any) -> dict[str, Any]:
    """Stack outputs with ``nodes`` ((address, ssh port) each), named <stack>-<i>."""
    data: dict[str, Any] = {
        "stack": stack,
        "provider": "aws",
        "region": "us-east-1",
        "nodes": [
            {
                "name": f"{stack}-{i}",
                "role": "head" if i == 0 else "worker",
                "instance_id": f"i-{i}",
                "public_ip": address,
                "private_ip": address,
                "ssh_port": port,
            }
            for i, (address, port) in enumerate(nodes)
        ],
        "ssh_user": "gpufleet-node",
    }
    data.update(extra)
    return data


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def ssh_banner() -> Iterator[int]:
    """A loopback port that answers with an SSH server's identification line (the line
    the test sshd sends first, ``SSH-2.0-OpenSSH_...``), then closes: a node that is up."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6 fake\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        srv.close()
