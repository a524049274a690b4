"""The OpenAI-compatible HTTP server over AsyncLLM (`python -m minillm.serve`), laid out as vLLM's: the request and
response models (protocol), what a request becomes (serving), the app and its routes (api_server), /metrics."""
