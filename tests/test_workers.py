"""A scenario's policies side by side on forked workers (kvsim.workers.run_forked, `kvsim run --workers`):
the same bytes as one after the other, progress that adds up, the first failing policy's error, nothing left behind."""

import multiprocessing
import time

import pytest

import kvsim
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.workers import can_fork, run_forked
from tests.conftest import scenario_dict

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs fork")

FILES = ("summary.json", "requests.csv", "timeseries.csv", "report.html")
THREE = [{"name": "paged"}, {"name": "fp8", "kv_cache_dtype": "fp8"},
         {"name": "contiguous", "allocator": "contiguous", "enable_prefix_caching": False}]


def _toml(tmp_path, policies=THREE, num_requests=300):
    lines = ['name = "three"', '[model]', 'name = "Llama-3.1-8B"', '[engine]', 'max_model_len = 8192']
    for p in policies:
        lines.append("[[policies]]")
        lines += [f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {str(v).lower()}"
                  for k, v in p.items()]
    lines += ["[workload]", f"num_requests = {num_requests}", "seed = 3",
              "prefix = { num_groups = 4, prefix_len = 512, fraction = 0.5 }"]
    path = tmp_path / "three.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_policies_side_by_side_write_the_same_bytes(tmp_path):
    path = _toml(tmp_path)
    assert main([str(path), "--out", str(tmp_path / "one"), "--workers", "1", "--quiet"]) == 0
    assert main([str(path), "--out", str(tmp_path / "two"), "--workers", "2", "--quiet"]) == 0
    assert main([str(path), "--out", str(tmp_path / "auto"), "--quiet"]) == 0  # one per policy, up to the cores
    for name in FILES:
        one = (tmp_path / "one" / name).read_bytes()
        assert one == (tmp_path / "two" / name).read_bytes() == (tmp_path / "auto" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted([*FILES, ".kvsim-results.json"])
    assert not multiprocessing.active_children()


def test_progress_adds_up_to_each_policys_requests():
    from kvsim.scenario.config import scenario_from_dict

    sc = scenario_from_dict(scenario_dict(policies=THREE, workload={"num_requests": 200}))
    ticks = {}

    def progress(label, total):
        assert total == 200
        ticks[label] = 0

        def tick(n):
            ticks[label] += n
        return tick
    side = kvsim.run(sc, progress=progress, workers=3)
    assert ticks == {p["name"]: 200 for p in THREE}
    assert side.summaries == kvsim.run(sc).summaries
    assert [r.name for r in side.runs] == [p["name"] for p in THREE] and all(r.events > 0 for r in side.runs)


def test_the_first_failing_policys_error_and_nothing_left(tmp_path, monkeypatch):
    """Policy 1 fails at once, policy 2 too but differently, policy 0 runs: the error is policy 1's (what one
    after the other raises), the results folder is not made and no worker is left."""
    import kvsim.pipeline as pipeline

    real = pipeline.simulate_policy

    def failing(scenario, policy, *args, **kw):
        if policy.name != "paged":
            raise KvsimError(f"{policy.name} cannot run")
        return real(scenario, policy, *args, **kw)
    monkeypatch.setattr(pipeline, "simulate_policy", failing)
    from kvsim.cli import dispatch

    with pytest.raises(KvsimError, match="^fp8 cannot run$"):
        dispatch([str(_toml(tmp_path)), "--out", str(tmp_path / "res"), "--workers", "3", "--quiet"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["three.toml"]  # no results, no temporary folder
    assert not multiprocessing.active_children()


def _slow_then(i, report):
    time.sleep(0.3 * (3 - i))  # the later tasks finish first
    if report is not None:
        report(i + 1)
    return i * i


def test_run_forked_gives_results_in_task_order():
    seen = []
    assert run_forked(_slow_then, 3, 3, lambda i, n: seen.append((i, n))) == [0, 1, 4]
    assert sorted(seen) == [(0, 1), (1, 2), (2, 3)]
    assert run_forked(_slow_then, 3, 1) == [0, 1, 4]  # one worker: one after the other


def _fail_late_or_early(i, report):
    if i == 0:
        time.sleep(0.5)
        raise ValueError("task 0, late")
    raise ValueError(f"task {i}, early")


def test_run_forked_raises_the_first_tasks_error_not_the_first_to_come():
    start = time.monotonic()
    with pytest.raises(ValueError, match="task 0, late"):
        run_forked(_fail_late_or_early, 3, 3)
    assert time.monotonic() - start >= 0.5
    assert not multiprocessing.active_children()


def test_workers_flag_is_checked(tmp_path, capsys):
    path = _toml(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([str(path), "--workers", "0", "--quiet"])
    assert exc.value.code == 2 and "--workers: must be an integer in [1, 256], got '0'" in capsys.readouterr().err
    with pytest.raises(KvsimError, match="--workers must be an integer"):
        kvsim.run(str(path), workers=0)
