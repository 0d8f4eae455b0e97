"""The layers' import rules (docs/design.md), read from the source with ast, so that a
violation fails here instead of surfacing later as an import cycle or a slow front end.

The package graph: each package or top-level module of jaxvllm (and pallas_kernels) is a
unit, ranked in LAYERS from the ground up; an import from a unit to one ranked above it runs
up. `python tests/test_layering.py` prints the graph's figures."""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxvllm"

# Bottom to top; a unit imports only units ranked below it (or on its own row).
LAYERS = [
    ("pallas_kernels", "version", "vllm_compat", "process_utils", "serial_utils", "inputs"),
    ("sampling_params",),
    ("pooling_params", "outputs", "lora"),
    ("beam_search",),
    ("platforms", "kernels"),
    ("transformers_utils", "kv_transfer"),
    ("distributed",),  # the mesh: its axes, partition specs, pipeline stages
    ("layers",),
    ("models",),
    ("config",),
    ("core",),
    ("backends",),
    ("memory_plan", "roofline", "worker"),
    ("executor", "metrics"),
    ("aot_compile", "engine"),
    ("entrypoints",),
    ("__init__",),
]
RANK = {unit: rank for rank, row in enumerate(LAYERS) for unit in row}


def import_statements(path: Path):
    """(module, names imported from it) for each import in a file, at the top or inside a
    function, relative imports resolved; names is () for a plain `import module`."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield base, tuple(alias.name for alias in node.names)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, and every name it imports from one (as module.name)."""
    modules = set()
    for base, names in import_statements(path):
        modules.add(base)
        modules.update(f"{base}.{name}" for name in names)
    return modules


def violations(layer: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    """What files of `layer` import among `forbidden` (prefixes), unless among `allowed`."""
    found = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden) and not any(
                    module == a or module.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    return found


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "pallas_kernels").rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str | None:
    """The package graph's unit of a module of this tree, None for any other."""
    parts = module.split(".")
    if parts[0] == "pallas_kernels":
        return "pallas_kernels"
    if parts[0] != "jaxvllm":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


@functools.cache
def module_graph() -> dict[str, set[str]]:
    """module -> the modules of this tree it imports: `from a import b` imports a.b where that
    is a module, else a."""
    paths = {module_name(p): p for p in source_files()}
    graph = {}
    for name, path in paths.items():
        imported = set()
        for base, names in import_statements(path):
            imported.update({f"{base}.{n}" for n in names} & paths.keys() or {base})
        graph[name] = (imported & paths.keys()) - {name}
    return graph


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph, index, low, stack, on_stack, cycles = module_graph(), {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(unit, unit it imports) -> the file imports that make the edge."""
    edges = defaultdict(list)
    for module, imported in module_graph().items():
        for m in imported:
            a, b = unit(module), unit(m)
            if a != b:
                edges[a, b].append(f"{module} -> {m}")
    return edges


def upward_edges() -> dict[tuple[str, str], list[str]]:
    return {(a, b): why for (a, b), why in package_edges().items() if RANK[b] > RANK[a]}


def test_every_unit_is_ranked():
    assert {u for edge in package_edges() for u in edge} <= set(RANK)
    assert {unit(module_name(p)) for p in source_files()} <= set(RANK)


def test_no_import_cycles():
    assert import_cycles() == []


def test_no_package_imports_one_ranked_above_it():
    assert upward_edges() == {}


@pytest.mark.parametrize("layer, forbidden, allowed", [
    ("core", ("jaxvllm.engine", "jaxvllm.worker", "jaxvllm.executor", "jax", "flax"), ()),  # host only
    ("worker", ("jaxvllm.engine", "jaxvllm.executor"), ()),  # sees only SchedulerOutput
    ("executor", ("jaxvllm.engine",), ()),  # the engine drives executors, not the reverse
    ("engine", ("jaxvllm.models",), ()),  # config and tokenizer come from transformers_utils
    ("transformers_utils", ("jax", "flax"), ()),  # the front end loads them
    ("lora", ("jax", "flax"), ()),  # the front end checks adapters
    # Facts and defaults about a device: no kernel, layer or model choice.
    ("platforms", ("jaxvllm", "pallas_kernels"), ("jaxvllm.platforms",)),
    ("kernels", ("jaxvllm", "pallas_kernels"), ("jaxvllm.kernels",)),  # each usable on its own
    ("../pallas_kernels", ("jaxvllm",), ()),
    # The mesh and its partition specs, below the layers; KV transfer, above them, is apart.
    ("distributed", ("jaxvllm",), ("jaxvllm.distributed", "jaxvllm.transformers_utils.quantized_weight")),
    ("kv_transfer", ("jaxvllm.worker", "jaxvllm.core", "jaxvllm.distributed"), ()),
])
def test_layer_imports(layer, forbidden, allowed):
    assert violations(layer, forbidden, allowed) == []


def test_async_llm_loads_no_model_loader_worker_or_jax():
    """The server's process tokenizes and streams; the model lives in the engine's process."""
    script = ("import json, sys, jaxvllm.engine.async_llm; print(json.dumps(sorted(m for m in sys.modules "
              "if m.split('.')[0] == 'jax' or m.startswith(('jaxvllm.models.loader', "
              "'jaxvllm.models.model_loader', 'jaxvllm.worker', 'jaxvllm.executor')))))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_the_scheduler_and_its_kv_connector_load_no_jax():
    """core/ is host only, and so is a KV connector's scheduler side (jaxvllm/kv_transfer)."""
    script = ("import json, sys, jaxvllm.core.scheduler, jaxvllm.kv_transfer.offloading_connector; "
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax'))))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_imported_modules_sees_nested_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "jaxvllm" / "core"
    pkg.mkdir(parents=True)
    source = pkg / "x.py"
    source.write_text("def f():\n    from jaxvllm.engine.messages import A\nfrom ..engine import b\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "jaxvllm")
    assert {"jaxvllm.engine.messages", "jaxvllm.engine"} <= imported_modules(source)
    assert violations("core", ("jaxvllm.engine",)) == [
        "jaxvllm/core/x.py imports jaxvllm.engine", "jaxvllm/core/x.py imports jaxvllm.engine.b",
        "jaxvllm/core/x.py imports jaxvllm.engine.messages",
        "jaxvllm/core/x.py imports jaxvllm.engine.messages.A"]


if __name__ == "__main__":
    edges, up, cycles = package_edges(), upward_edges(), import_cycles()
    units = {u for edge in edges for u in edge}
    print(f"{len(units)} units, {len(edges)} edges between them, {len(up)} upward, {len(cycles)} cycles")
    for (a, b), why in sorted(up.items()):
        print(f"  up: {a} -> {b}: {', '.join(sorted(why))}")
    for cycle in cycles:
        print(f"  cycle: {' <-> '.join(cycle)}")
