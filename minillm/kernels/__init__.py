"""Every kernel minillm runs in place of torch ops, in one place, as vLLM keeps csrc/ and _custom_ops.py:

- csrc/: the C++ kernels for the CPU (decode attention, the KV-cache store, the elementwise layers, the float32 and
  quantized matmuls), built on first use by minillm.kernels.cpu, which also wraps each op;
- packing.py: the weight layouts those matmuls read, made once at load;
- triton/: chapter 09's and chapter 14's Triton kernels (CUDA, or Triton's interpreter on a CPU).

The layers choose among them through the platform (minillm.platforms); nothing outside this package builds or
loads a native extension. Importing this package imports neither Triton nor the extension."""
