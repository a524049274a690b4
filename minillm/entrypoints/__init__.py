"""How people reach the engine from outside Python code: the terminal chat (`python -m minillm.chat`) and the
OpenAI-compatible HTTP server (`python -m minillm.serve`, in openai/)."""
