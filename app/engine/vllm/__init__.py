"""vLLM behind the engine seam (`app.engine.base`): the only package that imports vLLM
(with `app.engine.readout_worker`, which runs inside vLLM's workers).

- `engine`: `VllmEngine`, the one in-process `AsyncLLM`: generate and run, abort, LoRA,
  readouts.
- `consumer`: the one consumer of the engine core's outputs, a loop per engine step over
  vLLM's own request states, in place of AsyncLLM's output handler.
- `aborts`: the aborts of one turn of the event loop sent to vLLM in one call.
- `startup`: building it from `Settings` (engine arguments, CPU host, tools, vision,
  readouts), and what the process does once it runs (the environment cache, the heap).
- `errors`: vLLM's exceptions -> `app.errors`, in one place (`map_engine_errors`).
- `params`: neutral `SamplingOptions` -> vLLM's `SamplingParams`.
- `convert`: AsyncLLM's `RequestOutput` deltas -> neutral `TokenEvent`s (logprobs
  included), and vLLM's logprobs as the seam's.
- `tokenizer`: the engine's tokenizer and vLLM's chat renderer behind `Tokenizer`.
- `render_process`, `render_child`: a prompt of over a MiB of text templated in a process
  of its own by the same renderer, off the serving process's lock (the server's end, the
  child's).
- `stats`: the engine core's own request counts, from its scheduler stats.
- `vision`: how a vision-language model lays images into its prompt.
- `structured`, `tools`: vLLM's structured-output backends and tool parsers;
  `json_grammar`: xgrammar's JSON, corrected; `call_grammar`: a forced tool call's
  constraint, lowered for the server's backend.
- `lora`: an adapter judged before vLLM is asked to load it.
- `hold`: the engine's processes outlive signals meant for the server, until it stops
  them.
- `cli_args`: vLLM's engine flags, parsed by vLLM's parser.
"""
