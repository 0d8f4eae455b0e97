"""OutputProcessor: a request whose output cannot be processed, or that the engine failed,
ends with an error of its own while the others in the same step go on."""
from __future__ import annotations

import asyncio

import pytest

from jaxvllm.engine.exceptions import EngineGenerateError
from jaxvllm.engine.messages import EngineCoreRequest
from jaxvllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from jaxvllm.outputs import EngineCoreOutput, FinishReason
from jaxvllm.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def tok():
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    return load_tokenizer(default_model_path())


def request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=8,
                             output_kind=RequestOutputKind.DELTA), eos_token_id=2, sampling_seed=0,
                             arrival_time=0.0)


def test_one_faulty_output_fails_its_request_only(tok):
    async def main():
        proc = OutputProcessor(tok)
        queues = {r: RequestOutputCollector(RequestOutputKind.DELTA) for r in ("a", "b", "c")}
        for r, q in queues.items():
            proc.add_request(request(r), None, q)

        def fault(*args):  # a fault in request a's detokenizer only
            raise RuntimeError("cannot decode")
        proc.request_states["a"].detokenizer.update = fault
        _, to_abort = proc.process_outputs([
            EngineCoreOutput("a", tok.encode(" hello")), EngineCoreOutput("b", tok.encode(" world")),
            EngineCoreOutput("c", [], FinishReason.ERROR, error="The engine rejected the request.")])
        assert to_abort == ["a"]  # its blocks go back; "c" is gone from the engine already
        with pytest.raises(EngineGenerateError, match="Processing this request's output failed"):
            await queues["a"].get()
        with pytest.raises(EngineGenerateError, match="rejected"):
            await queues["c"].get()
        assert (await queues["b"].get()).outputs[0].text == " world"
        assert proc.get_num_unfinished_requests() == 1  # "b" goes on
        proc.process_outputs([EngineCoreOutput("b", tok.encode("!"), FinishReason.LENGTH)])
        assert proc.get_num_unfinished_requests() == 0
    asyncio.run(main())
