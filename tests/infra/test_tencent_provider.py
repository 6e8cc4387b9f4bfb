"""The Tencent provider's pure parts (billing, names, CAM and bucket documents) and what its
stacks declare under Pulumi's mocks that the common invariants do not look at."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from infra.catalog import load_catalog
from infra.providers import tencent as tp
from infra.reaper import tags as T
from infra.reaper.tencent import CAM_ACTIONS
from tests.infra.conftest import planned

ROOT = Path(__file__).resolve().parents[2]
STACKS = ROOT / "stacks"


def cfg_of(stack: str):
    cfg, _ = planned(STACKS / f"Pulumi.{stack}.yaml")
    return cfg


def test_pay_as_you_go_stops_without_compute_charges() -> None:
    cfg = cfg_of("tencent-a100x4")
    assert tp.charge_args(cfg) == {
        "instance_charge_type": "POSTPAID_BY_HOUR",
        "stopped_mode": "STOP_CHARGING",
    }


def test_the_stop_mode_is_the_catalogs_provider_fact() -> None:
    assert tp.stopped_mode() == load_catalog().providers["tencent"].stopped_mode == "STOP_CHARGING"


def test_spot_asks_for_spotpaid_with_the_stacks_cap() -> None:
    args = tp.charge_args(cfg_of("tencent-t4x1"))
    assert args["instance_charge_type"] == "SPOTPAID"
    assert args["spot_max_price"] == "6"
    assert args["stopped_mode"] == "STOP_CHARGING"


def test_spot_without_a_cap_bids_at_most_the_on_demand_price() -> None:
    cfg = replace(cfg_of("tencent-t4x1"), spot_max_price=None)
    on_demand = load_catalog().instance("tencent", cfg.instance_type).price
    assert on_demand is not None
    assert float(tp.charge_args(cfg)["spot_max_price"]) == on_demand.on_demand


def test_prepaid_is_by_the_month_and_never_renews_by_itself() -> None:
    cfg = replace(cfg_of("tencent-a100x1-monthly"), subscription_months=3)
    assert tp.charge_args(cfg) == {
        "instance_charge_type": "PREPAID",
        "instance_charge_type_prepaid_period": 3,
        "instance_charge_type_prepaid_renew_flag": "NOTIFY_AND_MANUAL_RENEW",
    }


@pytest.mark.parametrize("stack", ["a", "x" * 80, "trailing-dash-" * 5])
def test_bucket_names_fit_cos_and_keep_the_suffix_and_appid_whole(stack: str) -> None:
    name = tp.bucket_name_for(stack, "f30361c4", "1250000000")
    assert name.endswith("-f30361c4-1250000000")
    assert len(name.removesuffix("-1250000000")) <= 50
    assert "--" not in name


def test_the_reaper_may_stop_only_this_stacks_tagged_instances_and_never_terminate() -> None:
    doc = json.loads(tp.reaper_policy("s1"))
    allows = [s for s in doc["statement"] if s["effect"] == "allow"]
    assert {a for s in allows for a in s["action"]} == set(CAM_ACTIONS)
    (stop,) = [s for s in allows if "cvm:StopInstances" in s["action"]]
    tags = stop["condition"]["for_all_value:string_equal"]["qcs:resource_tag"]
    assert tags == [f"{T.MANAGED_BY}&{T.MANAGED_BY_VALUE}", f"{T.STACK}&s1"]
    denies = [s for s in doc["statement"] if s["effect"] == "deny"]
    assert denies and "cvm:TerminateInstances" in denies[0]["action"]


def test_nodes_reach_only_their_stacks_bucket_and_touch_only_their_stacks_instances() -> None:
    doc = json.loads(tp.node_policy("ap-guangzhou", "1250000000", "b-1250000000", "s1"))
    allows = [s for s in doc["statement"] if s["effect"] == "allow"]
    cos = {r for s in allows for r in s["resource"] if r.startswith("qcs::cos")}
    assert cos == {
        "qcs::cos:ap-guangzhou:uid/1250000000:b-1250000000",
        "qcs::cos:ap-guangzhou:uid/1250000000:b-1250000000/*",
    }
    unconditioned = {a for s in allows if "condition" not in s for a in s["action"]}
    assert {a for a in unconditioned if not a.startswith("cos:")} == {
        "cvm:DescribeInstances",
        "sts:GetCallerIdentity",
    }
    (scoped,) = [s for s in allows if "condition" in s]
    assert set(scoped["action"]) == {"tag:TagResources", "cvm:StopInstances"}
    assert f"{T.STACK}&s1" in scoped["condition"]["for_all_value:string_equal"]["qcs:resource_tag"]
    (deny,) = [s for s in doc["statement"] if s["effect"] == "deny"]
    assert "cvm:TerminateInstances" in deny["action"]


def test_the_bucket_refuses_plain_http_for_every_principal() -> None:
    doc = json.loads(tp.tls_only_policy("ap-guangzhou", "125", "b-125"))
    (stmt,) = doc["Statement"]
    assert stmt["Effect"] == "Deny" and stmt["Action"] == ["name/cos:*"]
    assert stmt["Condition"]["bool"]["cos:secure_transport"] == "false"


def test_the_function_gets_exactly_the_reapers_contract_variables() -> None:
    from infra.reaper.tencent import FUNCTION_ENV

    env = tp.function_env(cfg_of("tencent-a100x4"))
    assert tuple(env) == FUNCTION_ENV
    assert env["GPUFLEET_PROVIDER"] == "tencent" and env["GPUFLEET_APPLY"] == "true"


def test_the_reaper_zip_is_written_once_under_its_digest(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tp, "BUILD_DIR", tmp_path)
    first = tp.function_zip_path()
    assert Path(first).parent == tmp_path and Path(first).stat().st_size > 0
    mtime = Path(first).stat().st_mtime_ns
    assert tp.function_zip_path() == first and Path(first).stat().st_mtime_ns == mtime
    import zipfile

    with zipfile.ZipFile(first) as zf:
        assert "handler.py" in zf.namelist()


def test_a_stack_that_keeps_its_data_protects_instances_and_disks() -> None:
    cfg, result = planned(STACKS / "Pulumi.tencent-a100x4.yaml")
    assert cfg.destroy_data is False
    (node,) = result.of_type("tencentcloud:Instance/instance:Instance")
    assert node.inputs["disableApiTermination"] is True
    (disk,) = node.inputs["dataDisks"]
    assert disk["deleteWithInstance"] is False and disk["deleteWithInstancePrepaid"] is False
    assert disk["dataDiskType"] == "CLOUD_HSSD" and disk["encrypt"] is True
    (bucket,) = result.of_type("tencentcloud:Cos/bucket:Bucket")
    assert bucket.inputs["forceClean"] is False


def test_the_node_gets_its_role_key_and_the_stacks_security_group() -> None:
    _, result = planned(STACKS / "Pulumi.tencent-a100x4.yaml")
    (node,) = result.of_type("tencentcloud:Instance/instance:Instance")
    (role,) = [r for r in result.of_type("tencentcloud:Cam/role:Role") if "node" in r.name]
    (key,) = result.of_type("tencentcloud:Key/pair:Pair")
    (sg,) = result.of_type("tencentcloud:Security/group:Group")
    assert node.inputs["camRoleName"] == role.inputs["name"]
    assert node.inputs["keyIds"] == [key.id]
    assert node.inputs["orderlySecurityGroups"] == [sg.id]
    assert json.loads(role.inputs["document"])["statement"][0]["principal"] == {
        "service": ["cvm.qcloud.com"]
    }


def test_without_a_zone_the_first_zone_selling_the_type_is_taken() -> None:
    cfg, result = planned(STACKS / "Pulumi.tencent-t4x1.yaml")
    assert cfg.zone is None
    (subnet,) = result.of_type("tencentcloud:Subnet/instance:Instance")
    assert subnet.inputs["availabilityZone"] == "ap-guangzhou-3"  # the mock's first zone
    tokens = [t for t, _ in result.invokes]
    assert "tencentcloud:Instance/getTypes:getTypes" in tokens
