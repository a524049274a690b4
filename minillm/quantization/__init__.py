"""Chapter 14, quantization: fewer bytes per weight. A batch-1 decode step reads every weight once, so its time is
the weights' bytes over the memory's bandwidth; int8 reads a quarter of float32's bytes, GGUF's Q4_1 blocks about
a seventh. `formats` says what each byte means and holds the torch references, `methods` the linear methods the
platform picks for `LLM(..., quantization="int8" | "gguf")`, `kernels` the C++ matmuls that read the blocks."""
