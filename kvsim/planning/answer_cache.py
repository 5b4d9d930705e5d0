"""Answers kept on disk, so a fresh dashboard server answers a scenario it has answered before at once.

`plan(scenario, **settings)` and `deploy(scenario, target_rate, **settings)` are `kvsim.plan` and
`kvsim.deploy`, looked up first in a folder of earlier answers (`cache_dir()`: $KVSIM_CACHE_DIR, else
$XDG_CACHE_HOME/kvsim/answers, else ~/.cache/kvsim/answers; KVSIM_CACHE_DIR=off: no cache). An answer
is keyed by what decides it: the installed kvsim version and a digest of kvsim's own source files (an edited
checkout never reads an answer of other code), the scenario's validated content, the bytes of every
file it reads (model config, calibration, trace) and the search's settings. Answers are stored as JSON
(the plan.json document, `to_dict`), never pickled, and read back into the same records; a file that
does not read back is ignored (recomputed). A new answer is written to a hidden temporary and linked
into place without replacing anything (a race leaves the first writer's).

    python -m kvsim.planning.answer_cache [SCENARIO.toml ...]

precomputes the dashboard's first answer (the Answer page's plan and its target-rate deployment on the
scenario's own GPU, kvsim's default settings) for each scenario given, by default every one under
scenarios/ that a plan can take.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

CACHE_ENV = "KVSIM_CACHE_DIR"
FORMAT = 1  # of the stored documents


def cache_dir() -> Optional[Path]:
    """Where answers are kept (module docstring); None when the cache is off."""
    env = os.environ.get(CACHE_ENV)
    if env == "off":
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvsim" / "answers"


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of every source file of the package (path and bytes; its version is in __init__.py and
    pyproject's metadata, both read)."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[1]
    try:
        installed = version("kvsim")
    except PackageNotFoundError:
        installed = "not installed"
    h = hashlib.sha256(f"{installed}\0{FORMAT}\0".encode())
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json", ".csv", ".toml") and "__pycache__" not in path.parts and path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


PATH_KEYS = (("model", "hf_config"), ("backend", "calibration"), ("workload", "trace", "path"))


def scenario_content(scenario) -> dict:
    """The scenario's validated content, each file it names replaced by the sha256 of its bytes (a file
    named relative to the scenario or by its absolute path is the same input)."""
    data = scenario.model_dump(mode="json")
    for keys in PATH_KEYS:
        where = data
        for k in keys[:-1]:
            where = where.get(k) or {}
        if where.get(keys[-1]):
            where[keys[-1]] = _file_digest(scenario.resolve(where[keys[-1]]))
    return data


def answer_key(scenario, kind: str, settings: dict) -> str:
    """The key of one answer (module docstring)."""
    doc = {"code": code_digest(), "kind": kind, "scenario": scenario_content(scenario), "settings": settings}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()


def _read(path: Path, build: Callable[[dict], object]):
    try:
        return build(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write(path: Path, doc: dict) -> None:
    """`doc` as `path`, all or nothing, never over an existing file (module docstring)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another server wrote the same answer first
        finally:
            tmp.unlink()
    except OSError:
        pass  # a read-only or full disk: the answer is still returned, just not kept


def cached(scenario, kind: str, settings: dict, compute: Callable[[], object], build: Callable[[dict], object]):
    """`compute()`'s answer, or the one stored under its key (`build(doc)` reads a stored document back)."""
    folder = cache_dir()
    if folder is None:
        return compute()
    path = folder / f"{kind}-{answer_key(scenario, kind, settings)}.json"
    if path.is_file():
        found = _read(path, build)
        if found is not None:
            return found
    result = compute()
    _write(path, result.to_dict())
    return result


def plan_from_dict(doc: dict):
    from kvsim.planning.capacity import PlanResult, PolicyCapacity

    if doc.get("tuning"):
        raise ValueError("a tuned plan is not kept")
    return PlanResult(doc["scenario"], doc["meta"], [PolicyCapacity(**p) for p in doc["policies"]], doc["points"])


def deploy_from_dict(doc: dict):
    from kvsim.planning.deploy import Deployment, DeployResult

    deployments = [Deployment(**{k: v for k, v in d.items() if k != "label"}) for d in doc["deployments"]]
    return DeployResult(doc["target_rate"], doc["meta"], deployments, doc["skipped"], doc["points"])


def plan(scenario, *, progress=None, workers=None, **settings):
    """`kvsim.plan(scenario, **settings)`, kept on disk (`progress`, `workers`: not part of the answer)."""
    from kvsim.planning import capacity

    if settings.get("tune"):
        return capacity.plan(scenario, progress=progress, workers=workers, **settings)
    return cached(scenario, "plan", settings, lambda: capacity.plan(scenario, progress=progress, workers=workers,
                                                                     **settings), plan_from_dict)


def deploy(scenario, target_rate: float, *, progress=None, workers=None, **settings):
    """`kvsim.deploy(scenario, target_rate, **settings)` (aggregated), kept on disk."""
    from kvsim.planning import deploy as search
    from kvsim.planning.disagg import aggregated

    settings = {**settings, "tensor_parallel": list(settings.get("tensor_parallel", (1, 2, 4, 8)))}
    return cached(scenario, "deploy", {"target_rate": target_rate, **settings},
                  lambda: search.deploy(aggregated(scenario), target_rate, progress=progress, workers=workers,
                                        **settings), deploy_from_dict)


def first_answer(scenario) -> None:
    """The dashboard's Answer page for `scenario` at its defaults: the plan, and (for a rate, not sessions)
    the cheapest layout of its own GPU at its rate with the best policy (app/views/answer.py)."""
    result = plan(scenario, seeds=3, resolution=0.02, num_requests=None)
    if scenario.workload.sessions is not None or not result.policies:
        return
    best = max(result.policies, key=lambda p: (p.safe_rate, p.mean_rate))
    r0 = result.meta["scenario_rate"]
    if result.meta.get("load_unit") == "clients":
        r0 = best.at_safe_rate.get("throughput_rps") or 1.0
    deploy(scenario, float(f"{r0:.4g}"), gpus=[scenario.hardware.gpu], tensor_parallel=(1, 2, 4, 8),
           policy=best.policy, seeds=3, resolution=0.02, num_requests=None, top=1, max_replicas=64, headroom=False)


def main(argv: list[str]) -> int:
    from kvsim.errors import KvsimError
    from kvsim.scenario.config import load_scenario

    paths = argv or sorted(str(p) for p in Path("scenarios").glob("*.toml"))
    for path in paths:
        try:
            first_answer(load_scenario(path))
            print(f"{path}: kept in {cache_dir()}")
        except KvsimError as exc:  # e.g. a GPU scenario, or one a plan cannot take
            print(f"{path}: skipped ({exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
