"""A destroy keeps the Alicloud bucket (its data), so the next `pulumi up` must not ask OSS for
the same global name again: the name carries a random suffix held in the stack's state."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pulumi
import pytest

import infra.offline as offline
from infra.clouds.alicloud.program import bucket_name_for
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate

STACKS = Path(__file__).resolve().parents[2] / "stacks"
RANDOM_ID = "random:index/randomId:RandomId"
BUCKET = "alicloud:oss/bucket:Bucket"


def a100x4():
    return load_stack_file(STACKS / "Pulumi.a100x4.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})


class FreshDraws(offline.Mocks):
    """Like a real engine after a destroy: the random provider draws a new value each time a
    RandomId is created (a fresh stack state), everything else as the offline mocks answer."""

    draws = itertools.count(1)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        rid, out = super().new_resource(args)
        if args.typ == RANDOM_ID:
            out["hex"] = f"{next(self.draws):08x}"
        return rid, out


def bucket_of(result: offline.PlanResult) -> str:
    (bucket,) = result.of_type(BUCKET)
    return str(bucket.inputs["bucket"])


def test_up_after_a_destroy_that_kept_the_bucket_asks_for_a_new_name(monkeypatch):
    monkeypatch.setattr(offline, "Mocks", FreshDraws)
    first = bucket_of(evaluate(a100x4()))
    # `pulumi destroy` (bucket retained, state emptied), then `pulumi up` again:
    second = bucket_of(evaluate(a100x4()))
    assert first != second
    assert first.startswith("gpufleet-a100x4-") and second.startswith("gpufleet-a100x4-")


def test_the_bucket_name_is_the_stack_plus_the_suffix_in_state():
    result = evaluate(a100x4())
    (suffix,) = result.of_type(RANDOM_ID)
    assert suffix.inputs["byteLength"] == 4
    assert bucket_of(result) == bucket_name_for("a100x4", suffix.outputs["hex"])
    assert result.outputs["bucket"] == bucket_of(result)
    # the node role's bucket statements and the TLS-only policy name that same bucket
    (tls,) = result.of_type("alicloud:oss/bucketPolicy:BucketPolicy")
    assert tls.inputs["bucket"] == bucket_of(result)


@pytest.mark.parametrize("stack", ["a", "a100x4", "x" * 60, "ab-" * 20])
def test_bucket_names_fit_oss_rules_and_keep_the_whole_suffix(stack):
    name = bucket_name_for(stack, "0a1b2c3d")
    assert 3 <= len(name) <= 63 and name.endswith("-0a1b2c3d")
    assert "--" not in name and name.islower() and name[0].isalnum()
