"""The PromQL of vLLM's published Grafana dashboard (examples/observability/prometheus_grafana/
grafana.json, as on docs.vllm.ai in 2026-09: one entry per panel target, `$model_name` being the
dashboard's variable, filled from `label_values(model_name)`), and a matcher that finds the
series each query selects in a /metrics text: what a vLLM user's dashboard would show."""
from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

_RATE = "[$__rate_interval]"
_M = '{model_name="$model_name"}'
DASHBOARD_QUERIES = [
    *(f"histogram_quantile({q}, sum by(le) (rate(vllm:{h}_bucket{_M}{_RATE})))"
      for h in ("e2e_request_latency_seconds", "inter_token_latency_seconds",
                "request_time_per_output_token_seconds", "time_to_first_token_seconds")
      for q in ("0.99", "0.95", "0.9", "0.5")),
    *(f"rate(vllm:{h}_sum{_M}{_RATE})\n/\nrate(vllm:{h}_count{_M}{_RATE})"
      for h in ("e2e_request_latency_seconds", "inter_token_latency_seconds",
                "request_time_per_output_token_seconds", "time_to_first_token_seconds")),
    f"rate(vllm:prompt_tokens_total{_M}{_RATE})",
    f"rate(vllm:generation_tokens_total{_M}{_RATE})",
    f"vllm:num_requests_running{_M}",
    f"vllm:num_requests_waiting{_M}",
    f"vllm:kv_cache_usage_perc{_M}",
    f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{_M}{_RATE}))",
    f"sum by(le) (increase(vllm:request_generation_tokens_bucket{_M}{_RATE}))",
    f"sum by(finished_reason) (increase(vllm:request_success_total{_M}{_RATE}))",
    f"rate(vllm:request_queue_time_seconds_sum{_M}{_RATE})",
    f"rate(vllm:request_prefill_time_seconds_sum{_M}{_RATE})",
    f"rate(vllm:request_decode_time_seconds_sum{_M}{_RATE})",
    f"rate(vllm:request_max_num_generation_tokens_sum{_M}{_RATE})",
]
# A metric selector: name{label="value",...}; `by(...)` names labels the series must carry.
_SELECTOR = re.compile(r'(vllm:[a-zA-Z0-9_:]+)\{([^}]*)\}')
_MATCHER = re.compile(r'(\w+)="([^"]*)"')
_BY = re.compile(r'by\s*\(([^)]*)\)')


def selectors(query: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """(metric name, label matchers, grouping labels) of each selector in a query."""
    by = [label.strip() for group in _BY.findall(query) for label in group.split(",") if label.strip()]
    return [(name, dict(_MATCHER.findall(labels)), by) for name, labels in _SELECTOR.findall(query)]


def unmatched(metrics_text: str, model_name: str) -> list[str]:
    """The dashboard's selectors that select no series (empty: every panel has data)."""
    samples = [s for family in text_string_to_metric_families(metrics_text) for s in family.samples]
    label_values = {s.labels.get("model_name") for s in samples} - {None}
    missing = [] if model_name in label_values else [f"label_values(model_name) lacks {model_name!r}"]
    for query in DASHBOARD_QUERIES:
        for name, matchers, by in selectors(query.replace("$model_name", model_name)):
            if not any(s.name == name and all(s.labels.get(k) == v for k, v in matchers.items())
                       and all(label in s.labels for label in by) for s in samples):
                missing.append(f"{name}{matchers} by {by}")
    return missing
