"""Speculative decoding's price and memory: the resolved plan, the drafter, and its share of each step.

vLLM V1 (the scheduler and proposers read at vllm-project/vllm commit 00024d3, whose semantics are
those of the v0.10-v0.11 line the kernel tables' releases share) runs speculation inside the engine
step: a decoding sequence schedules its last sampled token and the k drafts proposed for it (1 + k
token rows, every one sampled by the rejection sampler), its KV slots are allocated with
`num_lookahead_tokens` = k more for the drafter's own KV (EAGLE, MTP and draft models; none for
n-gram), and after the verify pass the drafter proposes the next k drafts:

- EAGLE / EAGLE-3 / MTP (`vllm/v1/spec_decode/eagle.py`): a first pass of the draft layers over all the
  step's token rows (their hidden states feed it; logits for one row a sequence), then k - 1 passes of
  one row a sequence, each reading the draft's own KV. An EAGLE head is one decoder layer shaped as the
  target's (EAGLE-3: fed three of the target's layers through a 3h x h projection, its lm_head over a
  reduced vocabulary); an MTP layer is the model's own extra decoder layer (DeepSeek-V3: MLA and MoE).
- draft_model (`draft_model.py`): the same passes through a separate small model's layers.
- n-gram (`ngram_proposer.py`): a lookup in the prompt and output on the CPU; no GPU work.

`SpecPlan` is that resolved once per policy (method, k, lookahead, per-position acceptance and where it
comes from, the drafter's shape, weights and KV bytes). `SpeculativePricer` wraps the target's pricer:
a step is the target's verify pass (rows = sequences + drafts, all sampled; kvsim.perf.measured and
kvsim.perf.roofline read `Batch.num_spec_tokens`) plus the drafter's passes priced by a pricer of the
drafter's own shape (the kernel tables for its layers, or the roofline), GPU work only (the engine's
host work and step overhead are the target step's). A speculative cohort's run of steps (whose
contexts grow by the accepted tokens, not one a step) is priced step by step from arrays
(`SpecRunShape`), in the same arithmetic as a single step, so fused and single steps agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from kvsim.batch import Batch
from kvsim.errors import KvsimError
from kvsim.perf.acceptance import DEFAULT_PRESET, PRESETS, Acceptance, iid_rates, preset_rates
from kvsim.perf.memory import kv_bytes_per_token
from kvsim.perf.pricing import DecodeRunPrice
from kvsim.perf.weights import weights_per_gpu
from kvsim.scenario.models import CHUNKED, SLIDING, ModelSpec

EAGLE3_DRAFT_VOCAB = 32000  # the published EAGLE-3 heads' draft vocabulary (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
_FC_INPUTS = {"eagle": 2, "eagle3": 3, "mtp": 2}  # hidden states the drafter's input projection concatenates


@dataclass(frozen=True, slots=True)
class SpecPlan:
    """One policy's speculative decoding, resolved: what the scheduler, the pricer and the memory read."""

    method: str  # eagle, eagle3, mtp, ngram, draft_model
    k: int  # num_speculative_tokens
    lookahead: int  # vLLM's num_lookahead_tokens: k for drafters with a KV cache, 0 for n-gram
    rates: tuple[float, ...]  # p_1..p_k: unconditional per-position acceptance of a proposing step
    proposal_rate: float  # share of steps that propose drafts (n-gram's matches; 1 otherwise)
    seed: int
    source: str  # where the acceptance comes from
    draft: Optional[ModelSpec] = None  # the drafter's layers (None: n-gram)
    draft_weight_bytes: float = 0.0  # per GPU, beyond the target's
    draft_kv_bytes_per_token: float = 0.0  # per GPU: the drafter's own KV cache

    @property
    def mean_tokens(self) -> float:
        """Expected tokens a decoding sequence's step yields: 1 + q (p_1 + ... + p_k)."""
        return Acceptance(self.rates, self.proposal_rate, self.source).mean_tokens

    def describe(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.k, "num_lookahead_tokens": self.lookahead,
                "acceptance_per_position": list(self.rates), "proposal_rate": self.proposal_rate,
                "expected_tokens_per_step": round(self.mean_tokens, 6), "acceptance_source": self.source,
                "draft": None if self.draft is None else {
                    "name": self.draft.name, "layers": self.draft.num_hidden_layers,
                    "vocab_size": self.draft.vocab_size,
                    "weights_gib_per_gpu": round(self.draft_weight_bytes / 2**30, 4),
                    "kv_bytes_per_token_per_gpu": self.draft_kv_bytes_per_token}}


def resolve_speculation(scenario, policy, model: ModelSpec) -> Optional[SpecPlan]:
    """The policy's SpecPlan, or None when it does not speculate. Settings kvsim cannot simulate, or
    vLLM would refuse, are one line naming the key."""
    if not scenario.speculates(policy):
        return None
    cfg, src = scenario.speculative, scenario.source
    _check_simulable(scenario, policy, model)
    method = cfg.base_method
    k = policy.num_speculative_tokens or cfg.num_speculative_tokens
    acceptance = _acceptance(cfg, method, k, src)
    draft, weights = _drafter(cfg, method, model, scenario)
    hw = scenario.hardware
    kv = kv_bytes_per_token(draft, policy.kv_cache_dtype, hw.tensor_parallel_size) if draft is not None else 0.0
    return SpecPlan(method, k, 0 if method == "ngram" else k, acceptance.rates, acceptance.proposal_rate, cfg.seed,
                    acceptance.source, draft, weights, kv)


def _check_simulable(scenario, policy, model: ModelSpec) -> None:
    src = scenario.source
    if scenario.backend.name != "analytic":
        raise KvsimError(f"{src}: speculative: speculative decoding is simulated on the analytic backend, "
                         f"not {scenario.backend.name!r}")
    if policy.allocator != "paged":
        raise KvsimError(f"{src}: policies: policy {policy.name}: speculative decoding needs the paged allocator "
                         "(vLLM's; set the policy's speculative = false)")
    if scenario.disaggregated(policy):
        raise KvsimError(f"{src}: policies: policy {policy.name}: speculative decoding is not simulated on "
                         "disaggregated pools yet (set the policy's speculative = false)")
    windowed = [t for t in model.layer_types if t in (SLIDING, CHUNKED)]
    if windowed:
        raise KvsimError(f"{src}: speculative: {model.name} has {windowed[0].replace('_', ' ')} layers, whose "
                         "windowed KV cache kvsim does not yet simulate with speculative decoding")
    if scenario.backend.calibration == "triton":
        raise KvsimError(f"{src}: speculative: priced with vLLM's kernels or its calibrated roofline, not "
                         "backend.calibration = \"triton\"")


def _acceptance(cfg, method: str, k: int, src: str) -> Acceptance:
    if cfg.acceptance is not None:
        rates = tuple(cfg.acceptance[:k])
        return Acceptance(rates, cfg.proposal_rate or 1.0, "speculative.acceptance (given)")
    if cfg.acceptance_rate is not None:
        return Acceptance(iid_rates(cfg.acceptance_rate, k), cfg.proposal_rate or 1.0,
                          f"speculative.acceptance_rate = {cfg.acceptance_rate:g} (i.i.d. per draft)")
    dataset = (cfg.dataset or DEFAULT_PRESET[method]).lower()
    if dataset not in PRESETS[method]:
        raise KvsimError(f"{src}: speculative.dataset: no {method} preset {cfg.dataset!r} (presets: "
                         f"{', '.join(PRESETS[method])}; or give acceptance or acceptance_rate)")
    found = preset_rates(method, dataset, k)
    return found._replace(proposal_rate=cfg.proposal_rate or found.proposal_rate)


def _drafter(cfg, method: str, model: ModelSpec, scenario) -> tuple[Optional[ModelSpec], float]:
    """The drafter's layers as a ModelSpec and its weight bytes per GPU beyond the target's."""
    hw, src = scenario.hardware, scenario.source
    tp = hw.tensor_parallel_size
    if method == "ngram":
        return None, 0.0
    if method == "draft_model":
        draft_spec = _draft_model(cfg, scenario)
        if draft_spec.vocab_size != model.vocab_size:
            raise KvsimError(f"{src}: speculative.draft_model: {draft_spec.name}'s vocabulary ({draft_spec.vocab_size:,}) "
                             f"is not {model.name}'s ({model.vocab_size:,}): vLLM needs the draft and target to share it")
        draft = replace(draft_spec, dtype=model.dtype)
        return draft, weights_per_gpu(draft, tp).total
    if method == "mtp":
        have = model.num_nextn_predict_layers
        if not have:
            raise KvsimError(f"{src}: speculative.method: {cfg.method} drafts with the model's multi-token-prediction "
                             f"layers, and {model.name} has none (num_nextn_predict_layers = 0): use eagle3, ngram "
                             "or draft_model")
        layers = cfg.draft_num_layers or have
        if layers > have:
            raise KvsimError(f"{src}: speculative.draft_num_layers: {model.name} ships {have} MTP layer(s), not {layers}")
        draft = replace(model, name=f"{model.name} MTP", num_hidden_layers=layers, num_nextn_predict_layers=0,
                        moe=replace(model.moe, dense_layers=()) if model.moe else None, encoder_params=0)
        vocab = model.vocab_size
    else:  # an EAGLE head: dense decoder layers shaped as the target's
        vocab = min(cfg.draft_vocab_size or EAGLE3_DRAFT_VOCAB, model.vocab_size) if method == "eagle3" else model.vocab_size
        draft = replace(model, name=f"{model.name} {method.upper()} head", num_hidden_layers=cfg.draft_num_layers or 1,
                        layer_types=(), sliding_window=0, attention_chunk_size=0, moe=None, vocab_size=vocab,
                        num_nextn_predict_layers=0, encoder_params=0, tie_word_embeddings=False)
    w = weights_per_gpu(draft, tp)
    extra = w.total - w.embed - w.lm_head  # its layers; the embedding is the target's
    if method == "eagle3":
        extra += w.lm_head  # its own lm_head over the draft vocabulary
    fc = _FC_INPUTS[method] * model.hidden_size * model.hidden_size * model.activation_bytes / tp
    return draft, extra + fc


def _draft_model(cfg, scenario) -> ModelSpec:
    """speculative.draft_model (a preset) or draft_hf_config (a config.json), as model.name / hf_config read."""
    from kvsim.scenario.catalog import MODELS, load_hf_config

    if cfg.draft_model is not None:
        spec = {k.lower(): v for k, v in MODELS.items()}.get(cfg.draft_model.lower())
        if spec is None:
            raise KvsimError(f"{scenario.source}: speculative.draft_model: unknown model '{cfg.draft_model}' "
                             f"(presets: {', '.join(MODELS)}; or give speculative.draft_hf_config)")
        return spec
    return load_hf_config(scenario.resolve(cfg.draft_hf_config))


def with_draft(capacity, plan: Optional[SpecPlan], block_size: int, max_model_len: int, source: str, policy_name: str):
    """`capacity` (kvsim.perf.memory.KvCapacity) with the drafter's weights on every GPU and its layers'
    KV in every block (vLLM puts the draft's attention layers in the same KV cache groups)."""
    if plan is None or (not plan.draft_weight_bytes and not plan.draft_kv_bytes_per_token):
        return capacity
    weights = capacity.weights + plan.draft_weight_bytes
    kv = capacity.budget - weights - capacity.activations - capacity.reserve
    per_block = capacity.bytes_per_block + math.ceil(plan.draft_kv_bytes_per_token * block_size)
    blocks = max(0, int(kv // per_block))
    if blocks * block_size < max_model_len:
        raise KvsimError(f"{source}: policy {policy_name}: with the {plan.method} drafter ({plan.draft_weight_bytes / 2**30:.2f} "
                         f"GiB a GPU, its KV in every block) the KV cache holds {blocks * block_size} tokens, fewer "
                         f"than max_model_len {max_model_len}: lower engine.max_model_len or raise "
                         "hardware.tensor_parallel_size")
    return replace(capacity, weights=weights, kv=kv, bytes_per_block=per_block, num_blocks=blocks,
                   max_tokens=blocks * block_size)


def drafter_calibration(calibration):
    """The roofline's coefficients for the drafter's passes: no per-step fixed or host costs (the engine's
    step pays those once, in the target's price)."""
    return replace(calibration, graph_step_overhead_s=0.0, step_overhead_s=0.0, per_seq_overhead_s=0.0,
                   eager_layer_s=0.0, eager_attention_s=0.0, eager_quantized_s=0.0)


class SpecRunShape:
    """A speculative cohort's next steps as a price reads them: `num_seqs` sequences; step i verifies
    drafts[i] drafts (rows: num_seqs + drafts[i]) and reads reads[i] - shared keys (contexts and the new
    rows; blocks several sequences hold read once); `reads_prefix[i] - reads_prefix[0]` sums reads over
    the first i steps; `uniform_drafts`: the drafts every sequence verifies at every step (-1: they
    differ). The pricer fills `affine` (every step's price as A + B x, x its keys) or `cum`."""

    __slots__ = ("num_seqs", "drafts", "reads", "reads_prefix", "shared", "uniform_drafts", "cum", "affine", "_keys")

    def __init__(self, num_seqs: int, drafts: np.ndarray, reads: np.ndarray, reads_prefix: np.ndarray,
                 shared: int = 0, uniform_drafts: int = -1):
        self.num_seqs, self.drafts, self.reads, self.reads_prefix = num_seqs, drafts, reads, reads_prefix
        self.shared, self.uniform_drafts = shared, uniform_drafts
        self.cum = np.zeros(0)
        self.affine = None
        self._keys = None

    def __len__(self) -> int:
        return len(self.drafts)

    def prefix_list(self) -> list:
        """reads_prefix as Python ints (a run's searches look many up)."""
        p = self._keys
        if p is None:
            p = self._keys = self.reads_prefix.tolist()
        return p

    def keys(self, steps: int) -> float:
        """Keys the first `steps` steps read in all."""
        p = self._keys
        if p is None:
            p = self.prefix_list()
        return float(p[steps] - p[0] - self.shared * steps)

    def rows(self, steps: int) -> int:
        """Token rows the first `steps` steps compute in all."""
        if self.uniform_drafts >= 0:
            return steps * self.num_seqs * (1 + self.uniform_drafts)
        return steps * self.num_seqs + int(self.drafts[:steps].sum())


_CHUNK = 64  # steps a run's prices are computed for at a time (runs usually end at an arrival long before their last step)


class SpeculativePricer:
    """A `RunPricer` (kvsim.perf.pricing) for steps that verify drafts: the target's price of the verify
    pass plus the drafter's GPU work (module docstring). `draft` prices the drafter's layers (None:
    n-gram, whose lookup runs on the CPU within the engine's host work)."""

    prices_longest_decode = False

    def __init__(self, target, draft, plan: SpecPlan):
        self.target, self.draft, self.plan = target, draft, plan

    # ---- one step ---------------------------------------------------------------------------
    def step_time(self, batch: Batch) -> float:
        nd = batch.num_decode_seqs
        if nd and not batch.num_prefill_seqs and not batch.swap_in_blocks and not batch.swap_out_blocks:
            reads = batch.decode_read_tokens
            return float(self.prices(nd, np.array([nd + batch.num_spec_tokens]), np.array([reads]),
                                     np.array([reads - batch.num_spec_tokens]))[0])
        return self.target.step_time(batch) + self.draft_mixed(batch)

    def prices(self, n: int, rows: np.ndarray | int, reads: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Seconds of pure-decode steps of n sequences (verify + drafter), one per entry (`rows`: each
        step's, or an int for every step)."""
        out = self.target.decode_steps_time(n, rows, reads)
        if self.draft is None:
            return out
        draft, k = self.draft, self.plan.k
        out = out + draft.decode_steps_time(n, rows, reads, n, host=False)  # first pass over every row
        if k > 1:  # then one row a sequence, a key more each pass
            later = (base[None, :] + n * np.arange(1, k)[:, None]).ravel()
            out = out + draft.decode_steps_time(n, n, later, n, host=False).reshape(k - 1, len(base)).sum(axis=0)
        return out

    def draft_mixed(self, batch: Batch) -> float:
        """The drafter's GPU work in a step with prompt chunks: its first pass over all the step's rows
        (the target's aggregates), then k - 1 passes of one row a scheduled sequence."""
        if self.draft is None:
            return 0.0
        n, k = batch.num_prefill_seqs + batch.num_decode_seqs, self.plan.k
        first = self.draft.step_time(batch)
        if k == 1:
            return first
        base = batch.decode_context_tokens - batch.num_spec_tokens + batch.prefill_context_tokens + batch.num_prefill_tokens
        lo, hi = base + n, base + n * (k - 1)
        ab = self.draft.decode_steps_affine(n, n, lo, hi, n, host=False)
        if ab is not None:  # the passes' price is affine in their keys: its sum in closed form
            return first + ab[0] * (k - 1) + ab[1] * (lo + hi) * (k - 1) / 2
        return first + float(self.draft.decode_steps_time(n, n, base + n * np.arange(1, k), n, host=False).sum())

    # ---- runs of a speculative cohort's steps ---------------------------------------------------
    def affine(self, n: int, rows: int, lo: float, hi: float, drafts: int) -> tuple[float, float] | None:
        """(A, B): a step of n sequences, `rows` rows (each `drafts` drafts: rows = n (1 + drafts)), reading
        x keys in [lo, hi] costs A + B x (verify and drafter alike affine there), or None."""
        parts = [self.target.decode_steps_affine(n, rows, lo, hi)]
        draft, k = self.draft, self.plan.k
        if draft is not None:
            parts.append(draft.decode_steps_affine(n, rows, lo, hi, n, host=False))
            for i in range(1, k):  # later passes read base + n i, base = x - n * drafts
                shift = n * i - n * drafts
                ab = draft.decode_steps_affine(n, n, lo + shift, hi + shift, n, host=False)
                parts.append(None if ab is None else (ab[0] + ab[1] * shift, ab[1]))
        if any(p is None for p in parts):
            return None
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def _affine(self, shape: SpecRunShape):
        """(A, B) of the run's steps when one holds for all (every sequence verifying the same drafts at
        every step, and the price affine over the run's keys: the usual run), else ()."""
        if shape.affine is None:
            d = shape.uniform_drafts
            shape.affine = () if d < 0 else self.affine(
                shape.num_seqs, shape.num_seqs * (1 + d), float(shape.reads[0] - shape.shared),
                float(shape.reads[-1] - shape.shared), d) or ()
        return shape.affine

    def _cum(self, shape: SpecRunShape, steps: int, budget_s: float = math.inf) -> np.ndarray:
        """The run's cumulative prices, step by step, through `steps` steps or through the first that
        reaches budget_s, a chunk at a time (runs usually end at an arrival long before their last step)."""
        cum = shape.cum
        while len(cum) < steps and (not len(cum) or cum[-1] < budget_s):
            lo = len(cum)
            hi = min(len(shape), max(steps if budget_s == math.inf else 0, lo + _CHUNK, 2 * lo))
            n, drafts, d = shape.num_seqs, shape.drafts[lo:hi], shape.uniform_drafts
            reads = shape.reads[lo:hi] - shape.shared
            rows = n * (1 + d) if d >= 0 else n + drafts  # an int: the pricers skip checking every step's rows
            more = self.prices(n, rows, reads, reads - drafts).cumsum()
            cum = shape.cum = np.concatenate([cum, more + cum[-1]]) if lo else more
        return cum

    def decode_run_time(self, shape, k: int) -> float:
        if not isinstance(shape, SpecRunShape):
            return self.target.decode_run_time(shape, k)
        if k <= 0:
            return 0.0
        m = len(shape)
        if k > m:  # past the steps the shape knows (a search's overshoot): its last step's price again
            return self.decode_run_time(shape, m) + (k - m) * (self.decode_run_time(shape, m) -
                                                            self.decode_run_time(shape, m - 1))
        ab = shape.affine
        if ab is None:
            ab = self._affine(shape)
        if ab:
            return ab[0] * k + ab[1] * shape.keys(k)
        return float(self._cum(shape, k)[k - 1])

    def decode_run_within(self, shape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        if not isinstance(shape, SpecRunShape):
            return self.target.decode_run_within(shape, max_steps, budget_s)
        run_time = self.decode_run_time
        first = run_time(shape, 1)
        total = run_time(shape, max_steps)
        if total < budget_s:
            return DecodeRunPrice(max_steps, total, first)
        k = self.decode_steps_within(shape, budget_s)
        return DecodeRunPrice(k, run_time(shape, k), first)

    def decode_steps_within(self, shape, budget_s: float) -> int:
        """The smallest k >= 1 whose first k steps take budget_s or more (all of the shape's when none)."""
        if not isinstance(shape, SpecRunShape):
            return self.target.decode_steps_within(shape, budget_s)
        if not self._affine(shape):
            cum = self._cum(shape, len(shape), budget_s)
            return min(len(cum), int(cum.searchsorted(budget_s, side="left")) + 1)
        # run times rise with k: bisection over decode_run_time's closed form (inlined, the same arithmetic)
        a, b = shape.affine
        p, shared, lo, hi = shape.prefix_list(), shape.shared, 0, len(shape)
        if a * hi + b * float(p[hi] - p[0] - shared * hi) < budget_s:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a * mid + b * float(p[mid] - p[0] - shared * mid) >= budget_s:
                hi = mid
            else:
                lo = mid
        return hi

    def describe(self) -> dict | None:
        describe = getattr(self.target, "describe", None)
        out = describe() if describe is not None else None
        return None if out is None else {**out, "speculative": self.plan.describe()}


def spec_graph_sizes(sizes: tuple, query_len: int) -> tuple:
    """vLLM's adjust_cudagraph_sizes_for_spec_decode on a list of capture sizes: each rounded up to a
    multiple of query_len (1 + k), those past the largest dropped."""
    if query_len <= 1 or not sizes:
        return sizes
    top = max(sizes)
    out = sorted({-(-s // query_len) * query_len for s in sizes})
    return tuple(s for s in out if s <= top) or ((query_len,) if query_len <= top else ())
