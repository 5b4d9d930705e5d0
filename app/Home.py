"""kvsim's what-if sizing dashboard: `streamlit run app/Home.py`, or `python -m kvsim dashboard`.

The sidebar holds the scenario (a shipped or uploaded TOML) and a widget per setting; every page
shows one view of that same validated scenario through the library API, so its numbers are the
command line's. A page is one module under app/views/: to add one, write it (a title, then
`cur = kvdash.settings.current()`, then the body inside `with kvdash.errors.caught(st):`) and
list it in PAGES.
"""

import streamlit as st

from kvdash import settings

PAGES = [
    st.Page("views/whatif.py", title="What-if", icon=":material/tune:", default=True),
    st.Page("views/capacity.py", title="Capacity", icon=":material/speed:"),
    st.Page("views/memory.py", title="Memory", icon=":material/memory:"),
    st.Page("views/validation.py", title="Validation", icon=":material/fact_check:"),
]

st.set_page_config(page_title="kvsim", page_icon=":material/memory:", layout="wide")
page = st.navigation(PAGES)
settings.sidebar()
page.run()
