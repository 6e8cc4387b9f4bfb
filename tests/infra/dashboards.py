"""Checkers for the dashboard bodies the programs declare, against our summaries of each
cloud's documented structure (tests/data/dashboards/*.toml, each citing its source):
CloudWatch's DashboardBody and Azure Monitor's workbook content. Each returns the list
of problems, one line each ("widgets[1].width: 25 is outside 1-24"); empty is valid."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "dashboards"
CLOUDWATCH = tomllib.loads((DATA / "cloudwatch_dashboard_body.toml").read_text())
WORKBOOK = tomllib.loads((DATA / "azure_workbook.toml").read_text())
JSON_TYPES = {
    "string": str,
    "integer": int,
    "array": list,
    "object": dict,
    "boolean": bool,
}


def _keys(where: str, obj: Any, required: list[str], allowed: list[str]) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not an object"]
    out = [f"{where}: missing {k!r}" for k in required if k not in obj]
    known = set(required) | set(allowed)
    out += [f"{where}.{k}: not in the documented structure" for k in obj if k not in known]
    return out


def _range(where: str, value: Any, bounds: list[int]) -> list[str]:
    low, high = bounds
    if not isinstance(value, int) or isinstance(value, bool):
        return [f"{where}: {value!r} is not an integer"]
    return [] if low <= value <= high else [f"{where}: {value} is outside {low}-{high}"]


def _metric_row(where: str, row: Any) -> list[str]:
    spec = CLOUDWATCH["metric_array"]
    if not isinstance(row, list) or len(row) < 2:
        return [f"{where}: not [Namespace, MetricName, ...]"]
    rest = row[2:]
    if rest and isinstance(rest[-1], dict):
        rest = rest[:-1]  # the rendering options object
    out = [
        f"{where}[{i}]: {v!r} is not a string"
        for i, v in enumerate(row[:2])
        if not isinstance(v, str)
    ]
    if len(rest) % 2:
        out.append(f"{where}: dimensions come as name/value pairs, got {len(rest)} items")
    if len(rest) // 2 > spec["max_dimensions"]:
        out.append(f"{where}: more than {spec['max_dimensions']} dimensions")
    out += [f"{where}: dimension {v!r} is not a string" for v in rest if not isinstance(v, str)]
    return out


def _metric_properties(where: str, props: Any) -> list[str]:
    spec = CLOUDWATCH["metric_properties"]
    out = _keys(where, props, spec["required"], spec["optional"])
    if not isinstance(props, dict):
        return out
    if "view" in props and props["view"] not in spec["views"]:
        out.append(f"{where}.view: {props['view']!r} is not one of {spec['views']}")
    stat = props.get("stat")
    if (
        stat is not None
        and stat not in spec["stats"]
        and not re.fullmatch(spec["stat_percentile"], str(stat))
    ):
        out.append(f"{where}.stat: {stat!r} is not a statistic CloudWatch knows")
    period = props.get("period")
    if period is not None and not (
        isinstance(period, int) and (period in spec["periods_below_60"] or period % 60 == 0)
    ):
        out.append(f"{where}.period: {period!r} is not 1, 5, 10, 30 or a multiple of 60")
    rows = props.get("metrics")
    if not isinstance(rows, list):
        out.append(f"{where}.metrics: not an array")
    else:
        for i, row in enumerate(rows):
            out += _metric_row(f"{where}.metrics[{i}]", row)
    return out


def cloudwatch_problems(body: Any) -> list[str]:
    """What in ``body`` (a DashboardBody, parsed) CloudWatch's documented structure refuses."""
    spec = CLOUDWATCH["body"]
    out = _keys("body", body, spec["required"], spec["optional"])
    if not isinstance(body, dict) or not isinstance(body.get("widgets"), list):
        return out or ["body.widgets: not an array"]
    widgets = body["widgets"]
    if len(widgets) > spec["max_widgets"]:
        out.append(f"body.widgets: {len(widgets)} widgets, more than {spec['max_widgets']}")
    w = CLOUDWATCH["widget"]
    for i, widget in enumerate(widgets):
        where = f"widgets[{i}]"
        out += _keys(where, widget, w["required"], w["optional"])
        if not isinstance(widget, dict):
            continue
        if widget.get("type") not in w["types"]:
            out.append(f"{where}.type: {widget.get('type')!r} is not one of {w['types']}")
        for key in ("x", "y", "width", "height"):
            if key in widget:
                out += _range(f"{where}.{key}", widget[key], w[key])
        x, width = widget.get("x"), widget.get("width")
        if isinstance(x, int) and isinstance(width, int) and x + width > 24:
            out.append(f"{where}: x + width = {x + width}, past the 24 columns")
        if widget.get("type") == "metric":
            out += _metric_properties(f"{where}.properties", widget.get("properties"))
    return out


def _typed(where: str, obj: dict[str, Any], types: dict[str, str], *, closed: bool) -> list[str]:
    out = []
    for key, value in obj.items():
        kind = types.get(key)
        if kind is None:
            if closed:
                out.append(f"{where}.{key}: not in the workbook schema")
            continue
        py = JSON_TYPES[kind]
        if not isinstance(value, py) or (py is int and isinstance(value, bool)):
            out.append(f"{where}.{key}: {value!r} is not a {kind}")
    return out


def workbook_problems(doc: Any) -> list[str]:
    """What in ``doc`` (a workbook's serializedData, parsed) the published schema refuses,
    for the item kinds gpufleet uses (markdown, metric); another kind is reported."""
    top = WORKBOOK["workbook"]
    out = _keys("workbook", doc, top["required"], top["optional"])
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        return out or ["workbook.items: not an array"]
    item_spec, types = WORKBOOK["item"], WORKBOOK["item"]["types"]
    for i, item in enumerate(doc["items"]):
        where = f"items[{i}]"
        out += _keys(where, item, item_spec["required"], item_spec["optional"])
        if not isinstance(item, dict) or not isinstance(item.get("content"), dict):
            continue
        content = item["content"]
        if item.get("type") == types["markdown"]:
            out += _typed(
                f"{where}.content", content, WORKBOOK["markdown_content"]["keys"], closed=True
            )
        elif item.get("type") == types["metric"]:
            out += _typed(
                f"{where}.content", content, WORKBOOK["metric_content"]["keys"], closed=True
            )
            grid = content.get("gridSettings")
            if isinstance(grid, dict):
                out += _typed(
                    f"{where}.content.gridSettings",
                    grid,
                    WORKBOOK["grid_settings"]["keys"],
                    closed=True,
                )
            for j, metric in enumerate(content.get("metrics") or []):
                spec = WORKBOOK["metric_item"]
                mwhere = f"{where}.content.metrics[{j}]"
                out += [f"{mwhere}: missing {k!r}" for k in spec["required"] if k not in metric]
                out += _typed(mwhere, metric, {**spec["required"], **spec["optional"]}, closed=True)
        else:
            out.append(f"{where}.type: {item.get('type')!r} is not an item kind checked here")
    return out
