"""Prometheus metrics with vLLM's metric names under a `jaxvllm:` prefix.

A stat logger (`record` is called by AsyncLLM after every batch of engine outputs) that
owns its registry, so several servers in one process (tests) never collide. As in vLLM,
what an engine core reports carries an `engine` label ("0", "1", ... with data
parallelism); what the server counts itself does not.
"""
from __future__ import annotations

import prometheus_client as prom

from jaxvllm.core.stats import SchedulerStats

_LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0]
_TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


class PrometheusStatLogger:
    def __init__(self, model_name: str, num_engines: int = 1):
        self.registry = prom.CollectorRegistry()
        labels = {"model_name": model_name}

        def make(kind, name, doc, per_engine=True, **kw):
            extra = kw.pop("labelnames", [])
            names = ["model_name", "engine"] if per_engine else ["model_name"]
            metric = kind(f"jaxvllm:{name}", doc, labelnames=names + extra,
                          registry=self.registry, **kw)
            for engine in range(num_engines if per_engine and not extra else 0):
                metric.labels(**labels, engine=str(engine))  # each core's series, from the start
            return metric

        g, c, h = prom.Gauge, prom.Counter, prom.Histogram
        self.num_running = make(g, "num_requests_running", "Requests in the running batch.")
        self.num_waiting = make(g, "num_requests_waiting", "Requests waiting to be scheduled.")
        self.num_swapped = make(g, "num_requests_swapped", "Requests swapped to host memory.")
        self.kv_usage = make(g, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.free_blocks = make(g, "kv_cache_free_blocks", "Free KV-cache blocks (cached ones included).")
        self.total_blocks = make(g, "kv_cache_total_blocks", "Usable KV-cache blocks.")
        self.hit_rate = make(g, "prefix_cache_hit_rate", "Prefix-cache hits / queries since start (0-1).")
        self.compilations = make(g, "num_compilations", "XLA programs compiled by the engine so far.")
        self.prefix_queries = make(c, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = make(c, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = make(c, "num_preemptions", "Preemptions (recompute and swap).")
        self.prompt_tokens = make(c, "prompt_tokens", "Prompt tokens of requests that started decoding.")
        self.generation_tokens = make(c, "generation_tokens", "Generated tokens.")
        self.request_success = make(c, "request_success", "Finished requests by finish reason.",
                                    labelnames=["finished_reason"])
        self.aborted_by_server = make(c, "num_requests_aborted",
                                      "Requests the server aborted before they finished "
                                      "(client disconnects, a failed sibling prompt).",
                                      per_engine=False).labels(**labels)
        self.ttft = make(h, "time_to_first_token_seconds", "Time to first token.",
                         buckets=_LATENCY_BUCKETS)
        self.tpot = make(h, "time_per_output_token_seconds", "Time between consecutive tokens.",
                         buckets=_LATENCY_BUCKETS)
        self.e2e = make(h, "e2e_request_latency_seconds", "Arrival to finish of a request.",
                        buckets=_LATENCY_BUCKETS)
        self.request_prompt = make(h, "request_prompt_tokens", "Prompt length of finished requests.",
                                   buckets=_TOKEN_BUCKETS)
        self.request_generation = make(h, "request_generation_tokens",
                                       "Generated tokens of finished requests.", buckets=_TOKEN_BUCKETS)
        self._labels = labels
        # The engine reports cumulative counts; Prometheus counters only move by increments.
        self._last: dict[int, SchedulerStats] = {}

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats, engine: int = 0) -> None:
        if scheduler_stats is not None:
            self.update_scheduler(scheduler_stats, engine)
        if iteration_stats is None:
            return
        it = iteration_stats
        labels = dict(self._labels, engine=str(engine))
        self.prompt_tokens.labels(**labels).inc(it.num_prompt_tokens)
        self.generation_tokens.labels(**labels).inc(it.num_generation_tokens)
        for t in it.time_to_first_tokens_iter:
            self.ttft.labels(**labels).observe(t)
        for t in it.inter_token_latencies_iter:
            self.tpot.labels(**labels).observe(t)
        for req in it.finished_requests:
            self.request_success.labels(finished_reason=req.finish_reason, **labels).inc()
            self.e2e.labels(**labels).observe(req.e2e_latency)
            self.request_prompt.labels(**labels).observe(req.num_prompt_tokens)
            self.request_generation.labels(**labels).observe(req.num_generation_tokens)

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
