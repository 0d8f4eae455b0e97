"""Request bodies of the pooling endpoints, with OpenAI's (/v1/embeddings) and vLLM's names
(/pooling, /classify, /score, /rerank in the Jina and Cohere shapes). Strict types, as the
other bodies (protocol.py): a wrong type is a 400 naming the field."""
from __future__ import annotations

from typing import Literal, Union

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.protocol import ChatMessage, OpenAIBaseModel
from jaxvllm.pooling_params import PoolingParams

Input = Union[list[int], list[list[int]], str, list[str]]


class PoolingRequestBase(OpenAIBaseModel):
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True
    priority: int = 0

    def to_pooling_params(self, **kwargs) -> PoolingParams:
        """PoolingParams names the field it rejects first in its message: the 400's param."""
        try:
            return PoolingParams(truncate_prompt_tokens=self.truncate_prompt_tokens,
                                 **{k: v for k, v in kwargs.items() if v is not None})
        except ValueError as e:
            raise APIError(str(e), 400, str(e).split(" ", 1)[0]) from e


class EmbeddingRequest(PoolingRequestBase):
    """OpenAI's body; or vLLM's chat-style one, `messages` instead of `input`."""
    input: Input | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None


class PoolingRequest(EmbeddingRequest):
    task: str | None = None


class ClassificationRequest(PoolingRequestBase):
    input: Input
    use_activation: bool | None = None


class ScoreRequest(PoolingRequestBase):
    """text_1: one text scored against each of text_2, or one per text of text_2."""
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]
    use_activation: bool | None = None


class RerankRequest(PoolingRequestBase):
    """Jina's and Cohere's body: the documents ranked by their score against the query."""
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    use_activation: bool | None = None
