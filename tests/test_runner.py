"""The GPU engine's model runner against a float64 dense reference, on the CPU through Triton's interpreter.

A two-layer model with tiny shapes runs whole prompts, chunked prefill mixed with decodes, prefix-cache
hits and decode steps through the paged kernels, with scrambled block ids; every sampled row's logits
must match plain causal attention recomputed from scratch over the same token ids. The model runs in
float32 over a float16 KV cache: logits agree to 9e-4 of their largest value here, while an attention
scale off by 2% already misses by 9e-3 or more, so the bound is 3e-3.
Set KVSIM_TEST_DEVICE=cuda and TRITON_INTERPRET=0 to run the same checks on a GPU.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
try:
    from kvsim.backends.triton_engine.model import dense_reference_forward
    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig, graph_batch_sizes, pseudo_token_ids
except ImportError as exc:  # the kernel modules are written separately
    pytest.skip(f"triton engine not importable: {exc}", allow_module_level=True)

from kvsim.errors import KvsimError  # noqa: E402
from kvsim.scenario.catalog import ModelSpec, gpu_spec, model_spec  # noqa: E402
from kvsim.scenario.config import scenario_from_dict  # noqa: E402
from kvsim.sequence import Request, Sequence  # noqa: E402

DEVICE = os.environ.get("KVSIM_TEST_DEVICE", "cpu")
TOL = 3e-3 if DEVICE == "cpu" else 2e-2  # GPU dots on float32 operands run in tf32
BS, NUM_BLOCKS, VOCAB = 8, 64, 128
SPEC = ModelSpec(name="tiny", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=256,
                 rope_theta=10000.0, rms_norm_eps=1e-6, qk_norm=True, dtype="float32")


class Engine:
    """A runner plus what the scheduler and allocator would do around it: grow block tables from
    scrambled free block ids, advance sequences after each step, remember the tokens fed so far."""

    def __init__(self, seed: int = 0, enforce_eager: bool = True):
        # init_std 0.2: peaked attention, so reading a wrong block or position shows in the logits
        cfg = RunnerConfig(block_size=BS, max_num_seqs=8, max_model_len=128, kv_cache_dtype="float16",
                           num_blocks=NUM_BLOCKS, enforce_eager=enforce_eager, device=DEVICE, seed=seed, init_std=0.2)
        self.runner = ModelRunner(SPEC, cfg)
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(NUM_BLOCKS)]
        self.tokens: dict[int, list[int]] = {}  # per sequence: prompt ids, then sampled ids

    def add(self, request: Request) -> Sequence:
        known = [] if request.token_ids is None else [int(t) for t in request.token_ids]
        rest = pseudo_token_ids(np.full(request.prompt_len - len(known), request.request_id),
                                np.arange(len(known), request.prompt_len), VOCAB)
        self.tokens[request.request_id] = known + rest.tolist()
        seq = Sequence(request)
        seq.block_table = []  # its own table, as an allocator makes it (a new Sequence shares NO_BLOCKS)
        return seq

    def grow(self, work: list[tuple[Sequence, int]]) -> None:
        for seq, n in work:
            while len(seq.block_table) * BS < seq.num_computed_tokens + n:
                seq.block_table.append(self.free.pop())

    def step(self, work: list[tuple[Sequence, int]]):
        self.grow(work)
        out = self.runner.execute_model([s for s, _ in work], [n for _, n in work], with_logits=True)
        check_against_reference(self.runner, out, {sid: self.tokens[sid] for sid in out.seq_ids})
        sampled = dict(zip(out.seq_ids, out.token_ids))
        for seq, n in work:
            seq.num_computed_tokens += n
            if seq.seq_id in sampled:  # as Scheduler.postprocess
                assert seq.num_computed_tokens == seq.num_tokens
                seq.num_output_tokens += 1
                seq.num_tokens += 1
                self.tokens[seq.seq_id].append(sampled[seq.seq_id])
        return out


def check_against_reference(runner, out, tokens: dict[int, list[int]]) -> None:
    assert len(out.token_ids) == len(out.seq_ids) == out.logits.shape[0]
    refs = dense_reference_forward(runner.model, [tokens[sid] for sid in out.seq_ids])
    for logits, sid, token, ref in zip(out.logits.cpu().double(), out.seq_ids, out.token_ids, refs):
        want = ref[-1]
        scale = want.abs().max().item()
        assert torch.isfinite(logits).all()
        assert (logits - want).abs().max().item() <= TOL * scale, f"sequence {sid}"
        top2 = want.topk(2).values
        if top2[0] - top2[1] > 2 * TOL * scale:  # greedy is only defined up to the tolerance
            assert token == int(want.argmax()), f"sequence {sid}"


def test_whole_prompts_in_one_step():
    eng = Engine(seed=1)
    shared = np.arange(100, 110, dtype=np.int32)
    seqs = [eng.add(Request(3, 0.0, 13, 4)), eng.add(Request(7, 0.0, 20, 4, token_ids=shared)),
            eng.add(Request(9, 0.0, 5, 4))]
    out = eng.step([(s, s.prompt_len) for s in seqs])
    assert sorted(out.seq_ids) == [3, 7, 9]


def test_chunked_prefill_mixed_with_decodes():
    eng = Engine(seed=2)
    a, b = eng.add(Request(1, 0.0, 21, 4)), eng.add(Request(2, 0.0, 9, 4))
    assert eng.step([(a, 8), (b, 9)]).seq_ids == [2]  # a's first chunk samples nothing
    assert sorted(eng.step([(a, 12), (b, 1)]).seq_ids) == [2]  # prefill row first: the runner reorders
    # a's last chunk is one token: it runs through the decode kernel beside b's decode, and samples
    assert sorted(eng.step([(b, 1), (a, 1)]).seq_ids) == [1, 2]
    assert a.num_output_tokens == 1 and b.num_output_tokens == 3


def test_prefix_cache_hits_read_the_first_sequence_blocks():
    eng = Engine(seed=3)
    shared = np.random.default_rng(3).integers(0, VOCAB, 16).astype(np.int32)  # two full blocks
    a = eng.add(Request(10, 0.0, 21, 4, token_ids=shared))
    eng.step([(a, 21)])
    b = eng.add(Request(11, 0.0, 19, 4, token_ids=shared))
    b.block_table, b.num_computed_tokens = list(a.block_table[:2]), 16  # the allocator's prefix hit
    eng.step([(b, 3)])
    # a prompt that is all hit: vLLM recomputes its last token to get logits (one decode-kernel row)
    c = eng.add(Request(12, 0.0, 16, 4, token_ids=shared))
    c.block_table, c.num_computed_tokens = list(a.block_table[:2]), 15
    eng.step([(c, 1)])


def test_decode_steps_after_prefill():
    eng = Engine(seed=4)
    a, b = eng.add(Request(20, 0.0, 11, 8)), eng.add(Request(21, 0.0, 17, 8))
    eng.step([(a, 11), (b, 17)])
    for _ in range(4):  # a crosses from block 1 into block 2 on the way
        assert sorted(eng.step([(a, 1), (b, 1)]).seq_ids) == [20, 21]
    assert a.num_tokens == 16 and len(eng.tokens[20]) == 16


@pytest.mark.skipif(DEVICE == "cpu", reason="CUDA graphs need a GPU (KVSIM_TEST_DEVICE=cuda)")
def test_cuda_graph_decode_matches_eager():
    eng = Engine(seed=7, enforce_eager=False)
    seqs = [eng.add(Request(50 + i, 0.0, n, 8)) for i, n in enumerate((9, 30, 17))]
    eng.step([(s, s.prompt_len) for s in seqs])
    for _ in range(3):  # a decode step's KV writes are the same values at the same slots: repeatable
        eng.grow([(s, 1) for s in seqs])
        graph = eng.runner.execute_model(seqs, [1, 1, 1])  # padded to the batch-4 graph
        eager = eng.step([(s, 1) for s in seqs])  # checked against the reference
        assert sorted(eager.seq_ids) == [50, 51, 52]
        assert graph.seq_ids == eager.seq_ids and graph.token_ids == eager.token_ids


def test_slots_block_tables_and_token_ids_by_hand():
    eng = Engine(seed=5)
    known = np.array([3, 1, 4, 1, 5], dtype=np.int32)
    seq = eng.add(Request(42, 0.0, 13, 2, token_ids=known))
    seq.block_table, seq.num_computed_tokens = [5, 2, 9], 6
    inp = eng.runner.prepare([seq], [7])
    assert inp.positions.tolist() == list(range(6, 13))
    assert inp.slot_mapping.tolist() == [46, 47, 16, 17, 18, 19, 20]  # block 5 offsets 6-7, block 2 offsets 0-4
    assert inp.block_tables.tolist() == [[5, 2] + [0] * 14] and inp.context_lens.tolist() == [13]  # width 16k
    assert inp.logits_indices.tolist() == [6] and inp.cu_seqlens_q.tolist() == [0, 7]
    assert inp.input_ids.tolist() == eng.tokens[42][6:13]
    seq.num_computed_tokens = 0
    assert eng.runner.prepare([seq], [13]).input_ids[:5].tolist() == [3, 1, 4, 1, 5]
    other = pseudo_token_ids(np.full(8, 43), np.arange(5, 13), VOCAB)
    assert other.tolist() != eng.tokens[42][5:13]  # unique prompt parts differ between requests


def test_recompute_feeds_sampled_tokens_until_freed():
    eng = Engine(seed=6)
    seq = eng.add(Request(30, 0.0, 6, 4))
    first = eng.step([(seq, 6)]).token_ids[0]
    seq.num_computed_tokens = 0  # preempted: recompute prompt and output together
    assert eng.runner.prepare([seq], [7]).input_ids[6] == first
    eng.runner.free(seq)
    assert eng.runner.prepare([seq], [7]).input_ids[6] == pseudo_token_ids(np.array([30]), np.array([6]), VOCAB)[0]


def test_graph_batch_sizes():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert graph_batch_sizes(3) == [1, 2, 4]  # padded as vLLM pads
    assert graph_batch_sizes(300)[-3:] == [288, 296, 304]
    assert graph_batch_sizes(2000)[-1] == 512  # larger decode batches run eagerly


def _scenario(**engine):
    data = {"model": {"name": "Qwen3-0.6B"}, "policies": [{"name": "paged"}], "workload": {"num_requests": 4},
            "backend": {"name": "triton"}, "engine": engine}
    return scenario_from_dict(data, "gpu.toml")


def _backend(sc):
    from kvsim.backends.triton_engine.backend import TritonBackend
    from kvsim.pipeline import resolve_policy

    model, gpu = model_spec(sc), gpu_spec(sc)
    return TritonBackend(sc, sc.policies[0], model, gpu, *resolve_policy(sc, sc.policies[0], model, gpu))


def test_backend_refuses_swap_preemption():
    with pytest.raises(KvsimError, match=r"gpu.toml: engine.preemption_mode: .*swap"):
        _backend(_scenario(preemption_mode="swap"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_backend_without_cuda_says_so():
    with pytest.raises(KvsimError, match="backend 'triton' needs .*CUDA"):
        _backend(_scenario())
