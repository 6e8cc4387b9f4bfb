"""Bad stack config is refused with one clear line per problem, before anything is declared."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, StackConfig, load_stack_file, parse_config

GOOD = {"provider": "alicloud", "tier": "a100x4", "sshCidrs": ["203.0.113.0/24"]}


def problems(**changes: object) -> list[str]:
    raw = {**GOOD, **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "test")
    return exc.value.problems


def one(**changes: object) -> str:
    found = problems(**changes)
    assert len(found) == 1, found
    return found[0]


def test_a_good_config_parses_with_defaults_written_once():
    cfg = parse_config(GOOD, "a100x4")
    assert isinstance(cfg, StackConfig)
    assert cfg.instance_type == "ecs.gn7-c13g1.13xlarge"
    assert (cfg.nodes, cfg.billing, cfg.profile, cfg.region) == (
        1,
        "on-demand",
        "general",
        "cn-shanghai",
    )
    assert cfg.idle_minutes == 15 and cfg.ttl_hours == 24 and cfg.destroy_data is False


def test_config_is_frozen():
    cfg = parse_config(GOOD, "a100x4")
    with pytest.raises(AttributeError):
        cfg.nodes = 3  # type: ignore[misc]


def test_unknown_tier_suggests_the_closest():
    msg = one(tier="a100x44")
    assert msg.startswith("gpufleet:tier:") and "did you mean 'a100x4'" in msg


def test_unknown_provider_suggests_the_closest():
    msg = one(provider="alicoud")
    assert "gpufleet:provider" in msg and "did you mean 'alicloud'" in msg


def test_unknown_key_suggests_the_closest():
    msg = one(nodse=2)
    assert "gpufleet:nodse" in msg and "did you mean 'nodes'" in msg


def test_tier_not_offered_names_alternatives():
    msg = one(provider="aws")
    assert "aws does not offer tier 'a100x4'" in msg
    assert "p4d.24xlarge" in msg and "alicloud" in msg


def test_nodes_below_one_is_refused():
    assert "gpufleet:nodes: must be >= 1" in one(nodes=0)


def test_missing_ssh_cidrs_is_refused():
    assert "gpufleet:sshCidrs: required" in one(sshCidrs=None)


def test_world_open_ssh_needs_an_explicit_allow():
    msg = one(sshCidrs=["0.0.0.0/0"])
    assert "whole internet" in msg and "allowWorldSsh" in msg
    cfg = parse_config({**GOOD, "sshCidrs": ["0.0.0.0/0"], "allowWorldSsh": True}, "t")
    assert cfg.ssh_cidrs == ("0.0.0.0/0",)


def test_malformed_cidr_is_refused():
    assert "gpufleet:sshCidrs[1]: '10.0.0.300/8' is not a valid CIDR" in one(
        sshCidrs=["10.0.0.0/8", "10.0.0.300/8"]
    )


def test_cidr_with_host_bits_is_refused():
    assert "sshCidrs[0]" in one(sshCidrs=["10.0.0.1/8"])


def test_spot_and_subscription_together_are_refused():
    assert "exclude each other" in one(billing="spot", subscriptionMonths=3)


def test_subscription_on_aws_is_refused_and_points_at_alicloud():
    msg = one(provider="aws", tier="a100x8", billing="subscription")
    assert "aws sells no subscription billing here: use on-demand or spot" in msg
    assert "alicloud" in msg


def test_non_numeric_max_price_is_refused():
    assert "gpufleet:spotMaxPrice: 'cheap' is not a number" in one(
        billing="spot", spotMaxPrice="cheap"
    )


def test_spot_max_price_above_on_demand_is_refused():
    assert "above the on-demand price" in one(billing="spot", spotMaxPrice=500)


def test_root_disk_too_small_is_refused():
    assert "rootDiskGb: 50 GB is too small" in one(rootDiskGb=50)


def test_essd_level_below_its_minimum_size_is_refused():
    assert "PL3 starts at 1261 GiB" in one(scratchClass="PL3", scratchGb=500)


def test_scratch_class_must_belong_to_the_provider():
    assert "did you mean" in one(scratchClass="PL11") or "not one of" in one(scratchClass="PL11")
    assert "'io2' is not one of" in one(scratchClass="io2")


def test_all_problems_are_reported_together():
    found = problems(tier="a100x44", nodes=0, sshCidrs=["nope"], rootDiskGb="big", colour="red")
    keys = [p.split(":")[1] for p in found]
    assert keys == ["colour", "tier", "nodes", "sshCidrs[0]", "rootDiskGb"]


def test_values_from_the_engine_arrive_as_text_and_parse_the_same():
    raw = {**GOOD, "sshCidrs": '["203.0.113.0/24"]', "nodes": "2", "destroyData": "false"}
    cfg = parse_config(raw, "t")
    assert cfg.nodes == 2 and cfg.ssh_cidrs == ("203.0.113.0/24",) and not cfg.destroy_data


def test_reserved_tag_keys_are_refused():
    assert "tags.managed-by" in one(tags={"managed-by": "me"})
    assert "tags.gpufleet:stack" in one(tags={"gpufleet:stack": "x"})


def test_ttl_zero_is_an_explicit_opt_out():
    assert parse_config({**GOOD, "ttlHours": 0}, "t").ttl_hours == 0


def test_stack_files_must_be_named_like_pulumi_stacks(tmp_path):
    bad = tmp_path / "mystack.yaml"
    bad.write_text("config: {}\n")
    with pytest.raises(ConfigError, match=r"Pulumi\.<stack>\.yaml"):
        load_stack_file(bad)


def test_a_stack_file_that_is_not_yaml_is_refused(tmp_path):
    bad = tmp_path / "Pulumi.x.yaml"
    bad.write_text("config: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_stack_file(bad)


# --- upper bounds: absurd numbers are refused, naming the key and the bound -------------------


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("idleMinutes", 1e12, "<= 1440"),
        ("idleMinutes", 1441, "<= 1440"),
        ("ttlHours", 10**9, "<= 336"),
        ("rootDiskGb", 501, "<= 500 GB"),  # an Alicloud system disk
        ("bucketArchiveDays", 3651, "<= 3650"),
        ("scratchGb", 32769, "<= 32768 GiB"),  # ESSD
        ("nodes", 65, "<= 64"),
        ("maxHourlyCost", 1e300, "<= 100000"),
    ],
)
def test_absurdly_large_numbers_are_refused_with_the_bound(key, value, bound):
    line = one(**{key: value})
    assert line.startswith(f"gpufleet:{key}: must be {bound}"), line


def test_the_largest_allowed_values_still_parse():
    cfg = parse_config(
        {
            **GOOD,
            "idleMinutes": 1440,
            "ttlHours": 336,
            "rootDiskGb": 500,
            "bucketArchiveDays": 3650,
            "scratchGb": 32768,
        },
        "t",
    )
    assert (cfg.idle_minutes, cfg.ttl_hours, cfg.root_disk_gb) == (1440, 336, 500)


def test_aws_root_disks_may_be_larger_than_alicloud_system_disks():
    raw = {"provider": "aws", "tier": "t4x1", "sshCidrs": ["203.0.113.0/24"], "rootDiskGb": 2000}
    assert parse_config(raw, "t").root_disk_gb == 2000
    assert "<= 16384" in one(provider="aws", tier="t4x1", rootDiskGb=16385)


@pytest.mark.parametrize("key", ["idleMinutes", "ttlHours", "spotMaxPrice", "maxHourlyCost"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "-inf", "NaN"])
def test_nan_and_infinity_are_not_numbers(key, value):
    extra = {"billing": "spot"} if key == "spotMaxPrice" else {}
    line = one(**extra, **{key: value})
    assert line.startswith(f"gpufleet:{key}: ") and "is not a" in line, line


# --- SSH: the internet in pieces is still the internet ----------------------------------------


@pytest.mark.parametrize(
    "cidrs",
    [
        ["0.0.0.0/1", "128.0.0.0/1"],
        ["::/1", "8000::/1"],
        ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"],
        ["2.0.0.0/7"],
        ["2001::/16"],
    ],
    ids=["v4-halves", "v6-halves", "v4-quarters", "v4-slash7", "v6-slash16"],
)
def test_over_broad_ssh_networks_are_refused_like_the_world(cidrs):
    found = problems(sshCidrs=cidrs)
    assert found and all(p.startswith("gpufleet:sshCidrs[") for p in found), found
    assert all("allowWorldSsh" in p for p in found)


def test_many_small_networks_that_together_cover_the_internet_are_refused():
    line = one(sshCidrs=[f"{i}.0.0.0/8" for i in range(256)])
    assert line.startswith("gpufleet:sshCidrs: the listed IPv4 networks together cover the whole")


def test_more_than_a_sixty_fourth_of_the_addresses_is_refused_but_private_ranges_pass():
    line = one(sshCidrs=[f"{i}.0.0.0/8" for i in range(1, 6)])
    assert "together cover 1/51 of all addresses (at most 1/64)" in line
    private = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/32"]
    assert parse_config({**GOOD, "sshCidrs": private}, "t").ssh_cidrs == tuple(private)


def test_allow_world_ssh_accepts_the_split_internet_deliberately():
    cfg = parse_config(
        {**GOOD, "sshCidrs": ["0.0.0.0/1", "128.0.0.0/1"], "allowWorldSsh": True}, "t"
    )
    assert cfg.ssh_cidrs == ("0.0.0.0/1", "128.0.0.0/1")


def test_a_cidr_that_is_not_text_is_refused():
    assert "expected a CIDR" in one(sshCidrs=[167772160])


# --- scratch path: normalised, and only where scratch belongs ---------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "//etc",
        "/scratch/../etc",
        "/scratch/./x",
        "/scratch/",
        "/scratch//a",
        "/etc",
        "/",
        "/usr/local",
        "/home/me",
        "scratch",
        "/scratch/a b",
        "/mnt/a/b/c/d",
        "/boot/efi",
    ],
)
def test_odd_or_system_scratch_paths_are_refused(path):
    line = one(scratchPath=path)
    assert line.startswith("gpufleet:scratchPath: ") and "/scratch" in line, line


@pytest.mark.parametrize("path", ["/scratch", "/mnt/nvme", "/data/run-1", "/workspace"])
def test_plain_scratch_paths_under_the_allowed_roots_parse(path):
    assert parse_config({**GOOD, "scratchPath": path}, "t").scratch_path == path


# --- tags: reserved prefixes in any case, flat text values ------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "GPUFLEET:stack",
        "Gpufleet:x",
        "AWS:owner",
        "Acs:x",
        "aliyun-team",
        "Managed-By",
        "HTTPS://x",
    ],
)
def test_refused_tag_prefixes_hold_in_any_letter_case(key):
    line = one(tags={key: "x"})
    assert line.startswith(f"gpufleet:tags.{key}: ") and "reserved" in line, line


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "null"),
        ({"a": 1}, "got a dict"),
        (["a"], "got a list"),
        (float("nan"), "not a usable number"),
        ("x" * 129, "at most 128"),
        ("two\nlines", "one printable line"),
        ("acs:thing", "Alicloud refuses"),
    ],
)
def test_null_nested_and_unusable_tag_values_are_refused(value, says):
    line = one(tags={"team": value})
    assert line.startswith("gpufleet:tags.team: ") and says in line, line


def test_plain_tag_values_are_kept_as_text():
    cfg = parse_config({**GOOD, "tags": {"team": "ml", "cost-centre": 42, "dev": True}}, "t")
    assert dict(cfg.tags) == {"team": "ml", "cost-centre": "42", "dev": "true"}


def test_every_bad_tag_is_its_own_line():
    found = problems(tags={"AWS:x": "1", "a": None, "b": {"c": "d"}})
    assert [p.split(":")[1] for p in found] == ["tags.AWS", "tags.a", "tags.b"]


# --- sshPublicKey: one OpenSSH public key line, parsed, not only its prefix -------------------


@pytest.fixture(scope="module")
def real_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Public keys as ssh-keygen writes them (ed25519, rsa, ecdsa), comment included."""
    import subprocess

    keys = {}
    for kind in ("ed25519", "rsa", "ecdsa"):
        path = tmp_path_factory.mktemp("keys") / f"id_{kind}"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@laptop", "-f", str(path)],
            check=True,
            timeout=60,
        )
        keys[kind] = path.with_suffix(".pub").read_text()
    return keys


def test_the_keys_ssh_keygen_writes_are_accepted_as_they_are(real_keys: dict[str, str]) -> None:
    for key in real_keys.values():
        assert parse_config({**GOOD, "sshPublicKey": key}, "t").ssh_public_key == key.strip()


def test_a_key_with_a_second_line_is_refused(real_keys: dict[str, str]) -> None:
    injected = real_keys["ed25519"].strip() + "\nssh-ed25519 AAAAC3Nza attacker"
    assert "must be one line" in one(sshPublicKey=injected)


@pytest.mark.parametrize(
    "key,says",
    [
        ("ssh-rsa notbase64!!!", "not base64"),
        ("ssh-rsa", "base64 part is missing"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "'ssh-dss' is not an OpenSSH public key type"),
        ("AAAAC3NzaC1lZDI1NTE5AAAAI me@laptop", "is not an OpenSSH public key type"),
        # an ed25519 blob behind an rsa prefix, and an ed25519 key cut short
        (
            "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIPLANONLYPLACEHOLDERKEYxxxxxxxxxxxxxxxxxxxxx",
            "say ssh-rsa",
        ),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLANONL", "is 32 bytes"),
    ],
)
def test_a_key_that_is_not_one_openssh_public_key_is_refused(key: str, says: str) -> None:
    assert says in one(sshPublicKey=key)


def test_the_plans_placeholder_key_is_a_well_formed_key() -> None:
    from infra.config import ssh_key_problem
    from infra.offline import PLACEHOLDER_SSH_KEY

    assert ssh_key_problem(PLACEHOLDER_SSH_KEY) is None


def test_a_cidr_given_twice_is_refused_even_when_written_differently() -> None:
    said = one(sshCidrs=["203.0.113.0/24", "198.51.100.7/32", " 203.0.113.0/24"])
    assert said.startswith("gpufleet:sshCidrs[2]")
    assert "repeats sshCidrs[0] (203.0.113.0/24)" in said


def test_the_ttl_cap_is_the_one_the_guards_read():
    from gpufleet_node import idle_rules
    from infra import config

    assert config.MAX_TTL_HOURS == idle_rules.MAX_TTL_HOURS
