"""The front end compiles each new grammar in a process of its own: one that crashes
llguidance's compiler (a 5,000-rule Lark chain overflows its stack) is a ValueError naming
the problem, and the next grammar is checked by a fresh process."""
from __future__ import annotations

import pytest

from jaxvllm.engine.grammar_sandbox import GrammarSandbox
from jaxvllm.sampling_params import StructuredOutputsParams as SOP


def lark_chain(n: int) -> str:
    return "start: a0\n" + "".join(f"a{i}: a{i + 1}\n" for i in range(n)) + f'a{n}: "x"\n'


@pytest.fixture(scope="module")
def sandbox():
    box = GrammarSandbox()
    yield box
    box.close()


def test_a_crash_is_the_requests_error_and_the_next_check_works(sandbox):
    sandbox.check(SOP(grammar=lark_chain(100)))
    first = sandbox._proc.pid
    with pytest.raises(ValueError, match="crashed its compiler"):
        sandbox.check(SOP(grammar=lark_chain(5000)))
    sandbox.check(SOP(json={"type": "integer"}))
    assert sandbox._proc.pid != first


@pytest.mark.parametrize("params,match", [
    (SOP(regex="(a"), "does not compile"),
    (SOP(json={"enum": list(range(20_000))}), "enum/const values"),
    (SOP(json={"type": "integer", "x": float("nan")}), "must hold JSON values"),
])
def test_refusals_name_the_problem(sandbox, params, match):
    with pytest.raises(ValueError, match=match):
        sandbox.check(params)
