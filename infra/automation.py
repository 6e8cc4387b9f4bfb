"""The failover loop's engine: Pulumi's Automation API, kept thin (infra/failover.py Engine).

Each method is one Automation API call on the project's own stack (Pulumi.yaml in the repo
root, stack files in stacks/): the Pulumi CLI runs it as `pulumi up` would, with the policy
pack. The Pulumi CLI cannot be installed on the machines that test this project, so this
module is the one part of `make up` that only a real account exercises; the tests drive the
loop through a fake Engine instead. An update's failure reaches us as
pulumi.automation.errors.CommandError, whose text is the CLI's exit code, stdout and stderr
(sdk/python/lib/pulumi/automation/_cmd.py CommandResult.__str__); the provider's error is
in the stdout's Diagnostics section, which infra/capacity.py reads.
"""

from __future__ import annotations

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
