"""The sizing advisor's arithmetic, checked by hand and against published figures.

Each expected number is worked out in the comment beside it from the shipped catalog, so a
change in the model's arithmetic (not in the data) fails here.
"""

from __future__ import annotations

import ast
import datetime as dt
import math
from dataclasses import replace
from pathlib import Path

import pytest

import infra.pricing.sizing as sizing_module
from infra.catalog import load_catalog
from infra.pricing import memory, speed, workload
from infra.pricing.memory import activation_bytes, bytes_per_param, memory_breakdown
from infra.pricing.sizing import FILTERED, NO_FIT, OK, Filters, best_fix, size, with_fix
from infra.pricing.speed import read_calibrations, training_flops
from infra.pricing.workload import (
    SizingError,
    Workload,
    load_assumptions,
    load_models,
    params_from_shape,
    workload_for_model,
)

TODAY = dt.date(2026, 12, 1)
CAT = load_catalog()
A = load_assumptions()
MODELS = load_models()


def llama7b(**kw) -> Workload:
    return workload_for_model(MODELS["llama-2-7b"], 1e9, **kw)


def option(result, tier, provider, billing, nodes=1):
    return next(
        o
        for o in result.options
        if (o.tier, o.provider, o.billing, o.nodes) == (tier, provider, billing, nodes)
    )


# --- bytes per parameter (ZeRO, Rajbhandari et al. 2020) ----------------------------------------


def test_mixed_precision_adamw_needs_16_bytes_per_parameter_as_zero_says():
    b = bytes_per_param("bf16", "adamw")
    assert (b.weights, b.gradients, b.optimizer, b.master) == (2, 2, 12, 4)
    assert b.total == 16


@pytest.mark.parametrize(
    ("precision", "optimizer", "momentum", "total"),
    [
        ("fp32", "adamw", True, 16),  # 4 weights + 4 grads + 8 moments, no master copy
        ("bf16", "adamw-8bit", True, 10),  # 2 + 2 + (4 master + 1 + 1)
        ("fp32", "adamw-8bit", True, 10),  # 4 + 4 + 2
        ("bf16", "adafactor", True, 8),  # 2 + 2 + 4 master (factored moments counted apart)
        ("bf16", "sgd", True, 12),  # 2 + 2 + 4 master + 4 momentum
        ("bf16", "sgd", False, 8),  # 2 + 2 + 4 master
        ("fp32", "sgd", False, 8),  # 4 + 4, no state at all
        ("fp16", "adamw", True, 16),
    ],
)
def test_bytes_per_parameter_per_optimizer_and_precision(precision, optimizer, momentum, total):
    assert bytes_per_param(precision, optimizer, momentum).total == total


def test_a_7b_model_needs_112_gb_of_states_before_activations():
    w = Workload(params=7e9, tokens=1e9)  # no shape: activations unknown
    m = memory_breakdown(w, A)
    assert m.states_gb == pytest.approx(112.0)  # 7e9 x 16 B
    assert m.activations_gb is None
    assert m.per_gpu("ddp", 1, A.fsdp_gathered_layers) == pytest.approx(112.0 + 1.5)


def test_adafactor_counts_only_row_and_column_sums_of_each_matrix():
    w = llama7b(optimizer="adafactor")
    m = memory_breakdown(w, A)
    # 4 B master x 6,738,415,616 + 4 B x (16 x 4096 x 32 + 32000 + 4096) rows+cols
    want = (4 * 6_738_415_616 + 4 * (16 * 4096 * 32 + 32000 + 4096)) / 1e9
    assert m.optimizer_gb == pytest.approx(want)


# --- activations (Korthikanti et al. 2022) -----------------------------------------------------


def test_activations_without_recomputation_follow_korthikanti_with_eager_attention():
    w = Workload(
        params=1e9,
        tokens=1,
        layers=2,
        hidden=1024,
        heads=16,
        seq_len=2048,
        micro_batch=2,
        attention="eager",
    )
    got, how = activation_bytes(w)
    # s*b*h*(34 + 5*a*s/h) per layer: 2048*2*1024*(34 + 5*16*2048/1024) = 4194304 * 194
    assert got == pytest.approx(2 * 4_194_304 * 194)
    assert "34 + 160.0" in how and "Korthikanti" in how


def test_flash_attention_drops_the_stored_scores_term():
    w = Workload(params=1e9, tokens=1, layers=2, hidden=1024, heads=16, seq_len=2048)
    got, _ = activation_bytes(w)
    assert got == pytest.approx(2 * 2048 * 1024 * 34)


def test_full_checkpointing_keeps_2sbh_per_layer_plus_one_layer_recomputed():
    w = Workload(
        params=1e9,
        tokens=1,
        layers=24,
        hidden=1024,
        heads=16,
        seq_len=2048,
        grad_checkpointing=True,
    )
    got, how = activation_bytes(w)
    sbh = 2048 * 1024
    assert got == pytest.approx(2 * sbh * 24 + 34 * sbh)
    assert "checkpointing" in how


def test_fp32_doubles_activations_and_logits_are_4_bytes_per_vocab_entry():
    base = dict(params=1e9, tokens=1, layers=1, hidden=64, seq_len=128, vocab=1000)
    mixed, _ = activation_bytes(Workload(**base))
    full, _ = activation_bytes(Workload(**base, precision="fp32"))
    logits = 4 * 128 * 1000
    assert mixed == pytest.approx(128 * 64 * 34 + logits)
    assert full == pytest.approx(2 * 128 * 64 * 34 + logits)


def test_llama_2_7b_activations_at_4096_tokens_by_hand():
    _, how = activation_bytes(llama7b())
    m = memory_breakdown(llama7b(), A)
    # 4096*1*4096*34 x 32 layers = 18.25 GB, + 4*4096*32000 logits = 0.52 GB
    assert m.activations_gb == pytest.approx(18.78, abs=0.01)
    assert "x 32 layers" in how


def test_a_cnn_uses_its_measured_bytes_and_sqrt_checkpointing():
    spec = MODELS["resnet50"]
    w = workload_for_model(spec, 1.28e6, micro_batch=64)
    act, _ = activation_bytes(w)
    assert act == pytest.approx(64 * 56_619_268)
    ck, how = activation_bytes(replace(w, grad_checkpointing=True))
    assert ck == pytest.approx(64 * 56_619_268 * 2 / math.sqrt(50))
    assert "Chen" in how
    fp32 = workload_for_model(spec, 1.28e6, micro_batch=64, precision="fp32")
    assert activation_bytes(fp32)[0] == pytest.approx(64 * 88_067_748)


# --- sharding and fitting ----------------------------------------------------------------------


def test_fsdp_shards_states_over_every_gpu_and_gathers_two_layers():
    m = memory_breakdown(llama7b(), A)
    ddp = m.per_gpu("ddp", 8, 2)
    fsdp = m.per_gpu("fsdp", 8, 2)
    assert ddp == pytest.approx(m.states_gb + m.activations_gb + 1.5)
    # states / 8 + 2 layers of 16-bit weights (13.48 GB / 32 layers each)
    want = m.states_gb / 8 + 2 * m.weights_gb / 32 + m.activations_gb + 1.5
    assert fsdp == pytest.approx(want)
    assert m.per_gpu("fsdp", 16, 2) < fsdp  # two nodes: half the shard


def test_a_7b_full_finetune_with_ddp_does_not_fit_one_a100_80gb():
    r = size(llama7b(), today=TODAY)
    o = option(r, "a100-80gx8", "aws", "on-demand")
    assert o.status == NO_FIT and not o.fits
    assert o.per_gpu_memory_gb > 72  # 80 GB less the 10 % headroom
    assert "GB over" in o.why and "fits with --strategy fsdp" in o.why
    assert o.fix == "--strategy fsdp"
    assert not r.viable  # nothing fits with ddp at all
    assert best_fix(r) == "--strategy fsdp"


def test_with_fsdp_the_7b_run_fits_the_eight_gpu_tiers():
    r = size(with_fix(llama7b(), "--strategy fsdp"), today=TODAY)
    o = option(r, "a100-80gx8", "aws", "on-demand")
    assert o.status == OK and o.fits and o.per_gpu_memory_gb < 72
    assert option(r, "a100x1", "alicloud", "on-demand").status == NO_FIT


def test_gpt2_small_fits_a_t4():
    r = size(workload_for_model(MODELS["gpt2"], 1e9), today=TODAY)
    o = option(r, "t4x1", "aws", "on-demand")
    assert o.fits and o.status == OK
    # 124.4M x 16 B = 1.99 GB + activations 0.53 GB + 1.5 overhead
    assert o.per_gpu_memory_gb == pytest.approx(1.99 + 0.53 + 1.5, abs=0.02)
    assert "T4 has no bf16" in " ".join(o.notes)  # runs fp16 with a scaler instead


def test_a_non_fitting_single_gpu_tier_says_how_much_over_and_to_use_more_gpus():
    r = size(llama7b(), today=TODAY)
    o = option(r, "t4x1", "aws", "on-demand")
    over = o.per_gpu_memory_gb - 16 * 0.9
    assert f"{over:.1f} GB over" in o.why
    assert "more GPUs with --strategy fsdp, or a bigger GPU" in o.why and o.fix is None


# --- FLOPs and time ----------------------------------------------------------------------------


def test_training_flops_are_6_n_d_and_8_n_d_with_checkpointing():
    assert training_flops(Workload(params=7e9, tokens=1e9)) == pytest.approx(4.2e19)
    assert training_flops(Workload(params=7e9, tokens=1e9, grad_checkpointing=True)) == (
        pytest.approx(5.6e19)
    )


def test_cnn_flops_are_the_measured_per_image_figure_times_images():
    w = workload_for_model(MODELS["resnet50"], 1e6)
    assert training_flops(w) == pytest.approx(24_299_077_632 * 1e6)


def test_hours_and_on_demand_cost_by_hand_on_one_node():
    w = Workload(params=1e9, tokens=1e10)  # 6e19 FLOPs
    r = size(w, today=TODAY)
    o = option(r, "a100x8", "aws", "on-demand")
    # 6e19 / (8 x 312e12 x 0.20 MFU x 1.0) / 3600 = 33.39 h
    assert o.hours == pytest.approx(6e19 / (8 * 312e12 * 0.2) / 3600)
    assert o.cost == pytest.approx(21.958 * o.hours)
    assert o.currency == "USD" and o.cost_common == pytest.approx(o.cost)
    assert o.mfu == 0.2 and not o.mfu_measured and "unverified" in o.mfu_source
    assert o.peak_tflops == 312


def test_spot_adds_the_interruption_overhead_and_prices_the_middle_of_its_range():
    r = size(Workload(params=1e9, tokens=1e10), today=TODAY)
    od = option(r, "a100x8", "aws", "on-demand")
    spot = option(r, "a100x8", "aws", "spot")
    assert spot.hours == pytest.approx(od.hours * 1.10)
    assert spot.cost == pytest.approx((2.47 + 8.19) / 2 * spot.hours)
    assert spot.cost_range == pytest.approx((2.47 * spot.hours, 8.19 * spot.hours))


def test_multi_node_applies_the_stated_scaling_efficiency_by_network():
    r = size(Workload(params=1e9, tokens=1e10), today=TODAY)
    one = option(r, "a100x8", "aws", "on-demand", 1)
    four = option(r, "a100x8", "aws", "on-demand", 4)
    assert four.scaling_efficiency == pytest.approx(0.95**2)  # 400 Gbps EFA, two doublings
    assert four.hours == pytest.approx(one.hours / 4 / 0.95**2)
    ali = option(r, "a100x8", "alicloud", "on-demand", 2)
    assert ali.scaling_efficiency == pytest.approx(0.75)  # 30 Gbps TCP
    assert option(r, "t4x1", "aws", "on-demand").nodes == 1
    assert not any(o.tier == "t4x1" and o.nodes > 1 for o in r.options)


def test_multi_node_counts_the_infiniband_an_azure_nd_node_has_not_its_ethernet():
    r = size(Workload(params=1e9, tokens=1e10), today=TODAY)
    nd = option(r, "a100x8", "azure", "on-demand", 4)
    p4d = option(r, "a100x8", "aws", "on-demand", 4)
    # Standard_ND96asr_v4: 24 Gbps Ethernet beside 8x 200 Gb/s HDR InfiniBand (AZ-NDA100)
    assert nd.scaling_efficiency == pytest.approx(0.95**2)  # was 0.75**2 from the NIC alone
    assert nd.hours == pytest.approx(p4d.hours)  # the same GPUs, an equally fast fabric


def test_the_fabric_is_the_infiniband_where_a_type_has_it_else_its_network():
    nd = CAT.instance("azure", "Standard_ND96asr_v4")
    assert (nd.network_gbps, speed.fabric_gbps(nd)) == (24, 1600)
    assert speed.fabric_gbps(CAT.instance("aws", "p4d.24xlarge")) == 400  # the EFA figure
    ali = CAT.instance("alicloud", "ecs.gn7-c13g1.26xlarge")
    assert speed.fabric_gbps(ali) == ali.network_gbps


def test_each_offer_is_judged_by_its_own_gpu_not_the_tiers_nominal_one():
    # 3B params, ddp: 49.5 GB per GPU. Azure fills a100x1/a100x4 with the A100 80GB PCIe card
    # (catalog: Standard_NC24ads_A100_v4, NC96ads), which holds it; the 40 GB SXM card does not.
    w = Workload(params=3e9, tokens=1e10, layers=26, hidden=3072)
    r = size(w, today=TODAY)
    az = option(r, "a100x1", "azure", "spot")
    assert az.status == OK and az.fits and az.gpu_model == "A100-PCIE-80GB"
    assert option(r, "a100x4", "azure", "spot").status == OK
    ali = option(r, "a100x1", "alicloud", "on-demand")
    assert ali.status == NO_FIT and "usable of 40 " in ali.why
    # the recommendation changes: the 80 GB PCIe card is cheaper than a100-80gx8 for this run
    assert r.viable[0].tier == "a100x1" and r.viable[0].provider == "azure"


def test_a_spot_price_seen_once_is_an_observation_not_a_range():
    r = size(Workload(params=1e9, tokens=1e10), today=TODAY)
    az = option(r, "a100x8", "azure", "spot")
    assert az.spot_observation == "one observation, 2024-06-01, SCAZ"
    assert az.to_json()["spot_observation"] == az.spot_observation
    assert option(r, "a100x8", "aws", "spot").spot_observation is None  # 2.47-8.19 observed
    assert option(r, "a100x1", "alicloud", "spot").spot_observation is None  # the band


def test_a_deadline_over_more_nodes_finds_the_cheapest_run_that_finishes_in_time():
    w = Workload(params=3e9, tokens=1e11, layers=26, hidden=3072)
    r = size(w, filters=Filters(deadline_hours=168, max_nodes=64), today=TODAY)
    best = r.viable[0]
    assert best.hours <= 168 and best.nodes > 4  # four nodes of any tier take longer
    assert all(o.hours <= 168 for o in r.viable)
    assert best.cost_common == min(o.cost_common for o in r.viable)


# --- a transformer's shape --------------------------------------------------------------------


def test_heads_that_do_not_divide_the_hidden_size_are_refused_with_a_divisor():
    (problem,) = workload.shape_problems(
        Workload(params=7e9, tokens=1e9, layers=32, hidden=4096, heads=30)
    )
    assert "30 heads do not divide the hidden size 4096" in problem and "e.g. 32" in problem


@pytest.mark.parametrize(
    ("params", "layers", "hidden"),
    [(7e9, 2, 64), (1e8, 32, 4096), (7e11, 32, 4096)],
)
def test_a_shape_that_cannot_hold_the_parameter_count_is_refused(params, layers, hidden):
    (problem,) = workload.shape_problems(
        Workload(params=params, tokens=1e9, layers=layers, hidden=hidden)
    )
    assert f"--layers {layers} --hidden {hidden} make a model of about" in problem


def test_every_transformer_in_the_model_table_passes_its_own_shape_check():
    for spec in MODELS.values():
        assert workload.shape_problems(workload_for_model(spec, 1e9)) == [], spec.key


def test_alicloud_cost_is_in_cny_and_ranked_in_usd_at_the_catalog_rate():
    r = size(Workload(params=1e9, tokens=1e10), today=TODAY)
    o = option(r, "a100x8", "alicloud", "on-demand")
    assert o.currency == "CNY"
    assert o.cost == pytest.approx(252.66 * o.hours)
    assert o.cost_common == pytest.approx(o.cost / 7.15)
    cny = size(Workload(params=1e9, tokens=1e10), common_currency="CNY", today=TODAY)
    assert option(cny, "a100x8", "alicloud", "on-demand").cost_common == pytest.approx(o.cost)


def test_subscription_only_counts_when_the_run_is_long_enough_to_pay_off():
    short = size(Workload(params=1e9, tokens=1e10), today=TODAY)  # ~33 h on a100x8
    sub = option(short, "a100x8", "alicloud", "subscription")
    assert sub.status == FILTERED and sub.why.startswith("does not pay off")
    assert sub.months == 1 and sub.cost == pytest.approx(121_280)
    # 1.5e20 FLOPs on one A100: 1.5e20 / (312e12 x 0.2) / 3600 = 667.7 h, one month
    long = size(Workload(params=1e9, tokens=2.5e10), today=TODAY)
    sub1 = option(long, "a100x1", "alicloud", "subscription")
    od1 = option(long, "a100x1", "alicloud", "on-demand")
    assert od1.hours == pytest.approx(667.7, abs=0.1)
    assert sub1.status == OK and sub1.months == 1
    assert sub1.cost == pytest.approx(15_160)
    assert od1.cost == pytest.approx(667.7 * 31.58, abs=5)  # 21,086 CNY: the month is cheaper
    # 1,400 h needs two months; a 12-month-plus run would take the yearly rate
    longer = size(Workload(params=1e9, tokens=5.25e10), today=TODAY)
    sub2 = option(longer, "a100x1", "alicloud", "subscription")
    assert sub2.months == 2 and sub2.cost == pytest.approx(2 * 15_160)


# --- ranking and filters -----------------------------------------------------------------------


def test_options_are_ranked_cheapest_first_with_unusable_ones_last():
    r = size(workload_for_model(MODELS["gpt2"], 1e9), today=TODAY)
    statuses = [o.status for o in r.options]
    ok = [o.cost_common for o in r.options if o.status == OK]
    assert ok == sorted(ok)
    assert statuses == sorted(statuses, key=[OK, FILTERED, "no-price", NO_FIT].index)


def test_a_deadline_filters_slow_options_and_says_why():
    w = Workload(params=1e9, tokens=1e10)
    r = size(w, filters=Filters(deadline_hours=10), today=TODAY)
    assert r.viable and all(o.hours <= 10 for o in r.viable)
    slow = option(r, "a100x8", "aws", "on-demand")  # 33.4 h
    assert slow.status == FILTERED and "over the 10 h deadline" in slow.why


def test_a_budget_filters_expensive_options_using_the_top_of_the_spot_range():
    w = Workload(params=1e9, tokens=1e10)
    r = size(w, filters=Filters(budget=300, budget_currency="USD"), today=TODAY)
    assert r.viable and all(o.cost_common <= 300 for o in r.viable)
    spot = option(r, "a100x8", "aws", "spot")  # middle 197.8 USD, top 301 USD
    assert spot.cost_common < 300 and spot.status == FILTERED and "up to" in spot.why


def test_a_budget_in_another_currency_is_converted():
    w = Workload(params=1e9, tokens=1e10)
    r = size(w, filters=Filters(budget=7150, budget_currency="CNY"), today=TODAY)
    assert r.budget_common == pytest.approx(1000.0)


def test_an_impossible_deadline_is_bad_input_naming_the_fastest_option():
    with pytest.raises(SizingError) as exc:
        size(Workload(params=1e9, tokens=1e10), filters=Filters(deadline_hours=0.01), today=TODAY)
    (line,) = exc.value.problems
    assert "deadline 36 s is impossible" in line and "h100x8 x4" in line


def test_a_budget_nothing_meets_is_bad_input_naming_the_cheapest():
    with pytest.raises(SizingError, match="budget 1 USD is too small"):
        size(Workload(params=1e9, tokens=1e10), filters=Filters(budget=1), today=TODAY)


def test_bad_sizes_and_names_are_reported_together():
    with pytest.raises(SizingError) as exc:
        Workload(params=-1, tokens=0, optimizer="adam", layers=0)
    assert len(exc.value.problems) == 4
    assert any("did you mean 'adamw'" in p for p in exc.value.problems)
    with pytest.raises(SizingError, match="provider 'azur' is not in the catalog"):
        size(Workload(params=1e9, tokens=1e9), filters=Filters(providers=("azur",)))


def test_provider_and_billing_filters_limit_the_rows():
    r = size(
        Workload(params=1e9, tokens=1e9),
        filters=Filters(providers=("alicloud",), billings=("spot",)),
        today=TODAY,
    )
    assert {(o.provider, o.billing) for o in r.options} == {("alicloud", "spot")}


# --- calibration from verify-gpu reports -------------------------------------------------------


def write_report(
    reports: Path, mfu: float, started: str, tier: str = "a100x8", status: str = "PASS"
) -> Path:
    """A report written by verify-gpu's own code: the real Expected, Check, Verdict, VerifyRun."""
    from bootstrap.verify import judge as j
    from bootstrap.verify import report as v

    exp = j.expected_from(None, CAT, tier=tier)
    checks = (
        j.Check("gpu.count", j.PASS, "8", "8", value=8),
        j.Check("mfu", status, f"{mfu:.1%}", ">= 18.0%", value=mfu),
    )
    run = v.VerifyRun(
        expected=exp,
        verdicts=[j.Verdict("node-0", "gpu", checks)],
        cluster=None,
        measurements={
            "node-0": {"local": {"nvidia": {"gpus": [{"name": "NVIDIA A100-SXM4-40GB"}]}}}
        },
        seconds=1.0,
        started_at=started,
    )
    return v.save_report(run, reports)


def test_a_recorded_verify_report_replaces_the_catalog_mfu_and_says_so(tmp_path: Path):
    w = Workload(params=1e9, tokens=1e10)
    before = option(size(w, reports_dir=tmp_path, today=TODAY), "a100x8", "aws", "on-demand")
    path = write_report(tmp_path, 0.40, "2026-12-01T08:00:00Z")
    r = size(w, reports_dir=tmp_path, today=TODAY)
    after = option(r, "a100x8", "aws", "on-demand")
    assert after.mfu == pytest.approx(0.40) and after.mfu_measured
    assert "measured by verify-gpu" in after.mfu_source and str(path) in after.mfu_source
    assert after.hours == pytest.approx(before.hours / 2)  # 0.20 -> 0.40
    assert not after.estimate
    # other GPU models keep the catalog's expectation
    assert option(r, "h100x8", "aws", "on-demand").mfu == 0.2


def test_the_newest_report_wins_and_cpu_or_failed_runs_do_not_count(tmp_path: Path):
    write_report(tmp_path, 0.30, "2026-11-01T08:00:00Z")
    write_report(tmp_path, 0.35, "2026-11-20T08:00:00Z")
    write_report(tmp_path, 0.01, "2026-11-25T08:00:00Z", status="FAIL")  # a broken node
    (tmp_path / "adhoc" / "verify-broken.json").write_text("{not json")
    cals = read_calibrations(tmp_path, CAT)
    assert cals["A100-40GB"].mfu == pytest.approx(0.35)
    assert read_calibrations(tmp_path / "missing", CAT) == {}


# --- data and boundaries -----------------------------------------------------------------------


def test_the_model_table_has_the_issue_models_with_sources():
    wanted = {
        "gpt2",
        "gpt2-xl",
        "bert-large",
        "llama-2-7b",
        "llama-2-13b",
        "llama-3-8b",
        "resnet50",
        "vit-l-16",
    }
    assert wanted <= set(MODELS)
    for spec in MODELS.values():
        for tag in spec.source.replace(",", " ").split():
            assert tag in CAT.sources


@pytest.mark.parametrize("key", ["gpt2", "gpt2-xl"])
def test_gpt2_parameter_counts_follow_from_their_published_shapes(key):
    s = MODELS[key]
    assert params_from_shape(s.layers, s.hidden, s.vocab, s.seq_len) == s.params


def test_the_advisor_iterates_the_catalogs_providers_without_naming_any():
    names = {
        node.value
        for module in (sizing_module, workload, memory, speed)
        for node in ast.walk(ast.parse(Path(module.__file__).read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not names & {"aws", "alicloud", "azure", "tencent"}
    r = size(Workload(params=1e9, tokens=1e9), today=TODAY)
    assert {o.provider for o in r.options} == set(CAT.providers)


def test_the_json_contract_has_every_key_the_issue_lists():
    doc = size(workload_for_model(MODELS["gpt2"], 1e9), today=TODAY).to_json()
    assert {"params", "tokens", "flops", "memory", "options"} <= set(doc)
    assert {"weights_gb", "gradients_gb", "optimizer_gb", "activations_gb", "overhead_gb"} <= set(
        doc["memory"]
    )
    keys = {
        "tier",
        "provider",
        "instance_type",
        "billing",
        "nodes",
        "gpus",
        "gpu_model",
        "gpu_memory_gb",
        "per_gpu_memory_gb",
        "fits",
        "why",
        "peak_tflops",
        "mfu",
        "mfu_source",
        "scaling_efficiency",
        "hours",
        "cost",
        "currency",
        "cost_common",
        "common_currency",
    }
    for o in doc["options"]:
        assert keys <= set(o)


def test_the_advisor_imports_no_provider_sdk_and_no_pulumi():
    import subprocess
    import sys

    code = (
        "import sys, infra.pricing.sizing\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('boto3', 'botocore', 'pulumi', 'pulumi_aws', 'pulumi_alicloud',"
        " 'alibabacloud_ecs20140526', 'fabric', 'torch')]\n"
        "print(','.join(bad))\n"
    )
    repo = Path(sizing_module.__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(repo)!r})\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == ""
