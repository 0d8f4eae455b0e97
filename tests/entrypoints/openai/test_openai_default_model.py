"""The official `openai` client against `jaxvllm serve` with the default model
(SmolLM2-135M-Instruct), small cpu-dev style settings."""
from __future__ import annotations

import openai
import pytest
from default_server import default_server, oai  # noqa: F401  (fixtures)

from jaxvllm.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colors."}]




@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer():
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    return load_tokenizer(default_model_path())


def test_completion_streaming_and_not_agree(oai, model, tokenizer):
    assert model == "SmolLM2-135M-Instruct"
    full = oai.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert full.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert full.usage.completion_tokens == 8 or full.choices[0].finish_reason == "stop"
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chunks = list(oai.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert "paris" in full.choices[0].text.lower()


def test_chat_streaming_and_not_agree(oai, model, tokenizer):
    full = oai.chat.completions.create(model=model, messages=MESSAGES, max_completion_tokens=12,
                                       temperature=0)
    text = full.choices[0].message.content
    assert text and full.choices[0].message.role == "assistant"
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                               return_dict=False)
    assert full.usage.prompt_tokens == len(prompt_ids)
    if full.choices[0].finish_reason == "length":
        assert full.usage.completion_tokens == 12
    chunks = list(oai.chat.completions.create(model=model, messages=MESSAGES, max_completion_tokens=12,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_n_equals_2(oai, model):
    try:
        SamplingParams(n=2)
    except ValueError as e:
        pytest.skip(f"parallel sampling not in this build's SamplingParams yet: {e}")
    out = oai.completions.create(model=model, prompt=PROMPT, max_tokens=6, n=2, temperature=1.0, seed=3)
    assert [c.index for c in out.choices] == [0, 1]
    chat = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=2, seed=3)
    assert [c.index for c in chat.choices] == [0, 1]
    assert 2 <= out.usage.completion_tokens <= 12 and 2 <= chat.usage.completion_tokens <= 12


def test_stop_strings(oai, model):
    text = oai.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    cut = text.index(stop)
    out = oai.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == text[:cut]
    chat = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0,
                                       stop=["\n", ","])
    assert "\n" not in chat.choices[0].message.content and "," not in chat.choices[0].message.content


def test_seed_reproducibility(oai, model):
    def sample(seed):
        return oai.completions.create(model=model, prompt="Once upon a time", max_tokens=12,
                                      temperature=1.0, seed=seed).choices[0].text
    first = sample(1234)
    assert sample(1234) == first
    chat = [oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=1.0,
                                        seed=99).choices[0].message.content for _ in range(2)]
    assert chat[0] == chat[1]


def test_errors_through_the_client(oai, model):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=5)
    bad = openai.OpenAI(base_url=str(oai.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model, prompt=PROMPT, max_tokens=5)
