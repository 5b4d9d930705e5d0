"""The dashboard's speculative-decoding and energy knobs: a checkbox turns each scenario section on
(`[speculative]`, `[energy]`), and the section's keys become widgets (kvdash/fields.py) whose changes go
into the run's overrides like every other setting's."""

from __future__ import annotations

from kvdash import fields
from kvdash.source import toml_value

# widgets shown when the section is on, and the values a new section starts from
SPECULATIVE = {"method": "eagle3", "num_speculative_tokens": 3, "dataset": None, "acceptance_rate": None}
ENERGY = {"pue": 1.56, "usd_per_kwh": 0.081, "host_w_per_gpu": None, "gpu_max_w": None}


def _section(form, box, name: str, label: str, keys: dict, help_text: str) -> None:
    """A checkbox for scenario section `name` and, when it is on, a widget per key of `keys`."""
    current = getattr(form.base.scenario, name)
    on = box.checkbox(label, value=current is not None, key=f"{form.base.digest}:{name}", help=help_text)
    if not on:
        if current is not None:
            form.unset.append(name)
        return
    for key, start in keys.items():
        old = getattr(current, key) if current is not None else start
        new = fields.widget(box, f"{name}.{key}", old, widget_key=f"{form.base.digest}:{name}.{key}")
        if new is not None and (current is None or new != old):
            form.overrides.append(f"{name}.{key}={toml_value(new)}")
        elif new is None and current is not None and old is not None:
            form.unset.append(f"{name}.{key}")
    if current is None and not any(o.startswith(f"{name}.") for o in form.overrides):
        form.overrides.append(f"{name}={{}}")


def draw(form, bar) -> None:
    """The two expanders of the Advanced sidebar."""
    _section(form, bar.expander("Speculative decoding"), "speculative", "speculative decoding", SPECULATIVE,
             "Draft tokens verified in each decoding step (vLLM's speculative_config): EAGLE-3 heads, MTP layers, "
             "n-gram lookup or a draft model, with published acceptance by default. kvsim plan --speculative-k "
             "searches k and says where speculation stops paying.")
    _section(form, bar.expander("Energy"), "energy", "energy and its cost", ENERGY,
             "The GPU preset's power model, the host's share, PUE and the electricity price: J per output token, "
             "kWh and energy $ per million tokens beside the GPU-hour $.")


def speculation_section(scenario, toml_text: str, source: str, base_dir: str, search, workers: int) -> None:
    """The Capacity page's k search (`kvsim plan --speculative-k`): each policy without speculation and
    with each k, and where speculation stops paying; only for a scenario with [speculative]."""
    import streamlit as st

    from kvdash import errors

    st.subheader("Speculative decoding: which k, and where it stops paying")
    if scenario.speculative is None:
        st.info("Turn on **speculative decoding** in the Advanced sidebar to compare draft token counts.")
        return
    with errors.caught(st):
        ks = st.multiselect("draft tokens k to compare", list(range(1, 9)), default=[1, 2, 3, 4],
                            key="kvsim.capacity.spec_ks", help="`kvsim plan --speculative-k`")
        if st.button("Search k", key="kvsim.capacity.spec_button") and ks:
            result = _speculation_plan(toml_text, source, base_dir, tuple(sorted(ks)), search.seeds, search.resolution,
                                       search.num_requests, workers)
            from kvsim.planning.speculation import speculation_lines

            st.caption(f"python -m kvsim plan SCENARIO.toml --speculative-k {','.join(map(str, sorted(ks)))}")
            st.markdown("  \n".join(speculation_lines(result)))
            st.dataframe([{"policy": p.policy, "k": p.best_k, **row} for p in result.payoffs for row in p.loads])


def _speculation_plan(toml_text, source, base_dir, ks, seeds, resolution, num_requests, workers):
    from pathlib import Path

    from kvsim.planning.speculation import speculation_plan
    from kvsim.scenario.config import scenario_from_toml

    scenario = scenario_from_toml(toml_text, source, Path(base_dir))
    return speculation_plan(scenario, list(ks), seeds=seeds, resolution=resolution, num_requests=num_requests,
                            workers=workers)
