"""The notebooks run top to bottom in a real Jupyter kernel (nbclient) with the default model:
what a user opening them gets, including the trace parsing and the plots. The three build
LLM()'s default engine, as the README's examples do, so in the suite they load the step
programs that tests/entrypoints/test_readme_scripts.py compiled."""
from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def text_of(nb) -> str:
    return "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for o in cell.outputs)


def images_of(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
            if "image/png" in o.get("data", {})]


@pytest.mark.slow
def test_quickstart_runs_top_to_bottom():
    nb = execute("quickstart.ipynb")
    text = text_of(nb)
    assert "engine ready in" in text
    assert "The capital of France is" in text
    assert "chunks, finish_reason=length]" in text or "chunks, finish_reason=stop]" in text


@pytest.mark.slow
def test_profiling_parses_the_trace_and_plots():
    nb = execute("profiling.ipynb")
    text = text_of(nb)
    assert "engine steps; mean step" in text
    for span in ("schedule", "prepare_inputs", "model_step", "sampling", "update_from_output"):
        assert f"  {span} " in text
    assert "compilations after warm-up: 0" in text
    assert len(images_of(nb)) == 2  # per-step host/device bars, throughput curve


@pytest.mark.slow
def test_rl_loop_changes_the_outputs_without_compiling():
    text = text_of(execute("rl_loop.ipynb"))
    assert "is_sleeping=True" in text
    assert "outputs changed: True" in text
    assert "step programs compiled since the first generate: 0" in text
