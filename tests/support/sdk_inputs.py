"""Resource inputs checked against the installed provider SDKs' own typed classes.

The truth here is the SDKs in .venv, never a list of ours:
- the type token -> resource class map is the registry JSON each SDK's ``__init__.py``
  hands to ``_utilities.register``;
- input names are the resource's ``_internal_init`` keywords and its ``*Args`` getters
  (``@pulumi.getter(name="camelName")``);
- nesting and each value's kind (string, bool, number) come from the getters' type hints
  (``Input[...]``, ``Sequence[...]``, ``Mapping[...]``, nested ``*Args`` classes);
- enum values come from the SDK's ``Enum`` classes where a hint is ``Union[str, Enum]``;
- a string the SDK types without an enum, whose getter's docstring lists its values
  ("Valid values are `PrePaid`, `PostPaid`": all of Alicloud's and Tencent's choices), is
  checked against that list (DOC_LAGS names the values the docs predate, cited).

Two views of each resource are checked. What the program passed to the constructor
(:func:`capture_constructed`, before serialization, Python names): a plain dict with an
unknown key inside a typed input is caught here whatever serialization does with it. And
what the engine received (the mocks' camelCase inputs, :func:`check_engine_inputs`).
"""

from __future__ import annotations

import collections.abc as abc
import difflib
import enum
import functools
import importlib
import importlib.util
import inspect
import json
import re
import sys
import threading
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pulumi

# The provider SDKs the program uses, as installed (requirements.txt pins their versions).
SDK_PACKAGES = (
    "pulumi_aws",
    "pulumi_alicloud",
    "tencentcloud_iac_pulumi",
    "pulumi_azure_native",
    "pulumi_random",
)
# How the report names each provider package of a token (its first segment).
CLOUD_OF = {
    "aws": "aws",
    "alicloud": "alicloud",
    "tencentcloud": "tencent",
    "azure-native": "azure",
    "random": "random",
}
# Secret values reach the mocks wrapped in this signature (pulumi.runtime.rpc's _special_sig).
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
_SIG_KEY = "4dabf18193072939515e22adb298388d"
# An enum whose own docstring says this is no closed list of values: azure-native's
# VirtualMachineSizeTypes ("The enum data type is currently deprecated and will be removed
# by December 23rd 2023", pointing to the List VM sizes APIs; pulumi_azure_native 3.29.0,
# compute/_enums.py). A value outside it is recorded, not failed.
OPEN_ENUM_MARK = "The enum data type is currently deprecated"


class SdkLookupError(LookupError):
    """A token, class or hint the installed SDKs do not define."""


# --- token -> resource class, from each SDK's own registry -----------------------------------


def _registry_json(package: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SdkLookupError(f"{package} is not installed: pip install -r requirements.txt")
    with open(spec.origin, encoding="utf-8") as fh:
        text = fh.read()
    found = [
        re.search(rf'{key}="""(.*?)"""', text, re.S)
        for key in ("resource_modules", "resource_packages")
    ]
    modules, packages = (json.loads(m.group(1)) if m else [] for m in found)
    return modules, packages


@functools.cache
def _token_table() -> dict[str, tuple[str, str]]:
    """Every resource and provider token the installed SDKs register: token -> (module, class)."""
    table: dict[str, tuple[str, str]] = {}
    for package in SDK_PACKAGES:
        modules, packages = _registry_json(package)
        for mod in modules:
            for token, cls in mod["classes"].items():
                table[token] = (mod["fqn"], cls)
        for pkg in packages:
            table[pkg["token"]] = (pkg["fqn"], pkg["class"])
    return table


@functools.cache
def resource_class(token: str) -> type:
    """The SDK class that registers resources of type `token`."""
    entry = _token_table().get(token)
    if entry is None:
        near = difflib.get_close_matches(token, _token_table(), n=3, cutoff=0.6)
        raise SdkLookupError(f"no installed SDK registers {token}{_nearest(near)}")
    module, name = entry
    return typing.cast(type, getattr(importlib.import_module(module), name))


@functools.cache
def _module_table() -> dict[tuple[str, str], str]:
    """(token package, first module segment) -> the Python module, from the registries."""
    table: dict[tuple[str, str], str] = {}
    for package in SDK_PACKAGES:
        modules, packages = _registry_json(package)
        for mod in modules:
            table[(mod["pkg"], mod["mod"].split("/")[0])] = mod["fqn"]
        for pkg in packages:
            table[(pkg["pkg"], "index")] = pkg["fqn"]
    return table


@functools.cache
def invoke_function(token: str) -> Any:
    """The SDK function that invokes `token` (aws:ec2/getAmi:getAmi -> pulumi_aws.ec2.get_ami):
    its module from the registries, its name the token's last segment in snake case; its
    source must name the token."""
    pkg, mod, name = token.split(":")
    prefix = mod.split("/")[0]
    root = _module_table().get((pkg, "index"), "")
    # a module with no resources (Tencent's User) is in no registry: its lower-case name
    candidates = [_module_table().get((pkg, prefix)), f"{root}.{prefix.lower()}"]
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    for module in filter(None, candidates):
        try:
            function = getattr(importlib.import_module(module), snake, None)
        except ImportError:
            continue
        if function is not None and f"'{token}'" in inspect.getsource(function):
            return function
    raise SdkLookupError(f"no installed SDK defines the invoke {token}")


@functools.cache
def invoke_schema(token: str) -> Schema:
    """An invoke's arguments: the function's keywords, camel names from its `__args__`."""
    function = invoke_function(token)
    hints = typing.get_type_hints(function)
    pairs = re.findall(r"__args__\['(\w+)'\] = (\w+)", inspect.getsource(function))
    fields = tuple(dict.fromkeys(Field(snake, camel, hints[snake]) for camel, snake in pairs))
    return Schema(f"{sdk_version(function.__module__.split('.')[0])} {function.__name__}", fields)


def check_invoke_args(token: str, args: Mapping[str, Any], where: str) -> Report:
    """An invoke's arguments as the engine received them (camelCase)."""
    report = Report()
    _Walker(token, "pulumi", report, where).keyed(args, invoke_schema(token), "")
    return report


def cloud_of(token: str) -> str:
    """'aws' for aws:ec2/instance:Instance and for pulumi:providers:aws."""
    parts = token.split(":")
    return CLOUD_OF[parts[2] if token.startswith("pulumi:providers:") else parts[0]]


@functools.cache
def sdk_version(package: str) -> str:
    """'pulumi_aws 7.51.1': the installed distribution of an SDK package, for messages."""
    from importlib.metadata import version

    return f"{package} {version(package.replace('_', '-'))}"


# --- schemas: input names and their hints ----------------------------------------------------


@dataclass(frozen=True)
class Field:
    python: str
    pulumi: str
    hint: Any
    doc: str = field(default="", compare=False)  # the getter's docstring


@dataclass(frozen=True)
class Schema:
    owner: str  # the SDK class the names come from, for messages
    fields: tuple[Field, ...]

    @functools.cached_property
    def by_python(self) -> dict[str, Field]:
        return {f.python: f for f in self.fields}

    @functools.cached_property
    def by_pulumi(self) -> dict[str, Field]:
        return {f.pulumi: f for f in self.fields}

    def names(self, naming: str) -> dict[str, Field]:
        return self.by_python if naming == "python" else self.by_pulumi


def _globals_of(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        module = sys.modules.get(base.__module__)
        if module is not None:
            found.update(vars(module))
    return found


def _getters(cls: type) -> Iterator[tuple[str, str, Any, str]]:
    """(python name, pulumi name, return hint, docstring) of every @pulumi.getter of `cls`."""
    namespace = _globals_of(cls)
    local = {"Output": pulumi.Output, "T": type(None)}
    for base in reversed(cls.__mro__):
        for python_name, prop in vars(base).items():
            if not isinstance(prop, property) or prop.fget is None:
                continue
            pulumi_name = getattr(prop.fget, "_pulumi_name", None)
            if pulumi_name is None:
                continue
            hint = typing.get_type_hints(prop.fget, globalns=namespace, localns=local)
            yield python_name, pulumi_name, hint.get("return", Any), prop.fget.__doc__ or ""


def is_args_class(cls: Any) -> bool:
    """An SDK input type (an @pulumi.input_type `*Args` class)."""
    return isinstance(cls, type) and hasattr(cls, "_pulumi_input_type")


@functools.cache
def args_schema(cls: type) -> Schema:
    """The inputs of a nested `*Args` class: its getters."""
    fields = tuple(Field(py, name, hint, doc) for py, name, hint, doc in _getters(cls))
    return Schema(f"{sdk_version(cls.__module__.split('.')[0])} {cls.__qualname__}", fields)


def _args_class_of(resource: type) -> type:
    """The Args class `_internal_init` builds its props from (`__props__ = XArgs.__new__`):
    mostly <Resource>Args, <Resource>InitArgs where the name is taken by a nested type."""
    source = inspect.getsource(resource._internal_init)  # type: ignore[attr-defined]
    found = re.search(r"__props__ = (\w+)\.__new__\(", source)
    args = found and getattr(sys.modules[resource.__module__], found.group(1), None)
    if not args:
        raise SdkLookupError(f"{resource.__qualname__}._internal_init builds no known Args")
    return typing.cast(type, args)


@functools.cache
def resource_schema(token: str) -> Schema:
    """The inputs of a resource: its Args class's getters, which must be the keywords of
    `_internal_init` (less the SDKs' plumbing: `opts`, `__props__`; a keyword that would
    shadow `resource_name` carries a trailing underscore there, e.g. azure-native's
    `resource_name_`)."""
    resource = resource_class(token)
    args = _args_class_of(resource)
    schema = args_schema(args)
    init = resource._internal_init  # type: ignore[attr-defined]
    plumbing = {"__self__", "self", "resource_name", "opts", "__props__"}
    keywords = {p.rstrip("_") for p in inspect.signature(init).parameters if p not in plumbing}
    getters = {f.python.rstrip("_") for f in schema.fields}
    if keywords != getters:
        raise SdkLookupError(
            f"{token}: _internal_init and {args.__name__} disagree on {sorted(keywords ^ getters)}"
        )
    return Schema(schema.owner, schema.fields)


# --- values the SDK documents where it types no enum ----------------------------------------

# Alicloud's and Tencent's SDKs type every choice as a plain string and list the values in
# the getter's docstring instead ("Valid values are `PrePaid`, `PostPaid`"). Only these
# phrases, followed by two or more `backticked` words in the same sentence, count.
_DOCUMENTED = re.compile(
    r"(?:valid values?(?: are| is|:)|values include|only supports?|"
    r"possible values(?: are| is|:)|allowed values(?: are| is|:))\s*:?\s*",
    re.I,
)
# Values the cloud documents that the SDK's docstring predates: (token, input, value) ->
# where the cloud says so. tests/infra/test_sdk_inputs.py fails once the SDK lists it.
DOC_LAGS = {
    ("tencentcloud:Scf/function:Function", "runtime", "Python3.10"): (
        "Tencent SCF's Runtime Environment page lists Python 3.10 "
        "(tencentcloud.com/document/product/583/40323, updated 2025-01-03, read 2026-12-01); "
        "tencentcloud_iac_pulumi 0.2.3's docstring stops at Python3.6"
    ),
}


@functools.cache
def documented_values(doc: str) -> frozenset[str]:
    """The values a getter's docstring lists, or nothing when it lists none."""
    text = " ".join(doc.split())
    found: set[str] = set()
    for mark in _DOCUMENTED.finditer(text):
        rest = text[mark.end() :]
        # the sentence ends at the first ". " outside backticks (`Python3.6` has a dot)
        blanked = re.sub(r"`[^`]*`", lambda m: "x" * len(m.group(0)), rest)
        end = re.search(r"\.(\s|$)", blanked)
        words = re.findall(r"`([^`]+)`", rest[: end.start()] if end else rest)
        if len(words) >= 2:
            found.update(words)
    return frozenset(found)


# --- hints -> what a value may be ------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The alternatives a hint allows, flattened out of Input/Optional/Union/Awaitable."""

    anything: bool = False
    scalars: frozenset[type] = frozenset()
    enums: tuple[type[enum.Enum], ...] = ()
    args: tuple[type, ...] = ()
    sequence_of: tuple[Any, ...] = ()  # element hints
    mapping_of: tuple[Any, ...] = ()  # value hints
    open_mapping: bool = False  # a Mapping whose keys are the user's (tags, settings)


_UNION: Any = typing.Union  # built from hints at run time: Union[(a, b)] is Union[a, b]
_MAPPINGS = {dict, abc.Mapping, typing.Mapping, typing.Dict}  # noqa: UP006
_SEQUENCES = {list, tuple, abc.Sequence, typing.Sequence, typing.List}  # noqa: UP006


def _leaves(hint: Any) -> Iterator[Any]:
    origin = typing.get_origin(hint)
    # Input[T] is Union[T, Awaitable[T], Output[T]]: each alternative, unwrapped
    if origin in (typing.Union, abc.Awaitable, typing.Awaitable, pulumi.Output):
        for arg in typing.get_args(hint):
            yield from _leaves(arg)
    elif hint is pulumi.Output:
        yield Any
    else:
        yield hint


@functools.cache
def shape_of(hint: Any) -> Shape:
    anything, open_map = False, False
    scalars: set[type] = set()
    enums: list[type[enum.Enum]] = []
    args: list[type] = []
    seq: list[Any] = []
    mapping: list[Any] = []
    for leaf in _leaves(hint):
        origin = typing.get_origin(leaf)
        if leaf is Any or leaf is object:
            anything = True
        elif leaf is type(None):
            continue
        elif origin in _SEQUENCES:
            seq.extend(typing.get_args(leaf)[:1] or [Any])
        elif origin in _MAPPINGS or leaf in _MAPPINGS:
            values = typing.get_args(leaf)[1:2] or [Any]
            mapping.extend(values)
            open_map = True
        elif isinstance(leaf, type) and issubclass(leaf, enum.Enum):
            enums.append(leaf)
        elif isinstance(leaf, type) and typing.is_typeddict(leaf):
            continue  # the *ArgsDict twin of an *Args class: same names, checked through it
        elif isinstance(leaf, type) and leaf in (str, int, float, bool):
            scalars.add(leaf)
        elif is_args_class(leaf):
            args.append(leaf)
        elif isinstance(leaf, type) and hasattr(leaf, "_pulumi_output_type"):
            continue  # an output type accepted back as input: values are built from Args
        else:
            anything = True  # a hint we cannot read: no claim about it
    return Shape(
        anything,
        frozenset(scalars),
        tuple(dict.fromkeys(enums)),
        tuple(dict.fromkeys(args)),
        tuple(seq),
        tuple(mapping),
        open_map,
    )


# --- values ----------------------------------------------------------------------------------


class _Unknown:
    """A value the run never resolved: nothing to check."""


UNKNOWN = _Unknown()


def resolved(value: Any) -> Any:
    """An Output's value once the run is over (the mocks resolve them all); else UNKNOWN."""
    while isinstance(value, pulumi.Output):
        data = value._data
        if not data.done() or data.cancelled() or data.exception() is not None:
            return UNKNOWN
        result = data.result()
        if not result.is_known:
            return UNKNOWN
        value = result.value
    if inspect.isawaitable(value):
        return UNKNOWN
    if isinstance(value, dict) and _SIG_KEY in value:
        # the engine's view: a secret is unwrapped; a resource reference, asset or archive
        # is a value the SDK typed as such
        return value.get("value", UNKNOWN) if value[_SIG_KEY] == _SECRET_SIG else UNKNOWN
    return value


@dataclass
class Report:
    """What a check found, and how many inputs it looked at."""

    problems: list[str] = field(default_factory=list)
    checked: int = 0  # every named input at every depth, list elements each
    paths: set[tuple[str, str]] = field(default_factory=set)  # (token, path without indexes)
    open_enum_values: set[tuple[str, str]] = field(default_factory=set)  # (path, value)
    unresolved: list[str] = field(default_factory=list)  # paths whose Output never resolved
    enum_checked: int = 0  # strings checked against an SDK enum's members
    documented_checked: int = 0  # strings checked against the values a docstring lists


def _nearest(names: list[str]) -> str:
    return f" (nearest: {', '.join(names)})" if names else ""


class _Walker:
    def __init__(self, token: str, naming: str, report: Report, where: str):
        self.token, self.naming, self.report, self.where = token, naming, report, where

    def problem(self, path: str, text: str) -> None:
        self.report.problems.append(f"{self.where}: {path}: {text}")

    def keyed(self, values: Mapping[str, Any], schema: Schema, path: str) -> None:
        names = schema.names(self.naming)
        for key, value in values.items():
            if value is None:
                continue  # not sent (and the SDKs set their outputs to None in the props)
            here = f"{path}.{key}" if path else key
            known = names.get(key)
            if known is None:
                near = difflib.get_close_matches(str(key), list(names), n=3, cutoff=0.5)
                self.problem(here, f"{schema.owner} has no input {key!r}{_nearest(near)}")
                continue
            self.report.checked += 1
            self.report.paths.add((self.token, re.sub(r"\[\d+\]", "[]", here)))
            self.value(value, known.hint, here)
            self.documented(value, known, here)

    def documented(self, raw: Any, known: Field, path: str) -> None:
        """A string input the SDK types without an enum, against its docstring's values."""
        value = resolved(raw)
        if not isinstance(value, str) or shape_of(known.hint).enums:
            return
        allowed = documented_values(known.doc)
        if not allowed:
            return
        self.report.documented_checked += 1
        if value in allowed or (self.token, known.python, value) in DOC_LAGS:
            return
        near = difflib.get_close_matches(value, sorted(allowed), n=3, cutoff=0.5)
        self.problem(
            path,
            f"{value!r} is none of the values the SDK documents for {known.python}{_nearest(near)}",
        )

    def value(self, raw: Any, hint: Any, path: str) -> None:
        value = resolved(raw)
        if value is UNKNOWN:
            self.report.unresolved.append(f"{self.where}: {path}")
            return
        if value is None:
            return
        shape = shape_of(hint)
        if isinstance(value, pulumi.Resource | pulumi.Asset | pulumi.Archive):
            return  # a resource reference or an asset: the SDK types them as such
        if isinstance(value, enum.Enum):
            self.enum_member(value, shape, path)
        elif is_args_class(type(value)):
            self.args_object(value, shape, path)
        elif isinstance(value, Mapping):
            self.mapping(value, shape, path)
        elif isinstance(value, list | tuple):
            self.sequence(value, shape, path)
        elif isinstance(value, str) and self.json_config(value, shape):
            self.value(json.loads(value), hint, path)
        elif isinstance(value, str):
            self.string(value, shape, path)
        elif isinstance(value, bool | int | float):
            self.scalar(value, shape, path)

    def json_config(self, value: str, shape: Shape) -> bool:
        """A provider's SDK sends each input that is not a string as JSON text
        (`.apply(pulumi.runtime.to_json)` in every Provider._internal_init): such a string
        is checked as the value it encodes."""
        if not self.token.startswith("pulumi:providers:") or str in shape.scalars:
            return False
        try:
            return not isinstance(json.loads(value), str)
        except ValueError:
            return False

    def scalar(self, value: bool | float, shape: Shape, path: str) -> None:
        """A bool or number where the SDK types a bool, a number or something else."""
        if shape.anything:
            return
        if isinstance(value, bool):
            fits = bool in shape.scalars
        elif isinstance(value, int) or value.is_integer():
            fits = bool({int, float} & shape.scalars)  # the wire has one number type
        else:
            fits = float in shape.scalars
        if not fits:
            kind = type(value).__name__
            self.problem(
                path,
                f"{'an' if kind == 'int' else 'a'} {kind} where the SDK expects {_names(shape)}",
            )

    def enum_member(self, value: enum.Enum, shape: Shape, path: str) -> None:
        if shape.anything or type(value) in shape.enums:
            return
        self.problem(path, f"{type(value).__name__} given; the SDK expects {_names(shape)}")

    def args_object(self, value: Any, shape: Shape, path: str) -> None:
        cls = type(value)
        if not shape.anything and cls not in shape.args:
            self.problem(path, f"{cls.__name__} given; the SDK expects {_names(shape)}")
            return
        schema = args_schema(typing.cast(type, cls))
        self.keyed(_python_values(value, schema), schema, path)

    def mapping(self, value: Mapping[str, Any], shape: Shape, path: str) -> None:
        if shape.args:
            self.best_args(value, shape.args, path)
        elif shape.open_mapping:
            hints = shape.mapping_of or (Any,)
            for key, item in value.items():
                self.value(item, _UNION[hints], f"{path}[{key!r}]")
        elif not shape.anything:
            self.problem(path, f"a mapping where the SDK expects {_names(shape)}")

    def best_args(self, value: Mapping[str, Any], choices: tuple[type, ...], path: str) -> None:
        """A plain dict in an *Args position: its keys against the closest Args class."""
        tries = []
        for cls in choices:
            trial = Report()
            _Walker(self.token, self.naming, trial, self.where).keyed(value, args_schema(cls), path)
            tries.append((len(trial.problems), trial))
        _, best = min(tries, key=lambda t: t[0])
        self.report.problems.extend(best.problems)
        self.report.checked += best.checked
        self.report.paths.update(best.paths)
        self.report.open_enum_values.update(best.open_enum_values)
        self.report.unresolved.extend(best.unresolved)
        self.report.enum_checked += best.enum_checked
        self.report.documented_checked += best.documented_checked

    def sequence(self, value: list[Any] | tuple[Any, ...], shape: Shape, path: str) -> None:
        if shape.sequence_of:
            hint = _UNION[shape.sequence_of]
            for i, item in enumerate(value):
                self.value(item, hint, f"{path}[{i}]")
        elif not shape.anything:
            self.problem(path, f"a list where the SDK expects {_names(shape)}")

    def string(self, value: str, shape: Shape, path: str) -> None:
        if shape.anything:
            return
        if not shape.enums:
            if str not in shape.scalars:
                self.problem(path, f"a str where the SDK expects {_names(shape)}")
            return
        self.report.enum_checked += 1
        members = [str(m.value) for e in shape.enums for m in e]
        if value in members:
            return
        if any(OPEN_ENUM_MARK in (e.__doc__ or "") for e in shape.enums):
            self.report.open_enum_values.add((path, value))
            return
        near = difflib.get_close_matches(value, members, n=3, cutoff=0.5)
        enums = ", ".join(e.__name__ for e in shape.enums)
        self.problem(path, f"{value!r} is no value of the SDK's enum {enums}{_nearest(near)}")


def _names(shape: Shape) -> str:
    parts = [c.__name__ for c in (*shape.args, *shape.enums)]
    parts += sorted(t.__name__ for t in shape.scalars)
    if shape.sequence_of:
        parts.append("a list")
    if shape.open_mapping:
        parts.append("a mapping")
    return " or ".join(parts) or "nothing"


def _python_values(obj: Any, schema: Schema) -> dict[str, Any]:
    """An Args object's set inputs under their Python names (what its __init__ stored)."""
    stored = dict(vars(obj))
    return {k: v for k, v in stored.items() if not k.startswith("_")} or {
        f.python: getattr(obj, f.python, None) for f in schema.fields
    }


def check_constructed(token: str, props: Mapping[str, Any], where: str) -> Report:
    """The inputs a program passed to a resource's constructor, under Python names."""
    report = Report()
    _Walker(token, "python", report, where).keyed(props, resource_schema(token), "")
    return report


def check_engine_inputs(token: str, inputs: Mapping[str, Any], where: str) -> Report:
    """The inputs the engine received (the mocks' camelCase view)."""
    report = Report()
    _Walker(token, "pulumi", report, where).keyed(inputs, resource_schema(token), "")
    return report


# --- capturing what the program constructs ---------------------------------------------------


@dataclass(frozen=True)
class Constructed:
    token: str
    name: str
    cls: type
    props: dict[str, Any]  # Python names -> the values as passed (Args objects, dicts, Outputs)


def _props_dict(props: Any) -> dict[str, Any]:
    if props is None:
        return {}
    if isinstance(props, Mapping):
        return dict(props)
    return {k: v for k, v in vars(props).items() if not k.startswith("_")}


@contextmanager
def capture_constructed() -> Iterator[list[Constructed]]:
    """Record every custom resource the code in the block constructs, before serialization.

    pulumi.CustomResource.__init__ is where every SDK class's `_internal_init` hands its
    props over; component resources (ours) are not recorded. The patch is process-wide, so
    the block must not overlap another program run (infra.offline.evaluate runs one at a
    time)."""
    built: list[Constructed] = []
    lock = threading.Lock()
    original = pulumi.CustomResource.__init__

    def recording(self: Any, t: str, name: str, props: Any = None, *args: Any, **kw: Any) -> None:
        with lock:
            built.append(Constructed(t, name, type(self), _props_dict(props)))
        original(self, t, name, props, *args, **kw)

    pulumi.CustomResource.__init__ = recording  # type: ignore[method-assign]
    try:
        yield built
    finally:
        pulumi.CustomResource.__init__ = original  # type: ignore[method-assign]


# Filled by tests/infra/test_sdk_inputs.py's coverage test, printed in the run's summary:
# cloud -> (inputs checked, distinct resource-type input paths, values checked on an enum,
# values checked on a docstring's list).
COVERAGE: dict[str, tuple[int, int, int, int]] = {}


def coverage_line(runs: int) -> str:
    parts = [
        f"{cloud} {n} ({d} distinct paths, {e} enum values, {v} documented values)"
        for cloud, (n, d, e, v) in sorted(COVERAGE.items())
    ]
    return f"SDK-checked resource inputs over {runs} stack runs: " + "; ".join(parts)
