"""The served language model as GraphPipe sees it: its inputs, outputs and metadata.

    inputs   prompt       String  [-1]       a batch of UTF-8 prompts, generated concurrently
             prompt_ids   Int64   [-1, -1]   token ids (Int32 accepted), rows right-padded
                                             with -1
    outputs  text         String  [-1]       the text generated for each prompt
             token_ids    Int64   [-1, -1]   the generated token ids, rows padded with -1
             logprobs     Float32 [-1, -1]   each generated token's log-probability,
                                             padded with NaN
    config   a JSON object of sampling parameters (`app.protocols.graphpipe.config`)

A request sends exactly one input; without `input_names` it is recognised by its type.
Without `output_names` the answer is `text` (then `logprobs`, if the config asks).
"""

from __future__ import annotations

from app.engine.base import EngineInfo
from app.protocols.graphpipe.config import FIELDS
from app.protocols.graphpipe.metadata import IOMetadata, ModelMetadata
from app.protocols.graphpipe.tensors import TensorType

PROMPT = "prompt"
PROMPT_IDS = "prompt_ids"
TEXT = "text"
TOKEN_IDS = "token_ids"
LOGPROBS = "logprobs"
SERVER = "switchboard"

INPUTS = (
    IOMetadata(
        PROMPT,
        "A batch of prompts (UTF-8 strings); each is generated concurrently on the engine.",
        (-1,),
        TensorType.String,
    ),
    IOMetadata(
        PROMPT_IDS,
        "A batch of prompts as token ids, Int64 or Int32; rows are right-padded with -1.",
        (-1, -1),
        TensorType.Int64,
    ),
)

OUTPUTS = (
    IOMetadata(TEXT, "The text generated for each prompt.", (-1,), TensorType.String),
    IOMetadata(
        TOKEN_IDS,
        "The token ids generated for each prompt; rows are right-padded with -1.",
        (-1, -1),
        TensorType.Int64,
    ),
    IOMetadata(
        LOGPROBS,
        "The log-probability of each generated token; rows are right-padded with NaN.",
        (-1, -1),
        TensorType.Float32,
    ),
)

INPUT_NAMES = tuple(i.name for i in INPUTS)
OUTPUT_NAMES = tuple(o.name for o in OUTPUTS)


def describe(name: str, version: str, info: EngineInfo) -> ModelMetadata:
    """Metadata for `name`: the base model or one of its LoRA adapters."""
    what = (
        f"Language model `{name}`"
        if name == info.model_name
        else f"LoRA adapter `{name}` of the language model `{info.model_name}`"
    )
    description = (
        f"{what}: context of {info.max_model_len} tokens, vocabulary of {info.vocab_size}. "
        f"Send one input, `{PROMPT}` or `{PROMPT_IDS}`; choose outputs among "
        f"{', '.join(OUTPUT_NAMES)} with output_names (default: `{TEXT}`). The request's "
        f"config is a JSON object of sampling parameters: {', '.join(FIELDS)}."
    )
    return ModelMetadata(
        name=name,
        version=version,
        server=SERVER,
        description=description,
        inputs=INPUTS,
        outputs=OUTPUTS,
    )
