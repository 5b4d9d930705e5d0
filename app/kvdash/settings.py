"""The settings: the question in the main area (model, GPU, TP x replicas, arrival rate, SLO, with
units), everything else in the "Advanced" sidebar (the starting scenario or upload, policies, engine
limits, workload, the other SLO bounds); each widget is one scenario key, turned into a `--set`
override on the scenario's data and validated by the same strict schema as a file on disk.

This module is the one place that says which widget sets which key (the tuples below; the widgets
themselves come from the schema, kvdash.fields). Home.py draws them on every page, above the page,
so every page sees the same scenario: a page calls `current()`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st
import tomli_w

from kvdash import errors, fields
from kvdash.source import Base, Waiting, choose_base, toml_value
from kvsim.errors import KvsimError
from kvsim.scenario.catalog import GPUS, MODELS
from kvsim.scenario.config import (ArrivalConfig, PrefixConfig, Scenario, SloConfig, scenario_from_dict,
                                   scenario_from_toml)
from kvsim.scenario.load_curve import curve_text
from kvsim.scenario.layout import hardware_text
from kvsim.scenario.overrides import apply_overrides

# ---- which widgets the page shows: each is a scenario key, as `--set` and the TOML file name it
MAIN_SLO = ("percentile", "ttft_ms", "tpot_ms")  # in the main area, with the model, GPU, TP x replicas and rate
HARDWARE = ("model.dtype", "hardware.router", "hardware.gpu_memory_utilization", "hardware.data_parallel_size",
            "hardware.enable_expert_parallel", "model.expert_skew")
ENGINE = ("engine.max_num_seqs", "engine.max_num_batched_tokens", "engine.max_model_len", "engine.block_size",
          "engine.enable_prefix_caching", "engine.preemption_mode")
POLICY = ("allocator", "kv_cache_dtype", "enable_chunked_prefill", "max_num_batched_tokens", "enable_prefix_caching")
WORKLOAD = ("workload.num_requests", "workload.duration_s", "workload.seed")
OFFLOAD = ("kv_offload.backend", "kv_offload.kv_offloading_size", "kv_offload.eviction_policy",
           "kv_offload.store_threshold", "kv_offload.latency_us", "kv_offload.optimal_bound",
           "kv_offload.optimal_ttft")  # shown when the scenario has a [kv_offload] section
ARRIVAL = {"gamma": ("cv",)}  # by arrival.process, beside the rate (or a trace's time_scale) in the main area
RATE_KEY = {"trace": "arrival.time_scale", "immediate": "max_concurrency"}  # the main area's load widget under
# workload., by arrival process (default: arrival.rate); a closed loop's load is its clients
TP_DEGREES = (1, 2, 4, 8)
PROCESSES = ArrivalConfig.model_fields["process"].annotation.__args__
LENGTHS = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma", "min", "max"),
           "trace": ()}  # by prompt_len.dist / output_len.dist
PREFIX = fields.scalar_fields(PrefixConfig)
SLO = tuple(k for k in fields.scalar_fields(SloConfig) if k not in MAIN_SLO)  # the other bounds the schema has
STEPS = {"hardware.gpu_memory_utilization": 0.01, "workload.arrival.rate": 0.5, "workload.arrival.cv": 0.25,
         "workload.arrival.time_scale": 0.1, "workload.duration_s": 60.0, "workload.prefix.fraction": 0.05,
         "slo": 10.0, "kv_offload.kv_offloading_size": 8.0}  # number-input steps, by key or section


@dataclass(slots=True)
class Current:
    """The scenario every page shows: validated, with the overrides that made it from its start."""

    scenario: Scenario
    base: Base
    overrides: list[str]
    unset: list[str]
    policies: list[str]  # the compared ones, in the scenario's order
    data: dict = field(repr=False)

    def toml(self, extra: tuple[str, ...] = ()) -> str:
        """The settings as a scenario file (absolute paths), with `extra` overrides applied."""
        return tomli_w.dumps(apply_overrides(self.data, extra))

    def validated(self, extra: tuple[str, ...] = ()) -> tuple[str, Scenario]:
        """(TOML text, Scenario) of the settings with `extra` overrides, validated as a file would be."""
        text = self.toml(extra)
        return text, scenario_from_toml(text, self.base.source, self.base.base_dir)

    def arguments(self, policies: bool = True) -> str | None:
        """The settings as command-line arguments: the shipped scenario file and the changes as `--set`
        (with `policies`, `--policy` for each one compared when some are left out); None when they came from
        an upload or leave a key unset (then: the file `download_toml` gives)."""
        b = self.base
        if not b.source.startswith("scenarios/") or b.overrides or self.unset:
            return None
        out = b.source + "".join(f" --set {shlex.quote(o)}" for o in self.overrides)
        if policies and len(self.policies) < len(b.scenario.policies):
            out += "".join(f" --policy {p}" for p in self.policies)
        return out

    def download_toml(self) -> str:
        """The settings as a file for `python -m kvsim`: uploaded files named as uploaded (keep them beside
        it), other paths absolute on this machine."""
        up = str(self.base.upload_dir) + "/"
        text = self.toml().replace(f'"{up}', '"')
        lines = [f"# kvsim scenario saved by the dashboard from {self.base.source}"]
        changes = [*self.base.overrides, *self.overrides]
        if changes:
            lines.append("# with: " + " ".join(f"--set '{o}'" for o in changes).replace(up, ""))
        if self.unset:
            lines.append("# keys left unset: " + ", ".join(self.unset))
        if len(self.policies) < len(self.base.scenario.policies):
            lines.append("# policies kept: " + ", ".join(self.policies))
        lines.append("# run: python -m kvsim THIS_FILE.toml")
        return "\n".join(lines) + "\n" + text


class _Form:
    """Draws widgets for scenario keys and collects what they change as overrides (or unset keys)."""

    def __init__(self, base: Base):
        self.base, self.overrides, self.unset = base, [], []

    def value(self, key: str):
        """The starting scenario's value of `key` (the field's default where its section is absent)."""
        node = self.base.scenario
        parts = key.split(".")
        for i, part in enumerate(parts):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
            if node is None and i < len(parts) - 1:
                return fields.field(key).default
        return node

    def widget(self, container, key: str, *, force: bool = False, **kwargs):
        old = self.value(key)
        step = STEPS.get(key) or STEPS.get(key.split(".")[0])
        new = fields.widget(container, key, old, widget_key=f"{self.base.digest}:{key}", step=step, **kwargs)
        if force or new != old:
            if new is None:
                self.unset.append(key)
            else:
                self.overrides.append(f"{key}={toml_value(new)}")
        return new


def _unset(data: dict, key: str) -> None:
    *tables, name = key.split(".")
    node = data
    for t in tables:
        node = node[int(t)] if t.isdigit() else node.get(t, {})
    if isinstance(node, dict):
        node.pop(name, None)


MAIN_LABELS = {"hardware.gpu": "GPU", "hardware.tensor_parallel_size": "TP (GPUs per replica)",
               "hardware.num_replicas": "replicas", "workload.arrival.rate": "arrival rate (req/s)",
               "workload.max_concurrency": "clients (closed loop)",
               "workload.arrival.time_scale": "trace time scale (× gaps)", "slo.percentile": "SLO percentile",
               "slo.ttft_ms": "TTFT ≤ (ms)", "slo.tpot_ms": "TPOT ≤ (ms)"}


def _model(form: _Form, box) -> None:
    cfg = form.base.scenario.model
    hf = Path(cfg.hf_config or ".")
    here = cfg.name if cfg.name is not None else f"hf_config: {hf.parent.name}/{hf.name}"
    options = list(MODELS) + ([here] if here not in MODELS else [])
    model = box.selectbox("model", options, index=options.index(here), key=f"{form.base.digest}:model.name",
                          help=fields.help_text("model.name"))
    if model != here:
        form.overrides.append(f"model={toml_value({'name': model, 'dtype': cfg.dtype})}")
    traits = model_traits(MODELS.get(model))
    if traits:
        box.caption(traits)


def model_traits(spec) -> str:
    """What sets a preset apart as a KV-cache and step-time problem (the picker's caption): routed
    experts, latent attention, sliding windows; '' for a dense model of full attention."""
    if spec is None:
        return ""
    out = []
    if spec.moe:
        out.append(f"mixture of experts: {spec.moe.num_experts_per_tok} of {spec.moe.n_routed_experts} experts a token")
    if spec.mla:
        out.append(f"latent attention (MLA): {spec.mla.latent_dim} cached elements a token and layer")
    sliding = spec.num_sliding_layers
    if sliding:
        out.append(f"sliding window of {spec.sliding_window:,} tokens on {sliding} of {spec.num_hidden_layers} layers")
    return " · ".join(out)


def _main(form: _Form, box, process: str) -> None:
    """The question: model, GPU, TP × replicas, arrival rate (a trace's time scale) and the SLO, with units."""
    cols = box.columns([2.2, 1.5, 1.1, 0.8, 1.2, 1.0, 1.0, 1.0], vertical_alignment="bottom")
    _model(form, cols[0])
    rate = f"workload.{RATE_KEY.get(process, 'arrival.rate')}"
    curve = form.base.scenario.workload.arrival.curve is not None  # the rate follows [workload.arrival.curve]
    keys = ("hardware.gpu", "hardware.tensor_parallel_size", "hardware.num_replicas", *(() if curve else (rate,)),
            *(f"slo.{k}" for k in MAIN_SLO))
    for col, key in zip(cols[1:], keys):
        options = list(GPUS) if key == "hardware.gpu" else list(TP_DEGREES) if key.endswith("parallel_size") else None
        form.widget(col, key, label=MAIN_LABELS[key], options=options)


def _hardware(form: _Form, box) -> None:
    for key in HARDWARE:
        form.widget(box, key)


def _policies(form: _Form, box) -> list[str]:
    names = [p.name for p in form.base.scenario.policies]
    chosen = box.multiselect("policies to compare", names, default=names, key=f"{form.base.digest}:policies",
                             help="The scenario's [[policies]]: each one is simulated on the same requests.")
    for i, name in enumerate(names):
        if name in chosen:
            sub = box.container(border=True)
            sub.markdown(f"**{name}**")
            for key in POLICY:
                form.widget(sub, f"policies.{i}.{key}")
    return chosen


def _lengths(form: _Form, box, which: str) -> None:
    dist = form.widget(box, f"workload.{which}.dist", label=f"{which} distribution")
    cols = box.columns(2)
    for j, key in enumerate(LENGTHS.get(dist, ())):
        form.widget(cols[j % 2], f"workload.{which}.{key}", label=f"{which} {key}")


def _workload(form: _Form, box) -> str:
    """The workload's widgets but its rate (in the main area); returns the arrival process."""
    for key in WORKLOAD:
        form.widget(box, key)
    closed = form.base.scenario.workload.arrival.process == "immediate"  # a closed loop stays one: open ones need a rate
    process = form.widget(box, "workload.arrival.process", label="arrival process",
                          options=["immediate"] if closed else [p for p in PROCESSES if p != "immediate"])
    for key in ARRIVAL.get(process, ()):
        form.widget(box, f"workload.arrival.{key}")
    _lengths(form, box, "prompt_len")
    _lengths(form, box, "output_len")
    had = form.base.scenario.workload.prefix is not None
    on = box.checkbox("shared prefixes", value=had, key=f"{form.base.digest}:workload.prefix",
                      help="Groups of requests that share a system prompt ([workload.prefix]), so the "
                           "prefix cache has something to find.")
    if on:
        for key in PREFIX:
            form.widget(box, f"workload.prefix.{key}", force=not had)
    elif had:
        form.unset.append("workload.prefix")
    return process


def draw() -> None:
    """Draw the settings (the main area's question, the Advanced sidebar) and keep the scenario they
    make (or the error, or what the page waits for) for the page."""
    st.session_state["kvsim.current"] = st.session_state["kvsim.error"] = st.session_state["kvsim.waiting"] = None
    with errors.caught() as error:
        bar = st.sidebar
        bar.header("Advanced", help="Everything beside the question above: the scenario to start from (or "
                                    "your own files), the policies compared, engine limits, the workload.")
        try:
            base = choose_base(bar)
        except Waiting as wait:
            st.session_state["kvsim.waiting"] = str(wait)
            return
        form = _Form(base)
        _hardware(form, bar.expander("Model and hardware"))
        chosen = _policies(form, bar.expander("Policies"))
        _engine = bar.expander("Engine limits")
        for key in ENGINE:
            form.widget(_engine, key)
        if base.scenario.kv_offload is not None:
            offload = bar.expander("KV offload tiers")
            for key in OFFLOAD:
                form.widget(offload, key)
        process = _workload(form, bar.expander("Workload"))
        slo = bar.expander("SLO: other bounds")
        for key in SLO:
            form.widget(slo, f"slo.{key}")
        from kvdash import extras  # speculative decoding and energy: a section each, off unless the scenario has it

        extras.draw(form, bar)
        _main(form, st.container(), process)
        st.session_state["kvsim.current"] = build(base, form.overrides, form.unset, chosen)
    st.session_state["kvsim.error"] = error.message


def build(base: Base, overrides: list[str], unset: list[str], chosen: list[str]) -> Current:
    """Apply the overrides, drop unset keys and unchosen policies, and validate the result."""
    if not chosen:
        raise KvsimError("policies: choose at least one policy to compare")
    data = apply_overrides(base.data, overrides)
    for key in unset:
        _unset(data, key)
    data["policies"] = [p for p in data["policies"] if p.get("name") in chosen]
    if any(o.startswith(("model", "hardware.")) for o in overrides):  # the file's own description is stale
        data["description"] = layout_text(scenario_from_dict(data, base.source, base.base_dir)) + \
            f" (from {Path(base.source).name}, changed in the dashboard)"
    current = Current(base.scenario, base, list(overrides), list(unset), list(chosen), data)
    text = current.toml()
    current.scenario = scenario_from_toml(text, base.source, base.base_dir)
    return current


def layout_text(scenario: Scenario) -> str:
    """e.g. 'Llama-3.1-8B on 4 × H100-SXM as TP 2 × 2 replicas', 'Qwen3-30B-A3B on 2 × H100-SXM as TP 1 × DP 2 +
    EP × 1 replica': every GPU, and the layout as `kvsim plan` names it (kvsim.scenario.layout.hardware_text)."""
    model = scenario.model.name or Path(scenario.model.hf_config or "model").parent.name
    return f"{model} on {hardware_text(scenario.hardware)}"


def workload_text(scenario: Scenario) -> str:
    """The workload in a line: arrivals, lengths, how many requests."""
    wl = scenario.workload
    arrival = wl.arrival
    if arrival.process == "trace":
        head = f"{wl.trace.format} trace replay" + (f" at {arrival.time_scale:g}× its gaps" if arrival.time_scale != 1 else "")
    elif arrival.process == "immediate":
        head = (f"a closed loop of {wl.max_concurrency:,} clients" if wl.max_concurrency
                else f"{wl.num_requests:,} requests at once")
    elif arrival.curve is not None:
        head = f"{arrival.process} arrivals {curve_text(arrival.curve.model_dump())}"
    else:
        head = f"{arrival.process} arrivals at {arrival.rate:g} {'sessions' if wl.sessions else 'req'}/s" + (
            f" (cv {arrival.cv:g})" if arrival.process == "gamma" else "")
        if wl.max_concurrency:
            head += f", at most {wl.max_concurrency:,} in flight"
    if wl.sessions is not None:
        head += f", in multi-turn sessions ({_turns_text(wl.sessions.turns)} turns)"
    if wl.think_time_s is not None:
        head += f", think time ~{_think_mean(wl.think_time_s):g} s"

    def length(d, what):
        return {"fixed": lambda: f"{what} {d.value:,}", "uniform": lambda: f"{what} {d.min:,}–{d.max:,}",
                "lognormal": lambda: f"{what} ~{d.mean:,.0f} (lognormal)", "trace": lambda: f"{what} from the trace"}[d.dist]()
    parts = [head, length(wl.prompt_len, "prompts"), length(wl.output_len, "outputs")]
    if wl.prefix is not None:
        parts.append(f"{wl.prefix.num_groups} shared {wl.prefix.prefix_len:,}-token prefixes")
    if wl.num_requests:
        parts.append(f"{wl.num_requests:,} requests")
    return ", ".join(parts)


def _turns_text(d) -> str:
    return {"fixed": lambda: f"{d.value:,}", "uniform": lambda: f"{d.min:,}–{d.max:,}",
            "lognormal": lambda: f"~{d.mean:,.0f}", "trace": lambda: "the dataset's"}[d.dist]()


def _think_mean(d) -> float:
    return {"fixed": d.value, "uniform": (d.min or 0) + ((d.max or 0) - (d.min or 0)) / 2}.get(d.dist, d.mean)


def current() -> Current:
    """The sidebar's scenario; when it is not valid, its one-line error is on the page and the page stops
    (before an upload: a prompt for it)."""
    cur = st.session_state.get("kvsim.current")
    if cur is None:
        waiting = st.session_state.get("kvsim.waiting")
        if waiting:
            st.info(waiting)
        else:
            st.error(st.session_state.get("kvsim.error") or "no scenario")
        st.stop()
    return cur
