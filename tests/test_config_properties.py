"""Property tests of config loading: whatever a stack file says, the answer is a StackConfig or
a clean list of problems, never a traceback.

Inputs start from the real stack files in stacks/ and are mutated the way people and tools
break YAML: keys dropped, misspelt or invented, values of the wrong type, unicode, huge
numbers, NaN/inf, lists where a scalar belongs, maps where a list belongs.
"""

from __future__ import annotations

import ipaddress
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from infra.catalog import load_catalog
from infra.config import (
    KEYS,
    SSH_MIN_PREFIX,
    ConfigError,
    StackConfig,
    load_stack_file,
    parse_config,
    read_stack_file,
    strip_namespace,
)
from infra.offline import PLACEHOLDER_SSH_KEY
from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[1]
STACK_FILES = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))
BASES = [strip_namespace(read_stack_file(p)) for p in STACK_FILES]
# Every value any shipped stack uses, per key: crossing them over makes plausible configs.
SEEN: dict[str, list[Any]] = {}
for _base in BASES:
    for _k, _v in _base.items():
        SEEN.setdefault(_k, []).append(_v)

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples every CI run; failures reproduce
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "NaN",
            "inf",
            "-1",
            "0",
            "1e309",
            "0x10",
            "1_000",
            "true",
            "off",
            "null",
            "0.0.0.0/0",
            "::/0",
            "10.0.0.0/33",
            "203.0.113.7/32",
            "ｔ４ｘ１",
            "a100x4\n",
            "\x00",
            "ssh-ed25519 AAAA",
            "spot",
            "subscription",
            "aws",
            "alicloud",
            "us-east-1a",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=8,
)
keys = st.one_of(st.sampled_from(sorted(KEYS)), st.text(min_size=1, max_size=20))


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    raw = dict(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["drop", "set", "cross", "retype"]))
        if op == "drop" and raw:
            raw.pop(draw(st.sampled_from(sorted(raw))))
        elif op == "set":
            raw[draw(keys)] = draw(values)
        elif op == "cross":
            key = draw(st.sampled_from(sorted(SEEN)))
            raw[key] = draw(st.sampled_from(SEEN[key]))
        elif op == "retype" and raw:
            key = draw(st.sampled_from(sorted(raw)))
            value = raw[key]
            raw[key] = draw(
                st.sampled_from([[value], {"value": value}, str(value), None, [value, value]])
            )
    return raw


def assert_clean(
    outcome: StackConfig | ConfigError, prefix: tuple[str, ...] = ("gpufleet:",)
) -> None:
    if isinstance(outcome, ConfigError):
        assert outcome.problems, "a ConfigError must say what is wrong"
        for problem in outcome.problems:
            assert isinstance(problem, str) and problem.startswith(prefix), problem
            assert "\n" not in problem, f"one line per problem: {problem!r}"
    else:
        assert isinstance(outcome, StackConfig)
        assert outcome.nodes >= 1 and outcome.provider in load_catalog().providers
        assert all(isinstance(c, str) for c in outcome.ssh_cidrs) and outcome.ssh_cidrs
        for number in (outcome.spot_max_price, outcome.max_hourly_cost):
            assert number is None or (math.isfinite(number) and number > 0)


def parse(raw: dict[str, Any], stack: str = "fuzz") -> StackConfig | ConfigError:
    try:
        return parse_config(raw, stack)
    except ConfigError as exc:
        return exc


@SETTINGS
@given(mutated_configs())
def test_mutated_stack_configs_give_a_config_or_clean_problems(raw: dict[str, Any]) -> None:
    outcome = parse(raw)
    event("valid" if isinstance(outcome, StackConfig) else "config error")
    assert_clean(outcome)


@SETTINGS
@given(st.dictionaries(keys, values, max_size=8))
# Found by this test (fixed in infra/config.py): int(inf) raised OverflowError, and a key with a
# newline split one problem over two lines.
@example({"bucketArchiveDays": "INF"})
@example({"\n": None})
@example({"nodes": 10**400, "ttlHours": "1.5", "rootDiskGb": -1e400})
def test_random_configs_give_a_config_or_clean_problems(raw: dict[str, Any]) -> None:
    assert_clean(parse(raw))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(raw=mutated_configs())
def test_stack_files_written_to_disk_load_cleanly(
    raw: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Through YAML and the file loader, as `plan.py --stack-file` reads them."""
    path = tmp_path_factory.mktemp("stack") / "Pulumi.fuzz.yaml"
    try:
        text = yaml.safe_dump({"config": {f"gpufleet:{k}": v for k, v in raw.items()}})
    except yaml.YAMLError:
        assume(False)
        return
    path.write_text(text)
    try:
        outcome: StackConfig | ConfigError = load_stack_file(path)
    except ConfigError as exc:
        outcome = exc
    assert_clean(outcome, ("gpufleet:", str(path)))


@st.composite
def crossed_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A shipped stack with values other shipped stacks use crossed in, or optional keys dropped.

    Most of these are valid, so the test below plans many of them; mutated_configs() above is
    the hostile mix, mostly refused by the parser (the clean-problems tests above).
    """
    raw = dict(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.booleans()):
            key = draw(st.sampled_from(sorted(SEEN)))
            raw[key] = draw(st.sampled_from(SEEN[key]))
        else:
            optional = sorted(k for k in raw if k not in ("provider", "tier"))
            if optional:
                raw.pop(draw(st.sampled_from(optional)))
    return raw


# Hypothesis mixes constants harvested from the modules loaded so far into what it draws, so
# the same derandomized test draws other examples in a full run than alone, and the share the
# parser refuses moves with it: that share is not a property of the code, so the filter health
# check is off here (it failed a full run with 8 valid of 58, alone it passes).
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.filter_too_much],
)
@given(st.one_of(crossed_configs(), mutated_configs()))
def test_every_valid_mutated_config_plans_and_passes_the_mandatory_policies(
    raw: dict[str, Any],
) -> None:
    """A config the parser accepts is one the program can declare: no late traceback."""
    from infra.offline import evaluate
    from policy import rules as R
    from policy.plan_check import check_plan

    outcome = parse({**raw, "sshPublicKey": PLACEHOLDER_SSH_KEY})
    assume(isinstance(outcome, StackConfig))
    assert isinstance(outcome, StackConfig)
    try:
        result = evaluate(outcome)
    except Exception as exc:
        # Bad config only the program can see (the cost ceiling, no zone offering the type)
        # arrives as a ConfigError, possibly wrapped by Pulumi's Output machinery.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is None:
            raise
        assert_clean(cause)
        return
    mandatory = [v for v in check_plan(outcome, result) if v.level == R.MANDATORY]
    # With allowWorldSsh the parser accepts over-broad networks; the policy still refuses them.
    world = any(
        ipaddress.ip_network(c).prefixlen < SSH_MIN_PREFIX[ipaddress.ip_network(c).version]
        for c in outcome.ssh_cidrs
    )
    assert {v.policy for v in mandatory} <= ({"ssh-not-open-to-world"} if world else set())


# --- through the CLI: a handful of examples, each a fresh process (~1-2 s) ----------------------

# (stack name, config): each names a way a stack file goes wrong, and one valid crossover.
CLI_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "unicode-tier": (
        "fuzz",
        {"provider": "aws", "tier": "ｔ４ｘ１", "sshCidrs": ["203.0.113.0/24"]},
    ),
    "nan-and-huge": (
        "fuzz",
        {
            "provider": "aws",
            "tier": "t4x1",
            "sshCidrs": ["203.0.113.0/24"],
            "nodes": 10**30,
            "maxHourlyCost": float("nan"),
        },
    ),
    "lists-for-scalars": (
        "fuzz",
        {"provider": ["aws"], "tier": ["t4x1"], "sshCidrs": "203.0.113.0/24"},
    ),
    "region-of-the-other-cloud": (
        "fuzz",
        {"provider": "aws", "tier": "a100x8", "region": "cn-shanghai", "sshCidrs": ["10.0.0.0/8"]},
    ),
    "stack-name-no-host-can-have": (
        "My_Box",
        {"provider": "aws", "tier": "t4x1", "sshCidrs": ["10.0.0.0/8"]},
    ),
    "missing-everything": ("fuzz", {}),
    "valid-crossover": (
        "fuzz",
        {"provider": "alicloud", "tier": "a100x1", "sshCidrs": ["10.1.0.0/16"]},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(CLI_EXAMPLES))
def test_plan_cli_exits_0_or_2_and_never_prints_a_traceback(example: str, tmp_path: Path) -> None:
    stack, raw = CLI_EXAMPLES[example]
    path = tmp_path / f"Pulumi.{stack}.yaml"
    config = {f"gpufleet:{k}": v for k, v in raw.items()}
    path.write_text(yaml.safe_dump({"config": config}, allow_unicode=True))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plan.py"), "--stack-file", str(path), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert proc.stdout == ""
        lines = problems(proc.stderr)
        assert lines and all(line.startswith("gpufleet:") for line in lines), lines
    else:
        assert example == "valid-crossover"


# --- bounds, world-splitting CIDR sets, odd scratch paths and tag values ---------------------

NUMERIC_KEYS = ("idleMinutes", "ttlHours", "rootDiskGb", "scratchGb", "bucketArchiveDays", "nodes")
huge_or_odd_numbers = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e12", "1e308", "1e309", "-0", "NaN", "Infinity", "9" * 400, "0x5"]),
)


def assert_within_bounds(cfg: StackConfig) -> None:
    from infra.config import (
        MAX_ARCHIVE_DAYS,
        MAX_IDLE_MINUTES,
        MAX_NODES,
        MAX_TTL_HOURS,
    )

    info = load_catalog().providers[cfg.provider]

    assert 5 <= cfg.idle_minutes <= MAX_IDLE_MINUTES
    assert 0 <= cfg.ttl_hours <= MAX_TTL_HOURS
    assert 100 <= cfg.root_disk_gb <= info.max_root_disk_gb
    assert 1 <= cfg.scratch_gb <= (info.scratch_classes[cfg.scratch_class].max_gb or 0)
    assert 1 <= cfg.bucket_archive_days <= MAX_ARCHIVE_DAYS
    assert 1 <= cfg.nodes <= MAX_NODES


@SETTINGS
@given(
    base=st.sampled_from(BASES),
    numbers=st.dictionaries(st.sampled_from(NUMERIC_KEYS), huge_or_odd_numbers, min_size=1),
)
@example(base=BASES[0], numbers={"idleMinutes": 10**12})
@example(base=BASES[0], numbers={"ttlHours": float("inf"), "rootDiskGb": 10**400})
def test_huge_nan_and_infinite_numbers_are_refused_by_key_or_land_within_bounds(
    base: dict[str, Any], numbers: dict[str, Any]
) -> None:
    outcome = parse({**base, **numbers})
    assert_clean(outcome)
    if isinstance(outcome, StackConfig):
        assert_within_bounds(outcome)
    else:
        named = {p.split(":", 2)[1] for p in outcome.problems}
        assert named & set(numbers), outcome.problems  # the bad key is the one named


@st.composite
def partitions_of_the_internet(draw: st.DrawFn) -> list[str]:
    """The whole IPv4 or IPv6 space cut into random pieces (0.0.0.0/1 + 128.0.0.0/1, ...)."""
    version = draw(st.sampled_from([4, 6]))
    pieces = [ipaddress.ip_network("0.0.0.0/0" if version == 4 else "::/0")]
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        i = draw(st.integers(min_value=0, max_value=len(pieces) - 1))
        if pieces[i].prefixlen < pieces[i].max_prefixlen:
            pieces[i : i + 1] = list(pieces[i].subnets(prefixlen_diff=1))
    order = draw(st.permutations(range(len(pieces))))
    return [str(pieces[j]) for j in order]


@SETTINGS
@given(base=st.sampled_from(BASES), cidrs=partitions_of_the_internet())
@example(base=BASES[0], cidrs=["0.0.0.0/1", "128.0.0.0/1"])
def test_the_internet_in_any_pieces_is_refused_like_0_0_0_0_0(
    base: dict[str, Any], cidrs: list[str]
) -> None:
    outcome = parse({**base, "sshCidrs": cidrs, "allowWorldSsh": False})
    assert isinstance(outcome, ConfigError), cidrs
    assert all(p.startswith("gpufleet:sshCidrs") for p in outcome.problems), outcome.problems
    allowed = parse({**base, "sshCidrs": cidrs, "allowWorldSsh": True})
    assert isinstance(allowed, StackConfig)  # the explicit opt-in still works


ipv4_networks = st.builds(
    lambda addr, prefix: str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False)),
    st.ip_addresses(v=4),
    st.integers(min_value=0, max_value=32),
)


@SETTINGS
@given(base=st.sampled_from(BASES), cidrs=st.lists(ipv4_networks, min_size=1, max_size=70))
def test_accepted_ssh_sources_are_narrow_networks_covering_little_of_the_internet(
    base: dict[str, Any], cidrs: list[str]
) -> None:
    outcome = parse({**base, "sshCidrs": cidrs})
    assert_clean(outcome)
    if isinstance(outcome, StackConfig):
        nets = [ipaddress.ip_network(c) for c in outcome.ssh_cidrs]
        assert all(n.prefixlen >= SSH_MIN_PREFIX[n.version] for n in nets)
        union = ipaddress.collapse_addresses(nets)  # type: ignore[type-var]
        assert sum(n.num_addresses for n in union) <= 2**26


odd_paths = st.one_of(
    st.text(alphabet="/.ab-_ \n\x00etcsrach", max_size=24),
    st.builds(
        lambda root, rest: root + rest,
        st.sampled_from(["/scratch", "/mnt", "//", "/", "/etc", "/usr", "", "scratch"]),
        st.text(alphabet="/.ab-_", max_size=16),
    ),
)


@SETTINGS
@given(base=st.sampled_from(BASES), path=odd_paths)
@example(base=BASES[0], path="//etc")
@example(base=BASES[0], path="/scratch/../etc")
def test_an_accepted_scratch_path_is_plain_and_under_an_allowed_root(
    base: dict[str, Any], path: str
) -> None:
    import posixpath

    from infra.config import SCRATCH_ROOTS

    outcome = parse({**base, "scratchPath": path})
    assert_clean(outcome)
    if isinstance(outcome, StackConfig) and path.strip():
        got = outcome.scratch_path
        assert posixpath.normpath(got) == got and not got.startswith("//"), got
        assert ".." not in got.split("/")
        assert any(got == r or got.startswith(r + "/") for r in SCRATCH_ROOTS), got


tag_keys = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["GPUFLEET:stack", "Aws:x", "ACS:y", "aliyunz", "Managed-By", "team"]),
)


@SETTINGS
@given(base=st.sampled_from(BASES), tags=st.dictionaries(tag_keys, values, max_size=6))
@example(base=BASES[0], tags={"team": None, "a": {"b": 1}, "GpuFleet:x": "1"})
def test_accepted_tags_are_flat_printable_text_under_unreserved_keys(
    base: dict[str, Any], tags: dict[str, Any]
) -> None:
    from infra.config import refused_tag_prefixes

    outcome = parse({**base, "tags": tags})
    assert_clean(outcome)
    if isinstance(outcome, StackConfig):
        for key, value in outcome.tags.items():
            assert not key.strip().lower().startswith(refused_tag_prefixes()), key
            assert key.strip().lower() != "managed-by"
            assert isinstance(value, str) and value.isprintable() and len(value) <= 128
