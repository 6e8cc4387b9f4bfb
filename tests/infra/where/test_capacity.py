"""infra/capacity.py: the capacity-error classifier, on real error texts.

Each text is quoted from a public issue tracker (the URL beside it) as the tool of that
report printed it; the classifier must tell a full zone (fail over) from a quota or a bad
request (stop)."""

from __future__ import annotations

import pytest

from infra import capacity
from infra.catalog import CatalogError, load_catalog

CAPACITY = [
    # https://github.com/scylladb/scylla-cluster-tests/issues/5119 (boto3)
    (
        "aws",
        "botocore.exceptions.ClientError: An error occurred (InsufficientInstanceCapacity) "
        "when calling the RunInstances operation (reached max retries: 4): We currently do "
        "not have sufficient im4gn.xlarge capacity in the Availability Zone you requested "
        "(us-east-1c). Our system will be working on provisioning additional capacity. You "
        "can currently get im4gn.xlarge capacity by not specifying an Availability Zone in "
        "your request or choosing us-east-1b, us-east-1d.",
        "InsufficientInstanceCapacity",
    ),
    # https://github.com/red-hat-storage/ocs-ci/issues/9263 (the Terraform AWS provider, as
    # pulumi-aws wraps it)
    (
        "aws",
        "level=error msg=Error: creating EC2 Instance: InsufficientInstanceCapacity: We "
        "currently do not have sufficient m6i.xlarge capacity in the Availability Zone you "
        "requested (us-east-2a). Our system will be working on provisioning additional "
        "capacity. You can currently get m6i.xlarge capacity by not specifying an "
        "Availability Zone in your request or choosing us-east-2b, us-east-2c.\n"
        "level=error msg=\tstatus code: 500, request id: 889de2c1-f2f8-460c-a127-847a8493109a",
        "InsufficientInstanceCapacity",
    ),
    # https://github.com/aliyun/alibaba-cloud-sdk-go/issues/373
    (
        "alicloud",
        "create and run instance failed : SDK.ServerError\nErrorCode: OperationDenied.NoStock\n"
        "Recommend: \nRequestId: 918180F7-1A8D-462E-A984-D8EE81536052\nMessage: The resource "
        "is out of stock in the specified zone. Please try other types, or choose other "
        "regions and zones.",
        "OperationDenied.NoStock",
    ),
    # https://github.com/alibabacloud-automation/terraform-alicloud-ecs-instance/issues/9
    (
        "alicloud",
        "alicloud_instance.instances: Error creating Aliyun ecs instance: "
        "&common.Error{ErrorResponse:common.ErrorResponse{Response:common.Response{RequestId:"
        '"9DEEC05A-7458-469C-BBAE-F37BA9BCD82C"}, HostId:"ecs-cn-hangzhou.aliyuncs.com", '
        'Code:"Zone.NotOnSale", Message:"The specified zone is not available for purchase."}, '
        "StatusCode:403}",
        "Zone.NotOnSale",
    ),
    # https://github.com/cloud-barista/cb-spider/issues/660
    (
        "alicloud",
        "SDK.ServerError\nErrorCode: InvalidResourceType.NotSupported\nRecommend: "
        "https://next.api.aliyun.com/troubleshoot?q=InvalidResourceType.NotSupported&product=Ecs"
        "\nRequestId: CE6F8CC7-8A60-5B2E-AA50-E006ABF84EDF\nMessage: user order resource type "
        "[vpc][ecs.t5-lc1m2.large] not exists in [cn-beijing-l]",
        "InvalidResourceType.NotSupported",
    ),
    # https://github.com/denverdino/aliyungo/issues/78
    (
        "alicloud",
        "* aliyun_ecs_instance.test01: Failed to create instance from Image "
        "ubuntu1404_64_40G_aliaegis_20160222.vhd: Aliyun API Error: RequestId: "
        "D0CC639E-180D-4827-97CB-FC609F6C95CD Status Code: 403 Code: OperationDenied Message: "
        "The resource is out of usage.",
        "OperationDenied",
    ),
    # https://github.com/openshift/release/pull/5182
    (
        "azure",
        'level=error msg="Error: Code=\\"ZonalAllocationFailed\\" Message=\\"Allocation '
        "failed. We do not have sufficient capacity for the requested VM size in this zone. "
        "Read more about improving likelihood of allocation success at "
        'http://aka.ms/allocation-guidance\\""',
        "ZonalAllocationFailed",
    ),
    # https://github.com/vmware-tanzu/community-edition/issues/3963
    (
        "azure",
        "failed to create virtual machine: failed to create VM test-mc-20262-control-plane-"
        'khwrh in resource group test-mc-20262-resource-group: Code=\\"AllocationFailed\\" '
        'Message=\\"Allocation failed. We do not have sufficient capacity for the requested VM '
        "size in this region. Read more about improving likelihood of allocation success at "
        'http://aka.ms/allocation-guidance\\"',
        "AllocationFailed",
    ),
    # https://github.com/Azure/azure-cli/issues/2401
    (
        "azure",
        '"details": [{"code": "AllocationFailed", "message": "Allocation failed. Please try '
        "reducing the VM size or number of VMs, retry later, or try deploying to a different "
        'Availability Set or different Azure location."}]',
        "AllocationFailed",
    ),
    # https://github.com/MicrosoftDocs/azure-docs/issues/91276: ARM's preflight wraps
    # SkuNotAvailable in InvalidTemplateDeployment, without the code
    (
        "azure",
        'Original Error: Code="InvalidTemplateDeployment" Message="The template deployment '
        "failed with error: 'The resource with id: '/subscriptions/5d055bae/resourceGroups/pkr/"
        "providers/Microsoft.Compute/virtualMachines/pkrvm' failed validation with message: "
        "'The requested size for resource '/subscriptions/5d055bae/resourceGroups/pkr/providers"
        "/Microsoft.Compute/virtualMachines/pkrvm' is currently not available in location "
        "'eastus' zones '' for subscription '5d055bae'. Please try another size or deploy to a "
        "different location or zones. See https://aka.ms/azureskunotavailable for details.'.'.\"",
        "SkuNotAvailable",
    ),
    # https://github.com/HXSecurity/TerraformGoat/issues/101
    (
        "tencent",
        "Error: [TencentCloudSDKError] Code=ResourceUnavailable.InstanceType, Message=This "
        "instance type `S4.SMALL1` is not available in the current zone `800007`., "
        "RequestId=77801cde-d90e-4efc-a1e5-0a0e75a38f99",
        "ResourceUnavailable.InstanceType",
    ),
    # https://github.com/apecloud/kubeblocks/issues/2314 (the code inside TKE's own error)
    (
        "tencent",
        "Error: [TencentCloudSDKError] Code=FailedOperation.CvmCommon, Message=DashboardError,"
        "Code : -130000 , Msg : CVM_COMMON_ERROR[ResourceUnavailable.InstanceType:This instance "
        "type `S5.MEDIUM8` is not available in the current zone `800002`.:672ce686-28f1-4862-"
        "87fc-9c235ba95ea3], err : nil, RequestId=0e14c7df-39e6-466a-a2c1-54e10d92d2d9",
        "ResourceUnavailable.InstanceType",
    ),
]

NOT_CAPACITY = [
    # https://github.com/bentoml/bentoctl/issues/202: a quota, though it says "capacity"
    (
        "aws",
        "creating EC2 Instance: VcpuLimitExceeded: You have requested more vCPU capacity than "
        "your current vCPU limit of 32 allows for the instance bucket that the specified "
        "instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request "
        "to request an adjustment to this limit.",
        "VcpuLimitExceeded",
    ),
    # https://github.com/firesim/firesim/issues/410: that tool took this quota for a full zone
    (
        "aws",
        "An error occurred (VcpuLimitExceeded) when calling the RunInstances operation: You "
        "have requested more vCPU capacity than your current vCPU limit of 8 allows for the "
        "instance bucket that the specified instance type belongs to.",
        "VcpuLimitExceeded",
    ),
    # https://github.com/cloudfoundry/bosh-alicloud-cpi-release/issues/31
    (
        "alicloud",
        "Aliyun API Error: RequestId: 1260DE86-CA76-48FF-8345-D632E1D02B27 Status Code: 403 "
        "Code: Forbidden.RiskControl Message: This operation is forbidden by Aliyun "
        "RiskControl system.",
        None,
    ),
    # https://github.com/cloud-barista/cb-spider/issues/1013: a type the API refuses outright
    (
        "tencent",
        "Failed to Add Node Group :  [TencentCloudSDKError] Code=FailedOperation.AsCommon, "
        "Message=AS_COMMON_ERROR(err:[TencentCloudSDKError] Code=InvalidParameterValue."
        "InstanceTypeNotSupported, Message=不支持机型 `['S3.MEDIUM8']`., RequestId=26e8ca7e), "
        "RequestId=56ed65d0",
        None,
    ),
]


@pytest.mark.parametrize(("provider", "text", "code"), CAPACITY, ids=[c[2] for c in CAPACITY])
def test_a_full_zone_is_capacity_with_the_code_named(provider: str, text: str, code: str) -> None:
    verdict = capacity.classify(text, provider)
    assert verdict.capacity, verdict.reason
    assert verdict.matched[0].code == code and verdict.reason.startswith(f"capacity: {code} (")
    assert capacity.classify(text).capacity  # and without naming the cloud


@pytest.mark.parametrize(("provider", "text", "code"), NOT_CAPACITY)
def test_a_quota_or_a_refusal_is_not_capacity(provider: str, text: str, code: str | None) -> None:
    verdict = capacity.classify(text, provider)
    assert not verdict.capacity
    if code:
        assert verdict.reason.startswith(f"not capacity: {code} (")
    else:
        assert verdict.matched == () and "no capacity error code" in verdict.reason


def test_a_code_inside_a_longer_code_is_not_that_code() -> None:
    # made up to hold the words of the shorter code's rule too: only the token rule tells
    text = "ErrorCode: OperationDenied.NoStock Message: The resource is out of usage."
    (found,) = capacity.classify(text, "alicloud").matched
    assert found.code == "OperationDenied.NoStock"


def test_a_code_that_needs_its_words_does_not_count_without_them() -> None:
    # https://github.com/hashicorp/terraform-provider-aws/issues/9113: a configuration the
    # region does not support at all; no other zone helps
    text = (
        "Error: Error launching source instance: Unsupported: The requested configuration is "
        "currently not supported. Please check the documentation for supported configurations."
    )
    assert not capacity.classify(text, "aws").capacity
    # https://github.com/ned1313/Getting-Started-Terraform/issues/44: the zone lacks the type
    zone = (
        "Error: creating EC2 Instance: operation error EC2: RunInstances, https response error "
        "StatusCode: 400, RequestID: f5620d69-168d-41c0-ac2b-070fa64e0707, api error "
        "Unsupported: Your requested instance type (t3.micro) is not supported in your "
        "requested Availability Zone (us-east-1e). Please retry your request by not specifying "
        "an Availability Zone or choosing us-east-1a, us-east-1b, us-east-1c, us-east-1d, "
        "us-east-1f."
    )
    verdict = capacity.classify(zone, "aws")
    assert verdict.capacity and verdict.matched[0].code == "Unsupported"


def test_another_clouds_code_does_not_count_when_the_cloud_is_named() -> None:
    _, text, _ = CAPACITY[-1]  # Tencent's ResourceUnavailable.InstanceType
    assert not capacity.classify(text, "aws").capacity
    assert capacity.classify(text, "tencent").capacity


def test_every_cloud_lists_its_capacity_codes_each_with_a_known_source() -> None:
    cat = load_catalog()
    for provider in cat.providers:
        listed = capacity.codes(provider)
        assert any(c.capacity for c in listed), provider
        assert all(c.source in cat.sources and c.means for c in listed), provider


def test_every_tencent_code_is_one_the_sdk_defines() -> None:
    from tencentcloud.cvm.v20170312 import errorcodes

    defined = {v for k, v in vars(errorcodes).items() if k.isupper() and isinstance(v, str)}
    assert {c.code for c in capacity.codes("tencent")} <= defined


def test_a_row_with_an_unknown_key_is_refused() -> None:
    rows = [{"code": "X", "capacity": True, "source": "KP", "mean": "typo"}]
    with pytest.raises(CatalogError, match=r"unknown keys \['mean'\]"):
        capacity._parse("aws", rows, load_catalog().sources)
