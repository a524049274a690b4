"""The engine's statistics as Prometheus metrics under vLLM's names, so that vLLM's dashboards read minillm too."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minillm.metrics.stats import IterationStats, SchedulerStats

# vLLM's buckets, in seconds; inter-token latency adds 1-5 ms ones, where a small model on a CPU decodes
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class PrometheusStatLogger:
    """An AsyncLLM stat logger (vLLM's name) writing into a registry of its own, not prometheus_client's global
    one, so that several servers in one process (tests, a notebook) keep apart. Counters get the _total suffix.
    Every series is labelled with the engine core it counts (engine="0", "1", ... with --data-parallel-size), as
    vLLM labels them: sum over `engine` for the whole server."""

    def __init__(self, model_name: str, num_engines: int = 1):
        self.registry = CollectorRegistry()
        families = MetricFamilies(self.registry)
        self.engines = [families.labels(model_name, str(i)) for i in range(num_engines)]

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats, engine_idx: int = 0) -> None:
        """Set and add to the series of engine core `engine_idx`."""
        m = self.engines[engine_idx]
        m.num_requests_running.set(scheduler_stats.num_running_reqs)
        m.num_requests_waiting.set(scheduler_stats.num_waiting_reqs)
        m.kv_cache_usage.set(scheduler_stats.kv_cache_usage)
        m.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        m.generation_tokens.inc(iteration_stats.num_generation_tokens)
        m.num_preemptions.inc(scheduler_stats.num_preempted_reqs)
        m.prefix_cache_queries.inc(iteration_stats.prefix_cache_queries)
        m.prefix_cache_hits.inc(iteration_stats.prefix_cache_hits)
        for counter, value in zip(m.spec_decode, scheduler_stats.spec_decode):
            counter.inc(value)
        for histogram, values in (
            (m.time_to_first_token, iteration_stats.time_to_first_tokens_iter),
            (m.inter_token_latency, iteration_stats.inter_token_latencies_iter),
            (m.e2e_request_latency, iteration_stats.e2e_latencies),
        ):
            for value in values:
                histogram.observe(value)


class MetricFamilies:
    """vLLM's metrics, each a family of series labelled by model and engine; `labels` gives one engine's series."""

    def __init__(self, registry: CollectorRegistry):
        def metric(kind, name, documentation, **kwargs):
            return kind(name, documentation, ["model_name", "engine"], registry=registry, **kwargs)

        self.num_requests_running = metric(Gauge, "vllm:num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = metric(Gauge, "vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = metric(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.prompt_tokens = metric(Counter, "vllm:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = metric(Counter, "vllm:generation_tokens", "Generated tokens.")
        self.num_preemptions = metric(Counter, "vllm:num_preemptions", "Preemptions of running requests.")
        self.prefix_cache_queries = metric(
            Counter, "vllm:prefix_cache_queries", "Prefix-cache queries, in prompt tokens looked up."
        )
        self.prefix_cache_hits = metric(Counter, "vllm:prefix_cache_hits", "Prefix-cache hits, in cached tokens.")
        self.spec_decode = [  # speculative decoding (chapter 13), counted as in SchedulerStats.spec_decode
            metric(Counter, "vllm:spec_decode_num_drafts", "Verify runs: a request's drafts checked in one step."),
            metric(Counter, "vllm:spec_decode_num_draft_tokens", "Draft tokens verified."),
            metric(Counter, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."),
        ]
        self.time_to_first_token = metric(
            Histogram,
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first token.",
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.inter_token_latency = metric(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Time between two tokens of a request.",
            buckets=INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e_request_latency = metric(
            Histogram,
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to the last token, of finished requests.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )

    def labels(self, *values: str) -> SimpleNamespace:
        """Each metric's series with these label values, by the metric's attribute name."""
        return SimpleNamespace(**{
            name: [m.labels(*values) for m in family] if isinstance(family, list) else family.labels(*values)
            for name, family in vars(self).items()
        })  # fmt: skip
