"""The code's shape, checked on its syntax trees: imports point one way with no cycle, no module
reads another object's private attribute, engine functions stay short, and every part the engine
meets satisfies its Protocol (kvsim.engine.interfaces)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvsim"
# The layers of docs/architecture.md, bottom first: a module imports from its own layer or below.
LAYERS = [
    {"kvsim.errors", "kvsim.sequence", "kvsim.batch", "kvsim.guard", "kvsim.workers"},
    {"kvsim.scenario"},
    {"kvsim.perf"},
    {"kvsim.engine"},
    {"kvsim.backends"},
    {"kvsim.results"},
    {"kvsim.pipeline", "kvsim.autoscaled"},
    {"kvsim.planning", "kvsim.calibrate"},
    {"kvsim.cli", "kvsim.terminal", "kvsim.__main__", "kvsim"},
]
MAX_ENGINE_FUNCTION_LINES = 40


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: dict) -> set[str]:
    """kvsim modules that `name` imports anywhere (module level, in functions, for type checking)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer(name: str) -> int:
    return next(i for i, group in enumerate(LAYERS)
                if name in group or any(name.startswith(g + ".") for g in group if g != "kvsim"))


def test_imports_point_down_the_layers_and_form_no_cycle():
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    upward = [(a, b) for a, deps in graph.items() for b in deps
              if a != "kvsim" and layer(b) > layer(a)]
    assert not upward, f"imports pointing up the layers: {upward}"
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"
    assert "kvsim.results.metrics" not in {d for n, deps in graph.items() if n.startswith("kvsim.engine") for d in deps}


# Public names that start with "_": the named-tuple API, and os._exit (a forked worker's way out).
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_make", "_fields", "os._exit"}


def _own(value: ast.expr) -> bool:
    """self, cls, or super() (a subclass overriding its base's hook)."""
    return (isinstance(value, ast.Name) and value.id in ("self", "cls")) or \
        (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")


def test_no_module_reads_another_objects_private_attribute():
    """`x._name` only for x = self or cls: objects meet at their public names (records, Protocols)."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not _own(node.value) and node.attr not in PUBLIC_UNDERSCORED
                    and ast.unparse(node) not in PUBLIC_UNDERSCORED):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_engine_functions_are_short():
    long = []
    for path in (PACKAGE / "engine").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str)
                start = node.body[1].lineno if docstring and len(node.body) > 1 else first.lineno
                if node.end_lineno - start + 1 > MAX_ENGINE_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.name} ({node.end_lineno - start + 1} lines)")
    assert not long, long


# ---- every implementation satisfies its Protocol -------------------------------------------------

def test_allocators_backends_observers_sources_routers_and_pricers_satisfy_their_protocols():
    from conftest import make_scenario
    from kvsim.backends.analytic import AnalyticBackend
    from kvsim.engine.arrivals import ClosedLoop, RequestStream
    from kvsim.engine.block_manager import BlockManager
    from kvsim.engine.contiguous import ContiguousAllocator
    from kvsim.engine.interfaces import ArrivalSource, Backend, ClosedLoopSource, EngineObserver, KVAllocator, Router
    from kvsim.engine.reference_pool import ReferencePool
    from kvsim.engine.router import LeastLoaded, OneReplica, PrefixAffinity, RoundRobin
    from kvsim.perf.pricing import RunPricer
    from kvsim.pipeline import resolve_policy
    from kvsim.results.metrics import Metrics
    from kvsim.scenario.catalog import gpu_spec, model_spec

    for alloc in (BlockManager(8, 4), ContiguousAllocator(8, 4, 16), ReferencePool(8, 4)):
        assert isinstance(alloc, KVAllocator), type(alloc)
    sc = make_scenario()
    model, gpu = model_spec(sc), gpu_spec(sc)
    backend = AnalyticBackend(sc, sc.policies[0], model, gpu, *resolve_policy(sc, sc.policies[0], model, gpu))
    assert isinstance(backend, Backend) and isinstance(backend.pricer, RunPricer)
    assert isinstance(Metrics("p", sc.slo, 1.0), EngineObserver)
    assert isinstance(RequestStream([]), ArrivalSource)
    assert isinstance(ClosedLoop(iter(())), ClosedLoopSource) and not isinstance(RequestStream([]), ClosedLoopSource)
    for router in (OneReplica(), LeastLoaded([]), RoundRobin([None]), PrefixAffinity([], 16, True)):
        assert isinstance(router, Router)


@pytest.mark.parametrize("cls", ["BlockManager", "ContiguousAllocator", "ReferencePool"])
def test_allocator_methods_take_the_protocols_arguments(cls):
    import inspect

    from kvsim.engine import block_manager, contiguous, reference_pool
    from kvsim.engine.interfaces import KVAllocator

    impl = {"BlockManager": block_manager, "ContiguousAllocator": contiguous, "ReferencePool": reference_pool}[cls]
    impl = getattr(impl, cls)
    for name, member in vars(KVAllocator).items():
        if callable(member) and not name.startswith("_"):
            want = list(inspect.signature(member).parameters)
            have = list(inspect.signature(getattr(impl, name)).parameters)
            assert have[:len(want)] == want, (cls, name, have, want)
