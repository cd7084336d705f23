"""The images of Salience sessions on Redis (`app.store.redis_sessions`): kept once as
they came, decoded where they are needed.

- `keep` writes a Generate's attachments before the call names them, under
  `img:<digest>` (mime, a newline, the bytes): one copy shared by every session and fork
  that holds the image, expiring `MARGIN_S` after the sessions' TTL (every write of a
  session holding it pushes that back: `ttl_ms`).
- A session read from Redis names its images by digest (`block`); their pixels stay
  unloaded until an engine request needs them (`hydrate`), and then are decoded once on
  this replica, off the event loop, and kept for the next calls (the last
  `_DECODED` images).
- An image the store no longer holds is `store_unavailable` (the client opens a new
  session); one that decodes here into another number of pad tokens than where it was
  attached means the replicas serve different models (FAILED_PRECONDITION).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from app.engine.base import DecodedImage, GenerationRequest, PromptImage, VisionInfo
from app.errors import FailedPrecondition, Unavailable
from app.store.redis_connection import RedisConnection
from app.store.redis_session_fields import ImageRef
from app.store.sessions import Attached

MARGIN_S = 300.0  # how long an image outlives the TTL of the sessions holding it
_DECODED = 64  # decoded images kept per replica
_UNLOADED = object()  # the pixels of an image this replica has not decoded yet


class SessionImages:
    def __init__(
        self, redis: RedisConnection, prefix: str, *, ttl_s: float, vision: VisionInfo | None
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._vision = vision
        self.ttl_ms = int((ttl_s + MARGIN_S) * 1000)
        self._decoded: OrderedDict[str, DecodedImage] = OrderedDict()

    def key(self, digest: str) -> str:
        return self._prefix + "img:" + digest

    async def keep(self, images: Sequence[Attached]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for decoded, mime, data in images:
                pipe.set(self.key(decoded.digest), mime.encode() + b"\n" + data, px=self.ttl_ms)
            await pipe.execute()
        for decoded, _, _ in images:
            self._remember(decoded)

    def block(self, ref: ImageRef) -> PromptImage:
        """The image block a record names, decoded if this replica has it."""
        start, end, digest, pads = ref
        decoded = self._decoded.get(digest) or DecodedImage(_UNLOADED, digest, pads)
        return PromptImage(start, end, decoded)

    async def hydrate(self, request: GenerationRequest) -> GenerationRequest:
        if not any(block.image.pixels is _UNLOADED for block in request.images):
            return request
        images = [
            block if block.image.pixels is not _UNLOADED else await self._decode(block)
            for block in request.images
        ]
        return replace(request, images=tuple(images))

    async def _decode(self, block: PromptImage) -> PromptImage:
        digest = block.image.digest
        decoded = self._decoded.get(digest)
        if decoded is None:
            stored = await self._redis.call("get", self.key(digest))
            if stored is None or self._vision is None:
                raise Unavailable(
                    "The session store no longer holds the session's image "
                    f"{digest[:12]}: open a new session and send it again",
                    code="store_unavailable",
                )
            assert isinstance(stored, bytes)  # the client decodes no responses
            mime, _, data = stored.partition(b"\n")
            decoded = await asyncio.to_thread(self._vision.read_image, data, mime.decode())
            if decoded.pad_tokens != block.image.pad_tokens:
                raise FailedPrecondition(
                    f"the session's image {digest[:12]} makes {decoded.pad_tokens} image pad "
                    f"tokens here and made {block.image.pad_tokens} where it was attached: "
                    "the replicas sharing this store serve different models"
                )
            self._remember(decoded)
        return PromptImage(block.start, block.end, decoded)

    def _remember(self, decoded: DecodedImage) -> None:
        self._decoded[decoded.digest] = decoded
        self._decoded.move_to_end(decoded.digest)
        while len(self._decoded) > _DECODED:
            self._decoded.popitem(last=False)
