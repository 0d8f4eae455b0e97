"""Prometheus metrics under vLLM's V1 names, labels and buckets (`vllm/v1/metrics/loggers.py`),
so that vLLM's Grafana dashboard, KEDA rules and production stacks read a jaxvllm server
unchanged; what only jaxvllm has (compilations, swapped requests, free blocks) is `jaxvllm:`.

A stat logger (`record` is called by AsyncLLM after every batch of engine outputs) that
owns its registry, so several servers in one process (tests) never collide. As in vLLM,
what an engine core reports carries an `engine` label ("0", "1", ... with data
parallelism) beside `model_name`; what the server counts itself carries `model_name` only.
"""
from __future__ import annotations

import dataclasses

import prometheus_client as prom

from jaxvllm.core.stats import SchedulerStats
from jaxvllm.outputs import FinishReason

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
_REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                            50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class PrometheusStatLogger:
    def __init__(self, model_name: str, num_engines: int = 1, vllm_config=None):
        self.registry = prom.CollectorRegistry()
        self._labels = labels = {"model_name": model_name}
        self._num_engines = num_engines
        max_len = vllm_config.scheduler.max_model_len if vllm_config is not None else 2048
        token_buckets = build_1_2_5_buckets(max_len)

        def make(kind, name, doc, per_engine=True, **kw):
            extra = kw.pop("labelnames", [])
            names = ["model_name", "engine"] if per_engine else ["model_name"]
            metric = kind(name, doc, labelnames=names + extra, registry=self.registry, **kw)
            for engine in range(num_engines if per_engine and not extra else 0):
                metric.labels(**labels, engine=str(engine))  # each core's series, from the start
            return metric

        g, c, h = prom.Gauge, prom.Counter, prom.Histogram
        self.num_running = make(g, "vllm:num_requests_running", "Requests in the running batch.")
        self.num_waiting = make(g, "vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = make(g, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.num_swapped = make(g, "jaxvllm:num_requests_swapped", "Requests swapped to host memory.")
        self.free_blocks = make(g, "jaxvllm:kv_cache_free_blocks",
                                "Free KV-cache blocks (cached ones included).")
        self.total_blocks = make(g, "jaxvllm:kv_cache_total_blocks", "Usable KV-cache blocks.")
        self.hit_rate = make(g, "jaxvllm:prefix_cache_hit_rate",
                             "Prefix-cache hits / queries since start (0-1).")
        self.compilations = make(g, "jaxvllm:num_compilations", "XLA programs compiled by the engine so far.")
        self.prefix_queries = make(c, "vllm:prefix_cache_queries",
                                   "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = make(c, "vllm:prefix_cache_hits",
                                "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = make(c, "vllm:num_preemptions", "Cumulative number of preemptions.")
        # A KV connector's (vLLM's names): tokens looked up and found past the device's prefix
        # cache, and the offload tier's transfers by transfer_type (e.g. TPU_to_CPU).
        self.external_queries = make(c, "vllm:external_prefix_cache_queries",
                                     "External prefix cache queries from KV connector cross-instance cache "
                                     "sharing, in terms of number of queried tokens.")
        self.external_hits = make(c, "vllm:external_prefix_cache_hits",
                                  "External prefix cache hits from KV connector cross-instance cache "
                                  "sharing, in terms of number of cached tokens.")
        self.offload_bytes = make(c, "vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV connector",
                                  labelnames=["transfer_type"])
        self.offload_time = make(c, "vllm:kv_offload_total_time",
                                 "Total time measured by all KV offloading operations",
                                 labelnames=["transfer_type"])
        # Disaggregated prefill (JaxTransferConnector): its counters, by name (sent_requests,
        # sent_bytes, received_requests, received_bytes, failed_receives, expired_sends, ...).
        self.kv_transfer = make(c, "jaxvllm:kv_transfer", "KV moved between prefill and decode engines.",
                                labelnames=["counter"])
        self.prefill_computed = make(c, "jaxvllm:prefill_tokens_computed",
                                     "Prompt tokens computed here (prefix-cache hits and transferred KV skipped).")
        # Speculative decoding (vLLM's SpecDecodingProm): (counter, SchedulerStats field).
        self.spec_counters = [
            (make(c, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."), "spec_decode_num_drafts"),
            (make(c, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
             "spec_decode_num_draft_tokens"),
            (make(c, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
             "spec_decode_num_accepted_tokens")]
        self.spec_per_pos = make(c, "vllm:spec_decode_num_accepted_tokens_per_pos",
                                 "Accepted tokens per draft position.", labelnames=["position"])
        self.prompt_tokens = make(c, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(c, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = make(c, "vllm:request_success", "Count of successfully processed requests.",
                                    labelnames=["finished_reason"])
        for engine in range(num_engines):  # every reason's series from the start, as in vLLM
            for reason in FinishReason:
                self.request_success.labels(**labels, engine=str(engine), finished_reason=str(reason))
        self.aborted_by_server = make(c, "jaxvllm:num_requests_aborted",
                                      "Requests the server aborted before they finished "
                                      "(client disconnects, a failed sibling prompt).",
                                      per_engine=False).labels(**labels)

        def hist(name, doc, buckets):
            return make(h, name, doc, buckets=buckets)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        _ITL_BUCKETS)
        self.request_tpot = hist("vllm:request_time_per_output_token_seconds",
                                 "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        _REQUEST_LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               _REQUEST_LATENCY_BUCKETS)
        self.inference_time = hist("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   _REQUEST_LATENCY_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 _REQUEST_LATENCY_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                _REQUEST_LATENCY_BUCKETS)
        self.request_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                   token_buckets)
        self.request_generation = hist("vllm:request_generation_tokens",
                                       "Number of generation tokens processed.", token_buckets)
        self.max_generation = hist("vllm:request_max_num_generation_tokens",
                                   "Histogram of maximum number of requested generation tokens.",
                                   token_buckets)
        self.params_max_tokens = hist("vllm:request_params_max_tokens",
                                      "Histogram of the max_tokens request parameter.", token_buckets)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.",
                             [1, 2, 5, 10, 20])
        self.iteration_tokens = hist("vllm:iteration_tokens_total",
                                     "Histogram of number of tokens per engine_step.",
                                     _ITERATION_TOKEN_BUCKETS)
        if vllm_config is not None:
            self._cache_config_info(vllm_config.cache)
        # The engine reports cumulative counts; Prometheus counters only move by increments.
        self._last: dict[int, SchedulerStats] = {}

    def _cache_config_info(self, cache) -> None:
        """vLLM's `vllm:cache_config_info`: a gauge at 1 whose labels are the cache config."""
        info = {k: str(v) for k, v in dataclasses.asdict(cache).items()}
        gauge = prom.Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                           labelnames=[*info, "engine"], registry=self.registry)
        for engine in range(self._num_engines):
            gauge.labels(**info, engine=str(engine)).set(1)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats, engine: int = 0) -> None:
        if scheduler_stats is not None:
            self.update_scheduler(scheduler_stats, engine)
        if iteration_stats is None:
            return
        it = iteration_stats
        labels = dict(self._labels, engine=str(engine))

        def observe(metric, values):
            child = metric.labels(**labels)
            for v in values:
                child.observe(v)

        self.prompt_tokens.labels(**labels).inc(it.num_prompt_tokens)
        self.generation_tokens.labels(**labels).inc(it.num_generation_tokens)
        if it.num_prompt_tokens or it.num_generation_tokens:
            self.iteration_tokens.labels(**labels).observe(it.num_prompt_tokens + it.num_generation_tokens)
        observe(self.ttft, it.time_to_first_tokens_iter)
        observe(self.itl, it.inter_token_latencies_iter)
        observe(self.max_generation, it.max_num_generation_tokens_iter)
        observe(self.params_n, it.n_params_iter)
        done = it.finished_requests
        for req in done:
            self.request_success.labels(finished_reason=req.finish_reason, **labels).inc()
        for metric, attr in ((self.e2e, "e2e_latency"), (self.queue_time, "queued_time"),
                             (self.prefill_time, "prefill_time"), (self.decode_time, "decode_time"),
                             (self.inference_time, "inference_time"),
                             (self.request_tpot, "mean_time_per_output_token"),
                             (self.request_prompt, "num_prompt_tokens"),
                             (self.request_generation, "num_generation_tokens")):
            observe(metric, [getattr(req, attr) for req in done])
        observe(self.params_max_tokens, [r.max_tokens_param for r in done if r.max_tokens_param])

    def update_scheduler(self, s: SchedulerStats, engine: int = 0) -> None:
        labels = dict(self._labels, engine=str(engine))
        for gauge, value in ((self.num_running, s.num_running_reqs), (self.num_waiting, s.num_waiting_reqs),
                             (self.num_swapped, s.num_swapped_reqs), (self.kv_usage, s.kv_cache_usage),
                             (self.free_blocks, s.num_free_blocks), (self.total_blocks, s.num_total_blocks),
                             (self.hit_rate, s.prefix_cache_hit_rate),
                             (self.compilations, s.num_compilations)):
            gauge.labels(**labels).set(value)
        last = self._last.get(engine, SchedulerStats())
        self.prefix_queries.labels(**labels).inc(max(0, s.prefix_cache_queries - last.prefix_cache_queries))
        self.prefix_hits.labels(**labels).inc(max(0, s.prefix_cache_hits - last.prefix_cache_hits))
        self.preemptions.labels(**labels).inc(max(0, s.num_preemptions - last.num_preemptions))
        before = last.kv_connector_stats
        for name, value in s.kv_connector_stats.items():
            delta = max(0, value - before.get(name, 0))
            if name == "external_prefix_cache_queries":
                self.external_queries.labels(**labels).inc(delta)
            elif name == "external_prefix_cache_hits":
                self.external_hits.labels(**labels).inc(delta)
            elif name.endswith(("_total_bytes", "_total_time")):
                transfer_type, _, unit = name.rpartition("_total_")
                metric = self.offload_bytes if unit == "bytes" else self.offload_time
                metric.labels(**labels, transfer_type=transfer_type).inc(delta)
            elif name.startswith("kv_transfer_"):
                self.kv_transfer.labels(**labels, counter=name[len("kv_transfer_"):]).inc(delta)
        self.prefill_computed.labels(**labels).inc(max(0, s.num_prefill_tokens - last.num_prefill_tokens))
        for counter, name in self.spec_counters:
            counter.labels(**labels).inc(max(0, getattr(s, name) - getattr(last, name)))
        before = last.spec_decode_num_accepted_tokens_per_pos
        for pos, count in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
            self.spec_per_pos.labels(**labels, position=str(pos)).inc(
                max(0, count - (before[pos] if pos < len(before) else 0)))
        self._last[engine] = s

    def drop_engine(self, engine: int) -> None:
        """A dead core's gauges go: it runs nothing and holds no cache any more."""
        for gauge in (self.num_running, self.num_waiting, self.num_swapped, self.kv_usage,
                      self.free_blocks, self.total_blocks, self.hit_rate, self.compilations):
            try:
                gauge.remove(self._labels["model_name"], str(engine))
            except KeyError:
                pass

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)
