"""What the two Evergreen corpora (the websocket's, test_fuzz_evergreen.py, and gRPC's,
test_fuzz_grpc.py) share: the valid `SessionMessage`s they mutate, and how an ABORT
message is read."""

from __future__ import annotations

from google.protobuf import json_format, struct_pb2, text_format

from schemas import evergreen_service_pb2 as service_pb

CONFIG = (
    "configs { [type.googleapis.com/google.protobuf.Struct] { "
    'fields { key: "temperature" value { number_value: 0 } } '
    'fields { key: "max_tokens" value { number_value: 4 } } } }'
)
SEEDS_TEXT = (
    # The docs' example: a prompt node with one text child, and a GENERATE on it.
    f"""actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "p1" }}
                  outputs {{ name: "response" id: "r1" }} {CONFIG} }}
       node_fragments {{ id: "p1" child_ids: "q1" }}
       node_fragments {{ id: "q1" chunk_fragment {{ metadata {{ mimetype: "text/plain" }}
                                                    data: "Hello!" }} }}""",
    # The same on the LoRA adapter, the text in two fragments.
    f"""actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "q1" }}
                  outputs {{ name: "response" id: "r1" }} {CONFIG}
                  target_spec {{ id: "tiny-lora" }} }}
       node_fragments {{ id: "q1" continued: true
                         chunk_fragment {{ metadata {{ mimetype: "text/plain" role: "user" }}
                                           data: "def " }} }}
       node_fragments {{ id: "q1" seq: 1 chunk_fragment {{ data: "f():" }} }}""",
    # Nodes only: the session waits for more.
    """node_fragments { id: "a" child_ids: "b" child_ids: "c" }
       node_fragments { id: "b" chunk_fragment { metadata { mimetype: "text/plain" }
                                                 data: "x" } }
       node_fragments { id: "c" chunk_fragment { metadata { mimetype: "text/plain" }
                                                 ref: "data:text/plain;base64,eQ==" } }""",
)
SEEDS = [text_format.Parse(t, service_pb.SessionMessage()) for t in SEEDS_TEXT]


def evergreen_abort(message: service_pb.SessionMessage) -> tuple[str, str] | None:
    """(code, message) of the Evergreen ABORT that `message` is, or None if it is not
    one (over the websocket and gRPC alike)."""
    if len(message.actions) != 1 or message.actions[0].name != "ABORT":
        return None
    status = struct_pb2.Struct()
    if len(message.actions[0].configs) != 1 or not message.actions[0].configs[0].Unpack(status):
        return None
    fields = json_format.MessageToDict(status)
    code, text = fields.get("code"), fields.get("message")
    return (code, text) if isinstance(code, str) and isinstance(text, str) else None
