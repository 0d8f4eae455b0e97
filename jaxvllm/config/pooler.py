"""The runner a model runs under and its pooler, resolved as vLLM resolves them: `runner` auto
pools a `*ForSequenceClassification` checkpoint and generates with anything else; `convert`
auto classifies such a checkpoint and embeds with any other model under the pooling runner;
the pooler config's unset fields take the convert's defaults."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jaxvllm.config.json_section import section_fields
from jaxvllm.pooling_params import POOLING_TYPES


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model pools (vLLM's PoolerConfig): the hidden states of the LAST token,
    their MEAN, the first (CLS) token's, or ALL of them; L2-`normalize` embeddings; `softmax`
    a classifier's labels (its `use_activation`); `dimensions`: the Matryoshka default.
    None: the convert's default (embed: LAST, normalized; classify: LAST, softmax)."""
    pooling_type: str | None = None
    normalize: bool | None = None
    softmax: bool | None = None
    dimensions: int | None = None


RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")
_DEFAULTS = {"embed": PoolerConfig("LAST", normalize=True, softmax=False),
             "classify": PoolerConfig("LAST", normalize=False, softmax=True)}


def is_classifier(architectures) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in architectures or ())


def parse_pooler_config(value) -> PoolerConfig | None:
    """A PoolerConfig, a dict of its fields, or their JSON (the CLI's --pooler-config)."""
    value = section_fields(value, PoolerConfig, "pooler_config")
    return value if value is None or isinstance(value, PoolerConfig) else PoolerConfig(**value)


def resolve_runner(runner: str, convert: str, pooler_config, hf_config) -> tuple[str, str, PoolerConfig | None]:
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}.")
    if convert not in CONVERTS:
        raise ValueError(f"convert must be one of {CONVERTS}, got {convert!r}.")
    classifier = is_classifier(getattr(hf_config, "architectures", None))
    if runner == "auto":
        runner = "pooling" if classifier or convert in ("embed", "classify") else "generate"
    if runner == "generate":
        if convert not in ("auto", "none"):
            raise ValueError(f"convert={convert!r} needs runner='pooling'.")
        if pooler_config is not None:
            raise ValueError("pooler_config needs runner='pooling'.")
        if classifier:
            raise ValueError("A *ForSequenceClassification checkpoint has no LM head to generate with; "
                             "use runner='pooling'.")
        return "generate", "none", None
    if convert in ("auto", "none"):
        convert = "classify" if classifier else "embed"
    if convert == "classify" and not classifier:
        raise ValueError("convert='classify' needs a *ForSequenceClassification checkpoint (its score "
                         "head); this one has none. Use convert='embed'.")
    pooler = parse_pooler_config(pooler_config) or PoolerConfig()
    default = _DEFAULTS[convert]
    pooler = PoolerConfig(**{f.name: default.__dict__[f.name] if getattr(pooler, f.name) is None
                             else getattr(pooler, f.name) for f in dataclasses.fields(PoolerConfig)})
    pooler = dataclasses.replace(pooler, pooling_type=str(pooler.pooling_type).upper())
    if pooler.pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooler_config.pooling_type must be one of {POOLING_TYPES}, "
                         f"got {pooler.pooling_type!r}.")
    return "pooling", convert, pooler
