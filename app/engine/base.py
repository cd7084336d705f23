"""The engine seam: what every protocol core and route may know about the engine.

Neutral types only. Nothing here knows a wire format (no SSE, protobuf or flatbuffers),
and nothing here imports vLLM: `app.engine.vllm` implements `Engine` on top of it, and
unit tests implement it with a deterministic fake.

Invariants:
- `Engine.generate` yields `TokenEvent`s whose `token_ids`, `text` and `logprobs` are
  deltas (only what is new since the previous event); exactly one event, the last, has
  `finish_reason` set.
- Closing the iterator returned by `generate` (the consumer stopped, the client went
  away), or cancelling a `run`, aborts the engine request. No request outlives its
  consumer.
- A task that sets `OPEN_REQUESTS` learns the engine requests its calls have open, as the
  engine registers them, and may send their aborts before it cancels the task
  (`OpenRequests.abort`), which it must then do; the cancel aborts nothing twice.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from app.engine.constraints import Constraint
from app.engine.tools import ToolCall, ToolSupport
from app.errors import InvalidRequest

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling parameters with defaults applied; `app.engine.validation` checks them."""

    max_tokens: int = 16  # 0: prefill only (the prompt is scored, nothing generated)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 means all tokens (vLLM's -1)
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # top-k logprobs per sampled token (0: sampled only)
    prompt_logprobs: int | None = None  # top-k logprobs per prompt token
    skip_special_tokens: bool = True
    # False: the events' text stays empty (a router detokenizes): the engine turns token
    # ids into text only to match `stop`, which needs it.
    detokenize: bool = True
    # What the output must match (structured outputs); None: anything.
    constraint: Constraint | None = None
    # (token id, bias) pairs added to the logits before sampling, ids sorted.
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """An image a vision-language model can take: decoded, identified and measured."""

    pixels: object  # the decoded picture, as the engine takes it (for vLLM: a PIL image)
    digest: str  # sha256 of the encoded bytes: the image's identity in the engine's caches
    pad_tokens: int  # N: the features the vision encoder makes of it, one pad token each
    pixel_count: int = 0  # width x height: what decoding it cost (`ImageBudget` spends it)


class ReadImage(Protocol):
    """`VisionInfo.read_image`: decodes and measures one image, refusing (from its
    header, before decoding a pixel) one of more than `max_pixels` pixels."""

    def __call__(self, data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage: ...


@dataclass(frozen=True, slots=True)
class PromptImage:
    """An image inside a token prompt. `tokens[start:end]` is its vision block: the
    start marker, `image.pad_tokens` pad tokens, the end marker."""

    start: int
    end: int
    image: DecodedImage


@dataclass(slots=True)
class EngineTrace:
    """A traced request's link with the engine's own tracing: the W3C trace context
    (`traceparent`, `tracestate`) its engine span is a child of, and the engine's stage
    times, which the engine writes once the request has ended (monotonic seconds, the
    clock of `time.monotonic`; None: not reached, or an engine that does not tell).
    Only a traced request carries one: an untraced one costs nothing."""

    headers: Mapping[str, str]
    queued: float | None = None  # the engine took the request into its queue
    scheduled: float | None = None  # it left the queue: prefill began
    first_token: float | None = None  # prefill done, the first token out
    last_token: float | None = None  # decode done


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One engine request: a prompt (text or token ids) and how to continue it."""

    request_id: str
    prompt_token_ids: Sequence[int] | None = None
    prompt_text: str | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    lora_name: str | None = None  # None: the base model
    priority: int = 0  # lower runs first (vLLM's priority scheduler)
    # Positions of the prompt+output (absolute) at which readouts are wanted; the empty
    # tuple costs nothing. Ranges are [start, end).
    readout_ranges: tuple[tuple[int, int], ...] = ()
    # Every image of the token-id prompt, in prompt order, each with its block already
    # expanded in `prompt_token_ids`. Needs `EngineInfo.vision`.
    images: tuple[PromptImage, ...] = ()
    # Set on a traced request (`app.telemetry`): the engine's span goes under it.
    trace: EngineTrace | None = None


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image in a chat message, decoded and measured (`VisionInfo.read_image`)."""

    image: DecodedImage


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation, in no API's shape. `role` is one the chat template
    knows (system, developer, user, assistant, tool: templates take others as they
    will); `tool_calls` are an assistant turn's calls; `tool_call_id` marks a tool's
    answer to one of them; `reasoning` is an assistant turn's reasoning given back in the
    history."""

    role: str
    parts: tuple[TextPart | ImagePart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """What a chat template renders: the messages, the tools as the template takes them
    (`ToolPlan.template_tools`), and the template's switches and extra variables."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[Mapping[str, object], ...] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The logprob of one token, with the top-k alternatives at that position."""

    token_id: int
    logprob: float
    rank: int | None
    top: Mapping[int, float]  # token id -> logprob, best first


class TokenEvent(NamedTuple):
    """What the engine produced since the previous event of the same request.

    A named tuple, not a frozen dataclass: as immutable, and built once per token of every
    stream, where a frozen dataclass's `__init__` (an `object.__setattr__` per field)
    took 2.8-3.1 us against 1.2-1.3 (an event as `merge_deltas` builds it, best of 7
    runs). Derive one with `_replace`."""

    token_ids: Sequence[int]
    text: str
    logprobs: Sequence[TokenLogprob] | None = None  # one per token in `token_ids`
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that matched
    # Set on the first event only:
    prompt_token_ids: Sequence[int] | None = None
    # One per prompt token; the first is None (nothing predicts the first token).
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0
    # Readouts captured since the previous event, keyed by absolute position: float32
    # bytes [n_layers * n_concepts]. A position's hidden state exists once the engine has
    # fed that token in: prompt positions come with the first event, a decoded token's
    # with a later event (or, when the engine runs a step ahead, with its own), and the
    # last decoded token (never fed back) has none.
    readouts: Mapping[int, bytes] | None = None


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: str
    int_id: int


@dataclass(frozen=True, slots=True)
class ReadoutManifest:
    """What a readout holds: float32 [len(layers)][len(concepts)] per position."""

    concepts: tuple[str, ...]
    layers: tuple[int, ...]
    hidden_size: int
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class VisionInfo:
    """How the served vision-language model lays an image into its token stream: one
    block `[start_token_id] + [pad_token_id] * N + [end_token_id]` per image, where N is
    what `read_image` measures.

    `read_image(data, mime, max_pixels)` decodes an encoded image and measures it with
    the model's own image processor; it raises `InvalidRequest` for bytes that do not
    decode as `mime`, a `mime` the server does not take, or an image of more than
    `max_pixels` pixels (told from its header)."""

    start_token_id: int
    pad_token_id: int
    end_token_id: int
    max_images: int  # per prompt
    read_image: ReadImage = field(compare=False, repr=False)

    @property
    def token_ids(self) -> frozenset[int]:
        return frozenset((self.start_token_id, self.pad_token_id, self.end_token_id))


# What one prompt's images may decode to, in all: 128 Mi pixels (384 MiB as RGB), 1.5x
# what PIL lets one image be, eleven 12-megapixel photos.
MAX_PROMPT_PIXELS = 128 << 20


class ImageBudget:
    """What one prompt's images may cost, spent as each is read: at most the engine's
    `max_images` images and `MAX_PROMPT_PIXELS` pixels in all. An image past either is
    refused before a pixel of it is decoded (past the pixels: from its header, through
    `read_image`'s `max_pixels`), so one body of many small files that each inflate
    costs at most the budget, never a decode of each (images are counted as they come:
    those before the refused one are decoded, within the budget). Not thread-safe: one
    prompt's images are read in one thread."""

    def __init__(self, vision: VisionInfo) -> None:
        self._vision = vision
        self.images = 0
        self.pixels_left = MAX_PROMPT_PIXELS

    def read(self, data: bytes, mime: str) -> DecodedImage:
        if self.images >= self._vision.max_images:
            raise InvalidRequest(
                f"a prompt takes at most {self._vision.max_images} images; this is one more"
            )
        image = self._vision.read_image(data, mime, max_pixels=self.pixels_left)
        self.images += 1
        self.pixels_left -= image.pixel_count
        return image


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What the OpenAI- and Anthropic-shaped APIs sample with where a request is silent:
    the APIs' own defaults, or the model's where its generation_config.json sets them
    (as `vllm serve` applies them: a request's value, else the model's, else the API's).
    `max_tokens` (the model's `max_new_tokens`) bounds a request that names no limit;
    None: the rest of the context."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 means all tokens
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Static facts about the served model."""

    model_name: str  # the name clients use in `model`
    model_path: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool
    max_loras: int
    # Top-k logprobs a request may ask for (vLLM's --max-logprobs, -1 resolved to the
    # vocabulary size).
    max_logprobs: int = 20
    engine_version: str = ""
    readout: ReadoutManifest | None = None  # None: readouts are not configured
    vision: VisionInfo | None = None  # None: the model takes no images
    # Raises `InvalidRequest` (naming `constraint.param`) when the engine's
    # structured-output backend cannot compile the constraint; None: the engine has no
    # constrained decoding. Called by `app.engine.validation.validate_constraints`.
    check_constraint: Callable[[Constraint], None] | None = field(
        default=None, compare=False, repr=False
    )
    # Tool calling (the engine's parsers); None: the engine takes no tools.
    tools: ToolSupport | None = field(default=None, compare=False, repr=False)
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    # A request may bring its own chat template (`chat_template`, or `chat_template` in
    # its template kwargs) only when the operator says so, as `vllm serve
    # --trust-request-chat-template`: the template is Jinja the server runs.
    trust_request_chat_template: bool = False
    # The KV cache and the scheduler as the engine resolved them, what routers pair and
    # count replicas by (SMG's GetServerInfo); 0 or "": unknown.
    kv_block_size: int = 0
    kv_cache_dtype: str = ""
    model_dtype: str = ""
    max_num_seqs: int = 0
    # The engine's reasoning parser ("": none), and where it starts a request's grammar
    # on a prompt that ends inside the model's thinking: "after_reasoning" (held back
    # until the thought ends) or "first_token", SMG's labels; "": unknown.
    reasoning_parser: str = ""
    grammar_start: str = ""

    def require_vision(self, param: str | None) -> VisionInfo:
        """`vision`, for a request that brings images; a model that takes none refuses
        them here, the one wording of that refusal for every protocol (`param`: the
        client's field)."""
        if self.vision is None:
            raise InvalidRequest(f"The model {self.model_name!r} takes no images", param=param)
        return self.vision


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def apply_chat_template(self, prompt: ChatPrompt) -> list[int]:
        """The token ids of `prompt` rendered by the model's chat template, as `vllm
        serve` renders the same conversation; each image leaves one block of one pad
        token (`VisionInfo`), which the caller expands. Raises `InvalidRequest` when the
        model has no chat template or its template refuses the conversation. Blocking
        (template rendering): call it off the event loop."""
        ...

    def token_to_str(self, token_id: int) -> str: ...


class OpenRequests:
    """The engine requests a task's calls have open, each with its abort, as the engine
    registers them (an engine that does not keeps none: `abort` then does nothing, and
    the task's cancel aborts them as ever).

    Why: the batch lane takes some 190 requests off the engine when an interactive one
    comes (`app.batches.runner`). Cancelled, each task asks for its abort only as it
    unwinds, a turn of the event loop later and after every other's first step; with
    their aborts sent first, in the take-off's own turn, the engine core has them one
    turn and that whole unwinding sooner, and the step it runs next leaves them out."""

    def __init__(self) -> None:
        self._aborts: dict[str, Callable[[], None]] = {}

    def opened(self, engine_id: str, abort: Callable[[], None]) -> None:
        self._aborts[engine_id] = abort

    def closed(self, engine_id: str) -> None:
        self._aborts.pop(engine_id, None)

    def abort(self) -> None:
        """Send the abort of every engine request open now, without waiting (they go
        with the others asked for in this turn). A pushed request (`Engine.run`) taken
        off so hands on nothing more, its abort's last event included: its task waits
        for its cancel, which may come a few turns later (a pulled one's events end with
        the abort)."""
        for abort in list(self._aborts.values()):
            abort()


# Set by a task whose engine requests someone may abort ahead of its cancel; the engine
# registers each request it runs in that task (or in one the task started) while it runs.
OPEN_REQUESTS: ContextVar[OpenRequests | None] = ContextVar("open_requests", default=None)


class Engine(Protocol):
    """The one engine of the process, shared by every route."""

    @property
    def info(self) -> EngineInfo: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        """Run one request; raises `app.errors` classes (ModelNotFound, InvalidRequest,
        ContextLengthExceeded, EngineError) before the first event or from the iterator."""
        ...

    async def run(self, request: GenerationRequest, receive: Callable[[TokenEvent], None]) -> None:
        """Run one request, its events pushed: `receive(event)` is called for each, in
        order, from wherever the engine hands them on (vLLM's: its one loop per step, so
        the caller's task wakes once, at the end, not per event); returns after the last.
        Raises as `generate` does; an exception from `receive` is raised as it is, and
        the request aborted. Cancelling the awaiting task aborts the request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def loras(self) -> Sequence[LoraAdapter]: ...

    async def load_lora(self, name: str, path: str) -> LoraAdapter: ...

    async def unload_lora(self, name: str) -> None: ...

    def has_model(self, name: str) -> bool:
        """True for the base model's name and every loaded adapter's."""
        ...

    def num_running_requests(self) -> int:
        """Requests this process has handed to the engine and not yet seen finish."""
        ...

    def engine_requests(self) -> int:
        """Requests the engine itself holds (running or waiting), in its own latest
        report: a request leaves it once the engine has finished or aborted it, not when
        this process stops reading it."""
        ...

    def kv_event_sources(self) -> Mapping[int, Mapping[str, object]]:
        """The engine's KV-cache event publishers by data-parallel rank (vLLM's
        `--kv-events-config` as each engine reported it); empty when it publishes none."""
        ...

    async def check_health(self) -> None: ...
