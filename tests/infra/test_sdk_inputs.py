"""Every input of every resource of every stack is one the installed provider SDK defines.

The schema is the SDK's own (tests/support/sdk_inputs.py): its registry maps each type token
to a class, its Args getters name the inputs, their hints give the nesting, its Enum
classes the values (and, where it types no enum, the values its docstrings list). Each
shipped stack is checked, and variants of each: two nodes, and each billing mode the
catalog sells there. Both views are checked: the constructor's inputs (a misspelt key in a
plain nested dict is caught there) and the engine's camelCase inputs.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra.config import ConfigError
from infra.offline import Mocks, RecordingMonitor
from tests.infra.conftest import STACK_FILES, Built, build_capturing, built, variant_config
from tests.support import sdk_inputs as S

OURS = "gpufleet"  # our component resources' package: no SDK defines them

# Variants of each shipped stack: (label, changed keys, dropped keys). A variant the
# catalog refuses (ConfigError), or one equal to the stack as shipped, is not built. The
# cost cap (maxHourlyCost) is dropped: it shapes no resource, and two nodes exceed it.
VARIANTS = (
    ("nodes2", {"nodes": 2}, ()),
    ("spot", {"billing": "spot"}, ("subscriptionMonths",)),
    ("subscription", {"billing": "subscription", "subscriptionMonths": 1}, ("spotMaxPrice",)),
    ("on-demand", {"billing": "on-demand"}, ("subscriptionMonths", "spotMaxPrice")),
)


def _cases() -> tuple[list[tuple[str, Path, str]], list[str]]:
    cases = [(p.name[len("Pulumi.") : -len(".yaml")], p, "") for p in STACK_FILES]
    refused = []
    for name, path, _ in list(cases):
        for label, changes, drop in VARIANTS:
            try:
                cfg = variant_config(path, changes, (*drop, "maxHourlyCost"))
            except ConfigError as exc:
                refused.append(f"{name}+{label}: {exc.problems[0]}")
                continue
            if cfg == variant_config(path, {}):
                continue
            cases.append((f"{name}+{label}", path, label))
    return cases, refused


CASES, REFUSED = _cases()


@functools.cache
def run(case: str) -> Built:
    _, path, label = next(c for c in CASES if c[0] == case)
    if not label:
        return built(path)
    _, changes, drop = next(v for v in VARIANTS if v[0] == label)
    return build_capturing(variant_config(path, changes, (*drop, "maxHourlyCost")))


@functools.cache
def checked(case: str) -> tuple[S.Report, S.Report, dict[str, S.Report]]:
    """What the program constructed and what the engine received, each against the SDK;
    and the constructed inputs' report per cloud."""
    result = run(case)
    constructed, engine = S.Report(), S.Report()
    per_cloud: dict[str, S.Report] = {}
    for c in result.constructed:
        assert S.resource_class(c.token) is c.cls, f"{c.token}: the SDK registers another class"
        part = S.check_constructed(c.token, c.props, f"{case}: {c.token} {c.name}")
        _merge(constructed, part)
        _merge(per_cloud.setdefault(S.cloud_of(c.token), S.Report()), part)
    for r in result.result.resources:
        if r.type.startswith((f"{OURS}:", "pulumi:pulumi:")):
            continue
        where = f"{case}: {r.type} {r.name} (engine)"
        _merge(engine, S.check_engine_inputs(r.type, r.inputs, where))
    return constructed, engine, per_cloud


def _merge(into: S.Report, part: S.Report) -> None:
    into.problems += part.problems
    into.checked += part.checked
    into.paths |= part.paths
    into.open_enum_values |= part.open_enum_values
    into.unresolved += part.unresolved
    into.enum_checked += part.enum_checked
    into.documented_checked += part.documented_checked


CASE_IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_input_the_program_constructs_is_one_the_sdk_defines(case):
    constructed, _, _ = checked(case)
    assert constructed.checked > 0
    assert not constructed.problems, "\n".join(constructed.problems)
    assert not constructed.unresolved, "never resolved, so never checked"


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_input_the_engine_receives_is_one_the_sdk_defines(case):
    _, engine, _ = checked(case)
    assert engine.checked > 0
    assert not engine.problems, "\n".join(engine.problems)


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_resource_the_engine_receives_was_constructed_from_an_sdk_class(case):
    result = run(case)
    engine = {(r.type, r.name) for r in result.result.resources}
    engine = {(t, n) for t, n in engine if not t.startswith((f"{OURS}:", "pulumi:pulumi:"))}
    assert engine == {(c.token, c.name) for c in result.constructed}


@functools.cache
def invokes_checked() -> S.Report:
    """Every invoke's arguments, in every stack run, as the engine received them."""
    report = S.Report()
    for case in CASE_IDS:
        for token, args in run(case).result.invokes:
            _merge(report, S.check_invoke_args(token, args, f"{case}: invoke {token}"))
    return report


def test_every_invoke_argument_is_one_the_sdk_defines():
    report = invokes_checked()
    assert report.checked > 0
    assert not report.problems, "\n".join(report.problems)


def test_a_misspelt_key_in_an_invokes_nested_argument_fails():
    token = "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"
    args = {"filters": [{"name": "instance-type", "valuez": ["p4d.24xlarge"]}]}
    (problem,) = S.check_invoke_args(token, args, "invoke").problems
    assert problem.startswith("invoke: filters[0].valuez: pulumi_aws 7.51.1 ")
    assert problem.endswith("has no input 'valuez' (nearest: values)")


def test_the_checks_cover_every_cloud_with_multi_node_and_spot_variants(capsys):
    totals: dict[str, S.Report] = {}
    for case in CASE_IDS:
        for cloud, part in checked(case)[2].items():
            _merge(totals.setdefault(cloud, S.Report()), part)
    built_variants = {
        (run(case).cfg.provider, run(case).cfg.billing, run(case).cfg.nodes) for case in CASE_IDS
    }
    for cloud in ("aws", "alicloud", "tencent", "azure"):
        assert totals[cloud].checked > 0
        assert any(p == cloud and n > 1 for p, _, n in built_variants), f"{cloud}: no multi-node"
        assert (cloud, "spot", 1) in built_variants, f"{cloud}: no spot run"
    S.COVERAGE.clear()
    S.COVERAGE.update(
        {
            c: (r.checked, len(r.paths), r.enum_checked, r.documented_checked)
            for c, r in totals.items()
        }
    )
    with capsys.disabled():
        print("\n" + S.coverage_line(len(CASE_IDS)))
        print(f"SDK-checked invoke arguments: {invokes_checked().checked}")


# --- the check can fail: a misspelt key at the top, one in a nested dict, a bad enum value ---


def constructed_by(program: Callable[[], Any]) -> list[S.Constructed]:
    """Run `program` under Pulumi's mocks (infra/offline.py's) and return what it built."""
    mocks = Mocks("sdkcheck", "us-east-1")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        pulumi.runtime.set_mocks(
            mocks,
            project="gpufleet",
            stack="sdkcheck",
            preview=False,
            monitor=RecordingMonitor(mocks),
        )
        with S.capture_constructed() as seen:
            pulumi.runtime.test(lambda: pulumi.Output.from_input(program()))()
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        asyncio.set_event_loop(None)
        loop.close()
    return seen


# The nested typos are typed Any, as a dict built elsewhere in the program is (the mypy
# run sees the SDKs' *ArgsDict TypedDicts only for a literal written in the call, and skips
# the Tencent SDK altogether): this check is the one that sees them.


def _aws_nested() -> Any:
    import pulumi_aws as aws

    options: Any = {"http_tokenz": "required"}
    return aws.ec2.Instance("n", ami="ami-1", instance_type="t3.micro", metadata_options=options).id


def _azure_nested() -> Any:
    import pulumi_azure_native as az

    managed: Any = {"storage_acount_type": "Premium_LRS"}
    storage: Any = {"os_disk": {"create_option": "FromImage", "managed_disk": managed}}
    return az.compute.VirtualMachine("n", resource_group_name="rg", storage_profile=storage).id


def _alicloud_nested() -> Any:
    import pulumi_alicloud as ali

    disks: Any = [{"size": 100, "categry": "cloud_essd"}]
    return ali.ecs.Instance("n", data_disks=disks).id


def _tencent_nested() -> Any:
    import tencentcloud_iac_pulumi as tc

    disks: Any = [{"data_disk_type": "CLOUD_SSD", "data_disk_sise": 100}]
    return tc.instance.Instance("n", data_disks=disks).id


# provider: (token, a misspelt top-level key and the name it misspells, the nested program,
# the nested path it misspells, the name nearest to it)
MISSPELT = {
    "aws": (
        "aws:ec2/instance:Instance",
        "instance_typ",
        "instance_type",
        _aws_nested,
        "metadata_options.http_tokenz",
        "http_tokens",
    ),
    "azure": (
        "azure-native:compute:VirtualMachine",
        "hardware_profil",
        "hardware_profile",
        _azure_nested,
        "storage_profile.os_disk.managed_disk.storage_acount_type",
        "storage_account_type",
    ),
    "alicloud": (
        "alicloud:ecs/instance:Instance",
        "instance_typ",
        "instance_type",
        _alicloud_nested,
        "data_disks[0].categry",
        "category",
    ),
    "tencent": (
        "tencentcloud:Instance/instance:Instance",
        "instance_typ",
        "instance_type",
        _tencent_nested,
        "data_disks[0].data_disk_sise",
        "data_disk_size",
    ),
}


@pytest.mark.parametrize("cloud", sorted(MISSPELT))
def test_a_misspelt_top_level_input_fails_naming_the_input_it_misspells(cloud):
    token, typo, meant, *_ = MISSPELT[cloud]
    report = S.check_constructed(token, {typo: "x"}, f"{cloud} example")
    assert len(report.problems) == 1
    assert f": {typo}: " in report.problems[0]
    assert meant in report.problems[0].split("nearest:")[1]
    engine = S.check_engine_inputs(
        token, {S.resource_schema(token).by_python[meant].pulumi + "x": 1}, "e"
    )
    assert len(engine.problems) == 1


@pytest.mark.parametrize("cloud", sorted(MISSPELT))
def test_a_misspelt_key_in_a_nested_plain_dict_fails_though_the_sdk_accepts_it(cloud):
    token, *_, program, path, meant = MISSPELT[cloud]
    (seen,) = constructed_by(program)  # the SDK constructs it without a word
    assert seen.token == token
    report = S.check_constructed(token, seen.props, f"{cloud} example")
    assert len(report.problems) == 1, report.problems
    assert f": {path}: " in report.problems[0]
    assert meant in report.problems[0].split("nearest:")[1]


def _aws_enum() -> Any:
    import pulumi_aws as aws

    return aws.ec2.Instance("e", ami="ami-1", instance_type="p9.megalarge").id


def _azure_enum() -> Any:
    import pulumi_azure_native as az

    return az.compute.VirtualMachine("e", resource_group_name="rg", priority="Spott").id


ENUMS = {
    "aws": (
        _aws_enum,
        "instance_type",
        "'p9.megalarge' is no value of the SDK's enum InstanceType",
    ),
    "azure": (
        _azure_enum,
        "priority",
        "'Spott' is no value of the SDK's enum VirtualMachinePriorityTypes",
    ),
}


@pytest.mark.parametrize("cloud", sorted(ENUMS))
def test_a_value_the_sdk_enum_does_not_know_fails(cloud):
    program, path, says = ENUMS[cloud]
    (seen,) = constructed_by(program)
    report = S.check_constructed(seen.token, seen.props, f"{cloud} example")
    (problem,) = report.problems
    assert problem.split(": ", 1)[1].startswith(f"{path}: {says} (nearest: ")


@pytest.mark.parametrize("package", ["pulumi_alicloud", "tencentcloud_iac_pulumi"])
def test_the_sdks_that_type_no_enums_define_no_enum_module(package):
    """Alicloud's and Tencent's SDKs type every choice as a plain string: there is no enum to
    check a value against (a real account's API is what refuses a bad one). If an SDK
    version adds enums, this fails, and the enum test above gets that provider's case."""
    root = Path(str(importlib.import_module(package).__file__)).parent
    enums = [d for d, _, files in os.walk(root) if "_enums.py" in files]
    assert enums == []


def test_a_dict_where_the_sdk_expects_a_string_fails_as_wrong_nesting():
    report = S.check_constructed(
        "aws:ec2/instance:Instance", {"instance_type": {"name": "t3.micro"}}, "nesting"
    )
    assert [p.split(": ", 1)[1] for p in report.problems] == [
        "instance_type: a mapping where the SDK expects InstanceType or str"
    ]


def test_an_args_object_of_another_input_fails_as_wrong_nesting():
    import pulumi_aws as aws

    wrong = aws.ec2.InstanceRootBlockDeviceArgs(volume_size=10)
    report = S.check_constructed("aws:ec2/instance:Instance", {"metadata_options": wrong}, "n")
    assert [p.split(": ", 1)[1] for p in report.problems] == [
        "metadata_options: InstanceRootBlockDeviceArgs given; the SDK expects "
        "InstanceMetadataOptionsArgs"
    ]


def test_a_token_no_sdk_registers_fails_naming_the_nearest():
    with pytest.raises(S.SdkLookupError, match="aws:ec2/instance:Instance"):
        S.resource_schema("aws:ec2/instanse:Instance")


def test_an_enum_the_sdk_itself_calls_deprecated_is_no_closed_list():
    """azure-native's VirtualMachineSizeTypes says of itself that it is deprecated and no
    longer the list of sizes (its docstring points to the List VM sizes APIs): sizes newer
    than the enum (Standard_NC24ads_A100_v4) are valid, so the check makes no claim there."""
    import pulumi_azure_native as az

    sizes = az.compute.VirtualMachineSizeTypes
    assert S.OPEN_ENUM_MARK in (sizes.__doc__ or "")
    assert "Standard_NC24ads_A100_v4" not in {m.value for m in sizes}
    report = S.check_constructed(
        "azure-native:compute:VirtualMachine",
        {"hardware_profile": {"vm_size": "Standard_NC24ads_A100_v4"}},
        "open enum",
    )
    assert report.problems == []
    assert report.open_enum_values == {("hardware_profile.vm_size", "Standard_NC24ads_A100_v4")}


# --- where the SDK types no enum, the values its docstrings list ---------------------------

DOCUMENTED = {
    "alicloud": (
        "alicloud:ecs/instance:Instance",
        "internet_charge_type",
        "PayByTrafic",
        "PayByTraffic",
    ),
    "tencent": (
        "tencentcloud:Instance/instance:Instance",
        "instance_charge_type",
        "SPOT_PAID",
        "SPOTPAID",
    ),
}


@pytest.mark.parametrize("cloud", sorted(DOCUMENTED))
def test_a_value_outside_the_values_the_sdk_documents_fails(cloud):
    token, name, typo, meant = DOCUMENTED[cloud]
    report = S.check_constructed(token, {name: typo}, f"{cloud} example")
    (problem,) = report.problems
    said = problem.split(": ", 1)[1]
    assert said.startswith(f"{name}: {typo!r} is none of the values the SDK documents for {name}")
    assert meant in said.split("nearest:")[1]
    assert S.check_constructed(token, {name: meant}, "ok").problems == []


def test_documented_values_come_from_the_phrase_and_its_sentence_only():
    doc = "The mode. Valid values are `PrePaid`, `PostPaid`. Default to `PostPaid`. See `x`, `y`."
    assert S.documented_values(doc) == {"PrePaid", "PostPaid"}
    assert S.documented_values("Only `ONE-TIME` now.") == frozenset()
    assert S.documented_values("Valid values: `Python2.7`, `Python3.6`.") == {
        "Python2.7",
        "Python3.6",
    }


@pytest.mark.parametrize("lag", sorted(S.DOC_LAGS))
def test_each_value_the_sdk_docs_predate_is_still_missing_from_them(lag):
    """An exception stays only while the SDK's docstring lacks the value."""
    token, name, value = lag
    field = S.resource_schema(token).by_python[name]
    assert S.documented_values(field.doc), "the SDK no longer lists values: drop the exception"
    assert value not in S.documented_values(field.doc)


# --- the kind of a scalar: string, bool or number, as the SDK types it ----------------------


def test_a_string_where_the_sdk_expects_a_number_fails():
    report = S.check_constructed(
        "aws:ec2/instance:Instance", {"root_block_device": {"volume_size": "100"}}, "kind"
    )
    assert [p.split(": ", 1)[1] for p in report.problems] == [
        "root_block_device.volume_size: a str where the SDK expects int"
    ]


def test_a_fraction_where_the_sdk_expects_a_whole_number_fails_and_a_bool_for_a_string_too():
    report = S.check_constructed(
        "alicloud:ecs/instance:Instance",
        {"data_disks": [{"size": 100.5, "category": True}]},
        "kind",
    )
    assert [p.split(": ", 1)[1] for p in report.problems] == [
        "data_disks[0].size: a float where the SDK expects int",
        "data_disks[0].category: a bool where the SDK expects str",
    ]


def test_a_providers_json_encoded_setting_is_checked_as_what_it_encodes():
    token = "pulumi:providers:aws"
    assert S.check_constructed(token, {"skip_credentials_validation": "true"}, "p").problems == []
    (problem,) = S.check_constructed(token, {"skip_credentials_validation": "3"}, "p").problems
    assert problem.endswith("skip_credentials_validation: an int where the SDK expects bool")
