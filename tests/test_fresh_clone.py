"""A clone of kvsim is enough: the project's files (what `git ls-files` holds, or would once committed)
copied into an empty temporary folder with no `shared` folder anywhere above it, and every shipped
scenario run from there with `python -m kvsim`, the copy's own package imported. The traces the trace
scenarios replay ship in `traces/`, unchanged (their SHA-256 as `traces/README.md` lists them), with their
licences beside them; no README command reads `../shared`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TRACE_SCENARIOS = ("azure_conv.toml", "mooncake.toml", "mooncake_disagg.toml", "mooncake_offload.toml")
SHORT = 40  # requests of each scenario's run (a closed loop's too)
TRACE_REQUESTS = 150


def project_files() -> list[str]:
    """The project's files as a clone has them: tracked, plus new ones not ignored (not yet committed)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (ROOT / p).is_file())


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("clone")
    holders = [p for p in base.parents if (p / "shared").exists()]
    assert not holders, f"a `shared` folder above the copy ({holders[0]}): the test would prove nothing"
    dest = base / "kvsim"
    for rel in project_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def kvsim_in(clone: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m kvsim ARGS` run in the copy: its own package first on the path, not the one installed."""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=clone, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def shipped_scenarios() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("scenarios/*.toml"), *ROOT.glob("scenarios/*/*.toml")])


def on_the_gpu(name: str) -> bool:
    """A scenario for the `triton` backend (a GPU run, or one `kvsim validate` compares against)."""
    return tomllib.loads((ROOT / name).read_text()).get("backend", {}).get("name") == "triton"


def test_the_copy_imports_its_own_package(clone):
    env = {**os.environ, "PYTHONPATH": str(clone)}
    where = subprocess.run([sys.executable, "-c", "import kvsim.perf; print(kvsim.perf.__file__)"], cwd=clone,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(clone)


def test_the_shipped_traces_are_the_published_files_with_their_licences():
    listed = dict(re.findall(r"`([0-9a-f]{64})  ([\w.]+)`", (ROOT / "traces/README.md").read_text()))
    assert set(listed.values()) == {"azure_llm_2023_conv.csv", "mooncake_conversation.jsonl"}
    for digest, name in listed.items():
        assert hashlib.sha256((ROOT / "traces" / name).read_bytes()).hexdigest() == digest, name
    readme = (ROOT / "traces/README.md").read_text()
    assert "Splitwise" in readme and "ISCA 2024" in readme and "Apache License 2.0" in readme
    assert "Apache License" in (ROOT / "traces/LICENSE-Mooncake-Apache-2.0").read_text()
    assert "creativecommons.org/licenses/by/4.0" in (ROOT / "traces/LICENSE-Azure-CC-BY-4.0.md").read_text()


def test_no_shipped_input_or_readme_command_reads_shared():
    for path in [*ROOT.glob("scenarios/**/*.toml"), ROOT / "README.md"]:
        lines = path.read_text().splitlines()
        if path.suffix == ".md":  # the commands a user copies
            lines = [line for line in lines if line.startswith(("python -m kvsim", "kvsim "))]
        bad = [line for line in lines if "../shared" in line and not line.lstrip().startswith("#")]
        assert not bad, f"{path.name}: {bad[0]}"


@pytest.mark.parametrize("name", [s for s in shipped_scenarios() if on_the_gpu(s)])
def test_the_gpu_scenarios_validate_in_the_copy(clone, name):
    """As they are (the runs below price them on the analytic backend, as `kvsim validate` does)."""
    done = kvsim_in(clone, "memory", name, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["capacity"]


@pytest.fixture(scope="module")
def runs(clone, tmp_path_factory):
    """Every scenario run in the copy, briefly (the GPU ones on the analytic backend), two at a time:
    name -> (folder, process)."""
    out = tmp_path_factory.mktemp("runs")

    def one(name):
        requests = TRACE_REQUESTS if Path(name).name in TRACE_SCENARIOS else SHORT
        folder = out / re.sub(r"\W+", "_", name)
        analytic = ["--set", "backend.name=analytic"] if on_the_gpu(name) else []
        return name, (folder, kvsim_in(clone, "run", name, "--quiet", "--set", f"workload.num_requests={requests}",
                                       *analytic, "--out", str(folder)))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, shipped_scenarios()))


@pytest.mark.parametrize("name", shipped_scenarios())
def test_every_shipped_scenario_runs_in_the_copy(runs, name):
    folder, done = runs[name]
    assert done.returncode == 0, done.stderr
    summary = json.loads((folder / "summary.json").read_text())
    requests = TRACE_REQUESTS if Path(name).name in TRACE_SCENARIOS else SHORT
    for policy, figures in summary["policies"].items():
        counted = figures["requests"]
        assert counted["received"] == requests, policy
        assert counted["finished"] + counted["rejected"] == requests, policy  # every request accounted for


def test_the_trace_scenarios_replay_the_shipped_traces(runs):
    """The first requests' arrivals are the trace's own (Azure: seconds after the first timestamp;
    Mooncake: its millisecond timestamps)."""
    import csv
    from datetime import datetime

    with open(ROOT / "traces/azure_llm_2023_conv.csv") as f:
        rows = list(csv.DictReader(f))[:5]
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    expected = [(t - stamps[0]).total_seconds() for t in stamps]
    folder, _ = runs["scenarios/azure_conv.toml"]
    with open(folder / "requests.csv") as f:
        replayed = list(csv.DictReader(f))
    first = sorted((r for r in replayed if r["policy"] == replayed[0]["policy"]), key=lambda r: float(r["arrival_s"]))
    assert [float(r["arrival_s"]) for r in first[:5]] == pytest.approx(expected, abs=1e-6)
    assert [int(r["prompt_tokens"]) for r in first[:5]] == [int(r["ContextTokens"]) for r in rows]


def test_kernel_tables_without_their_data_say_where_it_is(clone):
    """The README's AIConfigurator command run before cloning AIConfigurator (and the command as it read
    before, through ../shared): one line naming the repository and the folder, exit 2."""
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("python -m kvsim calibrate aiconfigurator/"))
    folder = command.split()[4]
    for table in (folder, "../shared/profiles/aiconfigurator/h100_sxm"):
        done = kvsim_in(clone, "calibrate", table, "-o", "h100.npz")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "git clone https://github.com/ai-dynamo/aiconfigurator" in done.stderr
        assert f"aiconfigurator/{folder.split('aiconfigurator/', 1)[1]}" in done.stderr
        assert not (clone / "h100.npz").exists()
