"""Salience image attachments over native gRPC, on the live server of the tiny
vision-language model (real vLLM): the image reaches the model as it does over the
websocket, and a bad attachment is INVALID_ARGUMENT that leaves the session as it was.

Named to run after the text server's tests (as test_salience_images.py does): a second
engine in the process takes vLLM's Prometheus gauges over, which /metrics tests read."""

from __future__ import annotations

import grpc
import pytest

from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import LiveServer
from tests.images import Prompt, attachment, png
from tests.salience_client import JsonClient, decoded, open_session, run

pytestmark = pytest.mark.e2e


async def test_images_over_grpc_as_over_the_websocket(vl_server: LiveServer) -> None:
    import websockets

    prompt = Prompt(vl_server)
    async with websockets.connect(f"{vl_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        session = await open_session(client, vl_server.model)
        images = [attachment(png(3), prompt.start)]
        by_websocket = decoded(await run(client, session, 0, prompt.tokens, images, maxTokens=5))
    async with grpc.aio.insecure_channel(vl_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(model=vl_server.model))
        request = pb.GenerateRequest(
            session_id=opened.session_id,
            append_tokens=prompt.tokens,
            max_tokens=5,
            top_k=1,
        )
        image = request.images.add(
            bytes=png(3), mime="image/png", pad_range_start=prompt.start, pad_range_end=prompt.end
        )
        events = [event async for event in stub.Generate(request)]
        by_grpc = [e.token.id for e in events if e.HasField("token") and not e.token.is_prefill]
        # The same call rewinding the session, with bytes that are no PNG: refused before
        # the session changes.
        bad = pb.GenerateRequest()
        bad.CopyFrom(request)
        bad.truncating = True
        bad.images[0].CopyFrom(image)
        bad.images[0].bytes = b"not a png"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(bad):
                pass
        dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=opened.session_id))
    assert by_grpc == by_websocket and len(by_grpc) == 5
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(dump.tokens) == len(prompt.tokens) + 5
    assert vl_server.wait_idle() == 0
