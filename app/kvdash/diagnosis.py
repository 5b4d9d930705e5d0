"""Why the question's scenario cannot run, and the change that fixes it: the library's one line (what
`kvsim run` says first: `kvsim.perf.memory.check_fits`), sorted by what it is about so that a page
shows that problem's view and buttons and no other's:

- `setting`: a setting kvsim cannot simulate as vLLM runs it (an MLA model's block size on this GPU,
  swap preemption with sliding windows). The button sets what the line names; which change does is
  asked of the library (the candidates that make every policy simulable).
- `memory`: the model does not fit. Where each GPU's memory goes, and buttons for the layouts that
  fit best: fewest GPUs, then the cheapest, then the most memory bandwidth (this GPU's smallest TP
  degree among them). A layout fits when the library's whole check passes on it, block size included.
- `other` (more KV blocks than kvsim simulates, a TP degree the model refuses): the line alone, which
  names the key to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import streamlit as st

from kvdash import charts
from kvsim.errors import KvsimError
from kvsim.perf.kv_groups import vllm_block_size
from kvsim.perf.memory import check_fits, check_simulable, kv_capacity
from kvsim.planning.parallel import Parallel
from kvsim.scenario.catalog import GPUS, gpu_price, gpu_spec, model_spec

GIB = 2**30
TP_DEGREES = (1, 2, 4, 8)  # what the question's TP widget offers
SHOWN = 3  # layouts offered when the model does not fit
SETTING, MEMORY, OTHER = "setting", "memory", "other"


@dataclass(frozen=True, slots=True)
class Fix:
    """A button: its label and the scenario keys it sets (the question's and Advanced's widgets)."""

    label: str
    changes: dict


@dataclass(frozen=True, slots=True)
class Diagnosis:
    message: str  # the library's one line
    kind: str  # SETTING, MEMORY or OTHER
    fixes: tuple[Fix, ...] = ()


def problem(scenario, simulate: bool = True) -> str | None:
    """The library's one line on why the scenario cannot run (`simulate=False`: why `kvsim memory` cannot
    size it), or None when it can."""
    try:
        check_fits(scenario, model_spec(scenario), gpu_spec(scenario), scenario.policies, simulate=simulate)
    except KvsimError as exc:
        return str(exc)
    return None


def diagnose(scenario, simulate: bool = True) -> Diagnosis | None:
    """What keeps the scenario from running (module docstring), or None; `simulate=False`: from being sized
    (what `kvsim memory` checks: never a SETTING)."""
    message = problem(scenario, simulate)
    if message is None:
        return None
    try:
        model, gpu = model_spec(scenario), gpu_spec(scenario)
    except KvsimError:
        return Diagnosis(message, OTHER)
    if simulate and not _passes(check_simulable, scenario, model, gpu):
        return Diagnosis(message, SETTING, setting_fixes(scenario, model, gpu))
    if not _passes(kv_capacity, scenario, model, gpu, simulate=False):
        return Diagnosis(message, MEMORY, layout_fixes(scenario))
    return Diagnosis(message, OTHER)


def _passes(check, scenario, model, gpu, **kwargs) -> bool:
    try:
        for policy in scenario.policies:
            check(scenario, policy, model, gpu, **kwargs)
    except KvsimError:
        return False
    return True


def changed(scenario, changes: dict):
    """The scenario with `changes` ({"section.key": value}) applied, unvalidated: a trial."""
    sections: dict = {}
    for key, value in changes.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return scenario.model_copy(update={s: getattr(scenario, s).model_copy(update=u) for s, u in sections.items()})


def setting_fixes(scenario, model, gpu) -> tuple[Fix, ...]:
    """The change that makes every policy simulable: the block size vLLM runs the model with on this GPU,
    or recompute preemption."""
    candidates = ({"engine.block_size": vllm_block_size(model, gpu.name, scenario.engine.block_size)},
                  {"engine.preemption_mode": "recompute"})
    for change in candidates:
        (key, value), = change.items()
        if getattr(scenario.engine, key.split(".")[1]) != value and \
                _passes(check_simulable, changed(scenario, change), model, gpu):
            return (Fix(f"Set {key} = {value}", change),)
    return ()


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout that fits: on which GPU, at which TP degree, how many GPUs, at what price."""

    gpu: str
    tp: int
    num_gpus: int
    usd_per_hour: float | None
    bandwidth: float
    changes: dict

    def rank(self) -> tuple:
        """Fewest GPUs, then the cheapest, then the most memory bandwidth."""
        usd = math.inf if self.usd_per_hour is None else self.usd_per_hour
        return self.num_gpus, usd, -self.bandwidth, self.gpu

    def label(self, scenario) -> str:
        hw = scenario.hardware
        layout = Parallel(self.tp, hw.data_parallel_size, hw.enable_expert_parallel)
        price = "" if self.usd_per_hour is None else f", ${self.usd_per_hour:,.2f}/h"
        return f"Use {self.num_gpus} × {self.gpu} (TP {layout}" + \
            (f" × {hw.num_replicas} replicas" if hw.num_replicas > 1 else "") + f"){price}"


def layouts_that_fit(scenario) -> list[Layout]:
    """On each GPU preset, the smallest TP degree the question offers at which the scenario runs (the
    block size vLLM uses there, if it differs), best first (Layout.rank)."""
    hw = scenario.hardware
    out = []
    for name in GPUS:
        for tp in TP_DEGREES:
            changes = {"hardware.tensor_parallel_size": tp} if name == hw.gpu else \
                {"hardware.gpu": name, "hardware.tensor_parallel_size": tp}
            trial = changed(scenario, changes)
            try:
                model = model_spec(trial)
            except KvsimError:  # a degree the model refuses
                continue
            block = vllm_block_size(model, name, scenario.engine.block_size)
            if block != scenario.engine.block_size:
                changes["engine.block_size"] = block
                trial = changed(scenario, changes)
            if problem(trial) is None:
                n = tp * hw.data_parallel_size * hw.num_replicas
                price = gpu_price(scenario, name)
                out.append(Layout(name, tp, n, None if price is None else price.usd_per_hour * n,
                                  gpu_spec(trial).hbm_bandwidth_gbps, changes))
                break
    return sorted(out, key=Layout.rank)


def layout_fixes(scenario) -> tuple[Fix, ...]:
    """The best SHOWN layouts that fit, this GPU's among them when one fits."""
    ranked = layouts_that_fit(scenario)
    shown = ranked[:SHOWN]
    here = next((lay for lay in ranked if lay.gpu == scenario.hardware.gpu), None)
    if here is not None and here not in shown:
        shown = shown[:SHOWN - 1] + [here]
    return tuple(Fix(lay.label(scenario), lay.changes) for lay in shown)


def apply(digest: str, changes: dict) -> None:
    """A fix's button: set the widgets of the changed keys (before they are drawn)."""
    for key, value in changes.items():
        st.session_state[f"{digest}:{key}"] = value


def buttons(diag: Diagnosis, digest: str, where: str) -> None:
    """The fixes as buttons, the first (the best) primary."""
    if not diag.fixes:
        return
    cols = st.columns(max(len(diag.fixes), 3))
    for i, (col, fix) in enumerate(zip(cols, diag.fixes)):
        col.button(fix.label, on_click=apply, args=(digest, fix.changes), type="primary" if i == 0 else "secondary",
                   key=f"kvsim.{where}.fix_{i}", width="stretch")


def memory_view(scenario, where: str) -> None:
    """Where each GPU's memory goes (`kvsim.memory`'s breakdown, unchecked), under the buttons."""
    from kvsim.results.memory_report import memory_records

    try:
        caps = memory_records(scenario, model_spec(scenario), gpu_spec(scenario), seq_lens=())["capacity"]
    except KvsimError:  # nothing to draw: the line above says why
        return
    charts.plot(breakdown_figure(caps, scenario.hardware.gpu), f"kvsim.{where}_breakdown")
    st.caption("Per GPU: the weights (split over the GPUs of a replica), activations and non-torch memory, and "
               "what is left of the budget (gpu_memory_utilization × the GPU's memory) for the KV cache. The "
               "buttons: layouts that fit, fewest GPUs first, then the cheapest (list prices, or the scenario's "
               "[cost]), then the most memory bandwidth.")


def breakdown_figure(caps: list[dict], gpu: str) -> dict:
    """A stacked bar per capacity record of `kvsim.memory` (a kv dtype and its policies): weights,
    activations, non-torch reserve, the KV cache (none when the rest leaves no room: the bar then runs
    past the budget line by the shortfall) and what gpu_memory_utilization leaves out; lines at the GPU's
    memory and at the budget."""
    rows = [f"{c['kv_cache_dtype']} ({', '.join(c['policies'])})" for c in caps] if len(caps) > 1 else [gpu]
    parts = (("weights", "weights", "#636EFA"), ("activations", "activations", "#EF553B"),
             ("reserve", "non-torch memory", "#00CC96"), ("kv", "KV cache", "#AB63FA"))
    data = [{"type": "bar", "orientation": "h", "name": label, "y": rows, "x": [max(c[key], 0) / GIB for c in caps],
             "marker": {"color": color}, "hovertemplate": f"{label}: %{{x:,.2f}} GiB<extra></extra>"}
            for key, label, color in parts]
    used = [c["weights"] + c["activations"] + c["reserve"] + max(c["kv"], 0) for c in caps]
    data.append({"type": "bar", "orientation": "h", "name": "left out (gpu_memory_utilization)", "y": rows,
                 "x": [max(0.0, c["total"] - max(c["budget"], u)) / GIB for c, u in zip(caps, used)],
                 "marker": {"color": "#D0D0D0"}, "hovertemplate": "left out: %{x:,.2f} GiB<extra></extra>"})
    cap = caps[0]
    lines = [(cap["total"], f"GPU memory: {cap['total'] / GIB:,.1f} GiB", "solid"),
             (cap["budget"], f"budget at gpu_memory_utilization: {cap['budget'] / GIB:,.1f} GiB", "dash")]
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": x / GIB, "x1": x / GIB, "y0": 0, "y1": 1,
               "line": {"color": "#222", "dash": dash, "width": 2}, "name": name, "showlegend": True}
              for x, name, dash in lines]
    over = [u - c["budget"] for c, u in zip(caps, used) if u > c["budget"]]
    title = "Memory per GPU (GiB)" + (f": {max(over) / GIB:,.1f} GiB over the budget" if over else "")
    return {"data": data, "layout": {
        "barmode": "stack", "height": 220 + 40 * len(rows), "title": {"text": title}, "shapes": shapes,
        "xaxis": {"range": [0, max([cap["total"], *used]) / GIB * 1.05]},
        "yaxis": {"automargin": True, "autorange": "reversed"}, "margin": {"l": 90},
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.12, "traceorder": "normal"}}}
