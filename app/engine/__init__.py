"""The engine seam: neutral types every protocol speaks, and the only package that imports
vLLM (`vllm/`, with `readout_worker`, which runs inside vLLM's workers).

- `base`: the `Engine` protocol and the neutral types (`GenerationRequest`,
  `TokenEvent`, `ChatPrompt`, `Tokenizer`, `EngineInfo`);
- `validation`: the sampling limits, the constraint check and the prompt fit every
  protocol shares; `models`: the one model lookup (base model or LoRA adapter);
- `constraints`: the neutral output constraint; `tools`: the neutral tool seam (specs,
  choices, parsed calls, `ToolSupport.plan`);
- `images`: image decoding and counting, prompts with images for vLLM;
- `concepts`, `readout_client`, `readout_worker`: Salience's concept readouts (the files,
  the frontend's batching, the capture inside vLLM's workers); `preflight`: the
  start-up files (concepts, LoRA directories) checked without vLLM;
- `batch_gate`: requests that must run alone in an engine step;
- `cpu_host`: what a CPU build needs of its host (KV cache, niceness, pinning, the
  compile cache); `announce`: what the server tells the engine's processes as they start;
- `runtime_lora`: which LoRA adapters the control plane may load while the server runs;
- `turn`: the prompt turn, one build at a time, first come first served, given up while a
  build waits on another process;
- `vllm/`: `VllmEngine` over vLLM's `AsyncLLM`, split by concern.
"""
