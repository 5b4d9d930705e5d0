"""What vLLM's server adds around the measured kernels: CUDA-graph capture sizes and the server terms.

`ServerTerms` are the costs a kernel table cannot hold: GPU work outside the timed kernels (a step's
fixed cost, elementwise kernels, the sampler), the engine's host (CPU) work a step (scheduling, input
preparation, output processing: a fixed part and a part per sequence, which async scheduling overlaps
with the GPU's work, so a step takes the longer of the two), the API server on TTFT and E2E, and whether
the release schedules asynchronously by default. One JSON file per GPU (`kernel_data/<gpu>-server.json`,
written by benchmarks/ship_kernel_tables.py) holds their values, each with its public source under
"provenance"; a scenario's `backend.server_terms` names a file of its own (`kvsim calibrate --server-terms`
fits one to your serving runs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.perf.kernels import DATA_DIR, GPU_STEMS

_CAPTURE_LIMIT = 512  # vLLM's default ceiling on max_cudagraph_capture_size


def vllm_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int = 1) -> tuple[int, ...]:
    """vLLM's default cudagraph_capture_sizes (vllm/config/vllm.py `_set_cudagraph_sizes`, the rule
    `CompilationConfig.max_cudagraph_capture_size` documents since v0.11): [1, 2, 4] + 8..248 by 8 +
    256.. by 16 up to min(2 x max_num_seqs x decode_query_len, 512), none above max_num_batched_tokens.
    With speculative decoding (decode_query_len = 1 + num_speculative_tokens) each size is rounded up to a
    multiple of decode_query_len, those past the top dropped (`adjust_cudagraph_sizes_for_spec_decode`)."""
    q = decode_query_len
    top = min(2 * max_num_seqs * q, _CAPTURE_LIMIT, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, _CAPTURE_LIMIT + 1, 16)]
    if q > 1:
        sizes = sorted({-(-s // q) * q for s in sizes})
        return tuple(s for s in sizes if s <= top) or ((q,) if q <= top else ())
    return tuple(s for s in sizes if s <= top) or (1,)


@dataclass(slots=True, frozen=True)
class ServerTerms:
    """What a step costs beyond its kernels, and how the server around the engine adds to latency."""

    graph_step_overhead_s: float = 1.2e-4  # GPU: a CUDA-graph (pure decode) step beyond its kernels
    step_overhead_s: float = 1.2e-4  # GPU: a piecewise-graph or eager (prefill, mixed) step beyond its kernels
    piecewise_layer_s: float = 0.0  # the same step, per layer: the eager attention between its graph pieces
    host_step_s: float = 1.0e-3  # CPU: the engine's work a step (schedule, prepare inputs, launch, outputs)
    host_per_seq_s: float = 3.3e-6  # CPU: the same work per scheduled sequence
    host_tp_step_s: float = 0.0  # CPU: more a step under tensor parallelism (inputs to the workers, outputs back)
    elementwise_kernels_per_layer: float = 5.0  # add+RMSNorm x2, RoPE, KV store, SiLU-and-mul (+1: q/k norm)
    elementwise_kernel_s: float = 3e-6  # AIConfigurator's mem_empirical_constant_latency
    elementwise_bandwidth: float = 0.8  # AIConfigurator's mem_bw_empirical_scaling_factor
    sampler_bytes_per_vocab: float = 12.0  # a sampled row: 16-bit logits written, read, fp32 copy written and read
    api_server_s: float = 0.0  # per request, on TTFT and E2E: HTTP, tokenize, detokenize, stream (reported)
    async_scheduling: bool = True  # the scheduler runs a step ahead of the GPU (reported)

    def to_dict(self) -> dict:
        return asdict(self)


SERVER_TERMS = tuple(f.name for f in fields(ServerTerms))


def _checked_terms(path, where: str, terms) -> dict:
    if not isinstance(terms, dict):
        raise KvsimError(f"{path}: {where}: expected a JSON object of server terms")
    values = {}
    for key, value in terms.items():
        if key not in SERVER_TERMS:
            raise KvsimError(f"{path}: {where}.{key}: unknown server term (known: {', '.join(SERVER_TERMS)})")
        if key == "async_scheduling":
            if not isinstance(value, bool):
                raise KvsimError(f"{path}: {where}.{key}: must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
            raise KvsimError(f"{path}: {where}.{key}: must be a non-negative number, got {str(value)[:40]}")
        values[key] = value
    return values


def load_server_terms(path: Path, version: str | None = None) -> tuple[ServerTerms, dict]:
    """(terms, provenance) from a JSON file {"terms": {...}, "provenance": {...}} and, optionally,
    {"releases": {"0.19.0": {"terms": ..., "provenance": ...}}}: the terms fitted with a release's kernel
    tables, laid over the file's own for `version` (the nearest release fitted when it has none of its
    own). One line per problem."""
    from kvsim.perf.kernels import version_key
    from kvsim.scenario.files import read_json_object

    data = read_json_object(path, "server terms")
    prov = data.get("provenance", {})
    if not isinstance(prov, dict):
        raise KvsimError(f"{path}: provenance: expected a JSON object")
    values = _checked_terms(path, "terms", data.get("terms"))
    releases = data.get("releases") or {}
    if not isinstance(releases, dict):
        raise KvsimError(f"{path}: releases: expected a JSON object of vLLM releases")
    fitted = {v: (_checked_terms(path, f"releases.{v}.terms", (r or {}).get("terms") if isinstance(r, dict) else None),
                  (r or {}).get("provenance") or {}) for v, r in releases.items()}
    if version is not None and fitted:
        want = version_key(version)
        near = min(fitted, key=lambda v: (_distance(version_key(v), want), version_key(v)))
        own, own_prov = fitted[near]
        values.update(own)
        note = "" if near == version else f" (vLLM {near}'s fit, the nearest to {version})"
        prov = {**prov, **{k: f"{v}{note}" for k, v in own_prov.items() if k in own}}
    return ServerTerms(**values), prov


def _distance(a: tuple, b: tuple) -> tuple:
    return tuple(abs(x - y) for x, y in zip(a, b))


def server_terms(scenario, gpu_name: str, version: str | None = None) -> tuple[ServerTerms, dict]:
    """(terms, provenance) a scenario's measured pricing uses with `version`'s kernel tables: its
    backend.server_terms file, else the GPU's shipped ones."""
    own = scenario.backend.server_terms
    if own is not None:
        return load_server_terms(scenario.resolve(own), version)
    return shipped_terms(gpu_name, version)


def shipped_terms(gpu_name: str, version: str | None = None) -> tuple[ServerTerms, dict]:
    stem = GPU_STEMS.get(gpu_name)
    path = DATA_DIR / f"{stem}-server.json"
    if stem is None or not path.is_file():
        return ServerTerms(), {k: "built-in default (no server terms shipped for this GPU)" for k in SERVER_TERMS}
    return load_server_terms(path, version)


def terms_source(scenario, gpu_name: str) -> str:
    """Where a measured run's server terms come from, in a phrase for its pricing basis."""
    from kvsim.scenario.files import read_json_object

    own = scenario.backend.server_terms
    if own is not None:
        return f"server terms from {scenario.resolve(own).name}"
    stem = GPU_STEMS.get(gpu_name)
    path = DATA_DIR / f"{stem}-server.json"
    if stem is None or not path.is_file():
        return "built-in server terms"
    fitted_on = read_json_object(path, "server terms").get("fitted_on")
    if not isinstance(fitted_on, str):
        return "sourced server terms"
    if fitted_on == gpu_name:
        return f"server terms fitted to real vLLM serving runs on {gpu_name}"
    return f"server terms fitted on {fitted_on} serving runs (estimated for {gpu_name})"
