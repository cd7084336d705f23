"""Settings: one pydantic-settings class, built once (by the CLI or a test) and passed in.

Every field is described; `app.cli` turns each field into a `--flag` of
`switchboard serve`, and environment variables with the prefix `SWITCHBOARD_` fill the
same fields. vLLM's own engine flags are not repeated here: they are parsed by vLLM's
parser (so they keep the names `vllm serve` gives them) and carried in `engine_args`.
There is no module-level settings object.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.tenants import parse_limits

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # a store that replicas share


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", extra="forbid")

    model: str = Field(description="Model directory (or hub name already in the local cache).")
    served_model_name: str | None = Field(
        default=None, description="Name clients pass as `model`; defaults to --model."
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, description="Port to listen on.")
    api_key: str | None = Field(
        default=None,
        description="A key with full rights (the data plane and the control plane) as the "
        "default tenant. Once any key is configured (this one, --tenant-api-key, "
        "--control-plane-api-keys), every route but /health, /ready, /version, /metrics "
        "and the playground's files needs one: `Authorization: Bearer <key>` (Anthropic's "
        "`x-api-key` too; websockets may pass `?token=`; gRPC `authorization` metadata). "
        "With no key configured, every caller is the default tenant with full rights.",
    )
    tenant_api_key: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Keys that name a tenant, as TENANT_ID:KEY (repeatable; SMG's "
        "spelling): the data plane only, as that tenant. What a tenant stores (responses, "
        "conversations, background runs, Salience sessions) is its own: another tenant's "
        "id is not found. From the environment: a JSON list, or entries separated by "
        "spaces or commas.",
    )
    control_plane_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Keys of the control plane: the routes that change the server (LoRA "
        "load and unload) and nothing else. From the environment: a JSON list, or keys "
        "separated by spaces or commas.",
    )
    tenant_limits: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Quotas per tenant, as TENANT_ID:name=value,... (repeatable; `*` for "
        "every tenant's defaults); names: priority (the most urgent priority its requests "
        "may ask, vLLM's smaller-first order; default 0, the default priority), concurrent "
        "(units of engine work admitted at once; 0: none of its own), sessions and "
        "session_tokens (its Salience sessions and their tokens), stored_bytes (its stored "
        "responses', and apart its conversations', bytes), uploaded_bytes (its uploaded "
        "files' bytes in the batch store). Defaults: an equal share of "
        "each server-wide bound among the tenants the keys name (concurrent: of "
        "--max-queued-requests, and none with one tenant), so one tenant alone has the "
        "server's own bounds.",
    )
    grpc_port: int = Field(
        default=50051,
        ge=0,
        le=65535,
        description="Port of the native gRPC server (salience.v1.Salience, "
        "evergreen.v2.EvergreenService, grpc.health.v1, reflection), on --host; 0 turns it off.",
    )
    grpc_max_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest gRPC message received or sent (a Generate with images, a "
        "DumpSession of a long session).",
    )
    grpc_stream_interval_ms: float = Field(
        default=10.0,
        ge=0,
        description="SMG's gRPC workers (vllm.grpc.engine.VllmEngine): a stream's chunks go "
        "out at most this often, each with every token made meanwhile (its first at once); "
        "a gRPC message costs several times a token's work, so fewer, fuller chunks spend "
        "less CPU per token. 0 sends one as each engine step comes.",
    )
    grpc_stream_chunks_per_interval: int = Field(
        default=8,
        ge=0,
        description="SMG's gRPC workers: past this many streamed choices live, each "
        "stream's --grpc-stream-interval-ms grows in proportion (interval x streams / "
        "this), so that together they send about this many chunks an interval however "
        "many stream, each with more tokens; fewer streams keep the interval as it is. 0 "
        "turns the growth off.",
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        description="Static LoRA adapters as name=path, selected by the `model` field.",
    )
    allow_runtime_lora_updating: bool = Field(
        default=False,
        description="Let the control plane load and unload LoRA adapters while the server "
        "runs (/v1/load_lora_adapter, /v1/unload_lora_adapter), from --lora-root only. Off "
        "by default, as in vLLM; vLLM's own VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 turns it on "
        "too.",
    )
    lora_root: Path | None = Field(
        default=None,
        description="The directory runtime LoRA loading takes adapters from: a lora_path "
        "that does not resolve to an adapter's directory inside it is refused, with one "
        "message whatever the path (none says which paths exist). Needed when runtime "
        "updating is on.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM engine arguments (AsyncEngineArgs field names), passed through.",
    )
    log_level: str = Field(default="info", description="uvicorn log level.")
    access_log: Literal["text", "json", "off"] = Field(
        default="text",
        description="One line per request once it has ended, on stderr (logger "
        "`switchboard.access`): request id, tenant, API, model, status and outcome, input, "
        "output and cached tokens, time to first token, duration, client address; never a "
        "prompt or a key. `json`: one JSON object a line; `off`: none.",
    )
    enable_auto_tool_choice: bool = Field(
        default=False,
        description="Let the model decide when to call tools (tool_choice 'auto'), as "
        "`vllm serve --enable-auto-tool-choice`; needs --tool-call-parser.",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM's tool-call parser for the model's format (hermes, llama3_json, "
        "mistral, ...), as `vllm serve --tool-call-parser`; needed for any tool_choice "
        "but none.",
    )
    tool_strict_level: str = Field(
        default="auto",
        description="Floor for forcing tool calls by structured decoding, as `vllm serve "
        "--tool-strict-level`: auto (the call's envelope when tool_choice forces one; its "
        "arguments' schema only for tools marked strict), function (the envelope always), "
        "parameter (arguments' schemas too, as if every tool were strict).",
    )
    engine_niceness: int = Field(
        default=10,
        ge=0,
        le=19,
        description="On vLLM's CPU build, the niceness of the engine's processes (its engine "
        "core and workers; 0 leaves them as they are): of their threads once started, and of "
        "the session of their own they run in (its group, where the kernel groups by "
        "session). They spin on both cores while they wait for each other; niced, they give "
        "way at once to the frontend and to clients on the same host, in any session, which "
        "otherwise stall beside them (a client in another session sat runnable for up to "
        "1.5 s at a time at 16 streams). On a host busy with other work they give way to it "
        "too.",
    )
    engine_spin_ms: int | None = Field(
        default=None,
        ge=0,
        description="On vLLM's CPU build, how long the engine's processes busy-wait for each "
        "other's next message after the last one before they sleep on a socket; unset, "
        "vLLM's 1000 ms. While the engine steps, messages come every few milliseconds, so a "
        "few tens of milliseconds keep its speed; every spin past that is a core or two "
        "taken, after each burst of work, from whatever else runs on the host (at the "
        "engine's niceness).",
    )
    render_process: bool = Field(
        default=True,
        description="Template prompts of over a MiB of text in a child process of their own "
        "(the render process: the engine's renderer, built by vLLM from the engine's "
        "configuration), started beside the engine, so that a big prompt never holds the "
        "serving process's interpreter lock while it is templated (a 16 MiB chat took the "
        "honest clients' TTFT from 1.59x idle's to 1.21x). Its cost: vLLM's import again "
        "(~15 s of CPU at the engine's start, at niceness 19) and ~540 MiB resident. Off, "
        "such prompts are templated in the serving process's prompt threads.",
    )
    pin_frontend: bool = Field(
        default=True,
        description="On vLLM's CPU build, once the engine has started, keep this process's "
        "threads off the cores vLLM bound its OpenMP threads to. On by default: beside a "
        "client the kernel places (bench/frontends.py, two runs of 4 starts each) it read "
        "1.08-1.24x the tokens per second at 16 streams on 0.83-0.84x the frontend CPU per "
        "token, and no start below 0.84x its median where the unpinned frontend had one at "
        "0.24x; with the client pinned off the frontend's core it bought nothing (seven runs). "
        "A CPU build with no --kv-cache-memory-bytes and no VLLM_CPU_KVCACHE_SPACE also gets "
        "a 4 GiB KV cache (a quarter of available memory when that is less) instead of "
        "vLLM's 92% of the NUMA node, which fails to start when the page cache is full.",
    )

    # Admission and drain (app.admission, app.drain)
    max_queued_requests: int = Field(
        default=512,
        ge=0,
        description="Requests (an OpenAI prompt x choice, a GraphPipe batch row, an Evergreen "
        "GENERATE, a Salience Generate) that may wait for the engine, across every protocol; "
        "running ones are not counted. Beyond it a request is refused with 503 / UNAVAILABLE "
        "and a retry hint. Default 512: two full batches of vLLM's default 256 sequences. "
        "0: no bound.",
    )
    max_queued_tokens: int = Field(
        default=524_288,
        ge=0,
        description="Prompt tokens that may wait for the engine, across every protocol (a "
        "request alone in the queue is admitted however long). Default 512 x 1024 tokens, "
        "about a minute of prefill at 10k tokens/s. 0: no bound.",
    )
    ws_per_message_deflate: bool = Field(
        default=False,
        description="Offer permessage-deflate to websocket clients that ask for it. Off by "
        "default: a token frame is tens of bytes, and deflating each one cost the frontend "
        "about a tenth of its CPU per token on Salience and Evergreen (measured).",
    )
    drain_timeout_s: float = Field(
        default=25.0,
        ge=0,
        description="On SIGTERM: how long running requests may take to finish before they "
        "are aborted and sessions are ended. Keep the pod's grace period above it and "
        "--drain-grace-s (and any preStop delay) so the engine stops before SIGKILL.",
    )
    drain_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="On SIGTERM: how long the listener stays open at least, answering /ready "
        "with 503 and new work with 503 + Retry-After, so that a router probing /ready "
        "takes the replica out before its port closes (set it to the router's probe "
        "interval x failure threshold, plus a probe's timeout).",
    )

    # The Responses API's store (app.store)
    responses_store: str = Field(
        default="",
        description="Where stored responses live (`store: true`, previous_response_id, "
        "retrieval, background runs): a SQLite file path, or a redis:// URL that replicas "
        "share. Empty: SQLite at $XDG_STATE_HOME/switchboard/responses.sqlite3 "
        "(~/.local/state/... when unset), which survives restarts.",
    )
    responses_store_ttl_s: float = Field(
        default=30 * 24 * 3600,
        gt=0,
        description="How long a stored response lives (seconds; OpenAI keeps them 30 days). "
        "Expired responses are removed by the next write.",
    )
    responses_store_max_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="Bound on the bytes all stored responses hold; past it the responses "
        "written longest ago are evicted first.",
    )
    responses_store_max_record_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Bound on one stored response, and apart on one conversation (its "
        "object and items), below the store's own: one record cannot take the whole store "
        "and evict everyone's. A write past it is refused (429 store_full).",
    )
    responses_ws_kept: int = Field(
        default=8,
        ge=1,
        description="How many of its own responses (store: false ones included) a "
        "Responses websocket connection keeps for previous_response_id; past it the least "
        "recently used goes first.",
    )

    # Batches (app.batches): OpenAI's Files and Batch APIs, Anthropic's Message Batches
    batch_store: str = Field(
        default="",
        description="Where files and batches live (uploads, batches, their requests and "
        "results): a SQLite file path, or a redis:// URL that replicas share (any replica "
        "then advances and answers any batch). Empty: the Responses store's (--responses-store).",
    )
    batch_store_max_bytes: int = Field(
        default=8 << 30,
        gt=0,
        description="Bound on the bytes files and batches hold in their store (uploads, a "
        "batch's copy of its requests, results); an upload past it is refused (a batch "
        "already accepted still writes its results).",
    )
    batch_max_input_bytes: int = Field(
        default=200 * 1000 * 1000,
        gt=0,
        description="Largest batch input: an uploaded file (OpenAI documents 200 MB for a "
        "batch's input file) or a Message Batches body.",
    )
    batch_max_requests: int = Field(
        default=50_000,
        gt=0,
        description="Most requests in one batch (OpenAI documents 50,000).",
    )
    batch_max_running: int = Field(
        default=0,
        ge=0,
        description="Batch requests in the engine at once while no interactive request is "
        "(the lane's width on an idle server); 0: the engine's max_num_seqs and half as many "
        "again, its running batch full and some waiting to take finished ones' places.",
    )
    batch_busy_running: int = Field(
        default=2,
        ge=0,
        description="Batch requests in the engine at once while interactive requests are "
        "queued or running (or were, within the last half second): the lane's width under "
        "interactive load. Past it, the newest batch requests are taken off the engine and "
        "run again later.",
    )
    batch_recent_running: int = Field(
        default=16,
        ge=0,
        description="Batch requests in the engine at once for --batch-recent-s after "
        "interactive traffic paused (past the busy width's half second): the first "
        "interactive requests that come back wait for the engine step in flight, which "
        "takes longer the more sequences it runs.",
    )
    batch_recent_s: float = Field(
        default=10.0,
        ge=0,
        description="How long after interactive traffic paused the lane stays at "
        "--batch-recent-running before it widens to --batch-max-running (0: at once).",
    )
    batch_lease_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a replica's hold on a part of a batch (or on a background "
        "response) lasts unrenewed; it renews it every third of this while it works. A "
        "replica that dies leaves that work this long, then another (or it, restarted) "
        "takes it over.",
    )

    # On a network: what one request may cost (app.routes.http.bodies, docs/operations.md)
    max_request_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="Largest request body of every JSON API (OpenAI, Responses, "
        "Anthropic, Conversations): past it the answer is 413 in the API's shape, before "
        "the body is read past it. Default 32 MiB, Anthropic's own limit: room for a few "
        "images inline. GraphPipe has its own (--graphpipe-max-request-bytes).",
    )

    big_body_bytes_per_s: int = Field(
        default=4 * 1024 * 1024,
        gt=0,
        description="How fast one client (its tenant, else its address) may send big "
        "bodies (those over 256 KiB, over HTTP and websockets): each pays for its bytes "
        "as it is read, from the client's bucket holding 4 s of this pace; past it the "
        "body waits unread, so a client sending big bodies back to back cannot take the "
        "CPU the others need. An occasional big body is never delayed. Default 4 MiB/s "
        "(~0.05 of a core of parsing and templating). Behind a proxy that does not pass "
        "the client's address, every client is the proxy: raise it, or give tenants keys.",
    )

    max_connections: int = Field(
        default=4096,
        gt=0,
        description="HTTP and websocket connections open at once; past it a new one is "
        "answered 503 with Retry-After and closed before any of it is read (keep the "
        "process's open-file limit above it).",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a request's head (request line and headers) may take to "
        "arrive from its first byte (a connection's first request: from the connection); "
        "past it the answer is 408 and the connection is closed, so a client trickling "
        "heads holds nothing longer (slowloris).",
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web pages (origins, as `http://host:port`) that may drive this server "
        "besides its own playground, as `vllm serve --allowed-origins` (a JSON list is "
        "taken too): websocket upgrades and requests that change something from any other "
        "page are refused (403), and these get CORS headers. `*`: every page. Clients "
        "that send no Origin (SDKs, agents, routers, gRPC) are never affected.",
    )
    allowed_methods: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["*"],
        description="Methods CORS allows the --allowed-origins, as `vllm serve`.",
    )
    allowed_headers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["*"],
        description="Headers CORS allows the --allowed-origins, as `vllm serve`.",
    )
    trust_request_chat_template: bool = Field(
        default=False,
        description="Let a request bring its own chat template (`chat_template`, or "
        "`chat_template_kwargs.chat_template`), as `vllm serve "
        "--trust-request-chat-template`; refused with 400 otherwise. A template is Jinja "
        "that runs on the server's prompt-building thread.",
    )

    # GraphPipe
    graphpipe_max_request_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest GraphPipe request body accepted (413 past it, as "
        "--max-request-body-bytes for the JSON APIs); a body also decodes to at most its "
        "own size, strings shared by several offsets counted once per offset.",
    )

    # Salience
    salience_store: str = Field(
        default="",
        description="Where Salience sessions live: `memory` (this process), or a redis:// "
        "URL that replicas share, so that any replica serves any call of a session and a "
        "replica's death loses none. Empty: the Responses store's Redis when "
        "--responses-store is a redis:// URL, else `memory`.",
    )
    salience_lease_s: float = Field(
        default=5.0,
        gt=0,
        description="With a shared --salience-store: how long a Generate's hold on its "
        "session lasts unrenewed (its server renews it every fifth of this while the "
        "call runs). A replica that dies mid-Generate leaves the session busy this long; "
        "then it is as before that call.",
    )
    salience_session_ttl_s: float = Field(
        default=30 * 60, description="Idle time after which a Salience session expires."
    )
    salience_max_sessions: int = Field(
        default=1024,
        ge=1,
        description="Salience sessions per server; at the cap, opening one evicts the least "
        "recently used idle session (never one running a Generate).",
    )
    salience_max_session_tokens: int = Field(
        default=1_000_000, description="Tokens per Salience session (also bounded by context)."
    )
    salience_max_total_tokens: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="Tokens all Salience sessions hold together (a running Generate also "
        "counts its max_tokens); beyond it the least recently used idle sessions are "
        "evicted. Default 64 Mi tokens, about 256 MiB (a token held costs 4 bytes, "
        "measured): a full 64k-token context for each of 1024 sessions.",
    )
    readout_concepts: Path | None = Field(
        default=None, description="safetensors file of concept directions for Salience readouts."
    )

    # Evergreen
    evergreen_max_nodes: int = Field(default=10_000, description="Nodes per Evergreen session.")
    evergreen_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="Bytes an Evergreen session may hold (chunk data, ids, metadata, a fixed "
        "cost per fragment, the server's outputs); also bounds what one input flattens to.",
    )
    evergreen_max_pending_actions: int = Field(
        default=64, description="Actions waiting on inputs or running, per Evergreen session."
    )
    evergreen_max_depth: int = Field(
        default=256,
        description="Longest chain of nested nodes accepted (a conversation that nests "
        "each turn in the next grows it by one a turn).",
    )
    evergreen_file_root: Path | None = Field(
        default=None,
        description="Directory that `file://` refs may read under; unset: file refs rejected.",
    )

    @field_validator("evergreen_file_root")
    @classmethod
    def _check_file_root(cls, value: Path | None) -> Path | None:
        # Refused at start-up: a missing root would otherwise fail each file ref as an
        # internal error.
        if value is not None and not value.is_dir():
            raise ValueError(f"evergreen_file_root {value} is not a directory")
        return value

    @field_validator("lora_root")
    @classmethod
    def _check_lora_root(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"lora_root {value} is not a directory")
        return value

    @model_validator(mode="after")
    def _check_runtime_lora(self) -> Settings:
        if self.runtime_lora_updating() and self.lora_root is None:
            raise ValueError(
                "runtime LoRA updating (--allow-runtime-lora-updating, or vLLM's "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING) needs --lora-root, the directory it "
                "loads adapters from"
            )
        return self

    def runtime_lora_updating(self) -> bool:
        """Runtime LoRA loading asked for: our flag, or vLLM's variable as vLLM reads it."""
        vllms = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower()
        return self.allow_runtime_lora_updating or vllms in ("1", "true")

    @field_validator("salience_store")
    @classmethod
    def _check_salience_store(cls, value: str) -> str:
        if value not in ("", "memory") and not value.startswith(_REDIS_SCHEMES):
            raise ValueError(f"salience_store {value!r} is neither `memory` nor a redis:// URL")
        return value

    @field_validator("tenant_api_key", "control_plane_api_keys", "tenant_limits", mode="before")
    @classmethod
    def _split_entries(cls, value: Any, info: ValidationInfo) -> Any:
        # From the environment: a JSON list, or entries separated by spaces (keys: or
        # commas; a tenant's limits are separated by commas); the flags give a list.
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return (
                value if info.field_name == "tenant_limits" else value.replace(",", " ")
            ).split()
        return value

    @field_validator("api_key")
    @classmethod
    def _empty_key_is_none(cls, value: str | None) -> str | None:
        # An empty key (SWITCHBOARD_API_KEY= in a compose file) is no key, never a key
        # that an empty bearer token matches.
        return value or None

    @field_validator("allowed_origins", "allowed_methods", "allowed_headers", mode="before")
    @classmethod
    def _origin_entries(cls, value: Any) -> Any:
        # vLLM's spelling is one JSON list (`--allowed-origins '["http://a"]'`); entries
        # separated by spaces or commas are taken too, from a flag or the environment.
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        entries: list[Any] = []
        for item in items:
            if isinstance(item, str) and item.lstrip().startswith("["):
                entries.extend(json.loads(item))
            elif isinstance(item, str):
                entries.extend(item.replace(",", " ").split())
            else:
                entries.append(item)
        return entries

    @field_validator("tenant_api_key")
    @classmethod
    def _check_tenant_keys(cls, value: list[str]) -> list[str]:
        for entry in value:
            tenant, sep, key = entry.partition(":")
            if not sep or not tenant or not key:
                raise ValueError("a tenant API key is not TENANT_ID:KEY")
        return value

    @field_validator("control_plane_api_keys")
    @classmethod
    def _check_control_plane_keys(cls, value: list[str]) -> list[str]:
        if any(not key for key in value):
            raise ValueError("a control-plane API key is empty")
        return value

    @field_validator("tenant_limits")
    @classmethod
    def _check_tenant_limits(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_limits(entry)
        return value

    @field_validator("lora_modules")
    @classmethod
    def _check_lora_modules(cls, value: list[str]) -> list[str]:
        for item in value:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"LoRA module {item!r} is not name=path")
        return value

    def responses_store_location(self) -> str:
        """`responses_store`, or the default SQLite file under the state directory."""
        if self.responses_store:
            return self.responses_store
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return str(Path(state) / "switchboard" / "responses.sqlite3")

    def batch_store_location(self) -> str:
        """`batch_store`, or the Responses store's location."""
        return self.batch_store or self.responses_store_location()

    def salience_store_location(self) -> str:
        """`salience_store`, or the Responses store's Redis, or `memory`."""
        if self.salience_store:
            return self.salience_store
        if self.responses_store.startswith(_REDIS_SCHEMES):
            return self.responses_store
        return "memory"

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def lora_pairs(self) -> list[tuple[str, str]]:
        return [tuple(item.split("=", 1)) for item in self.lora_modules]  # type: ignore[misc]
