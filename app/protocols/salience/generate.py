"""One Salience Generate: request validation, the engine request, and the event stream.

Sans-IO. `GenerateCall` applies the request to its session (through `SessionStore`),
builds the token-id `GenerationRequest` for the whole session, with every image the
session holds (vLLM's prefix cache makes the repeated prefix cheap, and its processor
cache the repeated images), then turns the engine's `TokenEvent`s into `GenerateEvent`s.
Image attachments are checked and placed (`app.protocols.salience.images`) before the
session is touched; the caller decodes them beforehand, off the event loop, and passes
them in (`decoded`, in the order `check_attachments` gives), and the call's `claim` (the
id under which its session runs it, `lifecycle.py`). The events:

- prefill Token events for the positions of the prompt covered by `logprobs_ranges` or
  `readout_ranges`, with the first engine event;
- a Token event per decoded token, kept by the call (`decoded`) until it ends. A decoded
  token whose position wants a readout is held until its readout arrives (the engine reads
  a token's hidden state when it feeds that token in, after sampling it); the last token
  of a call is never fed in, so it goes out without one;
- a final Done with the counts and the finish reason (`closing`), once the call has ended
  on its session (`end`: the decoded tokens join it; `abandon`: a failed call, rolled
  back unless it had decoded tokens). The session's store is touched at the start and
  at the end of a call, never per token.

Defaults as the proto says: temperature 0 means 1.0, top_p 0 means 1.0, top_k 0 is off
(top_k 1 is greedy). max_tokens 0 is prefill only (scoring). Every sampling field, whether
or not the call decodes, is held to the limits all protocols share
(`app.engine.validation`), as is the prompt's fit in the context (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace

from app.engine.base import (
    DecodedImage,
    EngineInfo,
    GenerationRequest,
    SamplingOptions,
    TokenEvent,
    TokenLogprob,
)
from app.engine.validation import check_fit, check_token_ids, validate_sampling
from app.errors import InvalidRequest
from app.protocols.salience.images import check_attachments, place_images
from app.protocols.salience.sessions import SessionStore
from schemas import salience_pb2 as pb

Ranges = tuple[tuple[int, int], ...]
# How errors of the shared limits (`app.engine.validation`) name the request's fields.
FIELDS = {
    "prompt": "the session (with append_tokens)",
    "logprobs": "logprob_top_k",
    "prompt_logprobs": "logprob_top_k",
}
Finish = pb.GenerateDone.FinishReason
_FINISH = {
    "stop": Finish.FINISH_REASON_EOS,
    "length": Finish.FINISH_REASON_LENGTH,
    "abort": Finish.FINISH_REASON_CANCELLED,
}


def _ranges(ranges: Sequence[pb.PositionRange], name: str) -> Ranges:
    out = tuple((int(r.start), int(r.end)) for r in ranges)
    if any(start > end for start, end in out):
        raise InvalidRequest(f"{name}: a range's start is after its end")
    return out


def _covered(position: int, ranges: Ranges) -> bool:
    return any(start <= position < end for start, end in ranges)


def _meets(ranges: Ranges, lo: int, hi: int) -> bool:
    return any(start < hi and end > lo for start, end in ranges)


class GenerateCall:
    def __init__(
        self,
        store: SessionStore,
        request: pb.GenerateRequest,
        info: EngineInfo,
        request_id: str,
        decoded: Sequence[DecodedImage] = (),
        claim: str = "",
    ) -> None:
        self._logprob_ranges = _ranges(request.logprobs_ranges, "logprobs_ranges")
        self._readout_ranges = _ranges(request.readout_ranges, "readout_ranges")
        if self._readout_ranges and info.readout is None:
            raise InvalidRequest(
                "readout_ranges: this server has no readouts configured (--readout-concepts)"
            )
        append = list(request.append_tokens)
        check_token_ids(append, info, "append_tokens")
        attachments = check_attachments(request.images, append, int(request.offset), info)
        images = place_images(attachments, decoded)
        self.session_id = request.session_id
        self.claim = claim
        self._top_k = int(request.logprob_top_k)
        max_tokens = int(request.max_tokens)
        # Checked whether or not they will be used, before the session is touched.
        sampling = validate_sampling(
            SamplingOptions(
                max_tokens=max_tokens,
                temperature=request.temperature or 1.0,
                top_p=request.top_p or 1.0,
                top_k=int(request.top_k),
                stop_token_ids=tuple(request.stop_token_ids),
                logprobs=self._top_k,
            ),
            info,
            FIELDS,
            prefill_only=True,
        )
        # The session's length once the call is applied (check_generate refuses the call
        # otherwise), known up front to size the context check.
        self.prompt_len = int(request.offset) + len(append)
        needs_engine = max_tokens > 0 or self._wants_prefill_events
        mutation = store.check_generate(
            request.session_id,
            offset=int(request.offset),
            truncating=request.truncating,
            append=append,
            # Scoring still samples (and drops) one token inside the engine.
            max_tokens=max(max_tokens, 1) if needs_engine else 0,
            images=images,
        )
        # Without the engine the tokens are only kept: a no-op Generate (the TTL refresh)
        # works on an empty or a full session. Checked before the call is applied, which
        # may evict other sessions to make room for its tokens.
        check_fit(self.prompt_len, max_tokens, info, FIELDS, stored_only=not needs_engine)
        session = store.begin_generate(mutation, claim)
        self.decoded: array[int] = array("I")  # what the engine produced, in order
        self._produced = 0
        self._held: list[pb.Token] = []
        self._readouts: dict[int, bytes] = {}
        self._finish: int = Finish.FINISH_REASON_UNSPECIFIED
        decode_end = self.prompt_len + max_tokens
        self.engine_request: GenerationRequest | None = None
        self._prompt: list[int] = []
        if needs_engine:
            self._prompt = session.tokens.tolist()
            self.engine_request = GenerationRequest(
                request_id=request_id,
                prompt_token_ids=self._prompt,
                sampling=replace(
                    sampling,
                    logprobs=(
                        sampling.logprobs
                        if _meets(self._logprob_ranges, self.prompt_len, decode_end)
                        else None
                    ),
                    prompt_logprobs=(
                        sampling.logprobs
                        if _meets(self._logprob_ranges, 0, self.prompt_len)
                        else None
                    ),
                ),
                priority=int(request.priority),
                readout_ranges=self._readout_ranges,
                # The whole session is the prompt, so every image it holds goes along.
                images=tuple(session.images),
            )

    @property
    def _wants_prefill_events(self) -> bool:
        return _meets(self._logprob_ranges + self._readout_ranges, 0, self.prompt_len)

    def _token(self, token_id: int, position: int, prefill: bool) -> pb.Token:
        return pb.Token(id=token_id, position=position, is_prefill=prefill)

    def _with_logprob(self, token: pb.Token, entry: TokenLogprob | None) -> None:
        if entry is None or not _covered(token.position, self._logprob_ranges):
            return
        token.sampled_logprob = entry.logprob
        token.has_sampled_logprob = True
        if self._top_k > 0:
            token.logprobs.extend(pb.TokenLogprob(id=t, logprob=lp) for t, lp in entry.top.items())

    def _release_held(self, out: list[pb.GenerateEvent]) -> None:
        """Send held tokens, in order, as far as their readouts have arrived."""
        while self._held and self._held[0].position in self._readouts:
            token = self._held.pop(0)
            token.readout.extend(_floats(self._readouts.pop(token.position)))
            out.append(pb.GenerateEvent(token=token))

    def on_event(self, event: TokenEvent) -> list[pb.GenerateEvent]:
        out: list[pb.GenerateEvent] = []
        # Readouts may arrive before the token of their position (the engine can run a
        # step ahead of the frontend): keep them until that token is sent.
        self._readouts.update(event.readouts or {})
        if event.prompt_token_ids is not None:
            tokens = self._prompt
            prompt_lp = event.prompt_logprobs
            for position in self._prefill_positions():
                token = self._token(tokens[position], position, True)
                if prompt_lp is not None and position < len(prompt_lp):
                    self._with_logprob(token, prompt_lp[position])
                data = self._readouts.pop(position, None)
                if data is not None and _covered(position, self._readout_ranges):
                    token.readout.extend(_floats(data))
                out.append(pb.GenerateEvent(token=token))
        for i, token_id in enumerate(event.token_ids):
            position = self.prompt_len + self._produced
            self._produced += 1
            token = self._token(token_id, position, False)
            if event.logprobs is not None:
                self._with_logprob(token, event.logprobs[i])
            if _covered(position, self._readout_ranges) or self._held:
                self._held.append(token)
            else:
                out.append(pb.GenerateEvent(token=token))
        self._release_held(out)
        self.decoded.extend(event.token_ids)
        if event.finish_reason is not None:
            self._finish = _FINISH[event.finish_reason]
        return out

    def _prefill_positions(self) -> list[int]:
        wanted: set[int] = set()
        for start, end in self._logprob_ranges + self._readout_ranges:
            wanted.update(range(start, min(end, self.prompt_len)))
        return sorted(wanted)

    def closing(self, *, cancelled: bool = False) -> list[pb.GenerateEvent]:
        """The closing events (held tokens, then Done), once the call has ended."""
        out = [pb.GenerateEvent(token=token) for token in self._held]
        self._held.clear()
        finish = self._finish
        if cancelled:
            finish = Finish.FINISH_REASON_CANCELLED
        elif finish == Finish.FINISH_REASON_UNSPECIFIED:
            finish = Finish.FINISH_REASON_LENGTH  # prefill only: the budget of 0 is spent
        out.append(
            pb.GenerateEvent(
                done=pb.GenerateDone(
                    prompt_tokens=self.prompt_len,
                    completion_tokens=self._produced,
                    total_tokens=self.prompt_len + self._produced,
                    finish_reason=finish,
                )
            )
        )
        return out

    def end(self, store: SessionStore) -> None:
        """The call is over (done or cancelled): its session keeps what it decoded."""
        store.end_generate(self.session_id, self.claim, self.decoded)

    def abandon(self, store: SessionStore) -> None:
        """The call failed (the client gets an error): free the session. Unless tokens
        were decoded and streamed already, the session goes back to what it was before
        the call, which is what the client still believes."""
        store.end_generate(self.session_id, self.claim, self.decoded, rollback=not self._produced)


def _floats(data: bytes) -> list[float]:
    values = array("f")
    values.frombytes(data)
    return values.tolist()
