"""The request parameters an Alibaba Cloud API action takes, from the official
SDK's own request models (alibabacloud_ecs20140526, alibabacloud_cms20190101),
so that a local fake refuses a parameter the API does not define, as the API
does, instead of repeating our own reading of it."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Mapping
from typing import Any

# RPC common request parameters (signature v1, which the node signs with; the
# SDK's own v3 requests carry these in headers instead).
RPC_COMMON = frozenset(
    {
        "Action",
        "Version",
        "Format",
        "AccessKeyId",
        "Signature",
        "SignatureMethod",
        "SignatureVersion",
        "SignatureNonce",
        "Timestamp",
        "SecurityToken",
    }
)


def wire_names(model: type[Any]) -> set[str]:
    """The top-level names the model's ``to_map`` writes (``result['Name']``)."""
    return set(re.findall(r"result\['(\w+)'\]", inspect.getsource(model.to_map)))


def unknown_params(model: type[Any], params: Mapping[str, str]) -> list[str]:
    """The parameters of ``params`` that ``model`` does not define. A repeated one
    (``InstanceId.3``) counts as its list's name; a field of a list of objects
    (``Tag.1.Key``, ``MetricList.2.Values``) must be one the list's item model
    defines (the SDK names it ``<Request><List>``: TagResourcesRequestTag)."""
    known = wire_names(model) | RPC_COMMON
    models = sys.modules[model.__module__]
    unknown = []
    for key in params:
        name, _, rest = key.partition(".")
        if name not in known:
            unknown.append(key)
            continue
        field = rest.partition(".")[2]
        item = getattr(models, f"{model.__name__}{name}", None)
        if field and item is not None and field.split(".", 1)[0] not in wire_names(item):
            unknown.append(key)
    return sorted(unknown)
