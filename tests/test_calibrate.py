"""kvsim profile's step shapes, the table readers, and kvsim calibrate's fit (recovering known
coefficients from tables made with them, refusing a poor fit) and command line."""

import csv
import json
import os
from dataclasses import replace

import numpy as np
import pytest

from kvsim.batch import Batch
from kvsim.calibrate import fit as fitting
from kvsim.calibrate.profile import COLUMNS, ProfileOptions, Shape, build_step, default_grid, heldout_grid, shapes_for
from kvsim.calibrate.shapes import anchor_grid, ragged_heldout_grid, serving_grid
from kvsim.calibrate.tables import (BATCH_FIELDS, Observation, read_tables, read_vidur_allreduce,
                                    read_vidur_mlp, serving_observations, table_kind)
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.perf.calibration import Calibration
from kvsim.perf.roofline import VLLM_GRAPH_SIZES
from kvsim.scenario.catalog import MODELS

DEVICE = os.environ.get("KVSIM_TEST_DEVICE", "cpu")  # the GPU suite: KVSIM_TEST_DEVICE=cuda TRITON_INTERPRET=0
TRUE = Calibration(compute_efficiency=0.62, attention_efficiency=0.4, memory_efficiency=0.7,
                   graph_step_overhead_s=8e-4, step_overhead_s=3e-3, eager_layer_s=2e-4, per_seq_overhead_s=3e-6)
FREE = ["compute_efficiency", "attention_efficiency", "memory_efficiency", "graph_step_overhead_s", "step_overhead_s",
        "eager_layer_s", "per_seq_overhead_s"]


# ---- kvsim profile's shapes ------------------------------------------------------------------------
def test_build_step_aggregates_by_hand():
    blocks = np.arange(100)[::-1]
    seqs, counts, b = build_step(Shape("mixed", 2, 40, 1, 24, 16), blocks, 16)
    assert counts == [1, 1, 24]
    assert (b.num_decode_seqs, b.decode_context_tokens) == (2, 80)  # 39 cached + the new token, twice
    assert (b.num_prefill_seqs, b.num_prefill_tokens, b.prefill_context_tokens) == (1, 24, 16)
    assert b.prefill_attn_pairs == 24 * 16 + 24 * 25 // 2
    # distinct blocks in the order given: 3 + 3 + 3 (40 tokens, 40 tokens, 40 tokens at 16 a block)
    assert [list(s.block_table) for s in seqs] == [[99, 98, 97], [96, 95, 94], [93, 92, 91]]
    assert seqs[2].prompt_len == 40 and seqs[0].num_output_tokens == 1
    with pytest.raises(KvsimError, match="needs more than the 4 cache blocks"):
        build_step(Shape("decode", 2, 40), blocks[:4], 16)


def test_grids_stay_inside_the_cache_and_model_length():
    grid = default_grid(True, max_model_len=4096, max_cache_tokens=100_000, max_num_seqs=64)
    assert {s.phase for s in grid} == {"decode", "prefill", "mixed"}
    assert all(s.max_len <= 4096 and s.cache_tokens <= 100_000 and s.decode_seqs <= 64 for s in grid)
    assert any(s.eager for s in grid) and len(default_grid(False)) < len(default_grid(True))
    held = heldout_grid(3, 10, max_model_len=4096, max_cache_tokens=100_000, max_num_seqs=64)
    assert held == heldout_grid(3, 10, max_model_len=4096, max_cache_tokens=100_000, max_num_seqs=64)
    assert len(held) == 30 and all(s.max_len <= 4096 and s.cache_tokens <= 100_000 for s in held)
    assert not set(held) & set(grid) or len(set(held) - set(grid)) > 20  # off the regular grid


def test_ragged_shapes_and_the_serving_grid():
    blocks = np.arange(100)
    shape = Shape.ragged((40, 5, 17))
    assert (shape.phase, shape.decode_seqs, shape.decode_context, shape.cache_tokens) == ("decode", 3, 40, 62)
    seqs, counts, b = build_step(shape, blocks, 16)
    assert counts == [1, 1, 1] and [s.num_computed_tokens for s in seqs] == [39, 4, 16]
    assert (b.num_decode_seqs, b.decode_context_tokens, b.decode_max_context) == (3, 62, 40)
    assert [len(s.block_table) for s in seqs] == [3, 1, 2]
    mixed = Shape.ragged((30, 9), 17, 5)
    _, counts, b = build_step(mixed, blocks, 16)
    assert mixed.phase == "mixed" and counts == [1, 1, 17] and (b.num_prefill_tokens, b.decode_max_context) == (17, 30)
    grid = serving_grid(True, max_model_len=8192, max_cache_tokens=60_000, max_num_seqs=64)
    assert grid == serving_grid(True, max_model_len=8192, max_cache_tokens=60_000, max_num_seqs=64)  # fixed seed
    assert all(s.max_len <= 8192 and s.cache_tokens <= 60_000 and s.decode_seqs <= 64 for s in grid)
    assert any(s.contexts and max(s.contexts) > 8 * min(s.contexts) for s in grid)  # one long among short ones
    assert any(s.contexts and s.decode_seqs not in (1, 2, 4) and s.decode_seqs % 8 for s in grid)  # between graphs
    assert len(serving_grid(False)) < len(serving_grid(True)) and set(anchor_grid()) <= set(default_grid())
    held = ragged_heldout_grid(5, 12, max_model_len=8192, max_cache_tokens=100_000, max_num_seqs=64)
    assert held == ragged_heldout_grid(5, 12, max_model_len=8192, max_cache_tokens=100_000, max_num_seqs=64)
    assert len(held) == 12 and all(s.contexts and s.max_len <= 8192 and s.decode_seqs <= 64 for s in held)
    todo = shapes_for(ProfileOptions(grid="serving", heldout_per_phase=6), "auto", 200_000)
    assert {g for g, _ in todo} == {"fit", "heldout"} and sum(g == "heldout" for g, _ in todo) == 6


# ---- table readers -----------------------------------------------------------------------------------
def profile_row(**kw) -> dict:
    row = dict.fromkeys(COLUMNS, "0")
    row.update(source="kvsim-profile", grid="fit", gpu="H100-SXM", device="x", model="Llama-3.1-8B",
               kv_cache_dtype="auto", tp="1", cuda_graph="1", phase="decode", num_decode_seqs="20",
               decode_context_tokens="20000", step_s="0.008", graph_batch="")
    row.update({k: str(v) for k, v in kw.items()})
    return row


def write_csv(path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_read_profile_and_merge_repeats(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_csv(a, [profile_row(), profile_row(cuda_graph=0, phase="prefill", num_decode_seqs=0, decode_context_tokens=0,
                                             num_prefill_seqs=1, num_prefill_tokens=512, prefill_attn_pairs=131328,
                                             step_s="0.02", grid="heldout")])
    write_csv(b, [profile_row(step_s="0.010")])
    assert table_kind(a) == "profile"
    obs = read_tables([a, b])
    assert len(obs) == 2  # the decode shape of both files merged
    dec = next(o for o in obs if o.phase == "decode")
    assert dec.measured == pytest.approx(0.009) and dec.graph_batch == 24  # padded as vLLM pads 20
    assert dec.counts == (0, 0, 0, 0, 20, 20000, 0, 0) and dec.model is MODELS["Llama-3.1-8B"]
    pre = next(o for o in obs if o.phase == "prefill")
    assert pre.grid == "heldout" and pre.graph_batch == 0 and pre.band == "129-1024"


def test_read_profile_longest_decode_and_max_model_len(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_csv(a, [profile_row(decode_context=3000, decode_max_context=5000, max_model_len=8192)])
    old = profile_row(decode_context=1000)  # written before the columns: decode_context is the longest
    del old["decode_max_context"], old["max_model_len"]
    write_csv(b, [old])
    new, before = read_tables([a]), read_tables([b])
    assert new[0].counts[6] == 5000 and new[0].max_model_len == 8192 and new[0].table == str(a)
    assert before[0].counts[6] == 1000 and before[0].counts[7] == 0 and before[0].max_model_len == 0
    # the same shape in two tables: one observation, unless each table keeps its own
    write_csv(b, [profile_row(decode_context=3000, decode_max_context=5000, max_model_len=8192, step_s="0.01")])
    assert len(read_tables([a, b])) == 1 and len(read_tables([a, b], across_tables=False)) == 2


@pytest.mark.parametrize("change, match", [
    ({"step_s": "fast"}, r"a\.csv:2: step_s: not a number"),
    ({"num_decode_seqs": "2.5"}, r"a\.csv:2: num_decode_seqs: must be a whole number"),
    ({"model": "GPT-5"}, r"a\.csv:2: model: unknown model 'GPT-5'"),
    ({"gpu": "TPU"}, r"a\.csv:2: gpu: unknown GPU preset 'TPU'"),
    ({"phase": "warmup"}, r"a\.csv:2: phase: must be decode, prefill or mixed"),
])
def test_read_profile_errors_name_file_line_and_column(tmp_path, change, match):
    path = tmp_path / "a.csv"
    write_csv(path, [profile_row(**change)])
    with pytest.raises(KvsimError, match=match):
        read_tables([path])


def vidur_rows() -> list[dict]:
    ops = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
    rows = []
    for tokens, gated in ((1, "True"), (4096, "True"), (8, "False")):
        row = {f"time_stats.{op}.median": str(0.01 * (i + 1)) for i, op in enumerate(ops)}
        row.update(n_head="32", n_kv_head="32", n_embd="4096", n_expanded_embd="11008", vocab_size="32768",
                   use_gated_mlp=gated, num_tokens=str(tokens), num_tensor_parallel_workers="2")
        rows.append(row)
    return rows


def test_read_vidur_mlp(tmp_path):
    path = tmp_path / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    path.parent.mkdir(parents=True)
    write_csv(path, vidur_rows())
    assert table_kind(path) == "vidur-mlp"
    obs = read_vidur_mlp(path)
    assert len(obs) == 4  # two gated rows, a GEMM and a small-kernel observation each
    gemm = [o for o in obs if o.kind == "gemm"]
    # qkv 0.03 + o 0.05 + gate_up 0.07 + down 0.09 ms; norms 0.02 + 0.06, rope 0.04, act 0.08, add 0.10 ms
    assert gemm[0].measured == pytest.approx(0.24e-3) and gemm[0].gpu == "H100-SXM" and gemm[0].tp == 2
    small = [o for o in obs if o.kind == "elementwise"]
    assert small[1].measured == pytest.approx(0.30e-3) and small[1].counts == (4096,)
    m = gemm[0].model
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size, m.head_dim) == (1, 4096, 11008, 128)
    with pytest.raises(KvsimError, match="cannot tell the GPU"):
        read_vidur_mlp(_copy(path, tmp_path / "somewhere" / "mlp.csv"))


def _copy(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(src.read_text())
    return dst


def test_read_vidur_allreduce_skips_rows_across_nodes(tmp_path):
    path = tmp_path / "h100_dgx" / "all_reduce.csv"
    path.parent.mkdir()
    rows = [{"": str(i), "time_stats.all_reduce.median": ms, "num_workers": w, "size": size, "devices_per_node": d}
            for i, (ms, w, size, d) in enumerate((("0.03", "2", "2048", "8"), ("0.2", "4", "67108864", "8"),
                                                  ("0.5", "16", "2048", "8")))]
    write_csv(path, rows)
    obs = read_vidur_allreduce(path)
    assert [(o.tp, o.counts) for o in obs] == [(2, (2048,)), (4, (67108864,))]
    assert [o.measured for o in obs] == pytest.approx([3e-5, 2e-4])
    # priced as latency + ring bytes
    cal = Calibration(allreduce_latency_s=1e-5, allreduce_efficiency=0.5)
    assert fitting.Pricer(cal).price(obs[1]) == pytest.approx(1e-5 + 1.5 * 67108864 / (450e9 * 0.5))


def test_unknown_table_format(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(KvsimError, match=r"t\.csv: not a kvsim profile, Vidur mlp.csv or Vidur all_reduce.csv"):
        read_tables([path])


# ---- fitting -----------------------------------------------------------------------------------------
def synthetic(calibration: Calibration, noise: float = 0.0, seed: int = 0) -> list[Observation]:
    """Step observations priced by `calibration` (times a log-normal noise), over Llama-8B and Qwen3-0.6B."""
    rng = np.random.default_rng(seed)
    shapes = []
    for model in ("Llama-3.1-8B", "Qwen3-0.6B"):
        for n, ctx in ((1, 512), (8, 2048), (32, 1024), (128, 512), (256, 2048), (16, 8192)):
            shapes.append((model, Batch(num_decode_seqs=n, decode_context_tokens=n * ctx), True))
        for n, cached in ((64, 0), (512, 0), (2048, 0), (8192, 0), (256, 4096), (2048, 2048)):
            shapes.append((model, Batch(num_prefill_seqs=1, num_prefill_tokens=n, prefill_context_tokens=cached,
                                        prefill_attn_pairs=n * cached + n * (n + 1) // 2), False))
        for d, chunk in ((4, 128), (16, 512), (64, 2048)):
            shapes.append((model, Batch(num_decode_seqs=d, decode_context_tokens=d * 1000, num_prefill_seqs=1,
                                        num_prefill_tokens=chunk, prefill_attn_pairs=chunk * (chunk + 1) // 2), False))
    obs = []
    for i, (model, b, graph) in enumerate(shapes):
        counts = tuple(getattr(b, f) for f in BATCH_FIELDS)
        phase = "decode" if not b.num_prefill_seqs else "mixed" if b.num_decode_seqs else "prefill"
        padded = next(s for s in VLLM_GRAPH_SIZES if s >= b.num_decode_seqs) if graph else 0
        o = Observation("step", 1.0, "H100-SXM", f"syn:{i}", MODELS[model], 1, "auto", padded, counts, phase,
                        "all", "fit")
        true = fitting.Pricer(calibration).price(o) * float(np.exp(rng.normal(0, noise))) if noise else \
            fitting.Pricer(calibration).price(o)
        obs.append(Observation(**{**{f: getattr(o, f) for f in o.__slots__}, "measured": true}))
    return obs


def test_fit_recovers_known_coefficients():
    obs = synthetic(TRUE)
    assert set(FREE) <= set(fitting.identifiable(obs, Calibration()))
    got = fitting.fit(obs, Calibration(), FREE).calibration
    for name in FREE:
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    errors = fitting.holdout_errors(obs, Calibration(), FREE, k=3)
    assert np.nanmax(np.abs(errors)) < 0.01
    rows = fitting.slice_table(obs, errors)
    assert fitting.check_fit(errors, rows) is None
    assert {r["phase"] for r in rows} == {"decode", "prefill", "mixed"}


def test_per_table_coefficients_get_one_value_per_table():
    """Two machines: the same GPU work, a slower host on the second. Host coefficients per table."""
    host = ["graph_step_overhead_s", "step_overhead_s"]
    second = replace(TRUE, graph_step_overhead_s=1.3e-3, step_overhead_s=4e-3)
    obs = [replace(o, table="a") for o in synthetic(TRUE)]
    obs += [replace(o, table="b", source=o.source + "b") for o in synthetic(second)]
    f = fitting.fit(obs, Calibration(), FREE, per_table=host)
    for name in FREE:
        assert getattr(f.calibration, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert list(f.tables) == ["b"] and set(f.tables["b"]) == set(host)
    for name in host:
        assert f.tables["b"][name] == pytest.approx(getattr(second, name), rel=0.02), name
    assert np.max(np.abs(fitting.log_errors(obs, f.calibration, f.tables))) < 0.01
    # one value for both tables cannot follow them
    shared = fitting.fit(obs, Calibration(), FREE)
    assert np.max(np.abs(fitting.log_errors(obs, shared.calibration))) > 0.03
    errors = fitting.holdout_errors(obs, Calibration(), FREE, k=3, per_table=host)
    assert np.nanmax(np.abs(errors)) < 0.01


def test_a_poor_fit_is_refused():
    obs = synthetic(TRUE, noise=0.5, seed=1)  # +-50% (one sigma) scatter no model can follow
    errors = fitting.holdout_errors(obs, Calibration(), FREE, k=3)
    why = fitting.check_fit(errors, fitting.slice_table(obs, errors))
    assert why is not None and "hold-out median |error|" in why


def test_heldout_shapes_are_predicted_by_the_fit_to_the_rest():
    obs = synthetic(TRUE)
    obs = [o if i % 4 else Observation(**{**{f: getattr(o, f) for f in o.__slots__}, "grid": "heldout"})
           for i, o in enumerate(obs)]
    errors = fitting.holdout_errors(obs, Calibration(), FREE, k=3)
    assert not np.isnan(errors).any() and np.max(np.abs(errors)) < 0.01


def test_serving_results_are_fitted_by_simulating_them(tmp_path):
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario

    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "s"\n[model]\nname = "Qwen3-0.6B"\n[engine]\nmax_model_len = 2048\n'
                        '[[policies]]\nname = "paged"\n[workload]\nnum_requests = 30\n'
                        'arrival = { process = "poisson", rate = 20.0 }\n[output]\nreport_html = false\n'
                        '[backend]\npricing = "roofline"\n')  # serving figures fit the roofline's coefficients
    summary = run_scenario(load_scenario(scenario), None, write=False).summaries["paged"]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"completed": 30, "num_prompts": 30, "output_throughput": 1000.0,
                                 "median_ttft_ms": 2 * summary["ttft_s"]["p50"] * 1e3, "mean_tpot_ms": 5.0}))
    obs = serving_observations(scenario, bench)
    assert sorted(o.band for o in obs) == ["mean_tpot_ms", "median_ttft_ms", "output_throughput"]
    ttft = next(o for o in obs if o.band == "median_ttft_ms")
    assert ttft.measured == pytest.approx(2 * summary["ttft_s"]["p50"])  # ms -> s
    # the default calibration is the shipped H100 one: pricing the figure simulates the scenario
    from kvsim.perf.calibration import load_calibration, shipped_path
    price = fitting.Pricer(load_calibration(shipped_path("H100-SXM"))).price(ttft)
    assert price == pytest.approx(summary["ttft_s"]["p50"], rel=1e-9)


# ---- the command line ----------------------------------------------------------------------------------
def test_calibrate_cli_writes_a_fit_with_provenance(tmp_path, capsys):
    path = tmp_path / "p.csv"
    rows = []
    for o in synthetic(TRUE):
        row = profile_row(model=o.model.name, cuda_graph=int(o.graph_batch > 0), phase=o.phase,
                          graph_batch=o.graph_batch, step_s=f"{o.measured:.9g}")
        row.update({f: str(v) for f, v in zip(BATCH_FIELDS, o.counts)})
        rows.append(row)
    write_csv(path, rows)
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(path), "-o", str(out), "--free", ",".join(FREE), "--folds", "3"]) == 0
    doc = json.loads(out.read_text())
    assert doc["written_by"] == "kvsim calibrate" and doc["fit"]["fitted"] == FREE
    assert doc["coefficients"]["step_overhead_s"] == pytest.approx(3e-3, rel=0.02)
    assert "fitted by kvsim calibrate to 30 observations" in doc["provenance"]["memory_efficiency"]
    assert "built-in default" in doc["provenance"]["allreduce_latency_s"]
    assert "hold-out median |error|" in capsys.readouterr().out
    # its own file may be written again; started from it, the coefficients not fitted keep its provenance
    assert main(["calibrate", str(path), "-o", str(out), "--free", "memory_efficiency", "--folds", "2",
                 "--start", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again["provenance"]["step_overhead_s"].endswith("(from cal.json)")
    assert again["coefficients"]["step_overhead_s"] == doc["coefficients"]["step_overhead_s"]
    # a second table from a slower host: --per-table fits its host coefficient apart
    slow = tmp_path / "slow.csv"
    write_csv(slow, [dict(r, step_s=f"{float(r['step_s']) + 2e-3 * (r['cuda_graph'] == '0'):.9g}") for r in rows])
    out2 = tmp_path / "two.json"
    assert main(["calibrate", str(path), str(slow), "-o", str(out2), "--free", ",".join(FREE), "--folds", "3",
                 "--per-table", "step_overhead_s"]) == 0
    two = json.loads(out2.read_text())
    assert two["coefficients"]["step_overhead_s"] == pytest.approx(3e-3, rel=0.05)
    assert two["fit"]["per_table"][str(slow)]["step_overhead_s"] == pytest.approx(5e-3, rel=0.05)
    assert "one value per table" in two["provenance"]["step_overhead_s"]


@pytest.mark.parametrize("args, match", [
    (["calibrate", "-o", "{tmp}/c.json"], "give at least one TABLE"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/c.json", "--free", "speed"], "--free: unknown coefficient speed"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/mine.json"], r"mine\.json: already exists; kvsim does not overwrite"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/nope/c.json"], "folder .* does not exist"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/c.json", "--only", "steps"], "--only: unknown kind steps"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/c.json", "--only", "gemm"], "the tables hold no observations"),
    (["calibrate", "{tmp}/missing.csv", "-o", "{tmp}/c.json"], r"missing\.csv: table not found"),
    (["calibrate", "{tmp}/p.csv", "-o", "{tmp}/c.json", "--start", "triton"], "--start triton: name the GPU"),
])
def test_calibrate_cli_errors_are_one_line(tmp_path, capsys, args, match):
    write_csv(tmp_path / "p.csv", [profile_row()])
    (tmp_path / "mine.json").write_text("{}")
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("kvsim: error:")
    import re
    assert re.search(match, err), err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_cli_refuses_a_poor_fit_and_writes_nothing(tmp_path, capsys):
    rows = []
    for o in synthetic(TRUE, noise=0.5, seed=2):
        row = profile_row(model=o.model.name, cuda_graph=int(o.graph_batch > 0), phase=o.phase,
                          graph_batch=o.graph_batch, step_s=f"{o.measured:.9g}")
        row.update({f: str(v) for f, v in zip(BATCH_FIELDS, o.counts)})
        rows.append(row)
    write_csv(tmp_path / "p.csv", rows)
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(tmp_path / "p.csv"), "-o", str(out), "--free", "memory_efficiency,step_overhead_s",
                 "--folds", "3"]) == 2
    err = capsys.readouterr().err
    assert "fit refused: hold-out median |error|" in err and not out.exists()
    assert main(["calibrate", str(tmp_path / "p.csv"), "-o", str(out), "--free", "memory_efficiency,step_overhead_s",
                 "--folds", "3", "--max-error", "5"]) == 0 and out.exists()  # the threshold is overridable


def test_profile_without_a_gpu_is_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["profile", "--model", "Qwen3-0.6B", "-o", str(tmp_path / "p.csv")]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err and not (tmp_path / "p.csv").exists()
    assert main(["profile", "--model", "GPT-5", "-o", str(tmp_path / "p.csv")]) == 2
    assert "--model: unknown model GPT-5" in capsys.readouterr().err


def test_profile_runner_on_the_cpu(tmp_path):
    """The timing loop and the CSV row it writes, on a two-layer model through Triton's interpreter (on a GPU:
    KVSIM_TEST_DEVICE=cuda TRITON_INTERPRET=0)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig
    from kvsim.calibrate.profile import profile_runner
    from kvsim.scenario.catalog import ModelSpec

    spec = ModelSpec(name="tiny", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, intermediate_size=128, vocab_size=128, max_position_embeddings=256, dtype="float32")
    runner = ModelRunner(spec, RunnerConfig(block_size=8, max_num_seqs=8, max_model_len=128, kv_cache_dtype="float16",
                                            num_blocks=64, device=DEVICE))
    path = tmp_path / "p.csv"
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        shapes = [Shape("mixed", 2, 17, 1, 5, 3), Shape.ragged((20, 7, 13))]
        assert profile_runner(runner, "tiny", "float16", shapes, "H100-SXM", DEVICE, out, repeats=1, target_s=0,
                              passes=1) == 2
    rows = list(csv.DictReader(open(path)))
    assert [r["phase"] for r in rows] == ["mixed", "decode"]
    assert (rows[0]["num_decode_seqs"], rows[0]["decode_context_tokens"], rows[0]["prefill_attn_pairs"]) == \
        ("2", "34", str(5 * 3 + 15))
    graphs = "1" if DEVICE == "cuda" else "0"  # the runner captures CUDA graphs for decode on a GPU only
    assert float(rows[1]["step_s"]) > 0 and rows[1]["cuda_graph"] == graphs and rows[1]["repeats"] == "1"
    assert (rows[1]["decode_context"], rows[1]["decode_context_tokens"], rows[1]["decode_max_context"],
            rows[1]["max_model_len"]) == ("20", "40", "20", "128")
