"""The Prometheus logger under vLLM's V1 names: what the engine core and the front end
report lands in vLLM's metrics, with vLLM's labels and buckets."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from jaxvllm.config.engine_config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.metrics.prometheus import PrometheusStatLogger, build_1_2_5_buckets
from jaxvllm.metrics.stats import IterationStats, RequestStateStats


def samples(logger) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(logger.render().decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_buckets_are_vllms():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(2048)[-1] == 2000


def test_a_request_fills_vllms_histograms_and_counters():
    config = EngineConfig(model=ModelConfig(model="m"), cache=CacheConfig(block_size=16),
                          scheduler=SchedulerConfig(max_model_len=2048))
    logger = PrometheusStatLogger("m", 1, config)
    logger.record(SchedulerStats(num_running_reqs=1, kv_cache_usage=0.5, prefix_cache_queries=32,
                                 prefix_cache_hits=16, num_preemptions=1), None)
    it = IterationStats()
    req = RequestStateStats(arrival_time=100.0, max_tokens_param=3)
    req.update(1, 100.5, 7, it, queued_time=0.25, prefill_time=0.2)  # first token
    req.update(1, 100.6, 7, it)
    req.update(1, 100.8, 7, it)
    req.finish("length", 101.0, 7, it)
    it.max_num_generation_tokens_iter.append(3)
    it.n_params_iter.append(1)
    logger.record(None, it)
    m = samples(logger)
    base = "engine=0,model_name=m"
    assert m[f"vllm:num_requests_running{{{base}}}"] == 1
    assert m[f"vllm:kv_cache_usage_perc{{{base}}}"] == 0.5
    assert m[f"vllm:prefix_cache_queries_total{{{base}}}"] == 32
    assert m[f"vllm:prefix_cache_hits_total{{{base}}}"] == 16
    assert m[f"vllm:num_preemptions_total{{{base}}}"] == 1
    assert m[f"vllm:prompt_tokens_total{{{base}}}"] == 7
    assert m[f"vllm:generation_tokens_total{{{base}}}"] == 3
    assert m["vllm:request_success_total{engine=0,finished_reason=length,model_name=m}"] == 1
    assert m[f"vllm:iteration_tokens_total_sum{{{base}}}"] == 10
    for name, value in [("time_to_first_token_seconds", 0.5), ("e2e_request_latency_seconds", 1.0),
                        ("request_queue_time_seconds", 0.25), ("request_prefill_time_seconds", 0.2),
                        ("request_decode_time_seconds", 0.3), ("request_inference_time_seconds", 0.5),
                        ("inter_token_latency_seconds", 0.3),
                        ("request_time_per_output_token_seconds", 0.15),
                        ("request_max_num_generation_tokens", 3), ("request_params_max_tokens", 3)]:
        assert abs(m[f"vllm:{name}_sum{{{base}}}"] - value) < 1e-9, name
    assert m["vllm:time_to_first_token_seconds_bucket{engine=0,le=2560.0,model_name=m}"] == 1  # vLLM's top bucket
    assert m["vllm:request_prompt_tokens_bucket{engine=0,le=2000.0,model_name=m}"] == 1  # 1-2-5 to max_model_len
    info = [k for k in m if k.startswith("vllm:cache_config_info{")]
    assert len(info) == 1 and "block_size=16" in info[0] and "engine=0" in info[0]
    assert m[info[0]] == 1
    assert f"jaxvllm:num_compilations{{{base}}}" in m  # jaxvllm's own keep their prefix


def test_spec_decode_counters_use_vllms_names():
    logger = PrometheusStatLogger("m", 1, None)
    logger.record(SchedulerStats(spec_decode_num_drafts=3, spec_decode_num_draft_tokens=9,
                                 spec_decode_num_accepted_tokens=5,
                                 spec_decode_num_accepted_tokens_per_pos=[3, 2, 0]), None)
    logger.record(SchedulerStats(spec_decode_num_drafts=4, spec_decode_num_draft_tokens=12,
                                 spec_decode_num_accepted_tokens=7,
                                 spec_decode_num_accepted_tokens_per_pos=[4, 2, 1]), None)
    m = samples(logger)
    base = "engine=0,model_name=m"
    assert m[f"vllm:spec_decode_num_drafts_total{{{base}}}"] == 4
    assert m[f"vllm:spec_decode_num_draft_tokens_total{{{base}}}"] == 12
    assert m[f"vllm:spec_decode_num_accepted_tokens_total{{{base}}}"] == 7
    assert [m[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{base},position={i}}}"]
            for i in range(3)] == [4, 2, 1]


def test_kv_connector_counters_use_vllms_names():
    """The offload connector's cumulative counters move vLLM's external prefix cache and
    kv_offload counters by their increments, per transfer type."""
    logger = PrometheusStatLogger("m", 1, None)
    logger.record(SchedulerStats(kv_connector_stats={
        "external_prefix_cache_queries": 100, "external_prefix_cache_hits": 32,
        "TPU_to_CPU_total_bytes": 4096, "TPU_to_CPU_total_time": 0.5,
        "CPU_to_TPU_total_bytes": 0, "CPU_to_TPU_total_time": 0.0}), None)
    logger.record(SchedulerStats(kv_connector_stats={
        "external_prefix_cache_queries": 150, "external_prefix_cache_hits": 64,
        "TPU_to_CPU_total_bytes": 8192, "TPU_to_CPU_total_time": 0.75,
        "CPU_to_TPU_total_bytes": 2048, "CPU_to_TPU_total_time": 0.25}), None)
    m = samples(logger)
    base = "engine=0,model_name=m"
    assert m[f"vllm:external_prefix_cache_queries_total{{{base}}}"] == 150
    assert m[f"vllm:external_prefix_cache_hits_total{{{base}}}"] == 64
    assert m[f"vllm:kv_offload_total_bytes_total{{{base},transfer_type=TPU_to_CPU}}"] == 8192
    assert m[f"vllm:kv_offload_total_bytes_total{{{base},transfer_type=CPU_to_TPU}}"] == 2048
    assert m[f"vllm:kv_offload_total_time_total{{{base},transfer_type=TPU_to_CPU}}"] == 0.75
