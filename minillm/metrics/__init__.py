"""What the engine measures about itself (vLLM's vllm/v1/metrics): statistics made per step, turned into metrics by
stat loggers (the server's Prometheus /metrics)."""
