"""Speculative decoding (kvsim.engine.speculative, spec_cohort, kvsim.perf.speculative): acceptance draws,
the hand-computable tokens per step, vLLM's slots and rollback, fused runs against step by step, the
drafter's memory and price, bad input."""

import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_same_requests, make_scenario, make_seq, per_request

from kvsim.backends.analytic import AnalyticBackend
from kvsim.engine.block_manager import BlockManager
from kvsim.engine.settings import EngineSettings
from kvsim.engine.speculative import SpecScheduler, Speculator
from kvsim.perf.acceptance import expected_tokens, iid_rates, preset_rates
from kvsim.perf.server import vllm_capture_sizes
from kvsim.perf.speculative import SpecPlan, SpecRunShape, spec_graph_sizes
from kvsim.pipeline import run_scenario

EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3}


def plan(rates=(0.7, 0.45, 0.25), q=1.0, method="eagle3", seed=0) -> SpecPlan:
    k = len(rates)
    return SpecPlan(method, k, 0 if method == "ngram" else k, tuple(rates), q, seed, "test")


# ---- acceptance ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("q", [1.0, 0.35])
def test_scalar_and_vectorised_draws_agree_bit_for_bit(q):
    sp = Speculator(plan(q=q), 100_000)
    for rid in (0, 7, 123456):
        acc, prop = sp.draws(rid, 5, 505)
        assert acc.tolist() == [sp.accepted_at(rid, p) for p in range(5, 505)]
        if q < 1:
            assert prop.tolist() == [sp.proposes_at(rid, p) for p in range(5, 505)]


def test_draws_follow_the_per_position_rates():
    rates = (0.8, 0.5, 0.3, 0.1)
    sp = Speculator(plan(rates), 100_000)
    acc = np.concatenate([sp.draws(r, 0, 1000)[0] for r in range(400)])  # 400,000 draws
    for i, p in enumerate(rates, 1):
        assert (acc >= i).mean() == pytest.approx(p, abs=0.004)  # ~5 standard errors


def test_expected_tokens_is_the_geometric_sum_for_iid_acceptance():
    for a in (0.3, 0.6, 0.85):
        for k in (1, 3, 5):
            assert expected_tokens(iid_rates(a, k)) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_presets_are_non_increasing_and_extend_geometrically():
    got = preset_rates("eagle", "sharegpt", 3)
    assert got.rates == (0.622, 0.381, 0.252) and "SpecDecode-Bench" in got.source
    longer = preset_rates("mtp", "gpqa", 5)
    assert longer.rates[:3] == (0.92, 0.68, 0.38) and longer.rates[3] < 0.38 and "extrapolated" in longer.source
    assert all(b <= a for a, b in zip(longer.rates, longer.rates[1:]))


@pytest.mark.parametrize("spec, k", [({"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.6}, 3),
                                     ({"method": "eagle", "num_speculative_tokens": 2,
                                       "acceptance": [0.75, 0.5]}, 2)])
def test_simulated_tokens_per_step_match_the_closed_form(spec, k):
    """Mean tokens a proposing step yields (vLLM's mean acceptance length) against 1 + sum p_i: long
    outputs, so the last step of each request (which can cut the count) weighs little."""
    sc = make_scenario(speculative=spec, workload={"num_requests": 60, "arrival": {"rate": 4.0},
                                                   "output_len": {"dist": "fixed", "value": 1500},
                                                   "prompt_len": {"dist": "fixed", "value": 200}},
                       engine={"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048})
    s = run_scenario(sc, write=False).summaries["paged"]["speculative"]
    rates = iid_rates(spec["acceptance_rate"], k) if "acceptance_rate" in spec else tuple(spec["acceptance"])
    assert s["num_drafts"] > 30_000
    assert s["mean_acceptance_length"] == pytest.approx(expected_tokens(rates), rel=0.01)
    for got, want in zip(s["acceptance_rate_per_position"], rates):
        assert got == pytest.approx(want, abs=0.01)


# ---- the scheduler: slots, rollback, counters -------------------------------------------------------

def settings_with(p: SpecPlan, mml: int = 4096) -> EngineSettings:
    return EngineSettings(16, 64, 2048, mml, speculation=p)


def test_a_verify_step_allocates_lookahead_and_rolls_back_the_rejected_drafts():
    alloc = BlockManager(400, 16, enable_prefix_caching=False)
    sched = SpecScheduler(alloc, settings_with(plan()), use_cohort=False)
    seq = make_seq(1, 30, output_len=50)
    sched.add(seq)
    batch = sched.schedule()  # the prompt, first allocation: no lookahead (vLLM: num_computed_tokens == 0)
    assert batch.num_new_tokens == [30] and len(seq.block_table) == 2
    sched.postprocess(batch)
    assert (seq.num_computed_tokens, seq.num_output_tokens, seq.num_tokens) == (30, 1, 31)
    batch = sched.schedule()  # a decode: 1 + k rows, slots for them and k lookahead
    assert batch.num_new_tokens == [4] and batch.num_spec_tokens == 3 and batch.num_decode_seqs == 1
    assert len(seq.block_table) == math.ceil((30 + 4 + 3) / 16)
    a = Speculator(plan(), 4096).accepted_at(1, 1)
    sched.postprocess(batch)
    assert seq.num_output_tokens == 2 + a and seq.num_computed_tokens == 31 + a == seq.num_tokens - 1
    held = len(seq.block_table) * 16
    assert alloc.reserved_unused_tokens == held - seq.num_computed_tokens  # rejected drafts' slots are free again
    assert sched.counters.num_draft_tokens == 3 and sched.counters.num_accepted_tokens == a


def test_ngram_proposes_no_lookahead_and_sometimes_nothing():
    alloc = BlockManager(4000, 16, enable_prefix_caching=False)
    sched = SpecScheduler(alloc, settings_with(plan(q=0.3, method="ngram")), use_cohort=False)
    seqs = [make_seq(i, 20, output_len=40) for i in range(30)]
    for s in seqs:
        sched.add(s)
    rows = []
    while sched.has_work:
        batch = sched.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            if s.num_output_tokens:
                rows.append(n)
                # no lookahead: never more than the most its steps' rows reached (k = 3)
                assert len(s.block_table) <= math.ceil((s.num_computed_tokens + 4) / 16)
        sched.postprocess(batch)
    assert set(rows) == {1, 4} and 0.2 < rows.count(4) / len(rows) < 0.4


def test_blocks_held_never_exceed_what_vllm_allocates(monkeypatch):
    """Step by step, every scheduled sequence holds exactly the blocks of the most slots allocate_slots
    was asked for so far: ceil(min(computed + new + lookahead, max_model_len) / block_size) at its
    largest (tables never shrink; a first allocation takes no lookahead)."""
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    checked, most = [], {}
    schedule = SpecScheduler.schedule

    def check(self):
        batch = schedule(self)
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            look = 0 if s in self.admitted else self.speculator.lookahead
            slots = min(s.num_computed_tokens + n + look, self.max_model_len)
            most[s] = slots = max(slots, most.get(s, 0) if s.num_computed_tokens else 0)
            assert len(s.block_table) == math.ceil(slots / 16), (s.seq_id, len(s.block_table), slots)
            checked.append(s)
        return batch

    monkeypatch.setattr(SpecScheduler, "schedule", check)
    run_scenario(make_scenario(speculative=EAGLE3), write=False)
    assert len(checked) > 1000


# ---- fused runs against step by step --------------------------------------------------------------

FUSION = {
    "eagle3": dict(speculative=EAGLE3),
    "ngram": dict(speculative={"method": "ngram", "num_speculative_tokens": 3}),
    "tight memory, preemptions": dict(
        speculative={"method": "eagle", "num_speculative_tokens": 3},
        hardware={"memory_gib": 17.2, "gpu_memory_utilization": 0.97},
        engine={"max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096},
        workload={"num_requests": 150, "arrival": {"rate": 40.0}}),
    "roofline pricing": dict(speculative=EAGLE3, backend={"pricing": "roofline"}),
    "CPU offload tier": dict(
        speculative={"method": "eagle", "num_speculative_tokens": 3}, kv_offload={"kv_offloading_size": 2.0},
        hardware={"gpu_memory_utilization": 0.25}, engine={"max_model_len": 8192},
        workload={"num_requests": 150, "arrival": {"process": "poisson", "rate": 20.0},
                  "prompt_len": {"dist": "uniform", "min": 64, "max": 6000},
                  "output_len": {"dist": "uniform", "min": 1, "max": 200},
                  "prefix": {"num_groups": 6, "prefix_len": 2048, "fraction": 0.8}}),
}


@pytest.mark.parametrize("case", sorted(FUSION))
def test_speculative_fused_runs_match_step_by_step(monkeypatch, case):
    sc = make_scenario(**FUSION[case])
    fused, fused_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain, plain_sum = per_request(monkeypatch, sc)
    assert_same_requests(fused, plain)
    if case == "CPU offload tier":  # speculation under the offload connector: loads happen, all accounted
        off, f = plain_sum["paged"]["kv_offload"], fused_sum["paged"]
        assert off["tokens"]["cpu_hits"] > 0 and off["loads"]["blocks"] * 16 == off["tokens"]["cpu_hits"]
        assert plain_sum["paged"]["requests"]["finished"] == 150 and f["kv_offload"]["loads"] == off["loads"]
        # step counts differ by a step or two (a fused run ends at the connector's next event; so they do
        # without speculation, main's connector), and with them a last step's drafts cut by the budget
        spec, f_spec = plain_sum["paged"]["speculative"], f["speculative"]
        assert f_spec["num_accepted_tokens"] == pytest.approx(spec["num_accepted_tokens"], rel=1e-3)
        assert abs(f["engine_steps"] - plain_sum["paged"]["engine_steps"]) <= 2
        return
    for name, s in plain_sum.items():
        f = fused_sum[name]
        assert f["engine_steps"] == s["engine_steps"] and f["engine_events"] < s["engine_steps"]
        assert f["preemptions"] == s["preemptions"]
        assert f["speculative"]["num_accepted_tokens"] == s["speculative"]["num_accepted_tokens"]
        assert f["kv"]["mean_used_fraction"] == pytest.approx(s["kv"]["mean_used_fraction"], rel=1e-9)
        assert f["kv"]["peak_used_blocks"] == s["kv"]["peak_used_blocks"]
        fr, sr = f["timeseries"], s["timeseries"]
        assert len(fr) == len(sr) > 20
        for a, b in zip(fr, sr):
            assert a[:2] == b[:2] and a[3:] == b[3:] and a[2] == pytest.approx(b[2], abs=2e-6)
    if case == "tight memory, preemptions":
        assert plain_sum["paged"]["preemptions"] > 0


def test_same_seed_same_bytes_and_another_seed_other_draws():
    sc = make_scenario(speculative=EAGLE3)
    a = run_scenario(sc, write=False).summaries["paged"]
    b = run_scenario(sc, write=False).summaries["paged"]
    assert a == b
    other = make_scenario(speculative={**EAGLE3, "seed": 5})
    c = run_scenario(other, write=False).summaries["paged"]
    assert c["speculative"]["num_accepted_tokens"] != a["speculative"]["num_accepted_tokens"]


def test_tokens_arrive_in_chunks_itl_per_chunk_and_tpot_per_token():
    sc = make_scenario(speculative=EAGLE3, policies=[{"name": "spec"}, {"name": "plain", "speculative": False}])
    s = run_scenario(sc, write=False).summaries
    spec, plain = s["spec"], s["plain"]
    # a chunk of ~2.4 tokens a step: a gap per chunk (vllm bench serve's ITL) holds ~2.4 tokens' TPOT
    chunk = spec["speculative"]["mean_acceptance_length"]
    assert spec["itl_s"]["mean"] / spec["tpot_s"]["mean"] == pytest.approx(chunk, rel=0.15)
    assert plain["itl_s"]["mean"] / plain["tpot_s"]["mean"] == pytest.approx(1.0, rel=0.05)
    assert spec["tpot_s"]["mean"] < plain["tpot_s"]["mean"] < spec["itl_s"]["mean"]
    assert "speculative" not in plain


# ---- price and memory -----------------------------------------------------------------------------

def test_capture_sizes_are_multiples_of_the_query_length():
    sizes = vllm_capture_sizes(256, 8192, 4)
    assert all(s % 4 == 0 for s in sizes) and sizes[-1] == 512 and sizes[0] == 4
    assert spec_graph_sizes((1, 2, 4, 8, 16), 3) == (3, 6, 9)  # each rounded up: 1, 2 -> 3, 4 -> 6, 8 -> 9; 16 -> 18 is past 16


def test_a_run_shapes_price_is_the_sum_of_its_steps():
    from kvsim.pipeline import resolve_policy
    from kvsim.scenario.catalog import gpu_spec, model_spec

    sc = make_scenario(speculative=EAGLE3)
    model, gpu = model_spec(sc), gpu_spec(sc)
    cap, settings = resolve_policy(sc, sc.policies[0], model, gpu)
    pricer = AnalyticBackend(sc, sc.policies[0], model, gpu, cap, settings).pricer
    n, steps = 24, 40
    rng = np.random.default_rng(1)
    reads = 24 * 500 + np.cumsum(rng.integers(24, 96, steps))
    for drafts in (np.full(steps, 72), rng.integers(0, 73, steps)):  # uniform drafts (closed form), ragged
        shape = SpecRunShape(n, drafts, reads, np.concatenate([[0], np.cumsum(reads)]))
        one = [float(pricer.prices(n, np.array([n + d]), np.array([x]), np.array([x - d]))[0])
               for d, x in zip(drafts, reads)]
        assert pricer.decode_run_time(shape, steps) == pytest.approx(sum(one), rel=1e-9)
        budget = sum(one[:17]) - 1e-6
        assert pricer.decode_run_within(shape, steps, budget).steps == 17


def test_the_drafter_takes_weights_and_kv_from_the_cache():
    from kvsim.pipeline import resolve_policy
    from kvsim.scenario.catalog import gpu_spec, model_spec

    sc_plain, sc_spec = make_scenario(), make_scenario(speculative=EAGLE3)
    model, gpu = model_spec(sc_plain), gpu_spec(sc_plain)
    plain, _ = resolve_policy(sc_plain, sc_plain.policies[0], model, gpu)
    spec, settings = resolve_policy(sc_spec, sc_spec.policies[0], model, gpu)
    head = settings.speculation
    assert head.draft.num_hidden_layers == 1 and head.draft.vocab_size == 32000
    assert spec.bytes_per_block == plain.bytes_per_block * 33 // 32  # one more layer's page in every block
    assert spec.weights == pytest.approx(plain.weights + head.draft_weight_bytes)
    assert 0.5 * 2**30 < head.draft_weight_bytes < 1.5 * 2**30  # one Llama layer, 3h x h fc, 32k x 4096 lm_head
    assert spec.num_blocks < plain.num_blocks


# ---- bad input ----------------------------------------------------------------------------------------

BAD = [
    ("num_speculative_tokens = 0", "speculative.num_speculative_tokens: must be at least 1"),
    ("num_speculative_tokens = 2\nacceptance = [0.9, 1.2]", "speculative.acceptance[1]: must be at most 1"),
    ("num_speculative_tokens = 2\nacceptance = [0.5, 0.7]", "per-position rates cannot rise"),
    ("num_speculative_tokens = 2\nacceptance_rate = -0.1", "speculative.acceptance_rate: must be at least 0"),
]


@pytest.mark.parametrize("extra, message", BAD)
def test_bad_speculative_settings_are_one_line_exit_2(tmp_path, extra, message):
    _bad(tmp_path, f"[speculative]\nmethod = \"eagle3\"\n{extra}\n", message)


def test_mtp_on_a_model_without_mtp_layers_is_one_line(tmp_path):
    _bad(tmp_path, "[speculative]\nmethod = \"deepseek_mtp\"\nnum_speculative_tokens = 1\n",
         "speculative.method: deepseek_mtp drafts with the model's multi-token-prediction layers")


def test_a_power_above_the_gpus_limit_is_one_line(tmp_path):
    _bad(tmp_path, "[energy]\ngpu_max_w = 900\n", "energy.gpu_max_w: 900 W is above the H100-SXM's board power")


def _bad(tmp_path, section: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"""[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "p"\n[workload]\nnum_requests = 3\n{section}""")
    out = subprocess.run([sys.executable, "-m", "kvsim", str(path), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "o").exists()
