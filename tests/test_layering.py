"""The layers' import rules (docs/design.md), read from the source with ast, so that a
violation fails here instead of surfacing later as an import cycle or a slow front end."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxvllm"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function, relative imports resolved."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)
    return modules


def violations(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    return found


@pytest.mark.parametrize("layer, forbidden", [
    ("core", ("jaxvllm.engine", "jaxvllm.worker", "jaxvllm.executor", "jax", "flax")),  # host only
    ("worker", ("jaxvllm.engine", "jaxvllm.executor")),  # sees only SchedulerOutput
    ("executor", ("jaxvllm.engine",)),  # the engine drives executors, not the reverse
    ("engine", ("jaxvllm.models",)),  # config and tokenizer come from transformers_utils
    ("transformers_utils", ("jax", "flax")),  # the front end loads them
    ("lora", ("jax", "flax")),  # the front end checks adapters
])
def test_layer_imports(layer, forbidden):
    assert violations(layer, forbidden) == []


def test_async_llm_loads_no_model_loader_worker_or_jax():
    """The server's process tokenizes and streams; the model lives in the engine's process."""
    script = ("import json, sys, jaxvllm.engine.async_llm; print(json.dumps(sorted(m for m in sys.modules "
              "if m.split('.')[0] == 'jax' or m.startswith(('jaxvllm.models.loader', "
              "'jaxvllm.models.model_loader', 'jaxvllm.worker', 'jaxvllm.executor')))))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_the_scheduler_and_its_kv_connector_load_no_jax():
    """core/ is host only, and so is a KV connector's scheduler side (distributed/kv_transfer)."""
    script = ("import json, sys, jaxvllm.core.scheduler, jaxvllm.distributed.kv_transfer.offloading_connector; "
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
