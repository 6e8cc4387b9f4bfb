"""Every stack in stacks/ runs through the real program under mocks and keeps the invariants.

A new stack file is picked up with no test change (the fixture globs stacks/).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

from infra.catalog import load_catalog
from infra.config import WORLD
from infra.offline import PlanResult
from infra.reaper import tags as T

CAT = load_catalog()
AZ_VM = "azure-native:compute:VirtualMachine"
AZ_NSG = "azure-native:network:NetworkSecurityGroup"


# Python packages whose name is not pulumi_<package> (token package -> module).
PACKAGES = {"tencentcloud": "tencentcloud_iac_pulumi"}
TC_INSTANCE = "tencentcloud:Instance/instance:Instance"


def _args_class(token: str) -> type | None:
    pkg, mod_path, cls = token.split(":")
    if pkg in ("pulumi", "gpufleet"):
        return None
    # azure-native -> pulumi_azure_native
    package = PACKAGES.get(pkg, f"pulumi_{pkg.replace('-', '_')}")
    mod = mod_path.split("/")[0]
    if mod == "index":  # top-level resources (random.RandomId) live in the package itself
        return getattr(importlib.import_module(package), cls + "Args", None)
    for candidate in (mod, mod + "_", mod.lower()):
        try:
            module = importlib.import_module(f"{package}.{candidate}")
        except ImportError:
            continue
        return getattr(module, cls + "Args", None)
    raise AssertionError(f"cannot find the SDK class for {token}")


def taggable(token: str) -> bool:
    args = _args_class(token)
    return args is not None and "tags" in inspect.signature(args.__init__).parameters


def instances(result: PlanResult) -> list:
    return (
        result.of_type("aws:ec2/instance:Instance")
        + result.of_type("alicloud:ecs/instance:Instance")
        + result.of_type(TC_INSTANCE)
        + result.of_type(AZ_VM)
    )


def size_of(node) -> str:
    if node.type == AZ_VM:
        return str(node.inputs["hardwareProfile"]["vmSize"])
    return str(node.inputs["instanceType"])


def test_every_taggable_resource_carries_the_stack_tags(stack):
    cfg, result = stack
    checked = 0
    for r in result.resources:
        if taggable(r.type):
            tags = r.inputs.get("tags") or {}
            assert tags.get(T.MANAGED_BY) == "gpufleet", f"{r.type} {r.name} untagged"
            assert tags.get(T.STACK) == cfg.stack, f"{r.type} {r.name}"
            checked += 1
    assert checked >= 5


def test_node_count_and_instance_type_are_what_config_and_catalog_say(stack):
    cfg, result = stack
    nodes = instances(result)
    assert len(nodes) == cfg.nodes
    expected = CAT.resolve(cfg.tier, cfg.provider, cfg.profile).name
    assert {size_of(n) for n in nodes} == {expected}
    roles = sorted(n.inputs["tags"][T.ROLE] for n in nodes)
    assert roles == ["head"] + ["worker"] * (cfg.nodes - 1)
    assert [n["name"] for n in result.outputs["nodes"]] == [
        f"{cfg.stack}-{i}" for i in range(cfg.nodes)
    ]


def test_instance_metadata_requires_tokens_imdsv2(stack):
    _, result = stack
    for n in instances(result):
        if n.type == TC_INSTANCE:
            continue  # CVM's instance resource has no token-only option (SECURITY.md)
        if n.type == AZ_VM:
            continue  # Azure's IMDS has no tokens (Metadata: true header, no hop past the host)
        tokens = n.inputs.get("metadataOptions", {}).get("httpTokens") or n.inputs.get("httpTokens")
        assert tokens == "required", n.name


def test_every_disk_is_encrypted(stack):
    _, result = stack
    for n in instances(result):
        if n.type == AZ_VM:
            # platform-managed keys are always on; encryption at host covers temp disk + cache
            assert n.inputs["securityProfile"]["encryptionAtHost"] is True
        elif n.type.startswith("aws:"):
            assert n.inputs["rootBlockDevice"]["encrypted"] is True
            for disk in n.inputs.get("ebsBlockDevices", []):
                assert disk["encrypted"] is True
        elif n.type == TC_INSTANCE:
            # the system disk cannot be encrypted on CVM (docs/clouds/tencent.md, known gaps)
            assert n.inputs["dataDisks"] and all(
                d["encrypt"] is True for d in n.inputs["dataDisks"]
            )
        else:
            assert n.inputs["systemDiskEncrypted"] is True
            for disk in n.inputs.get("dataDisks", []):
                assert disk["encrypted"] is True


def test_nodes_stop_rather_than_terminate_and_keep_scratch_disks(stack):
    cfg, result = stack
    for n in instances(result):
        if n.type == AZ_VM:
            # the disk is its own resource in the kept data group, retained unless
            # destroyData: the VM only ever detaches it
            for disk in n.inputs["storageProfile"].get("dataDisks") or []:
                assert disk["deleteOption"] == "Detach"
            for disk in result.of_type("azure-native:compute:Disk"):
                assert disk.retain_on_delete is not cfg.destroy_data
        elif n.type.startswith("aws:"):
            assert n.inputs["instanceInitiatedShutdownBehavior"] == "stop"
            for disk in n.inputs.get("ebsBlockDevices", []):
                assert disk["deleteOnTermination"] is cfg.destroy_data
        else:
            for disk in n.inputs.get("dataDisks", []):
                assert disk["deleteWithInstance"] is cfg.destroy_data


def test_ssh_is_never_open_to_the_world(stack):
    cfg, result = stack
    ssh_sources = []
    for r in result.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        if r.inputs.get("fromPort") == 22:
            ssh_sources.append(r.inputs.get("cidrIpv4") or r.inputs.get("cidrIpv6"))
    for r in result.of_type("alicloud:ecs/securityGroupRule:SecurityGroupRule"):
        if r.inputs.get("portRange") == "22/22":
            ssh_sources.append(r.inputs.get("cidrIp") or r.inputs.get("ipv6CidrIp"))
    for r in result.of_type("tencentcloud:Security/groupRuleSet:GroupRuleSet"):
        for rule in r.inputs.get("ingresses", []):
            if rule.get("port") == "22":
                ssh_sources.append(rule.get("cidrBlock") or rule.get("ipv6CidrBlock"))
    for nsg in result.of_type(AZ_NSG):
        for rule in nsg.inputs["securityRules"]:
            allowed = rule["direction"] == "Inbound" and rule["access"] == "Allow"
            ssh = rule["destinationPortRange"] in ("22", "*") and rule["name"] != "intra-stack"
            if allowed and ssh:
                ssh_sources.append(rule["sourceAddressPrefix"])
            assert rule["sourceAddressPrefix"] not in ("*", "Internet", "Any"), rule
    assert sorted(ssh_sources) == sorted(cfg.ssh_cidrs)
    assert not set(ssh_sources) & set(WORLD)


def test_nodes_reach_each_other_on_every_port(stack):
    cfg, result = stack
    if cfg.provider == "azure":
        (nsg,) = result.of_type(AZ_NSG)
        (rule,) = [r for r in nsg.inputs["securityRules"] if r["name"] == "intra-stack"]
        assert rule["protocol"] == "*" and rule["destinationPortRange"] == "*"
        assert rule["sourceAddressPrefix"] == rule["destinationAddressPrefix"]  # the subnet
        return
    protocols = [
        r.inputs.get("ipProtocol")
        for r in result.resources
        if ("IngressRule" in r.type or r.inputs.get("type") == "ingress")
        and (r.inputs.get("referencedSecurityGroupId") or r.inputs.get("sourceSecurityGroupId"))
    ]
    # Tencent: one rule set; its entry naming the group itself is the rule between nodes.
    for r in result.of_type("tencentcloud:Security/groupRuleSet:GroupRuleSet"):
        protocols += [
            rule["protocol"].lower()
            for rule in r.inputs.get("ingresses", [])
            if rule.get("sourceSecurityId") == r.inputs["securityGroupId"]
            and rule.get("action") == "ACCEPT"
        ]
    assert len(protocols) == 1
    assert protocols[0] in ("-1", "all")


def test_bucket_is_private_encrypted_versioned_and_tls_only(stack):
    cfg, result = stack
    if cfg.provider == "aws":
        (bucket,) = result.of_type("aws:s3/bucket:Bucket")
        assert bucket.inputs["forceDestroy"] is cfg.destroy_data
        (block,) = result.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        assert all(
            block.inputs[k] is True
            for k in (
                "blockPublicAcls",
                "blockPublicPolicy",
                "ignorePublicAcls",
                "restrictPublicBuckets",
            )
        )
        (sse,) = result.of_type(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
        )
        rule = sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]
        assert rule["sseAlgorithm"] in ("AES256", "aws:kms")
        (ver,) = result.of_type("aws:s3/bucketVersioning:BucketVersioning")
        assert ver.inputs["versioningConfiguration"]["status"] == "Enabled"
        (lc,) = result.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
        rules = {r["id"]: r for r in lc.inputs["rules"]}
        assert rules["archive-old-objects"]["transitions"][0]["days"] == cfg.bucket_archive_days
        assert rules["abort-stale-multipart-uploads"]["abortIncompleteMultipartUpload"]
        (pol,) = result.of_type("aws:s3/bucketPolicy:BucketPolicy")
        stmt = json.loads(pol.inputs["policy"])["Statement"][0]
        assert (
            stmt["Effect"] == "Deny" and stmt["Condition"]["Bool"]["aws:SecureTransport"] == "false"
        )
    elif cfg.provider == "tencent":
        (bucket,) = result.of_type("tencentcloud:Cos/bucket:Bucket")
        assert bucket.inputs["acl"] == "private"
        assert bucket.inputs["encryptionAlgorithm"] == "AES256"
        assert bucket.inputs["versioningEnable"] is True
        assert bucket.inputs["forceClean"] is cfg.destroy_data
        rule = bucket.inputs["lifecycleRules"][0]
        classes = [(t["days"], t["storageClass"]) for t in rule["transitions"]]
        assert classes == [
            (cfg.bucket_archive_days, "STANDARD_IA"),
            (cfg.bucket_archive_days + 180, "ARCHIVE"),
        ]
        assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 7
        (pol,) = result.of_type("tencentcloud:Cos/bucketPolicy:BucketPolicy")
        # the documented form (COS 436/46206): lowercase elements, bool_equal
        stmt = json.loads(pol.inputs["policy"])["statement"][0]
        assert stmt["effect"] == "deny"
        assert stmt["condition"]["bool_equal"]["cos:secure-transport"] == "false"
        assert stmt["principal"]["qcs"] == ["qcs::cam::anyone:anyone"]
    elif cfg.provider == "azure":
        (account,) = [
            a
            for a in result.of_type("azure-native:storage:StorageAccount")
            if a.name == f"{cfg.stack}-account"
        ]
        assert account.inputs["allowBlobPublicAccess"] is False
        assert account.inputs["allowSharedKeyAccess"] is False
        assert account.inputs["enableHttpsTrafficOnly"] is True
        assert account.inputs["minimumTlsVersion"] == "TLS1_2"
        assert account.inputs["encryption"]["services"]["blob"]["enabled"] is True
        (container,) = [
            c
            for c in result.of_type("azure-native:storage:BlobContainer")
            if c.inputs["containerName"] == "gpufleet"
        ]
        assert container.inputs["publicAccess"] == "None"
        (svc,) = result.of_type("azure-native:storage:BlobServiceProperties")
        assert svc.inputs["isVersioningEnabled"] is True
        (lc,) = result.of_type("azure-native:storage:ManagementPolicy")
        base = lc.inputs["policy"]["rules"][0]["definition"]["actions"]["baseBlob"]
        days = base["tierToCool"]["daysAfterModificationGreaterThan"]
        assert days == cfg.bucket_archive_days
    else:
        (bucket,) = result.of_type("alicloud:oss/bucket:Bucket")
        assert bucket.inputs["serverSideEncryptionRule"]["sseAlgorithm"] == "AES256"
        assert bucket.inputs["versioning"]["status"] == "Enabled"
        assert bucket.inputs["forceDestroy"] is cfg.destroy_data
        rule = bucket.inputs["lifecycleRules"][0]
        assert rule["transitions"][0]["days"] == cfg.bucket_archive_days
        assert rule["abortMultipartUploads"][0]["days"] == 7
        (block,) = result.of_type("alicloud:oss/bucketPublicAccessBlock:BucketPublicAccessBlock")
        assert block.inputs["blockPublicAccess"] is True
        (acl,) = result.of_type("alicloud:oss/bucketAcl:BucketAcl")
        assert acl.inputs["acl"] == "private"
        (pol,) = result.of_type("alicloud:oss/bucketPolicy:BucketPolicy")
        stmt = json.loads(pol.inputs["policy"])["Statement"][0]
        assert stmt["Condition"]["Bool"]["acs:SecureTransport"] == ["false"]


def test_spot_stacks_ask_for_spot_that_stops_on_interruption(stack):
    cfg, result = stack
    for n in instances(result):
        if n.type == AZ_VM:
            assert (n.inputs["priority"] == "Spot") is (cfg.billing == "spot")
            if cfg.billing == "spot":
                assert n.inputs["evictionPolicy"] == "Deallocate"  # never Delete
        elif n.type.startswith("aws:"):
            market = n.inputs.get("instanceMarketOptions")
            if cfg.billing == "spot":
                assert market["marketType"] == "spot"
                assert market["spotOptions"]["instanceInterruptionBehavior"] == "stop"
                assert market["spotOptions"]["spotInstanceType"] == "persistent"
            else:
                assert market is None
        elif n.type == TC_INSTANCE:
            charge = n.inputs["instanceChargeType"]
            assert (charge == "SPOTPAID") is (cfg.billing == "spot")
            if charge == "SPOTPAID":  # the SDK requires a cap; a one-time request
                assert float(n.inputs["spotMaxPrice"]) > 0
                assert n.inputs["spotInstanceType"] == "ONE-TIME"
        else:
            spot = n.inputs.get("spotStrategy")
            assert (spot != "NoSpot") is (cfg.billing == "spot")


def test_multi_node_efa_stacks_get_efa_interfaces_and_a_cluster_placement_group(stack):
    cfg, result = stack
    it = CAT.instance(cfg.provider, cfg.instance_type)
    lts = result.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    pgs = result.of_type("aws:ec2/placementGroup:PlacementGroup")
    if cfg.provider == "aws" and it.efa and (cfg.nodes > 1 or it.efa_interfaces > 1):
        assert len(lts) == cfg.nodes
        for lt in lts:
            nics = lt.inputs["networkInterfaces"]
            efa = [n for n in nics if n.get("interfaceType") == "efa-only"]
            assert len(efa) == it.efa_interfaces and len(nics) == it.efa_interfaces + 1
            assert {n["networkCardIndex"] for n in efa} == set(range(it.efa_interfaces))
            primary = [n for n in nics if n["networkCardIndex"] == 0 and n["deviceIndex"] == 0]
            assert len(primary) == 1 and "interfaceType" not in primary[0]  # ENA primary
        assert [p.inputs["strategy"] for p in pgs] == ["cluster"]
        for n in instances(result):
            assert n.inputs["placementGroup"] == pgs[0].name
        # several interfaces: AWS gives no automatic public IP, so each node gets an EIP
        # (every EFA layout has two or more; tests/infra/test_aws_stack.py: every type)
        eips = result.of_type("aws:ec2/eip:Eip")
        assert len(eips) == cfg.nodes
        assert all(e.inputs["networkInterface"].startswith("eni-") for e in eips)
        assert result.outputs["tier"]["efa"] is True
    else:
        assert not lts


def test_scratch_is_local_nvme_or_a_fast_data_disk(stack):
    cfg, result = stack
    it = CAT.instance(cfg.provider, cfg.instance_type)
    scratch = result.outputs["scratch"]
    assert scratch["path"] == cfg.scratch_path
    if it.nvme_count:
        assert scratch == {
            "path": cfg.scratch_path,
            "kind": "nvme",
            "devices": it.nvme_count,
            "size_gb": it.local_nvme_gb,
        }
    else:
        assert scratch["kind"] == "disk" and scratch["size_gb"] == cfg.scratch_gb
        for n in instances(result):
            disks = (
                n.inputs.get("dataDisks")
                or n.inputs.get("ebsBlockDevices")
                or n.inputs.get("storageProfile", {}).get("dataDisks")
            )
            d = disks[0]
            if n.type == AZ_VM:  # attached by id: the size is on the disk resource
                by_id = {r.id: r for r in result.of_type("azure-native:compute:Disk")}
                d = by_id[d["managedDisk"]["id"]].inputs
            size = d.get("size", d.get("volumeSize", d.get("dataDiskSize", d.get("diskSizeGB"))))
            assert len(disks) == 1 and size == cfg.scratch_gb


def test_every_stack_declares_its_idle_guard(stack):
    cfg, result = stack
    if cfg.provider == "aws":
        (fn,) = result.of_type("aws:lambda/function:Function")
        assert fn.inputs["environment"]["variables"]["GPUFLEET_STACK"] == cfg.stack
        (rule,) = result.of_type("aws:cloudwatch/eventRule:EventRule")
        assert rule.inputs["scheduleExpression"] == "rate(5 minutes)"
        policies = [
            json.loads(p.inputs["policy"]) for p in result.of_type("aws:iam/rolePolicy:RolePolicy")
        ]
        stop = [
            s for p in policies for s in p["Statement"] if s.get("Action") == "ec2:StopInstances"
        ]
        assert (
            stop and stop[0]["Condition"]["StringEquals"][f"aws:ResourceTag/{T.STACK}"] == cfg.stack
        )
        actions = json.dumps(policies)
        assert "TerminateInstances" not in actions
        (dash,) = result.of_type("aws:cloudwatch/dashboard:Dashboard")
        body = json.loads(dash.inputs["dashboardBody"])
        ids = {n["instance_id"] for n in result.outputs["nodes"]}
        assert {m[3] for m in body["widgets"][0]["properties"]["metrics"]} == ids
    elif cfg.provider == "tencent":
        from infra.clouds.tencent.entry import HANDLER as SCF_HANDLER
        from infra.clouds.tencent.reaper import (
            BUCKET_ENV,
            CAM_ACTIONS,
            FUNCTION_ENV,
            SCF_RUNTIME,
        )

        (fn,) = result.of_type("tencentcloud:Scf/function:Function")
        assert set(fn.inputs["environment"]) == {*FUNCTION_ENV, BUCKET_ENV}
        assert fn.inputs["environment"][BUCKET_ENV] == result.outputs["bucket"]
        assert fn.inputs["environment"]["GPUFLEET_STACK"] == cfg.stack
        assert fn.inputs["environment"]["GPUFLEET_APPLY"] == "true"
        assert (fn.inputs["runtime"], fn.inputs["handler"]) == (SCF_RUNTIME, SCF_HANDLER)
        assert Path(fn.inputs["zipFile"]).is_file()  # the SDK uploads it from this path
        (trigger,) = fn.inputs["triggers"]
        assert trigger["type"] == "timer" and trigger["triggerDesc"] == "0 */5 * * * * *"
        docs = [
            json.loads(p.inputs["document"])
            for p in result.of_type("tencentcloud:Cam/policy:Policy")
            if p.name.endswith("reaper-policy")
        ]
        allowed = [s for d in docs for s in d["statement"] if s["effect"] == "allow"]
        assert {a for s in allowed for a in s["action"]} == set(CAM_ACTIONS)
        (stop,) = [s for s in allowed if "cvm:StopInstances" in s["action"]]
        assert f"{T.STACK}&{cfg.stack}" in json.dumps(stop["condition"])
        assert "TerminateInstances" not in json.dumps(allowed)
        for n in instances(result):
            if cfg.billing != "subscription":
                assert n.inputs["stoppedMode"] == "STOP_CHARGING"
    elif cfg.provider == "azure":
        from infra.clouds.azure.program import AZURE_SCHEDULE, reaper_contract

        (app,) = result.of_type("azure-native:web:WebApp")
        settings = {s["name"]: s["value"] for s in app.inputs["siteConfig"]["appSettings"]}
        assert settings["GPUFLEET_STACK"] == cfg.stack
        assert settings["GPUFLEET_SCHEDULE"] == AZURE_SCHEDULE == "0 */5 * * * *"
        required, actions = reaper_contract()
        assert all(settings.get(k) for k in required)
        (role,) = [
            r
            for r in result.of_type("azure-native:authorization:RoleDefinition")
            if r.name == f"{cfg.stack}-reaper-role"
        ]
        assert sorted(role.inputs["permissions"][0]["actions"]) == sorted(actions)
        assert "delete" not in json.dumps(role.inputs["permissions"]).lower()
        assert result.of_type("azure-native:applicationinsights:Workbook")
    else:
        (fn,) = result.of_type("alicloud:fc/v3Function:V3Function")
        assert fn.inputs["environmentVariables"]["GPUFLEET_STACK"] == cfg.stack
        assert fn.inputs["code"]["zipFile"]
        (trigger,) = result.of_type("alicloud:fc/v3Trigger:V3Trigger")
        assert trigger.inputs["triggerType"] == "timer"
        assert json.loads(trigger.inputs["triggerConfig"])["enable"] is True
        docs = [
            json.loads(p.inputs["policyDocument"])
            for p in result.of_type("alicloud:ram/policy:Policy")
        ]
        stop = [s for d in docs for s in d["Statement"] if "ecs:StopInstances" in s["Action"]]
        assert stop[0]["Condition"]["StringEquals"][f"acs:ResourceTag/{T.STACK}"] == [cfg.stack]
        assert "DeleteInstance" not in json.dumps(docs)
        for n in instances(result):
            if cfg.billing != "subscription":
                assert n.inputs["stoppedMode"] == "StopCharging"


def test_nodes_carry_the_idle_policy_in_their_tags(stack):
    cfg, result = stack
    for n in instances(result):
        tags = n.inputs["tags"]
        assert tags[T.IDLE_MINUTES] == str(cfg.idle_minutes)
        assert tags[T.TTL_HOURS] == (str(cfg.ttl_hours) if cfg.ttl_hours else "off")
        assert tags[T.WATCHDOG] == "on"


def test_outputs_keep_the_documented_contract(stack):
    cfg, result = stack
    from infra.program import OUTPUT_DOCS

    assert set(result.outputs) == set(OUTPUT_DOCS)
    assert result.outputs["ssh_user"] == CAT.providers[cfg.provider].ssh_user
    zone = result.outputs["zone"]
    assert zone.startswith(cfg.region) or zone in CAT.providers[cfg.provider].zone_names
    for node in result.outputs["nodes"]:
        assert set(node) == {"name", "role", "instance_id", "public_ip", "private_ip"}
        assert node["private_ip"].startswith("10.42.")
    cost = result.outputs["hourly_cost"]
    assert cost["currency"] == CAT.providers[cfg.provider].currency and cost["amount"] > 0


def test_the_provider_outputs_doc_names_every_cloud_the_catalog_knows():
    from infra.catalog import provider_names
    from infra.program import OUTPUT_DOCS

    clouds = OUTPUT_DOCS["provider"].removesuffix(" (a cloud in infra/clouds/)")
    assert clouds.split(" | ") == list(provider_names())


def test_no_resource_carries_an_alarm_action_that_stops_a_node(stack):
    """A CloudWatch alarm reads neither tags nor GPUs: on a 96-vCPU p4d a one-process GPU
    job keeps CPU near 1 %, and a protected or leased node would be stopped like any other.
    Only the watchdog and the reaper, which read both, may stop a node."""
    _, result = stack
    assert not result.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    assert not result.of_type("aws:cloudwatch/compositeAlarm:CompositeAlarm")
    for r in result.resources:
        assert "arn:aws:automate:" not in json.dumps(r.inputs, default=str), r.name
