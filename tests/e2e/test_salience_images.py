"""Salience image attachments over a real websocket against a live server on the tiny
vision-language model (real vLLM): the image reaches the model, later turns and forks
send it again, bad attachments are INVALID_ARGUMENT and leave nothing running."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
import websockets

from schemas import salience_pb2 as pb
from schemas import salience_ws_pb2 as ws_pb
from tests.conftest import LiveServer
from tests.images import Prompt, attachment, png
from tests.salience_client import JsonClient, decoded, open_session, run, scored

pytestmark = pytest.mark.e2e


async def test_the_image_reaches_the_model(vl_server: LiveServer) -> None:
    prompt = Prompt(vl_server)
    after_image = [{"start": prompt.end, "end": len(prompt.tokens)}]
    results = []
    async with websockets.connect(f"{vl_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        for seed in (1, 2, 1):
            session = await open_session(client, vl_server.model)
            events = await run(
                client,
                session,
                0,
                prompt.tokens,
                [attachment(png(seed), prompt.start)],
                maxTokens=6,
                logprobsRanges=after_image,
            )
            results.append((decoded(events), scored(events)))
            assert events[-1]["done"]["promptTokens"] == len(prompt.tokens)
            dump = await client.call("DumpSession", {"sessionId": session})
            assert dump["response"]["tokens"][: len(prompt.tokens)] == prompt.tokens
    (first, first_lp), (other, other_lp), (again, again_lp) = results
    assert len(first) == 6 and len(first_lp) == len(prompt.tail)
    # Same tokens, another image: the model sees it in the text that follows.
    assert first_lp != pytest.approx(other_lp, abs=1e-3)
    assert first != other
    # The same image again: the same answer.
    assert again == first and again_lp == pytest.approx(first_lp, abs=1e-4)
    assert vl_server.wait_idle() == 0


async def test_binary_frames_carry_images_as_json_does(vl_server: LiveServer) -> None:
    prompt = Prompt(vl_server)

    async def call(ws: Any, frame: ws_pb.ClientFrame) -> ws_pb.ServerFrame:
        await ws.send(frame.SerializeToString())
        return ws_pb.ServerFrame.FromString(await ws.recv())

    async with websockets.connect(f"{vl_server.ws_url}/salience/ws") as ws:
        json_session = await open_session(JsonClient(ws), vl_server.model)
        by_json = decoded(
            await run(
                JsonClient(ws),
                json_session,
                0,
                prompt.tokens,
                [attachment(png(3), prompt.start)],
                maxTokens=5,
            )
        )
        opened = await call(
            ws, ws_pb.ClientFrame(id="o", open_session=pb.OpenSessionRequest(model=vl_server.model))
        )
        request = pb.GenerateRequest(
            session_id=opened.open_session.session_id,
            append_tokens=prompt.tokens,
            offset=0,
            max_tokens=5,
            top_k=1,
        )
        request.images.add(
            bytes=png(3), mime="image/png", pad_range_start=prompt.start, pad_range_end=prompt.end
        )
        await ws.send(ws_pb.ClientFrame(id="g", generate=request).SerializeToString())
        by_binary = []
        while True:
            frame = ws_pb.ServerFrame.FromString(await asyncio.wait_for(ws.recv(), 120))
            assert frame.WhichOneof("reply") == "event", frame
            if frame.event.WhichOneof("event") == "done":
                break
            by_binary.append(frame.event.token.id)
    assert by_binary == by_json and len(by_json) == 5


async def test_later_turns_and_forks_send_the_image_again(vl_server: LiveServer) -> None:
    prompt = Prompt(vl_server)
    tok = vl_server.engine.tokenizer
    more = tok.encode(" and then", add_special_tokens=False)
    image = attachment(png(4), prompt.start)
    async with websockets.connect(f"{vl_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        session = await open_session(client, vl_server.model)
        first = decoded(await run(client, session, 0, prompt.tokens, [image], maxTokens=4))
        length = len(prompt.tokens) + len(first)
        second = decoded(await run(client, session, length, more, [], maxTokens=4))
        # One call with the whole conversation gives the same second answer: the second
        # turn, which attached nothing, still sent the session's image.
        whole = await open_session(client, vl_server.model)
        at_once = decoded(
            await run(client, whole, 0, [*prompt.tokens, *first, *more], [image], maxTokens=4)
        )
        assert at_once == second

        # A fork after the block inherits the image: same prompt, same continuation.
        fork = await client.call(
            "ForkSession", {"sessionId": session, "atPosition": len(prompt.tokens)}
        )
        child = fork["response"]["sessionId"]
        assert decoded(await run(client, child, len(prompt.tokens), [], [], maxTokens=4)) == first

        # Never inside the block: neither a fork nor a truncation.
        before = (await client.call("DumpSession", {"sessionId": session}))["response"]["tokens"]
        for inside in (prompt.start + 1, prompt.end - 1):
            split = await client.call("ForkSession", {"sessionId": session, "atPosition": inside})
            assert split["error"]["code"] == "FAILED_PRECONDITION"
            cut = await run(client, session, inside, [], [], truncating=True, maxTokens=1)
            assert cut[0]["error"]["code"] == "FAILED_PRECONDITION"
        after = (await client.call("DumpSession", {"sessionId": session}))["response"]["tokens"]
        assert after == before

        # A fork at the block's start has no image; it can attach another one there.
        bare = await client.call("ForkSession", {"sessionId": session, "atPosition": prompt.start})
        bare_id = bare["response"]["sessionId"]
        other = decoded(
            await run(
                client,
                bare_id,
                prompt.start,
                [*prompt.block, *prompt.tail],
                [attachment(png(5), prompt.start)],
                maxTokens=4,
            )
        )
        assert other != first
    assert vl_server.wait_idle() == 0


async def test_bad_attachments_are_invalid_argument_and_leak_nothing(vl_server: LiveServer) -> None:
    prompt = Prompt(vl_server)
    five = Prompt(vl_server, n=5)
    garbage = base64.b64encode(b"\x89PNG\r\n\x1a\n not really").decode()
    cases = [
        (five.tokens, [attachment(png(1), five.start, n=5)], "expected 4, got 5"),
        (prompt.tokens, [{**attachment(png(1), prompt.start), "bytes": garbage}], "do not decode"),
        (prompt.tokens, [attachment(png(1), prompt.start, mime="image/jpeg")], "image/jpeg"),
        (prompt.tokens, [attachment(png(1, fmt="BMP"), prompt.start)], "do not decode"),
        (prompt.tokens, [attachment(png(1), prompt.start + 1)], "not a vision block"),
        (prompt.tokens, [], "outside every block"),
        # vLLM would place this image as 0 pad tokens, the encoder makes 21 features.
        (prompt.tokens, [attachment(png(1, 600, 20), prompt.start)], "cannot take a 600x20"),
    ]
    async with websockets.connect(f"{vl_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        session = await open_session(client, vl_server.model)
        for tokens, images, message in cases:
            reply = await run(client, session, 0, tokens, images, maxTokens=3)
            assert reply[0]["error"]["code"] == "INVALID_ARGUMENT", (message, reply)
            assert message in reply[0]["error"]["message"]
            assert vl_server.running_requests() == 0
            dump = await client.call("DumpSession", {"sessionId": session})
            assert dump["response"].get("tokens", []) == []
        # The socket, the session and the engine are all still fine.
        good = await run(
            client, session, 0, prompt.tokens, [attachment(png(1), prompt.start)], maxTokens=3
        )
        assert len(decoded(good)) == 3
    assert vl_server.wait_idle() == 0
