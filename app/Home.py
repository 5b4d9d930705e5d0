"""kvsim's what-if sizing dashboard: `streamlit run app/Home.py`, or `python -m kvsim dashboard`.

Every page opens with its title and the question (model, GPU, TP x replicas, arrival rate, SLO; the
rest under "Advanced" in the sidebar), then shows one view of that same validated scenario through
the library API, so its numbers are the command line's. The first page is the answer: each policy's
safe rate and cost, and what serves a target rate. A page is one module under app/views/: to add
one, write it (`cur = kvdash.settings.current()`, then the body inside `with
kvdash.errors.caught(st):`) and list it in PAGES. Nothing is fetched from outside (the favicon is
app/favicon.png), so the dashboard works offline.
"""

from pathlib import Path

import streamlit as st

from kvdash import settings

FAVICON = Path(__file__).resolve().parent / "favicon.png"
PAGES = [
    st.Page("views/answer.py", title="Answer", icon=":material/check_circle:", default=True),
    st.Page("views/whatif.py", title="What-if", icon=":material/tune:"),
    st.Page("views/capacity.py", title="Capacity", icon=":material/speed:"),
    st.Page("views/memory.py", title="Memory", icon=":material/memory:"),
    st.Page("views/validation.py", title="Validation", icon=":material/fact_check:"),
    st.Page("views/disagg.py", title="Disaggregation", icon=":material/call_split:"),
    st.Page("views/autoscale.py", title="Autoscaling", icon=":material/monitoring:"),
]

st.set_page_config(page_title="kvsim", page_icon=str(FAVICON), layout="wide")
page = st.navigation(PAGES)
st.title(page.title)
settings.draw()
page.run()
