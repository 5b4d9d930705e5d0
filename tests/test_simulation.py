"""Whole simulations of small synthetic scenarios: accounting, determinism, fused decode runs, and
the policy effects a capacity planner exists to show."""

import json

import pytest

from kvsim.backends.analytic import AnalyticBackend
from kvsim.cli import main
from kvsim.engine.settings import EngineSettings
from kvsim.engine.simulator import Simulation
from kvsim.perf.memory import kv_capacity
from kvsim.perf.pricing import RunSearch
from kvsim.results.metrics import Metrics
from kvsim.pipeline import run_scenario
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.workload import generate_requests

from conftest import make_scenario, scenario_dict

# Llama-3.1-8B (15 GiB of weights) on a GPU cut to 20 GiB: about 970 blocks of 16 tokens of KV,
# so KV memory is what limits the batch.
TIGHT = {"memory_gib": 20.0}
BUSY = {"num_requests": 150, "arrival": {"rate": 50.0},
        "prompt_len": {"dist": "uniform", "min": 200, "max": 1500},
        "output_len": {"dist": "uniform", "min": 50, "max": 400}}
PAGED = {"name": "paged"}
CONTIGUOUS = {"name": "contiguous", "allocator": "contiguous", "enable_chunked_prefill": False}


def summaries(**sections) -> dict:
    return run_scenario(make_scenario(**sections), write=False).summaries


def test_every_request_is_accounted_for():
    sc = make_scenario(engine={"max_model_len": 700},  # prompts up to 600 + outputs up to 200: some rejected
                       policies=[PAGED, CONTIGUOUS, {"name": "fp8", "kv_cache_dtype": "fp8"}])
    for name, s in run_scenario(sc, write=False).summaries.items():
        req = s["requests"]
        assert req["received"] == 100, name
        assert req["finished"] + req["rejected"] == req["received"], name
        assert req["rejected"] > 0 and sum(req["rejected_by_reason"].values()) == req["rejected"]
        assert all("max_model_len" in reason for reason in req["rejected_by_reason"])


def test_rejections_match_max_model_len():
    sc = make_scenario(engine={"max_model_len": 700})
    too_long = sum(r.prompt_len + r.output_len > 700 for r in generate_requests(sc))
    s = run_scenario(sc, write=False).summaries["paged"]
    assert 0 < too_long < 100
    assert s["requests"]["rejected"] == too_long
    assert s["requests"]["finished"] == 100 - too_long


def test_same_scenario_same_summary():
    sc = scenario_dict(hardware=TIGHT, workload=BUSY, policies=[PAGED, CONTIGUOUS])
    first = run_scenario(scenario_from_dict(sc), write=False).summaries
    second = run_scenario(scenario_from_dict(sc), write=False).summaries
    assert first == second
    assert first["paged"]["preemptions"] > 0  # a run with something to get wrong


def test_two_cli_runs_write_identical_summaries(tmp_path):
    text = (tmp_path / "s.toml")
    text.write_text('name = "det"\n[model]\nname = "Llama-3.1-8B"\n[hardware]\nmemory_gib = 20.0\n'
                    '[engine]\nmax_model_len = 4096\n[[policies]]\nname = "paged"\n'
                    '[[policies]]\nname = "fp8"\nkv_cache_dtype = "fp8"\n'
                    '[workload]\nseed = 7\nnum_requests = 60\narrival = { process = "gamma", rate = 30.0, cv = 2.0 }\n'
                    'prompt_len = { dist = "lognormal", mean = 600, sigma = 0.8, max = 3000 }\n'
                    'output_len = { dist = "lognormal", mean = 150, sigma = 0.8, max = 1000 }\n')
    for out in ("a", "b"):
        assert main([str(text), "--out", str(tmp_path / out), "--quiet"]) == 0
    a, b = ((tmp_path / out / "summary.json").read_bytes() for out in ("a", "b"))
    assert a == b
    assert json.loads(a)["policies"]["paged"]["requests"]["finished"] == 60


# ---- fused decode runs ---------------------------------------------------------------------

def per_request(monkeypatch, scenario) -> tuple[dict, dict]:
    """Every finished request's (TTFT, E2E, outputs, preemptions, cached tokens), by (policy, id)."""
    rows = {}
    on_finish = Metrics.on_finish

    def spy(self, seq):
        arrival = seq.request.arrival_time
        rows[(self.policy, seq.seq_id)] = (seq.first_token_time - arrival, seq.finish_time - arrival,
                                           seq.num_output_tokens, seq.num_preemptions, seq.num_cached_tokens)
        on_finish(self, seq)

    monkeypatch.setattr(Metrics, "on_finish", spy)
    series = {}
    summary = Metrics.summary

    def keep(self, **kw):  # the time series of each policy, beside its summary
        series[self.policy] = self.timeseries_rows()
        return summary(self, **kw)

    monkeypatch.setattr(Metrics, "summary", keep)
    summaries = run_scenario(scenario, write=False).summaries
    for name, rows_ in series.items():
        summaries[name]["timeseries"] = rows_
    return rows, summaries


def assert_same_requests(fused: dict, plain: dict) -> None:
    """per_request's rows agree: the same requests, counts exactly, times to 1e-9."""
    assert fused.keys() == plain.keys() and fused
    for key, (ttft, e2e, *counts) in plain.items():
        f_ttft, f_e2e, *f_counts = fused[key]
        assert f_counts == counts, key
        assert f_ttft == pytest.approx(ttft, rel=1e-9, abs=1e-12), key
        assert f_e2e == pytest.approx(e2e, rel=1e-9, abs=1e-12), key


FUSION_CASES = {
    "tight memory, preemptions": dict(hardware=TIGHT, workload=BUSY, policies=[
        PAGED, CONTIGUOUS, {"name": "fp8", "kv_cache_dtype": "fp8"},
        {"name": "known", "allocator": "contiguous", "contiguous_reserve": "known_output"}]),
    "swap preemption": dict(hardware=TIGHT, workload=BUSY, engine={"preemption_mode": "swap", "swap_space": 0.5},
                            policies=[PAGED]),
    "prefix groups, two replicas": dict(hardware={"num_replicas": 2}, workload={
        "num_requests": 120, "arrival": {"rate": 15.0}, "prefix": {"num_groups": 3, "prefix_len": 512}}),
    "budget smaller than the batch": dict(engine={"max_num_batched_tokens": 32, "max_num_seqs": 64},
                                          workload={"num_requests": 80, "arrival": {"rate": 20.0}}),
    # measured pricing schedules asynchronously by default; these two flip it
    "synchronous scheduling": dict(hardware=TIGHT, workload=BUSY, engine={"async_scheduling": False}),
    "roofline, async scheduling": dict(backend={"pricing": "roofline"}, engine={"async_scheduling": True},
                                       workload={"num_requests": 120, "arrival": {"rate": 25.0}}),
    # the triton calibration prices the longest decode's serial walk: runs carry the longest context too
    "ragged decodes, serial term": dict(backend={"calibration": "triton"}, workload={
        "num_requests": 120, "arrival": {"rate": 20.0}, "prompt_len": {"dist": "lognormal", "mean": 900, "sigma": 1.0,
                                                                       "max": 3500}}),
}


@pytest.mark.parametrize("case", sorted(FUSION_CASES))
def test_fused_decode_runs_match_step_by_step(monkeypatch, case):
    sc = make_scenario(**FUSION_CASES[case])
    fused, fused_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain, plain_sum = per_request(monkeypatch, sc)
    assert_same_requests(fused, plain)
    for name, s in plain_sum.items():
        f = fused_sum[name]
        assert s["engine_events"] == s["engine_steps"]  # no fusion: one event a step
        assert f["engine_steps"] == s["engine_steps"]
        assert f["engine_events"] < s["engine_steps"]  # fusion did happen
        assert f["preemptions"] == s["preemptions"]
        assert f["duration_s"] == pytest.approx(s["duration_s"], rel=1e-9)
        assert f["itl_s"]["mean"] == pytest.approx(s["itl_s"]["mean"], rel=1e-6)
        # The time series and KV figures too: a fused run leaves the rows of every bucket it
        # crosses and holds its blocks step by step.
        assert f["kv"]["mean_used_fraction"] == pytest.approx(s["kv"]["mean_used_fraction"], rel=1e-9)
        assert f["kv"]["peak_used_blocks"] == s["kv"]["peak_used_blocks"]
        fr, sr = f["timeseries"], s["timeseries"]
        assert len(fr) == len(sr) and len(sr) > 20, name
        for a, b in zip(fr, sr):
            assert a[:2] == b[:2] and a[3:] == b[3:] and a[2] == pytest.approx(b[2], abs=2e-6), (name, a, b)


def test_the_cohort_keeps_its_longest_member_only_when_the_price_reads_it():
    sc = make_scenario()
    model, gpu = model_spec(sc), gpu_spec(sc)
    cap = kv_capacity(sc, sc.policies[0], model, gpu)
    settings = EngineSettings(16, 64, 2048, 4096)
    assert not AnalyticBackend(sc, sc.policies[0], model, gpu, cap, settings).prices_longest_decode  # vLLM: no serial term
    triton = make_scenario(backend={"calibration": "triton"})
    assert AnalyticBackend(triton, triton.policies[0], model, gpu, cap, settings).prices_longest_decode


@pytest.mark.parametrize("case", ["tight memory, preemptions", "prefix groups, two replicas"])
def test_engine_clock_running_ahead_of_simpy_changes_nothing(monkeypatch, case):
    """Engines skip SimPy timeouts while no other event is due; yielding every step must agree exactly."""
    monkeypatch.setattr(Simulation, "ONE_REPLICA_WITHOUT_SIMPY", False)
    assert_running_ahead_changes_nothing(monkeypatch, make_scenario(**FUSION_CASES[case]))


def assert_running_ahead_changes_nothing(monkeypatch, sc) -> None:
    """Engines skipping SimPy timeouts, and every step yielding one: the same requests and summaries."""
    import simpy

    ahead, ahead_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(simpy.Environment, "peek", lambda self: float("-inf"))  # every step yields
    stepped, stepped_sum = per_request(monkeypatch, sc)
    assert ahead == stepped and ahead
    assert ahead_sum == stepped_sum


# Arrival times that tie with each other and with step ends, rejected requests among them, so
# that SimPy's order of equal-time events is what the one-replica clock must replay.
TIES = {"num_requests": 120, "arrival": {"process": "deterministic", "rate": 40.0},
        "prompt_len": {"dist": "uniform", "min": 100, "max": 900},
        "output_len": {"dist": "uniform", "min": 1, "max": 60}}


@pytest.mark.parametrize("case", ["tight memory, preemptions", "swap preemption", "budget smaller than the batch",
                                  "ragged decodes, serial term", "ties", "synchronous scheduling",
                                  "roofline, async scheduling"])
def test_one_replica_without_simpy_replays_simpy_exactly(monkeypatch, case):
    """A lone replica's loop replays SimPy's clock and event order (OneReplicaClock): every figure,
    every request's times, every time-series row the same, to the bit."""
    sections = FUSION_CASES.get(case) or dict(engine={"max_model_len": 700, "max_num_seqs": 8}, workload=TIES)
    assert_replays_simpy(monkeypatch, make_scenario(**sections))


def assert_replays_simpy(monkeypatch, sc) -> dict:
    """The lone replica without SimPy and with it: every request's figures and the summaries alike."""
    alone, alone_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(Simulation, "ONE_REPLICA_WITHOUT_SIMPY", False)
    queued, queued_sum = per_request(monkeypatch, sc)
    assert alone == queued and alone
    assert alone_sum == queued_sum
    return alone_sum


# ---- policy effects ------------------------------------------------------------------------

def test_paged_runs_more_sequences_than_contiguous_slabs():
    sc = make_scenario(hardware=TIGHT, workload=BUSY, policies=[PAGED, CONTIGUOUS])
    s = run_scenario(sc, write=False).summaries
    cap = kv_capacity(sc, sc.policies[1], model_spec(sc), gpu_spec(sc))
    slabs = cap.num_blocks // (4096 // 16)  # every slab reserves max_model_len
    assert 1 <= slabs < 10
    assert s["contiguous"]["peak_running"] == slabs
    assert s["paged"]["peak_running"] >= 3 * slabs
    assert s["paged"]["ttft_s"]["mean"] < s["contiguous"]["ttft_s"]["mean"]


@pytest.mark.parametrize("gpu", ["tight H100", "L40S"])
def test_8_bit_kv_runs_more_sequences_when_memory_bound(gpu):
    hardware, engine, workload = TIGHT, {}, BUSY
    if gpu == "L40S":  # 46 GiB: room for about 12 sequences of 16k tokens in bf16
        hardware, engine = {"gpu": "L40S"}, {"max_model_len": 16384}
        workload = {"num_requests": 150, "arrival": {"rate": 50.0},
                    "prompt_len": {"dist": "uniform", "min": 4000, "max": 12000},
                    "output_len": {"dist": "uniform", "min": 50, "max": 300}}
    s = summaries(hardware=hardware, engine=engine, workload=workload, policies=[
        PAGED, {"name": "fp8", "kv_cache_dtype": "fp8"}, {"name": "int8", "kv_cache_dtype": "int8"}])
    bf16 = s["paged"]
    assert bf16["preemptions"] > 0  # memory is the bottleneck
    for name in ("fp8", "int8"):
        q = s[name]
        assert q["kv"]["num_blocks"] > 1.9 * bf16["kv"]["num_blocks"]
        assert q["peak_running"] > 1.5 * bf16["peak_running"], name
        # Preemptions are cheap now that a preempted sequence re-hits its own cached blocks, so
        # their count says little; the queue drains sooner.
        assert q["ttft_s"]["mean"] < bf16["ttft_s"]["mean"], name
        assert q["duration_s"] < bf16["duration_s"], name


def test_chunked_prefill_lowers_token_itl_p99_on_long_prompts():
    s = summaries(engine={"max_model_len": 20000, "max_num_batched_tokens": 2048},
                  policies=[{"name": "chunked"}, {"name": "whole", "enable_chunked_prefill": False}],
                  workload={"num_requests": 60, "arrival": {"rate": 3.0},
                            "prompt_len": {"dist": "uniform", "min": 8000, "max": 16000},
                            "output_len": {"dist": "uniform", "min": 100, "max": 300}})
    chunked, whole = s["chunked"]["itl_s"], s["whole"]["itl_s"]
    assert chunked["p99"] < 0.5 * whole["p99"]
    assert chunked["max"] < whole["max"]


def test_prefix_caching_hits_the_shared_system_prompts():
    sc = make_scenario(policies=[{"name": "cache", "enable_prefix_caching": True},
                                 {"name": "no-cache", "enable_prefix_caching": False}],
                       workload={"num_requests": 150, "arrival": {"rate": 20.0},
                                 "prompt_len": {"dist": "uniform", "min": 50, "max": 300},
                                 "prefix": {"num_groups": 3, "prefix_len": 2048, "fraction": 0.8}})
    s = run_scenario(sc, write=False).summaries
    # A roomy cache and no preemption: every group member after its group's first hits the whole
    # 2048-token prefix (128 full blocks of 16), and nothing else can hit.
    seen, hit, total = set(), 0, 0
    for r in generate_requests(sc):
        total += r.prompt_len
        if r.token_ids is not None:
            key = r.token_ids[:8].tobytes()
            hit += 2048 if key in seen else 0
            seen.add(key)
    assert len(seen) == 3
    cache, plain = s["cache"], s["no-cache"]
    assert cache["preemptions"] == plain["preemptions"] == 0
    assert cache["prefix_hit_rate"] == pytest.approx(hit / total, rel=1e-12)
    assert plain["prefix_hit_rate"] == 0
    assert cache["ttft_s"]["mean"] < 0.5 * plain["ttft_s"]["mean"]


def test_overload_queues_and_preempts_where_light_load_does_not():
    light = summaries(hardware=TIGHT, workload={**BUSY, "num_requests": 60, "arrival": {"rate": 0.5}})["paged"]
    heavy = summaries(hardware=TIGHT, workload=BUSY)["paged"]
    assert light["preemptions"] == 0 and light["peak_waiting"] <= 3
    assert heavy["preemptions"] > 0 and heavy["peak_waiting"] > 50
    assert heavy["ttft_s"]["mean"] > 20 * light["ttft_s"]["mean"]
    assert heavy["requests"]["finished"] == 150


def test_two_replicas_halve_the_queueing_of_a_burst():
    # 300 requests at once, at most 16 running per replica: requests wait for about
    # 300 / 16 / 2 rounds on one replica, half that on two.
    burst = {"num_requests": 300, "arrival": {"rate": 2000.0}}
    one = summaries(engine={"max_num_seqs": 16}, workload=burst)["paged"]
    two = summaries(engine={"max_num_seqs": 16}, workload=burst, hardware={"num_replicas": 2})["paged"]
    assert one["peak_running"] == 16 and two["peak_running"] == 32
    assert 0.4 < two["ttft_s"]["mean"] / one["ttft_s"]["mean"] < 0.6
    assert 0.4 < two["duration_s"] / one["duration_s"] < 0.6
    assert two["kv"]["num_blocks"] == 2 * one["kv"]["num_blocks"]


def test_contiguous_slabs_of_many_sizes_fragment_the_cache_and_pages_do_not():
    """With prompt + output slabs ("known_output"), freed holes come in many sizes: some free
    memory sits in holes too small for the next slab. Pages never leave such holes."""
    sc = make_scenario(
        hardware={"gpu": "H100-SXM", "gpu_memory_utilization": 0.3},
        engine={"max_model_len": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 16384},
        policies=[{"name": "slabs", "allocator": "contiguous", "contiguous_reserve": "known_output"},
                  {"name": "paged"}],
        workload={"num_requests": 300, "arrival": {"rate": 50.0},
                  "prompt_len": {"dist": "uniform", "min": 100, "max": 8000},
                  "output_len": {"dist": "uniform", "min": 10, "max": 400}})
    kv = {name: s["kv"] for name, s in run_scenario(sc, write=False).summaries.items()}
    assert 0 < kv["slabs"]["peak_external_fragmentation"] <= 1  # at times no hole holds the next slab
    assert kv["paged"]["peak_external_fragmentation"] == 0


def test_prefix_affinity_routing_keeps_each_group_on_one_replica_cache():
    """Four replicas, eight system prompts: routed by prompt prefix, each replica sees only its
    groups, so after the first request of a group every member hits; least-loaded routing makes
    each group miss once per replica."""
    common = dict(hardware={"gpu": "H100-SXM", "num_replicas": 4},
                  workload={"num_requests": 400, "arrival": {"rate": 40.0},
                            "prefix": {"num_groups": 8, "prefix_len": 1024, "fraction": 1.0}})
    hit = {}
    for router in ("prefix_affinity", "least_loaded"):
        sc = make_scenario(**merge_router(common, router))
        hit[router] = run_scenario(sc, write=False).summaries["paged"]["prefix_hit_rate"]
    requests = list(generate_requests(sc))
    groups = {r.token_ids.tobytes() for r in requests}
    prompt_tokens = sum(r.prompt_len for r in requests)
    # every member but the first of its group hits all 64 blocks of its 1024-token system prompt
    assert hit["prefix_affinity"] == pytest.approx(1024 * (len(requests) - len(groups)) / prompt_tokens)
    assert hit["least_loaded"] < hit["prefix_affinity"]


def merge_router(sections: dict, router: str) -> dict:
    out = {k: dict(v) for k, v in sections.items()}
    out["hardware"]["router"] = router
    return out


# ---- async scheduling ------------------------------------------------------------------------

class OneSecondSteps(RunSearch):
    """Every step takes one second, whatever it holds."""

    def step_time(self, batch) -> float:
        return 1.0 if batch.num_prefill_tokens or batch.num_decode_seqs else 0.0

    def decode_run_time(self, shape, k: int) -> float:
        return float(max(k, 0))


def one_second_steps(monkeypatch):
    init = AnalyticBackend.__init__

    def plug(self, *args):
        init(self, *args)
        self.pricer = OneSecondSteps()
        self.execute, self.decode_run, self.decode_run_time = (
            self.pricer.step_time, self.pricer.decode_run_within, self.pricer.decode_run_time)

    monkeypatch.setattr(AnalyticBackend, "__init__", plug)


@pytest.mark.parametrize("fuse", [True, False])
def test_async_scheduling_runs_a_request_that_arrives_mid_step_one_step_later(monkeypatch, tmp_path, fuse):
    """Steps of one second; A arrives at 0 (6 tokens out), B at 2.5, during A's step [2, 3), C at 20 on an
    idle engine. Synchronous: B's prefill is the step [3, 4), its first token at 4. Async (vLLM's
    AsyncScheduler planned [3, 4) while [2, 3) ran): B waits for [4, 5). C finds the engine idle: no wait."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,6\n2.5,10,3\n20,10,2\n")
    one_second_steps(monkeypatch)
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", fuse)
    got = {}
    for mode in (False, True):
        sc = make_scenario(engine={"async_scheduling": mode}, workload={
            "num_requests": 3, "arrival": {"process": "trace"}, "prompt_len": {"dist": "trace"},
            "output_len": {"dist": "trace"}, "trace": {"format": "csv", "path": str(tmp_path / "t.csv")}})
        rows, summaries = per_request(monkeypatch, sc)
        got[mode] = {sid: (ttft, e2e) for (_, sid), (ttft, e2e, *_) in rows.items()}
        assert summaries["paged"]["async_scheduling"] is mode
    assert got[False] == {0: (1.0, 6.0), 1: (1.5, 3.5), 2: (1.0, 2.0)}
    assert got[True] == {0: (1.0, 6.0), 1: (2.5, 4.5), 2: (1.0, 2.0)}


def test_async_scheduling_is_the_priced_releases_default():
    measured = run_scenario(make_scenario(), write=False).summaries["paged"]
    roofline = run_scenario(make_scenario(backend={"pricing": "roofline"}), write=False).summaries["paged"]
    assert measured["async_scheduling"] is True and roofline["async_scheduling"] is False
    # on the same steps, a request waits one step more: TTFT grows, nothing else about a request changes
    sync = run_scenario(make_scenario(engine={"async_scheduling": False}), write=False).summaries["paged"]
    assert measured["ttft_s"]["mean"] > sync["ttft_s"]["mean"]
    assert measured["requests"] == sync["requests"]
