"""Where a run's step prices come from, and whether its answers are measured or estimated.

`pricing_basis(scenario, model, gpu)` resolves, once per scenario, what prices a step and labels it:

- "measured": vLLM kernels timed on this GPU (AIConfigurator's tables, `measured_tables`), a roofline
  calibrated on this GPU (a shipped calibration of the preset, or a calibration file fitted on it), or
  a backend that runs the steps on the device (triton);
- "estimated": everything else, with the reason: a GPU preset with neither tables nor a calibration of
  its own (its datasheet priced with H100 efficiencies), a datasheet figure overridden, layers the
  tables do not time (MoE experts or MLA where the release's tables lack any fused-MoE or MLA module
  rows: the roofline prices them), a calibration fitted on another GPU; and measured tables that stand
  in: another release's (engine.vllm_version with no tables of its own: the newest shipped release not
  newer, kvsim.perf.kernels.nearest_release), or a part priced from rows of another format
  (`PricingBasis.parts`, kvsim.perf.kernel_plan: weight-only GEMMs, a fused MoE of another format).
  `parts` lists, measured or estimated, each part of the model priced otherwise than by plain rows of
  its shapes (quantised weights, windowed layers), so the label says which part rests on what.

Every output carries `PricingBasis.to_dict()` (summary.json's "pricing_basis", the report, `plan`,
`deploy`, the dashboard), so an answer never hides that it rests on a datasheet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from kvsim.errors import KvsimError

MEASURED, ESTIMATED = "measured", "estimated"
SPEED_FIELDS = ("hbm_bandwidth_gbps", "bf16_tflops", "fp8_tflops", "fp32_tflops", "nvlink_gbps")


@dataclass(frozen=True, slots=True)
class PricingBasis:
    """What prices the steps (`pricing`: "measured" kernel tables, "roofline", or the backend's
    name), the answer's label ("measured" or "estimated") and why, in one line."""

    pricing: str
    label: str
    why: str
    vllm_version: str | None = None  # the release whose kernels price the steps (measured tables)
    tables: str | None = None  # the kernel-table file's name
    parts: tuple = ()  # kvsim.perf.kernel_plan.Part of each part priced otherwise than by plain rows

    @property
    def estimated(self) -> bool:
        return self.label == ESTIMATED

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("parts")  # only where there are any (a plain model's answers are as they were)
        if self.parts:
            out["parts"] = [p.to_dict() for p in self.parts]
        return out

    def short(self) -> str:
        """'measured (why)' or 'estimated (why)': the label with its reason, for a table cell or a note."""
        return f"{self.label} ({self.why})"


def unmeasured_layers(model, max_model_len: int, tables=None) -> str:
    """What of the model the kernel `tables` do not time ('' when they time every layer: dense GQA layers
    whose attention sees the whole sequence, as a window no shorter than max_model_len does, and MoE
    experts or MLA attention where the tables hold their fused-MoE or MLA module rows); without
    tables (the roofline): MoE experts and MLA attention whatever they are."""
    if tables is None:
        parts = [name for name, has in (("MoE experts", model.moe), ("MLA attention", model.mla)) if has is not None]
    else:
        from kvsim.perf.kernel_moe import untimed_layers

        parts = untimed_layers(tables, model)
    windows = [w for kind, w in (("sliding_attention", model.sliding_window), ("chunked_attention",
                                                                                model.attention_chunk_size))
               if w and w < max_model_len and (kind in model.layer_types or not model.layer_types)]
    if windows and tables is None:  # the tables price windowed layers (kvsim.perf.kernel_plan.window_plans)
        parts.append("sliding-window or chunked attention")
    return " and ".join(parts)


def _uncovered(scenario, model, tables=None) -> str:
    from kvsim.scenario.defaults import max_model_len

    return unmeasured_layers(model, max_model_len(scenario, model), tables)


def _overridden(gpu) -> list[str]:
    from kvsim.scenario.catalog import GPUS

    preset = GPUS.get(gpu.name)
    return [] if preset is None else [f for f in SPEED_FIELDS if getattr(gpu, f) != getattr(preset, f)]


def _shipped_gpus() -> list[str]:
    from kvsim.perf.kernels import GPU_STEMS, shipped_versions

    return [g for g in GPU_STEMS if shipped_versions(g)]


def measured_tables(scenario, gpu, model=None) -> Path | None:
    """The kernel-table file the scenario's steps are priced with (backend.pricing; "auto": measured when
    tables ship for the GPU preset, the vLLM calibration is in use, no datasheet figure is overridden and
    the tables time every layer of `model`), or None for the roofline. A version, file or setting that
    cannot be honoured is one line."""
    from kvsim.perf.kernels import shipped_versions

    b, src = scenario.backend, scenario.source
    want, version, own = b.pricing, scenario.engine.vllm_version, b.kernel_tables
    if want == "roofline":
        if version is not None or own is not None:
            key = "engine.vllm_version" if version is not None else "backend.kernel_tables"
            raise KvsimError(f"{src}: {key}: needs measured pricing, but backend.pricing is roofline")
        return None
    overridden = _overridden(gpu)
    versions = shipped_versions(gpu.name)
    auto = want == "auto" and own is None
    if auto:
        why = (f"hardware.{overridden[0]} overrides the {gpu.name} datasheet" if overridden else
               f"backend.calibration = {b.calibration} prices with the roofline" if b.calibration not in (None, "vllm")
               else f"no measured kernel tables ship for {gpu.name}" if not versions else None)
        if why is not None:
            if version is not None:
                raise KvsimError(f"{src}: engine.vllm_version: needs measured kernel tables, but {why} "
                                 f"(tables ship for {', '.join(_shipped_gpus())})")
            return None
    elif overridden:
        raise KvsimError(f"{src}: hardware.{overridden[0]}: measured kernel tables cannot follow an overridden "
                         f"datasheet figure; use backend.pricing = \"roofline\"")
    path = _tables_path(scenario, gpu, versions)
    if model is None:
        return path
    from kvsim.perf.kernels import load_tables

    uncovered = _uncovered(scenario, model, load_tables(str(path)))
    if not uncovered:
        return path
    why = f"the kernel tables do not time {model.name}'s {uncovered}"
    if auto and version is None:
        return None
    if auto:
        raise KvsimError(f"{src}: engine.vllm_version: needs measured kernel tables, but {why} in vLLM {version}'s")
    raise KvsimError(f"{src}: backend.pricing: {why} yet; use backend.pricing = \"roofline\" (an estimate)")


def _tables_path(scenario, gpu, versions) -> Path:
    """The kernel-table file asked for: backend.kernel_tables, else the shipped release (engine.vllm_version,
    else the newest)."""
    from kvsim.perf.kernels import nearest_release, shipped_path, version_key

    src, version, own = scenario.source, scenario.engine.vllm_version, scenario.backend.kernel_tables
    if own is not None:
        if version is not None:
            raise KvsimError(f"{src}: engine.vllm_version: give it or backend.kernel_tables, not both "
                             f"(the file names its own release)")
        return scenario.resolve(own)
    if not versions:
        raise KvsimError(f"{src}: backend.pricing: no measured kernel tables ship for {gpu.name} "
                         f"(they ship for {', '.join(_shipped_gpus())}; or give backend.kernel_tables)")
    if version is None:
        version = max(versions, key=version_key)
    elif version not in versions:  # the nearest release shipped prices it, and the label says so
        version = nearest_release(versions, version)
    return shipped_path(gpu.name, version)


def _calibrated_on(scenario, gpu_name: str) -> tuple[str | None, str]:
    """(the GPU the roofline's calibration was fitted on, or None when unknown; where it came from)."""
    from kvsim.perf.calibration import ENGINES, SHIPPED_DIR, shipped_path
    from kvsim.scenario.files import read_json_object

    name = scenario.backend.calibration
    if name is None or name in ENGINES:
        path = shipped_path(gpu_name, name or "vllm")
        if not path.exists():
            return None, "built-in H100-class coefficients"
        return gpu_name, f"shipped calibration {path.relative_to(SHIPPED_DIR.parent).as_posix()}"
    path = scenario.resolve(name)
    gpu = read_json_object(path, "calibration").get("gpu")
    return (gpu if isinstance(gpu, str) else None), f"calibration file {path.name}"


def pricing_basis(scenario, model, gpu) -> PricingBasis:
    """How the scenario's steps are priced and whether that makes its answers measured or estimated."""
    from kvsim.perf.kernels import load_tables

    backend = scenario.backend.name
    if backend == "triton":
        return PricingBasis("triton", MEASURED, "every step timed on the GPU by the triton backend")
    if backend != "analytic":
        return PricingBasis(backend, ESTIMATED, f"priced by the {backend} backend, which kvsim cannot vouch for")
    path = measured_tables(scenario, gpu, model)
    if path is not None:
        return _measured_basis(scenario, model, gpu, path)
    overridden = _overridden(gpu)
    if overridden:
        return PricingBasis("roofline", ESTIMATED, f"hardware.{overridden[0]} overrides the {gpu.name} datasheet: "
                            "the roofline on the changed figure")
    fitted_on, source = _calibrated_on(scenario, gpu.name)
    if fitted_on is None and source.startswith("built-in"):
        return PricingBasis("roofline", ESTIMATED, f"no measured kernels or calibration for {gpu.name}: its "
                            "datasheet priced with H100 efficiencies")
    if fitted_on is not None and fitted_on != gpu.name:
        return PricingBasis("roofline", ESTIMATED, f"roofline calibrated on {fitted_on}, applied to {gpu.name}")
    uncovered = _uncovered(scenario, model)
    if uncovered:
        return PricingBasis("roofline", ESTIMATED, f"no measured kernels for {model.name}'s {uncovered}: "
                            f"the roofline ({source})")
    on = f"calibrated on {gpu.name}" if fitted_on else "calibrated on a GPU its file does not name"
    return PricingBasis("roofline", MEASURED, f"roofline {on} ({source})")


def _measured_basis(scenario, model, gpu, path) -> PricingBasis:
    """The label of a run priced by measured tables: measured unless the release stands in for another or a
    part of the model is priced from rows of another format (kvsim.perf.kernel_plan)."""
    from kvsim.perf.kernel_plan import Part, pricing_parts
    from kvsim.perf.kernels import load_tables, release_of, version_key

    tables = load_tables(str(path))
    version, asked = tables.vllm_version, scenario.engine.vllm_version
    kv = scenario.policies[0].kv_cache_dtype if scenario.policies else "auto"
    parts = pricing_parts(tables, model, gpu.name, kv)
    if asked is not None and scenario.backend.kernel_tables is None and release_of(asked) != version:
        rule = "the newest shipped release not newer" if version_key(release_of(asked)) > version_key(version) \
            else "the oldest shipped, every table being newer"
        parts.insert(0, Part("kernels", ESTIMATED, f"no kernel tables of vLLM {asked} on {gpu.name}: vLLM "
                                                   f"{version}'s, {rule}"))
    from kvsim.perf.server import terms_source

    why = f"vLLM {version} kernels timed on {gpu.name} (NVIDIA AIConfigurator) plus {terms_source(scenario, gpu.name)}"
    if parts:  # each part with its own label: which of the answer rests on what
        why += "; " + "; ".join(f"{p.part}: {p.label} ({p.why})" for p in parts)
    label = ESTIMATED if any(p.label == ESTIMATED for p in parts) else MEASURED
    return PricingBasis("measured", label, why, version, path.name, tuple(parts))

