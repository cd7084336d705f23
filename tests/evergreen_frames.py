"""Evergreen messages as the tests write them, at every layer (no I/O here).

- `message`, `generate`, `leaf`: a `SessionMessage` from protobuf text format, and the
  pieces tests assemble it from (a GENERATE action, a one-fragment text leaf);
- `GREEDY`, `first_turn`: a greedy 8-token config, and the spec's first example;
- `turn`: one GENERATE on a one-chunk prompt as a JSON mapping, the shape a JSON
  websocket frame (or `json_format.ParseDict`) takes;
- `workload_actions`: a session's share of tests/aborts.py's workload, as GENERATEs;
- `abort_status`: the status an ABORT message carries;
- `INFO`, `planner`, `plan`: the engine facts and GENERATE planning the core tests use.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format, struct_pb2, text_format

from app.engine.base import EngineInfo
from app.protocols.evergreen.generate import GeneratePlan, plan_action
from schemas import evergreen_pb2 as pb
from schemas import evergreen_service_pb2 as service_pb
from tests.aborts import Workload

TEXT = 'metadata { mimetype: "text/plain" }'


def message(text: str) -> service_pb.SessionMessage:
    """A SessionMessage from protobuf text format."""
    return text_format.Parse(text, service_pb.SessionMessage())


def generate(prompt: str, response: str, max_tokens: int = 4, config: str = "") -> str:
    """A GENERATE of `response` from `prompt` (text format); `config` adds Struct fields."""
    configs = (
        "configs { [type.googleapis.com/google.protobuf.Struct] { fields { "
        f'key: "max_tokens" value {{ number_value: {max_tokens} }} }} {config} }} }}'
    )
    return (
        f'actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "{prompt}" }} '
        f'outputs {{ name: "response" id: "{response}" }} {configs} }}'
    )


def leaf(node_id: str, data: str, extra: str = "") -> str:
    """A text node in one fragment (text format)."""
    return (
        f'node_fragments {{ id: "{node_id}" chunk_fragment {{ {TEXT} data: "{data}" }} {extra} }}'
    )


GREEDY = (
    "configs { [type.googleapis.com/google.protobuf.Struct] { "
    'fields { key: "temperature" value { number_value: 0 } } '
    'fields { key: "max_tokens" value { number_value: 8 } } } }'
)


def first_turn(config: str) -> str:
    """The spec's first example, the video's two file parts sent as data: refs of text (the
    tiny model takes text only)."""
    return f"""
        actions {{ name: "GENERATE" {config}
                  inputs {{ name: "prompt" id: "prompt_1" }}
                  outputs {{ name: "response" id: "response_1" }} }}
        node_fragments {{ id: "prompt_1" child_ids: "question_1" child_ids: "video_1" }}
        node_fragments {{ id: "question_1" chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} data: "Write a summary of this video: " }} }}
        node_fragments {{ id: "video_1" seq: 0 continued: true chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} ref: "data:,lap%201%20" }} }}
        node_fragments {{ id: "video_1" seq: 1 chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} ref: "data:,lap%202" }} }}
    """


def turn(text: str, max_tokens: int, **config: Any) -> dict[str, Any]:
    """One GENERATE (`max_tokens` and `config` in its Struct) of response "r" from a prompt
    "p" of one chunk, `text`; as the JSON mapping of a SessionMessage."""
    struct = {"@type": "type.googleapis.com/google.protobuf.Struct"}
    return {
        "actions": [
            {
                "name": "GENERATE",
                "configs": [{**struct, "value": {"max_tokens": max_tokens, **config}}],
                "inputs": [{"name": "prompt", "id": "p"}],
                "outputs": [{"name": "response", "id": "r"}],
            }
        ],
        "nodeFragments": [
            {
                "id": "p",
                "chunkFragment": {
                    "metadata": {"mimetype": "text/plain"},
                    "data": base64.b64encode(text.encode()).decode(),  # bytes, in JSON
                },
            }
        ],
    }


# Sessions the abort workload is spread over: each stays under --evergreen-max-pending-actions.
SESSIONS = 2


def workload_actions(workload: Workload, session: int) -> dict[str, Any]:
    """Session `session`'s share of the abort workload, as the JSON mapping of one
    SessionMessage: a GENERATE per prompt (greedy, the workload's max_tokens)."""
    config = {
        "@type": "type.googleapis.com/google.protobuf.Struct",
        "value": {"max_tokens": workload.max_tokens, "temperature": 0},
    }
    actions, fragments = [], []
    for i in range(session, len(workload.texts), SESSIONS):
        actions.append(
            {
                "name": "GENERATE",
                "configs": [config],
                "inputs": [{"name": "prompt", "id": f"p{i}"}],
                "outputs": [{"name": "response", "id": f"r{i}"}],
            }
        )
        text = base64.b64encode(workload.texts[i].encode()).decode()
        chunk = {"metadata": {"mimetype": "text/plain"}, "data": text}
        fragments.append({"id": f"p{i}", "chunkFragment": chunk})
    return {"actions": actions, "nodeFragments": fragments}


# A fragment past the final seq of a node: a broken rule that aborts the session.
PAST_THE_END = (
    f'node_fragments {{ id: "x" chunk_fragment {{ {TEXT} }} }} node_fragments {{ id: "x" seq: 1 }}'
)


def abort_status(final: service_pb.SessionMessage) -> dict[str, Any]:
    """The status (`code`, `message`, ...) of `final`, which must be one ABORT and
    nothing else."""
    assert [a.name for a in final.actions] == ["ABORT"], final
    assert not final.node_fragments, final
    status = struct_pb2.Struct()
    assert final.actions[0].configs[0].Unpack(status)
    return json_format.MessageToDict(status)


INFO = EngineInfo(
    model_name="tiny",
    model_path="/nonexistent",
    max_model_len=1024,
    vocab_size=2048,
    eos_token_ids=(2,),
    has_chat_template=True,
    max_loras=1,
)


def planner(
    info: EngineInfo = INFO, loras: tuple[str, ...] = ()
) -> Callable[[pb.Action], GeneratePlan]:
    """How a core session plans its GENERATEs: against `info`, with `loras` loaded."""
    return lambda action: plan_action(action, info, lambda name: name in loras)


def plan(
    configs: dict[str, Any] | None = None, target: str = "", info: EngineInfo = INFO
) -> GeneratePlan:
    """The plan of a GENERATE of "r" from "p" with `configs` (a Struct) on `target`
    ("tiny-lora" is loaded)."""
    action = text_format.Parse(
        'name: "GENERATE" inputs { name: "prompt" id: "p" } outputs { name: "response" id: "r" }',
        pb.Action(),
    )
    if configs is not None:
        struct = struct_pb2.Struct()
        struct.update(configs)
        action.configs.add().Pack(struct)
    action.target_spec.id = target
    return planner(info, loras=("tiny-lora",))(action)
