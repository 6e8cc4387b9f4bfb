"""gpufleet's policy pack: `pulumi preview --policy-pack policy/` runs this file.

Thin on purpose: the rules are pure functions in policy/rules.py (also run offline by
`make plan`), and policy/pack.py adapts them to the policy SDK.
"""

import sys
from pathlib import Path

# The CLI starts the pack with policy/ as the working directory; the rules import the repo's
# catalog and tag contract, so the repository root must be importable even without the
# editable install.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policy.pack import build_policies  # noqa: E402
from policy.rules import PACK_NAME  # noqa: E402

PolicyPack(
    name=PACK_NAME,
    policies=build_policies(),
    enforcement_level=EnforcementLevel.MANDATORY,
    description="gpufleet guardrails: no public SSH, IMDSv2, encryption everywhere, private "
    "TLS-only buckets, tagged and idle-guarded GPU nodes, a cost ceiling, spot for dev boxes.",
)
