"""A stack file's YAML, read as the Pulumi CLI reads it, and safely.

The Pulumi CLI reads `Pulumi.<stack>.yaml` with Go's yaml.v3, which differs from PyYAML's
default YAML 1.1 reading in ways that change a stack (go-yaml/yaml, decode.go and the README's
"Compatibility" section, v3 branch, read 2026-12-02):

- a mapping key given twice is an error ("mapping key ... already defined at line N"), where
  PyYAML keeps the last one silently (a t4x1 file with a second `gpufleet:tier` planned a
  p5.48xlarge);
- base-60 numbers are not numbers (`ttlHours: 1:30` is the text "1:30", not 90), and
  yes/no/on/off are text unless read into a typed bool: only true/false are booleans;
- an alias is followed at most so far ("document contains excessive aliasing") and an anchor
  that contains itself is refused, where PyYAML expands an alias bomb until memory runs out.

Here the file is composed into nodes first (aliases stay shared, nothing is expanded), the
nodes are checked (duplicate keys, keys that are not text, the expanded size), and only then
built into Python values with libyaml's C parser. A stack file is a few hundred bytes; one over
`MAX_BYTES` or `MAX_VALUES` is refused before any of that work.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml

MAX_BYTES = 256 * 1024  # the shipped stack files are under 1 KiB; a 10 MB file took 90 s
MAX_VALUES = 10_000  # values after aliases are expanded (the shipped files hold about 30)

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DROPPED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


class StackYamlError(ValueError):
    """One line: what is wrong with the file and how to fix it."""


class _Loader(_Base):
    """SafeLoader with yaml.v3's scalars: booleans are true/false, no base-60 numbers."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"
    ),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load(text: str) -> Any:
    """The document in `text`, or StackYamlError saying what in it is refused."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise StackYamlError(
            f"the file is {size:,} bytes; a stack file is a few hundred (limit {MAX_BYTES:,}): "
            "is this the right file?"
        )
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check(root: yaml.Node) -> None:
    """Duplicate and non-text keys, self-containing anchors, and the expanded size."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise StackYamlError(f"line {_line(node)}: an anchor's value contains itself")
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.MappingNode):
            _check_keys(node)
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        if total > MAX_VALUES:
            raise StackYamlError(
                f"line {_line(node)}: this value holds over {MAX_VALUES:,} values once its "
                "aliases are expanded; a stack file holds a few dozen"
            )
        return total

    size(root)


def _check_keys(node: yaml.MappingNode) -> None:
    seen: dict[str, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise StackYamlError(f"line {_line(key)}: a key must be text, not a list or mapping")
        if key.tag == "tag:yaml.org,2002:merge":
            continue
        if key.tag != "tag:yaml.org,2002:str":
            kind = _KINDS.get(key.tag, key.tag)
            raise StackYamlError(
                f"line {_line(key)}: the key {key.value} is read as {kind}, not text: quote it "
                f"('{key.value}')"
            )
        if key.value in seen:
            raise StackYamlError(
                f"line {_line(key)}: {key.value} is set twice (first at line "
                f"{seen[key.value]}); the Pulumi CLI refuses that: keep one"
            )
        seen[key.value] = _line(key)


_KINDS = {
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:null": "an empty value",
}


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1
