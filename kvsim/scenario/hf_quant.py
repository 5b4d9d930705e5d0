"""A checkpoint's weight format from its config.json `quantization_config`, read as vLLM's quantisation
methods read it, or one line naming the key at fault.

The section sits at the top level or, in multimodal checkpoints, inside `text_config` (Kimi-K2.5). What
kvsim reads of it is the format of the linear layers (`kvsim.scenario.models.QUANT_FORMATS`) and which
roles it covers (attention, dense MLPs, shared experts, routed experts): a role is left unquantised when
the method's ignore list (`ignore`, `exclude_modules`, `modules_to_not_convert`, `ignored_layers`)
names its modules in most of its layers. Names are tried as transformers' modules are named across
families (`self_attn.o_proj`, `mlp.experts.0.down_proj`, `block_sparse_moe.experts.0.w2`,
`feed_forward.experts`, with a `language_model.` prefix too); patterns as vLLM matches them:
`re:` a regular expression from the name's start (compressed-tensors), else a glob (ModelOpt) or a
module name or suffix.

| quant_method | format |
| --- | --- |
| `fp8` (vLLM, transformers' FineGrainedFP8) | `fp8` with `weight_block_size`, else `fp8_tensor` |
| `fbgemm_fp8` | `fp8_tensor` |
| `mxfp4` (gpt-oss) | `mxfp4`, routed experts only (vLLM's Mxfp4Config quantises FusedMoE layers) |
| `modelopt` (`quant_algo`), `modelopt_fp4` | FP8 / FP8_PER_CHANNEL_PER_TOKEN: `fp8_tensor`; NVFP4: `nvfp4` |
| `compressed-tensors` (`config_groups`) | 4-bit int weights, no activation quantisation: `int4` (w4a16, its `group_size`); 4-bit float, groups of 16: `nvfp4`, of 32: `mxfp4`; 8-bit float: `fp8` by block, else `fp8_tensor` |
| `gptq`, `awq` (4 bits) | `int4` with the checkpoint's group size |

Other methods and formats (int8 weights, bitsandbytes, GGUF, mixed precision) are refused naming the
key. Zero points of asymmetric int4 (a few hundredths of a percent of the bytes) are not counted. The
KV cache's dtype is the scenario's policy (vLLM's --kv-cache-dtype), whatever `kv_cache_scheme` says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from kvsim.errors import KvsimError
from kvsim.scenario.models import DEFAULT_QUANTIZED, QUANT_ROLES

_MODULES = {  # a role's modules as the families name them ({i}: the layer)
    "attn": ("self_attn.o_proj", "self_attn.q_proj", "self_attn.qkv_proj", "self_attn.kv_b_proj",
             "self_attn.q_b_proj"),
    "mlp": ("mlp.down_proj", "mlp.gate_proj", "feed_forward.down_proj"),
    "shared": ("mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj", "feed_forward.shared_expert.down_proj"),
    "experts": ("mlp.experts.0.down_proj", "mlp.experts.down_proj", "block_sparse_moe.experts.0.w2",
                "feed_forward.experts.down_proj", "feed_forward.experts.0.down_proj"),
}
_PREFIXES = ("model.layers.{i}.", "language_model.model.layers.{i}.", "model.language_model.layers.{i}.")
_IGNORE_KEYS = ("ignore", "exclude_modules", "modules_to_not_convert", "ignored_layers")
_MODELOPT = {"FP8": "fp8_tensor", "FP8_PER_CHANNEL_PER_TOKEN": "fp8_tensor", "NVFP4": "nvfp4"}
_READ = ("fp8, fbgemm_fp8, mxfp4, modelopt (FP8, NVFP4), compressed-tensors (fp8, int4 w4a16, nvfp4, mxfp4), "
         "gptq and awq (4-bit)")


@dataclass(frozen=True, slots=True)
class CheckpointQuant:
    """A checkpoint's weight format, the QUANT_ROLES it covers and (int4) the values per scale."""

    format: str
    roles: tuple[str, ...]
    group_size: int = 0


def quant_section(top: dict, text: dict, src: str) -> tuple[dict | None, str]:
    """The quantization_config (top level first, then text_config's; compressed-tensors' older
    `compression_config`) and its key for messages."""
    for cfg, prefix in ((top, ""), (text, "text_config.")):
        for name in ("quantization_config", "compression_config"):
            q = cfg.get(name) if isinstance(cfg, dict) else None
            if q is not None:
                if not isinstance(q, dict):
                    raise KvsimError(f"{src}: {prefix}{name}: must be a table")
                return q, prefix + name
    return None, ""


def with_modelopt_file(cfg: dict, folder) -> dict:
    """config.json's dict with ModelOpt's `hf_quant_config.json` beside it as its quantization_config, as vLLM
    reads checkpoints of ModelOpt 0.29 and before (which kept the section in that file); `cfg` when it has one."""
    from pathlib import Path

    from kvsim.scenario.files import read_json_object

    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    path = Path(folder) / "hf_quant_config.json"
    given = any(d.get(k) is not None for d in (cfg, text) for k in ("quantization_config", "compression_config"))
    if given or not path.is_file():
        return cfg
    section = read_json_object(path, "hf_quant_config.json")
    return {**cfg, "quantization_config": {"quant_method": "modelopt", **section}}


def checkpoint_quant(top: dict, text: dict, src: str, role_layers: dict) -> CheckpointQuant | None:
    """The checkpoint's format and roles (None: unquantised). `role_layers`: each role's layer indices."""
    q, key = quant_section(top, text, src)
    if q is None:
        return None
    method = q.get("quant_method")
    if method is None and isinstance(q.get("producer"), dict) and q["producer"].get("name") == "modelopt":
        method = "modelopt"
    fmt, group = _format(q, f"{src}: {key}", method)
    if method == "mxfp4":
        roles = ("experts",)
    else:
        patterns = _ignore_patterns(q, f"{src}: {key}")
        roles = tuple(r for r in QUANT_ROLES if not _mostly_ignored(r, role_layers.get(r, ()), patterns))
    if not roles:
        return None
    default = DEFAULT_QUANTIZED.get(fmt, QUANT_ROLES)  # kept as () when the format's own: a preset's spelling
    return CheckpointQuant(fmt, () if roles == default else roles, group)


def _format(q: dict, where: str, method) -> tuple[str, int]:
    if method in ("fp8", "fbgemm_fp8"):
        return ("fp8" if q.get("weight_block_size") else "fp8_tensor"), 0
    if method == "mxfp4":
        return "mxfp4", 0
    if method in ("modelopt", "modelopt_fp4"):
        algo = q.get("quant_algo")
        if algo is None and isinstance(q.get("quantization"), dict):
            algo = q["quantization"].get("quant_algo")
        algo = "NVFP4" if algo is None and method == "modelopt_fp4" else algo
        if algo not in _MODELOPT:
            raise KvsimError(f"{where}.quant_algo: {str(algo)[:40]!r} is not read (kvsim reads "
                             f"{', '.join(_MODELOPT)})")
        return _MODELOPT[algo], 0
    if method == "compressed-tensors":
        return _compressed_tensors(q, where)
    if method in ("gptq", "awq"):
        bits = q.get("bits", q.get("w_bit"))
        if bits != 4:
            raise KvsimError(f"{where}.bits: {method} checkpoints of {str(bits)[:10]} bits are not priced "
                             f"(kvsim reads 4-bit ones)")
        return "int4", _group(q.get("group_size", q.get("q_group_size")), where)
    raise KvsimError(f"{where}.quant_method: {str(method)[:40]!r} checkpoints are not supported (kvsim reads "
                     f"{_READ}; or give the unquantised config)")


def _compressed_tensors(q: dict, where: str) -> tuple[str, int]:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise KvsimError(f"{where}.config_groups: must be a table of quantisation groups")
    found = set()
    for name, g in groups.items():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise KvsimError(f"{where}.config_groups.{str(name)[:30]}.weights: must be a table")
        found.add(_scheme(w, g.get("input_activations"), f"{where}.config_groups.{str(name)[:30]}.weights"))
    if len(found) > 1:
        raise KvsimError(f"{where}.config_groups: mixed weight formats ({', '.join(sorted(f for f, _ in found))}) "
                         f"are not priced")
    return found.pop()


def _scheme(w: dict, acts, where: str) -> tuple[str, int]:
    bits, kind, size = w.get("num_bits"), w.get("type"), w.get("group_size")
    if bits == 4 and kind == "int" and not acts:
        return "int4", _group(size, where)
    if bits == 4 and kind == "float" and size in (16, 32):
        return ("nvfp4" if size == 16 else "mxfp4"), 0
    if bits == 8 and kind == "float":
        return ("fp8" if w.get("strategy") == "block" else "fp8_tensor"), 0
    raise KvsimError(f"{where}: {str(bits)[:6]}-bit {str(kind)[:10]} weights"
                     f"{' with quantised activations' if acts and bits == 4 else ''} are not priced (kvsim reads "
                     f"4-bit int weight-only, 4-bit float in groups of 16 or 32, and 8-bit float)")


def _group(size, where: str) -> int:
    if size in (None, -1):  # per output channel: one scale a row, a negligible share of the bytes
        return 1 << 20
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise KvsimError(f"{where}.group_size: must be a positive integer or -1, got {str(size)[:20]}")
    return size


def _ignore_patterns(q: dict, where: str) -> list[str]:
    out = []
    for key in _IGNORE_KEYS:
        value = q.get(key)
        if value is None and key == "exclude_modules" and isinstance(q.get("quantization"), dict):
            value = q["quantization"].get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise KvsimError(f"{where}.{key}: must be a list of module names or patterns")
        out += value
    return out


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    return fnmatchcase(name, pattern) or name == pattern or name.endswith("." + pattern) \
        or name.startswith(pattern + ".")


def _mostly_ignored(role: str, layers, patterns: list[str]) -> bool:
    """Whether the ignore list names the role's modules in more than half of its layers."""
    if not patterns or not layers:
        return False
    hits = sum(any(_matches(prefix.format(i=i) + module, p) for prefix in _PREFIXES
                   for module in _MODULES[role] for p in patterns) for i in layers)
    return hits * 2 > len(layers)
