"""Evaluate the real program offline, under Pulumi's own mocks: no CLI, no account, no network.

The mocks record every resource exactly as the engine would receive it (type, name, inputs in
the engine's camelCase) and answer the few invokes the program makes with realistic data.
What a cloud answers is its own: each cloud folder's mocks.py (infra/clouds/<name>/) fills in
the outputs of its resource types and answers its invokes, found by the Pulumi package its
type tokens start with (``PACKAGE``), so this module names no cloud.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import pulumi
import pulumi.resource
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.proto import resource_pb2

from infra import clouds
from infra.config import StackConfig

PLACEHOLDER_SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLANONLYPLACEHOLDERKEYxxxxxxxxxxxxxxxxxxxxx "
    "gpufleet-plan-placeholder"
)


@dataclass
class RecordedResource:
    type: str
    name: str
    inputs: dict[str, Any]
    id: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)
    urn: str = ""
    parent: str = ""  # the parent's URN: the stack's for top-level resources
    dependencies: tuple[str, ...] = ()  # URNs this resource's inputs or dependsOn refer to
    retain_on_delete: bool = False  # the resource option: a destroy leaves it in the cloud

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "urn": self.urn,
            "parent": self.parent,
            "dependencies": list(self.dependencies),
            "inputs": self.inputs,
        }


@dataclass
class PlanResult:
    resources: list[RecordedResource]
    outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stack_urn: str = ""

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_]


def keep_number_kinds(value: Any) -> Any:
    """Whole floats back to ints, everywhere in `value`.

    Inputs reach the mocks through protobuf's Struct, which has only doubles: `fromPort=22`
    arrives as 22.0. The engine's own display (and the provider) read them as JSON numbers, so
    a whole number is shown as one."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: keep_number_kinds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keep_number_kinds(v) for v in value]
    return value


def _digest(*parts: str, n: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


class Engine(Protocol):
    """What a cloud's mocks.py may ask of the fake engine while it answers."""

    region: str

    def digest(self, *parts: str, n: int = 8) -> str: ...

    def ips_for(self, name: str) -> tuple[str, str]: ...

    def recorded(self, typ: str) -> list[RecordedResource]: ...


def cloud_mocks() -> dict[str, ModuleType]:
    """Each cloud's mocks.py by the Pulumi package its type tokens start with ("aws",
    "azure-native"): the list is the cloud folders that have one."""
    found = (clouds.module(name, "mocks") for name in clouds.names("mocks.py"))
    return {mod.PACKAGE: mod for mod in found}


class Mocks(pulumi.runtime.Mocks):
    """Deterministic fake engine: same program, same answers, every run."""

    digest = staticmethod(_digest)

    def __init__(self, stack: str, region: str):
        self.stack, self.region = stack, region
        self.resources: list[RecordedResource] = []
        self.invokes: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._clouds = cloud_mocks()

    @staticmethod
    def ips_for(name: str) -> tuple[str, str]:
        """Stable per name (resources register concurrently, so no counters)."""
        n = int(_digest("ip", name), 16)
        # 198.51.100.0/24 is a documentation range: never a real host.
        return f"198.51.100.{10 + n % 240}", f"10.42.{n // 240 % 15}.{10 + n % 240}"

    def recorded(self, typ: str) -> list[RecordedResource]:
        """The resources of one type registered so far (a cloud's answer may depend on
        them: an EC2 instance's interfaces are its launch template's)."""
        with self._lock:
            return [r for r in self.resources if r.type == typ]

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = keep_number_kinds(dict(args.inputs))
        record = RecordedResource(args.typ, args.name, inputs, **_registering.__dict__)
        with self._lock:
            self.resources.append(record)
        rid = f"{args.name}-{_digest(args.typ, args.name)}"
        out = dict(inputs)
        typ = args.typ
        cloud = self._clouds.get(typ.split(":")[0])
        if cloud is not None:
            rid = cloud.resource(typ, args.name, inputs, out, rid, self)
        elif typ == "random:index/randomId:RandomId":
            raw = bytes.fromhex(_digest("random", args.name, n=2 * int(inputs["byteLength"])))
            out.update(hex=raw.hex(), dec=str(int.from_bytes(raw, "big")))
        out.setdefault("id", rid)
        record.id, record.outputs = rid, out
        return rid, out

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return self._answer(args), []

    def _answer(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        inputs = dict(args.args)
        with self._lock:
            self.invokes.append((args.token, inputs))
        token = args.token
        cloud = self._clouds.get(token.split(":")[0])
        answer = None if cloud is None else cloud.invoke(token, inputs, self)
        if answer is None:
            raise NotImplementedError(
                f"no offline answer for invoke {token}: add one in the cloud's mocks.py"
            )
        return dict(answer)


# What RecordingMonitor knows of the registration in progress on this thread (urn, parent,
# dependencies), for Mocks.new_resource, which the SDK calls without them.
_registering = threading.local()


def _in_own_event_loop(call: Callable[[Any], Any], request: Any) -> Any:
    """Run one monitor call on a worker thread in an event loop that is closed afterwards.

    The SDK runs monitor calls on its executor's threads, and each call there creates an event
    loop for the thread (`_ensure_event_loop`) that nobody closes. At interpreter exit those
    loops were collected after their self-pipe sockets, and `BaseEventLoop.__del__` printed
    "Exception ignored ... Invalid file descriptor: -1" now and then."""
    if threading.current_thread() is threading.main_thread():
        return call(request)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return call(request)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


class RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, plus where each resource sits in the tree and what it needs."""

    def __init__(self, mocks: Mocks):
        super().__init__(mocks)
        self.stack_urn = ""

    def RegisterResource(self, request: Any) -> Any:  # the gRPC method's name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            self.stack_urn = urn
        deps = {*request.dependencies}
        for prop in request.propertyDependencies.values():
            deps.update(prop.urns)
        _registering.__dict__.update(
            urn=urn,
            parent=request.parent,
            dependencies=tuple(sorted(deps)),
            retain_on_delete=bool(request.retainOnDelete),
        )
        try:
            return _in_own_event_loop(super().RegisterResource, request)
        finally:
            _registering.__dict__.clear()

    def Invoke(self, request: Any) -> Any:
        return _in_own_event_loop(super().Invoke, request)

    def ReadResource(self, request: Any) -> Any:
        return _in_own_event_loop(super().ReadResource, request)


_RUN_LOCK = threading.Lock()  # Pulumi's runtime settings are process-global

# What `Resource.__init__` does with each alias when the engine takes alias specs: nothing
# of it is ever read (see `_aliases_sent_as_specs`).
_NOT_COLLAPSED = object()


@contextlib.contextmanager
def _aliases_sent_as_specs() -> Iterator[None]:
    """Skip the SDK's work on aliases that the engine, not the SDK, resolves.

    Every azure-native resource carries its type's older API versions as aliases (the 33
    resources of azure-t4x1 carry 717). `Resource.__init__` collapses each into a URN
    Output (`pulumi.resource.collapse_alias_to_urn`, about ten Outputs and tasks each), and
    the only reader of those URNs, `pulumi.runtime.resource.all_aliases`, is called only for
    an engine without alias specs. The mock monitor, like the Pulumi CLI, takes alias specs
    (`RESOURCE_MONITOR_FEATURE_ALIAS_SPECS`), so each resource still sends its aliases, as
    specs, to the monitor; only the unread URNs are not built. Measured: an Azure plan's
    program 1.0 -> 0.35 CPU s once the SDK is loaded. For an engine without alias specs the
    SDK's own function runs unchanged. tests/infra/test_offline_aliases.py proves that the
    plan is the same and fails if the SDK starts reading those URNs elsewhere."""
    collapse = pulumi.resource.collapse_alias_to_urn
    specs = resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS

    def collapse_unless_specs(*args: Any) -> Any:
        if pulumi_settings.monitor_supports_feature(specs):
            return _NOT_COLLAPSED
        return collapse(*args)

    pulumi.resource.collapse_alias_to_urn = collapse_unless_specs  # type: ignore[assignment]
    try:
        yield
    finally:
        pulumi.resource.collapse_alias_to_urn = collapse


def evaluate(cfg: StackConfig, project: str = "gpufleet") -> PlanResult:
    """Run the real program for `cfg` under mocks and return what it declared.

    It runs in an event loop of its own, whose executor threads and loop are shut and closed
    before it returns: nothing of the run is left for the interpreter to collect at exit."""
    from infra.program import build

    with _RUN_LOCK, _aliases_sent_as_specs():
        mocks = Mocks(cfg.stack, cfg.region)
        monitor = RecordingMonitor(mocks)
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # set_mocks registers a Stack only when there is no root resource yet: a second run
        # in one process (the tests plan every stack) would hang its resources under the
        # first run's Stack, of another stack name, and record no stack URN of its own.
        pulumi_settings.ROOT.set(None)
        try:
            pulumi.runtime.set_mocks(
                mocks, project=project, stack=cfg.stack, preview=False, monitor=monitor
            )
            captured: dict[str, Any] = {}

            @pulumi.runtime.test
            def _run() -> pulumi.Output[Any]:
                outputs = build(cfg)
                return pulumi.Output.from_input(outputs).apply(captured.update)

            _run()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()
            pulumi_settings.ROOT.set(None)
        # Resources and invokes register from concurrent threads, so their arrival order
        # changes run to run: the plan is handed out in URN (and token) order instead, so
        # `plan.py --json` is byte-identical for an unchanged stack.
        resources = sorted(mocks.resources, key=lambda r: r.urn)
        invokes = sorted(mocks.invokes, key=lambda i: (i[0], repr(sorted(i[1].items()))))
        return PlanResult(resources, captured, invokes, monitor.stack_urn)
