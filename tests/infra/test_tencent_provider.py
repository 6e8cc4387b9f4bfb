"""The Tencent provider's pure parts (billing, names, CAM and bucket documents) and what its
stacks declare under Pulumi's mocks that the common invariants do not look at."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node.fleet_names import HEARTBEAT_OBJECT_PREFIX
from infra.catalog import load_catalog
from infra.clouds.tencent import program as tp
from infra.clouds.tencent.reaper import CAM_ACTIONS
from infra.components.args import billing_of, guard_args
from infra.config import StackConfig
from infra.reaper import tags as T
from tests.infra.conftest import planned
from tests.support import tencent_cam as cam
from tests.support.tencent_cam import ALLOW, DENY, IMPLICIT_DENY, Request

ROOT = Path(__file__).resolve().parents[2]
STACKS = ROOT / "stacks"


def cfg_of(stack: str) -> StackConfig:
    cfg, _ = planned(STACKS / f"Pulumi.{stack}.yaml")
    return cfg


def charge_of(cfg: StackConfig) -> dict[str, Any]:
    """The CVM billing arguments a node of this stack is declared with."""
    return tp.charge_args(billing_of(cfg), cfg.instance_type)


def test_pay_as_you_go_stops_without_compute_charges() -> None:
    cfg = cfg_of("tencent-a100x4")
    assert charge_of(cfg) == {
        "instance_charge_type": "POSTPAID_BY_HOUR",
        "stopped_mode": "STOP_CHARGING",
    }


def test_the_stop_mode_is_the_catalogs_provider_fact() -> None:
    assert tp.stopped_mode() == load_catalog().providers["tencent"].stopped_mode == "STOP_CHARGING"


def test_spot_asks_for_spotpaid_with_the_stacks_cap() -> None:
    args = charge_of(cfg_of("tencent-t4x1"))
    assert args["instance_charge_type"] == "SPOTPAID"
    assert args["spot_max_price"] == "6"
    assert args["stopped_mode"] == "STOP_CHARGING"


def test_spot_without_a_cap_bids_at_most_the_on_demand_price() -> None:
    cfg = replace(cfg_of("tencent-t4x1"), spot_max_price=None)
    on_demand = load_catalog().instance("tencent", cfg.instance_type).price
    assert on_demand is not None
    assert float(charge_of(cfg)["spot_max_price"]) == on_demand.on_demand


def test_prepaid_is_by_the_month_and_never_renews_by_itself() -> None:
    cfg = replace(cfg_of("tencent-a100x1-monthly"), subscription_months=3)
    assert charge_of(cfg) == {
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


def test_the_reaper_grants_exactly_its_contract_and_denies_terminate() -> None:
    doc = json.loads(tp.reaper_policy("s1", "qcs::cos:ap-guangzhou:uid/125:b-125"))
    allows = [s for s in doc["statement"] if s["effect"] == "allow"]
    assert {a for s in allows for a in s["action"]} == set(CAM_ACTIONS)
    denies = [s for s in doc["statement"] if s["effect"] == "deny"]
    assert denies and "cvm:TerminateInstances" in denies[0]["action"]


def test_stack_grants_name_one_tag_pair_with_for_any_value() -> None:
    """Two pairs in one for_any_value list would admit a resource carrying either: every
    gpufleet node of every stack carries managed-by&gpufleet."""
    assert tp._tag_condition("s1") == {
        "for_any_value:string_equal": {"qcs:resource_tag": [f"{T.STACK}&s1"]}
    }


def test_nodes_may_read_only_descriptions_and_their_identity_without_a_condition() -> None:
    doc = json.loads(tp.node_policy("ap-guangzhou", "1250000000", "b-1250000000", "s1"))
    allows = [s for s in doc["statement"] if s["effect"] == "allow"]
    cos = {r for s in allows for r in s["resource"] if r.startswith("qcs::cos")}
    assert cos == {
        "qcs::cos:ap-guangzhou:uid/1250000000:b-1250000000/",
        "qcs::cos:ap-guangzhou:uid/1250000000:b-1250000000/*",
    }
    unconditioned = {a for s in allows if "condition" not in s for a in s["action"]}
    assert {a for a in unconditioned if not a.startswith("cos:")} == {
        "cvm:DescribeInstances",
        "sts:GetCallerIdentity",
    }
    (scoped,) = [s for s in allows if "condition" in s]
    assert set(scoped["action"]) == {"tag:TagResources", "cvm:StopInstances"}
    assert scoped["condition"] == tp._tag_condition("s1")


# --- what CAM decides for the guards' own calls (tests/support/tencent_cam.py, an
# evaluator of CAM's documented semantics; its own tests are Tencent's examples).

OWNER_UIN = "100000000001"


def stack_documents(stack: str) -> dict[str, str]:
    """The stack's CAM and bucket policy documents, as the program declares them."""
    _, result = planned(STACKS / f"Pulumi.{stack}.yaml")
    docs = {p.name: p.inputs["document"] for p in result.of_type("tencentcloud:Cam/policy:Policy")}
    (bucket_policy,) = result.of_type("tencentcloud:Cos/bucketPolicy:BucketPolicy")
    docs["bucket"] = bucket_policy.inputs["policy"]
    return docs


def node_tags(stack: str) -> dict[str, str]:
    _, result = planned(STACKS / f"Pulumi.{stack}.yaml")
    return dict(result.of_type("tencentcloud:Instance/instance:Instance")[0].inputs["tags"])


def instance_request(action: str, tags: dict[str, str], instance: str = "ins-1") -> Request:
    """A CVM or Tag API call on one instance, with the instance's tags as CAM sees them
    (qcs:resource_tag: one key&value per tag); the resource is the six-segment name the
    watchdog writes for TagResources (infra/clouds/tencent/node.py)."""
    resource = f"qcs::cvm:ap-guangzhou:uin/{OWNER_UIN}:instance/{instance}"
    pairs = [f"{k}&{v}" for k, v in tags.items()]
    return Request(action, resource, {"qcs:resource_tag": pairs})


def another_stacks(tags: dict[str, str]) -> dict[str, str]:
    return {**tags, T.STACK: "someone-elses-stack", "Name": "someone-elses-stack-0"}


@pytest.mark.parametrize("action", ["cvm:StopInstances", "tag:TagResources"])
def test_our_node_may_stop_itself_and_write_its_lease_and_another_stacks_node_may_not(
    action: str,
) -> None:
    docs = stack_documents("tencent-a100x4")
    node = [docs["tencent-a100x4-node-policy"]]
    ours = node_tags("tencent-a100x4")
    assert cam.decide(node, instance_request(action, ours)) == ALLOW
    assert cam.decide(node, instance_request(action, another_stacks(ours))) == IMPLICIT_DENY
    untagged = {"Name": "hand-made"}
    assert cam.decide(node, instance_request(action, untagged)) == IMPLICIT_DENY


@pytest.mark.parametrize(
    "action", ["cvm:TerminateInstances", "tag:UnTagResources", "tag:DeleteTags"]
)
def test_the_node_may_never_terminate_or_untag_even_itself(action: str) -> None:
    docs = stack_documents("tencent-a100x4")
    node = [docs["tencent-a100x4-node-policy"]]
    request = instance_request(action, node_tags("tencent-a100x4"))
    assert cam.decide(node, request) == DENY


def test_the_reaper_may_stop_its_stacks_instances_only_and_never_terminate() -> None:
    docs = stack_documents("tencent-a100x4")
    reaper = [docs["tencent-a100x4-reaper-policy"]]
    ours = node_tags("tencent-a100x4")
    assert cam.decide(reaper, instance_request("cvm:StopInstances", ours)) == ALLOW
    other = instance_request("cvm:StopInstances", another_stacks(ours))
    assert cam.decide(reaper, other) == IMPLICIT_DENY
    assert cam.decide(reaper, instance_request("cvm:TerminateInstances", ours)) == DENY
    for action in CAM_ACTIONS:
        # the describe and metric reads: any resource (the bucket read: its own test)
        if action != "cvm:StopInstances" and not action.startswith("cos:"):
            assert cam.decide(reaper, Request(action, "*")) == ALLOW


def test_the_reaper_may_read_its_stacks_heartbeats_and_no_other_object() -> None:
    """The heartbeat is an object the node writes (HEARTBEAT_OBJECT_PREFIX + instance id);
    the reaper HEADs it over HTTPS, and nothing else of COS."""
    docs = stack_documents("tencent-a100x4")
    reaper_and_bucket = [docs["tencent-a100x4-reaper-policy"], docs["bucket"]]
    bucket = bucket_of("tencent-a100x4")
    role = "qcs::cam::uin/100000000001:roleName/gpufleet-tencent-a100x4-reaper"

    def head(resource: str, action: str = "cos:HeadObject") -> str:
        ctx = {"cos:secure-transport": ["true"]}
        return cam.decide(reaper_and_bucket, Request(action, resource, ctx, role))

    assert head(f"{bucket}/{HEARTBEAT_OBJECT_PREFIX}ins-1") == ALLOW
    assert head(f"{bucket}/checkpoints/step-100.pt") == IMPLICIT_DENY
    assert head(f"{bucket}/{HEARTBEAT_OBJECT_PREFIX}ins-1", "cos:GetObject") == IMPLICIT_DENY
    other = "qcs::cos:ap-guangzhou:uid/1250000000:someone-elses-bucket-1250000000"
    assert head(f"{other}/{HEARTBEAT_OBJECT_PREFIX}ins-1") == IMPLICIT_DENY


def bucket_of(stack: str) -> str:
    _, result = planned(STACKS / f"Pulumi.{stack}.yaml")
    (bucket,) = result.of_type("tencentcloud:Cos/bucket:Bucket")
    return f"qcs::cos:ap-guangzhou:uid/1250000000:{bucket.inputs['bucket']}"


NODE_ROLE = "qcs::cam::uin/100000000001:roleName/gpufleet-tencent-a100x4-node"


@pytest.mark.parametrize(
    ("action", "path"),
    [
        ("cos:HeadBucket", "/"),
        ("cos:GetBucket", "/"),
        ("cos:ListMultipartUploads", "/"),
        ("cos:PutObject", "/checkpoints/step-100.pt"),
        ("cos:GetObject", "/checkpoints/step-100.pt"),
        ("cos:ListParts", "/checkpoints/step-100.pt"),
        ("cos:AbortMultipartUpload", "/checkpoints/step-100.pt"),
    ],
)
def test_the_node_reaches_its_stacks_bucket_over_https_and_no_other(action: str, path: str) -> None:
    """Bucket APIs name ``<bucket>/`` and objects ``<bucket>/<key>`` (COS 436/31923)."""
    docs = stack_documents("tencent-a100x4")
    node_and_bucket = [docs["tencent-a100x4-node-policy"], docs["bucket"]]
    bucket = bucket_of("tencent-a100x4")

    def ask(resource: str, https: str) -> str:
        ctx = {"cos:secure-transport": [https]}
        return cam.decide(node_and_bucket, Request(action, resource, ctx, NODE_ROLE))

    assert ask(bucket + path, "true") == ALLOW
    assert ask(bucket + path, "false") == DENY
    other = "qcs::cos:ap-guangzhou:uid/1250000000:someone-elses-bucket-1250000000"
    assert ask(other + path, "true") == IMPLICIT_DENY


def test_the_bucket_refuses_plain_http_for_every_principal() -> None:
    bucket = bucket_of("tencent-a100x4")
    doc = [stack_documents("tencent-a100x4")["bucket"]]
    for who in (NODE_ROLE, "qcs::cam::uin/100000000009:uin/100000000009"):
        http = Request("cos:GetObject", bucket + "/k", {"cos:secure-transport": ["false"]}, who)
        assert cam.decide(doc, http) == DENY
        https = Request("cos:GetObject", bucket + "/k", {"cos:secure-transport": ["true"]}, who)
        assert cam.decide(doc, https) == IMPLICIT_DENY  # the bucket policy grants nothing


def test_the_function_gets_exactly_the_reapers_contract_variables() -> None:
    from infra.clouds.tencent.reaper import FUNCTION_ENV

    env = tp.function_env(guard_args(cfg_of("tencent-a100x4")))
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


def test_the_disks_kept_after_their_instance_are_the_providers_own_list() -> None:
    """The SDK's InstanceDataDiskArgs says which disk types and charges the flags apply to;
    our list is that one, read from the installed SDK, not from memory."""
    import re

    import tencentcloud_iac_pulumi as tc

    doc = tc.instance.InstanceDataDiskArgs.__init__.__doc__ or ""
    found = {}
    for flag in ("delete_with_instance", "delete_with_instance_prepaid"):
        m = re.search(
            rf":param [^:]* {flag}: .*?only applied to (.*?) disk with `(\w+)` instance", doc
        )
        assert m, flag
        found[flag] = (tuple(re.findall(r"`(\w+)`", m[1])), m[2])
    assert found["delete_with_instance"] == (tp.KEEPABLE_DATA_DISKS, "POSTPAID_BY_HOUR")
    assert found["delete_with_instance_prepaid"] == (tp.KEEPABLE_DATA_DISKS, "PREPAID")
    assert set(tp.KEEPABLE_CHARGES) == {"POSTPAID_BY_HOUR", "PREPAID"}  # not SPOTPAID


def plan_notes(stack: str, **changes: object) -> list[str]:
    return tp.PROVIDER.stack_notes(replace(cfg_of(stack), **changes))


def test_the_plan_says_a_reclaimed_spot_node_takes_its_scratch_disk_with_it() -> None:
    from scripts.plan import plan

    _, notes = plan(STACKS / "Pulumi.tencent-t4x1.yaml")
    (note,) = [n for n in notes if "repossesses" in n]
    assert "scratch disk goes with it" in note and "213/17816" in note


def test_the_plan_says_an_hssd_scratch_disk_is_released_with_its_instance() -> None:
    (note,) = plan_notes("tencent-a100x4")
    assert note.startswith("gpufleet:scratchClass CLOUD_HSSD:") and "CLOUD_SSD" in note
    assert plan_notes("tencent-a100x4", scratch_class="CLOUD_SSD") == []
    assert plan_notes("tencent-a100x4", destroy_data=True) == []  # nothing is to be kept
    assert plan_notes("tencent-a100x1-monthly", scratch_class="CLOUD_PREMIUM") == []


def test_a_stack_that_keeps_its_data_protects_instances_and_disks() -> None:
    cfg, result = planned(STACKS / "Pulumi.tencent-a100x4.yaml")
    assert cfg.destroy_data is False
    (node,) = result.of_type("tencentcloud:Instance/instance:Instance")
    assert node.inputs["disableApiTermination"] is True
    (disk,) = node.inputs["dataDisks"]
    # Asked to stay; for CLOUD_HSSD the provider does not apply it, and the plan says so.
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
