"""How people reach the engine from outside Python code: the terminal chat (`python -m minillm.chat`) and the
OpenAI-compatible HTTP server (`python -m minillm.serve`, in openai/)."""

# What both run with unless --enforce-eager: the batch-1 decode step compiled when the engine starts (on a CPU the
# default is op by op, which suits notebooks that build many engines, not a process that serves for hours); larger
# batches run op by op, so none waits for the compiler while serving.
COMPILED_BATCH_1 = dict(enforce_eager=False, cudagraph_capture_sizes=[1])
ENFORCE_EAGER_HELP = "decode op by op (default: the batch-1 step compiled at start, some seconds once per model)"
