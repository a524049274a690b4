"""The errors a front end hands its callers (vLLM's vllm/v1/engine/exceptions.py)."""


class EngineError(RuntimeError):
    """The engine could not serve this request: its step failed (alone: the other requests go on), or the front end
    was closed. A server answers 500."""


class EngineDeadError(EngineError):
    """The engine core is gone (its process died, or a failure stopped it): every waiting request fails with this,
    and nothing more can be served. A server reports itself unhealthy (503)."""


class QueueFullError(RuntimeError):
    """max_queue requests are already waiting for their first token (a server answers 429: retry later)."""
