"""Starting and stopping a stack's nodes from the laptop (``fab start`` / ``fab stop``).

A cloud that can do it has a power.py in its folder (found with
``infra.clouds.module(name, "power")``) with one function::

    connect(region, stack, env, endpoint) -> a client with
        describe(ids) -> {id: NodePower}   only the ids the cloud knows
        start(ids)    -> {id: why}         the ids whose start was refused
        stop(ids)     -> {id: why}         the ids whose stop was refused

``env`` holds the caller's environment (credentials, subscription); ``endpoint`` an API
URL instead of the cloud's own (tests). ``connect`` raises ValueError with a one-line
reason when it cannot make a client (no credentials): said before any call. The SDKs are
imported by the cloud modules only; each reuses its reaper's client (the same calls, the
same bounded retries), adding the start.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.reaper.core import Instance


@dataclass(frozen=True)
class NodePower:
    """One node as the cloud's API describes it: the reaper's view plus its addresses."""

    instance: Instance
    # None: the cloud keeps the address across a stop (a static IP), so the stack's
    # outputs still hold the right one.
    public_ip: str | None = None
    private_ip: str | None = None

    @property
    def state(self) -> str:
        return self.instance.state
