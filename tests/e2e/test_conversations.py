"""The Conversations API through the openai SDK's `client.conversations`, unchanged, on the
live server (its SQLite store), and across two replicas sharing a real redis-server (two
apps on the live engine: the store is what they share).

How these fail: an SDK call that cannot read an answer (a missing field, a wrong object
type, a cursor page the SDK's pager cannot walk); items out of order, lost, or held
twice; a conversation or item one replica wrote that another cannot see; an error that is
not OpenAI's shape or does not name its field.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import LiveServer
from tests.error_bodies import body_of
from tests.replicas import app_on_live_engine

pytestmark = pytest.mark.e2e


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def _user(text: str, **extra: str) -> Any:
    """A user message as an input item's JSON (typed Any: the tests add an `id` to it, or
    send items the SDK's TypedDicts forbid, as a client's JSON may)."""
    return {"type": "message", "role": "user", "content": text, **extra}


def _json(item: dict[str, Any]) -> Any:
    """An item as the JSON a client may send, whatever the SDK's types allow."""
    return item


def _texts(items: Any) -> list[str]:
    return [item.content[0].text for item in items]


def test_a_conversation_through_the_sdk(live_server: LiveServer) -> None:
    client = _client(live_server.base_url)
    made = client.conversations.create(
        items=[_user("one"), {"role": "assistant", "content": "two"}],
        metadata={"topic": "t"},
    )
    assert made.object == "conversation" and made.id.startswith("conv_")
    assert made.metadata == {"topic": "t"}
    assert client.conversations.retrieve(made.id).created_at == made.created_at
    updated = client.conversations.update(made.id, metadata={"topic": "u"})
    assert updated.metadata == {"topic": "u"}
    added = client.conversations.items.create(made.id, items=[_user(str(n)) for n in range(3, 8)])
    assert _texts(added.data) == ["3", "4", "5", "6", "7"] and not added.has_more
    newest = client.conversations.items.list(made.id, limit=3)  # desc, as OpenAI
    assert _texts(newest.data) == ["7", "6", "5"] and newest.has_more
    # The SDK's pager walks every page, after the last id of each.
    walked = list(client.conversations.items.list(made.id, limit=2, order="asc"))
    assert _texts(walked) == ["one", "two", "3", "4", "5", "6", "7"]
    assert [getattr(item, "role", None) for item in walked[:2]] == ["user", "assistant"]
    assert all(getattr(item, "status", None) == "completed" for item in walked)
    third = walked[2]
    assert third.id is not None
    assert client.conversations.items.retrieve(third.id, conversation_id=made.id).id == third.id
    after = client.conversations.items.delete(third.id, conversation_id=made.id)
    assert after.id == made.id and after.object == "conversation"
    assert "3" not in _texts(client.conversations.items.list(made.id, order="asc"))
    gone = client.conversations.delete(made.id)
    assert (gone.id, gone.deleted, gone.object) == (made.id, True, "conversation.deleted")
    with pytest.raises(openai.NotFoundError) as missing:
        client.conversations.retrieve(made.id)
    assert body_of(missing.value)["param"] == "conversation_id"


def test_what_a_conversation_refuses(live_server: LiveServer) -> None:
    client = _client(live_server.base_url)
    made = client.conversations.create(items=[_user("a", id="msg_given")])
    again: list[Any] = [_user("b", id="msg_given")]
    cases: list[tuple[Any, str, type[Exception]]] = [
        (lambda: client.conversations.create(items=[_user("x")] * 21), "items",
         openai.BadRequestError),
        (lambda: client.conversations.create(metadata={str(i): "v" for i in range(17)}),
         "metadata", openai.BadRequestError),
        (lambda: client.conversations.items.create(made.id, items=[_json({"role": "user"})]),
         "items.0.content", openai.BadRequestError),
        (lambda: client.conversations.items.create(made.id, items=[]), "items",
         openai.BadRequestError),
        (lambda: client.conversations.items.create(made.id, items=again), "items",
         openai.BadRequestError),
        (lambda: client.conversations.items.retrieve("msg_none", conversation_id=made.id),
         "item_id", openai.NotFoundError),
        (lambda: client.conversations.items.list("conv_none"), "conversation_id",
         openai.NotFoundError),
        (lambda: client.conversations.items.list(made.id, after="msg_none"), "after",
         openai.BadRequestError),
    ]  # fmt: skip
    for call, param, kind in cases:
        with pytest.raises(kind) as raised:
            call()
        assert isinstance(raised.value, openai.APIStatusError)
        assert body_of(raised.value)["param"] == param, raised.value.body
    assert _texts(client.conversations.items.list(made.id)) == ["a"]  # nothing half-added


def test_replicas_share_conversations_through_redis(
    live_server: LiveServer, redis_url: str
) -> None:
    with (
        app_on_live_engine(live_server, responses_store=redis_url) as a,
        app_on_live_engine(live_server, responses_store=redis_url) as b,
    ):
        made = _client(a).conversations.create(items=[_user("from a")])
        _client(b).conversations.items.create(made.id, items=[_user("from b")])
        assert _texts(_client(a).conversations.items.list(made.id, order="asc")) == [
            "from a",
            "from b",
        ]
        _client(a).conversations.update(made.id, metadata={"by": "a"})
        assert _client(b).conversations.retrieve(made.id).metadata == {"by": "a"}
        answer = _client(b).responses.create(
            model=live_server.model, conversation=made.id, input="to b", max_output_tokens=2
        )
        listed = list(_client(a).conversations.items.list(made.id, order="asc"))
        assert _texts(listed[:3]) == ["from a", "from b", "to b"]
        assert listed[-1].id == answer.output[-1].id
        _client(b).conversations.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            _client(a).conversations.items.list(made.id)


def test_a_response_continues_a_conversation_and_adds_to_it(live_server: LiveServer) -> None:
    client = _client(live_server.base_url)
    conversation = client.conversations.create(items=[_user("My name is Alice.")])
    answer = client.responses.create(
        model=live_server.model, conversation=conversation.id, input="And yours?",
        max_output_tokens=4,
    )  # fmt: skip
    assert answer.conversation is not None and answer.conversation.id == conversation.id
    listed = list(client.conversations.items.list(conversation.id, order="asc"))
    assert _texts(listed[:2]) == ["My name is Alice.", "And yours?"]
    assert [item.id for item in listed[2:]] == [item.id for item in answer.output]
    # The model was given the conversation: the same input alone is a shorter prompt.
    alone = client.responses.create(
        model=live_server.model, input="And yours?", max_output_tokens=1
    )
    assert answer.usage is not None and alone.usage is not None
    assert answer.usage.input_tokens > alone.usage.input_tokens
    # Streamed: the items are there once response.completed is.
    with client.responses.stream(
        model=live_server.model, conversation={"id": conversation.id}, input="Go on.",
        max_output_tokens=4,
    ) as stream:  # fmt: skip
        for event in stream:
            if event.type == "response.completed":
                now = list(client.conversations.items.list(conversation.id, order="asc"))
                assert _texts(now[3:4]) == ["Go on."]
                assert now[-1].id == getattr(event.response.output[-1], "id", None)


def test_what_a_response_in_a_conversation_refuses(live_server: LiveServer) -> None:
    client = _client(live_server.base_url)
    conversation = client.conversations.create(items=[_user("a", id="msg_held")])
    first = client.responses.create(model=live_server.model, input="x", max_output_tokens=1)
    cases: list[tuple[dict[str, Any], str, type[Exception]]] = [
        ({"conversation": conversation.id, "previous_response_id": first.id}, "conversation",
         openai.BadRequestError),
        ({"conversation": "conv_none"}, "conversation", openai.NotFoundError),
        ({"conversation": conversation.id, "input": [_user("b", id="msg_held")]},
         "input.0.id", openai.BadRequestError),
    ]  # fmt: skip
    for extra, param, kind in cases:
        body: dict[str, Any] = {
            "model": live_server.model,
            "input": "y",
            "max_output_tokens": 1,
            **extra,
        }
        with pytest.raises(kind) as raised:
            client.responses.create(**body)
        assert isinstance(raised.value, openai.APIStatusError)
        assert body_of(raised.value)["param"] == param, raised.value.body
    assert _texts(client.conversations.items.list(conversation.id)) == ["a"]
