"""The failover loop's engine: Pulumi's Automation API, kept thin (infra/failover.py Engine).

Each method is one Automation API call on the project's own stack (Pulumi.yaml in the repo
root, stack files in stacks/): the Pulumi CLI runs it as `pulumi up` would, with the policy
pack. The Pulumi CLI cannot be installed on the machines that test this project, so this
module is the one part of `make up` that only a real account exercises; the tests drive the
loop through a fake Engine instead. An update's failure reaches us as
pulumi.automation.errors.CommandError, whose text is the CLI's exit code, stdout and stderr
(sdk/python/lib/pulumi/automation/_cmd.py CommandResult.__str__); the provider's error is
in the stdout's Diagnostics section, which infra/capacity.py reads.

`fab recover` (bootstrap/tasks/recover.py) uses the node methods below (failover.NodeEngine):
each is one Automation API call limited to one node's URNs with ``target`` (read in
sdk/python/lib/pulumi/automation/_stack.py, pulumi/pulumi at 1b59498, 2026-08-21: up, preview,
refresh and preview_refresh take ``target``, up and preview ``target_dependents``; they
become the CLI's --target / --target-dependents). A refresh reports a resource the cloud no
longer has as a ``delete`` in its summary (pkg/resource/deploy/step.go RefreshStep.ResultOp,
counted by pkg/engine/update.go), which is how a deleted instance is told from a stopped one.
The root stack resource is always part of a targeted update (step_generator.go: "Implicitly
targeted resources (providers, root stack)"), so the outputs name the new node's address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.failover import UpdateFailed
from infra.placement import Candidate

ROOT = Path(__file__).resolve().parent.parent
KEY = "gpufleet:placement"


class PulumiEngine:
    """One stack through pulumi.automation (imported only when `make up` runs)."""

    def __init__(self, stack: str, say: Any = print):
        from pulumi import automation as auto

        self._auto = auto
        self._say = say
        self.stack = auto.create_or_select_stack(stack_name=stack, work_dir=str(ROOT))

    def update(self, candidate: Candidate) -> None:
        # gpufleet:placement was set by record(): the program's zone: auto resolution takes it
        try:
            self.stack.up(on_output=self._say, policy_packs=[str(ROOT / "policy")])
        except self._auto.errors.CommandError as exc:
            raise UpdateFailed(str(exc)) from None

    def destroy(self) -> None:
        self.stack.destroy(on_output=self._say)

    def refresh(self) -> None:
        # An update killed mid-way leaves pending creates: drop them from the state (the
        # nodes carry the stack's tags, so the idle reaper finds one the state lost).
        self.stack.refresh(on_output=self._say, clear_pending_creates=True)

    def resource_count(self) -> int:
        state = self.stack.export_stack().deployment or {}
        resources = state.get("resources") or []
        return sum(1 for r in resources if r.get("type") != "pulumi:pulumi:Stack")

    def recorded(self) -> str | None:
        config = self.stack.get_all_config()
        value = config.get(KEY)
        return value.value if value is not None else None

    def record(self, key: str | None) -> None:
        if key is None:
            if self.recorded() is not None:  # removing a key that is not set is an error
                self.stack.remove_config(KEY)
        else:
            self.stack.set_config(KEY, self._auto.ConfigValue(key))

    # ------------------------------------------------------------------ one node (recover)

    def resources(self) -> list[Mapping[str, Any]]:
        state = self.stack.export_stack().deployment or {}
        return [dict(r) for r in state.get("resources") or []]

    def outputs(self) -> Mapping[str, Any]:
        return {k: v.value for k, v in self.stack.outputs().items()}

    def refresh_would_delete(self, urns: Sequence[str]) -> list[str]:
        """The URNs of ``urns`` whose resource the cloud no longer has: a targeted
        preview_refresh, read from its events (nothing is written)."""
        gone: list[str] = []

        def seen(event: Any) -> None:
            meta = getattr(getattr(event, "res_outputs_event", None), "metadata", None)
            meta = meta or getattr(getattr(event, "resource_pre_event", None), "metadata", None)
            op = getattr(meta, "op", None)
            urn = str(getattr(meta, "urn", ""))
            if str(getattr(op, "value", op)) == "delete" and urn in urns and urn not in gone:
                gone.append(urn)

        self.stack.preview_refresh(target=list(urns), on_event=seen, on_output=self._say)
        return gone

    def refresh_only(self, urns: Sequence[str]) -> dict[str, int]:
        """Refresh these URNs alone: a deleted instance leaves the state."""
        result = self.stack.refresh(target=list(urns), on_output=self._say)
        return _ops(result.summary.resource_changes)

    def preview_only(self, urns: Sequence[str]) -> dict[str, int]:
        """What an update of these URNs (and what depends on them) would do, by operation."""
        result = self.stack.preview(
            target=list(urns), target_dependents=True, policy_packs=[str(ROOT / "policy")]
        )
        return _ops(result.change_summary)

    def update_only(self, urns: Sequence[str]) -> dict[str, int]:
        """Update these URNs (and what depends on them): the deleted instance is created
        again; UpdateFailed on an error."""
        try:
            result = self.stack.up(
                target=list(urns),
                target_dependents=True,
                on_output=self._say,
                policy_packs=[str(ROOT / "policy")],
            )
        except self._auto.errors.CommandError as exc:
            raise UpdateFailed(str(exc)) from None
        return _ops(result.summary.resource_changes)


def _ops(summary: Mapping[Any, int] | None) -> dict[str, int]:
    """An OpMap (OpType -> count) as plain operation names."""
    return {str(getattr(k, "value", k)): int(v) for k, v in (summary or {}).items()}
