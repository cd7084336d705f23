"""The engine layer on real vLLM (the live server's engine, driven on its own loop). Its
abort tests follow tests/aborts.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.engine.base import (
    OPEN_REQUESTS,
    GenerationRequest,
    OpenRequests,
    SamplingOptions,
    TokenEvent,
)
from app.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from tests.aborts import AbortWatch, Workload
from tests.conftest import LiveServer

pytestmark = pytest.mark.engine


async def _run(engine: Any, request: GenerationRequest) -> list[TokenEvent]:
    return [event async for event in engine.generate(request)]


def greedy(max_tokens: int, **kw: Any) -> SamplingOptions:
    return SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def test_events_are_deltas_with_one_final(live_server: LiveServer) -> None:
    engine = live_server.engine
    request = GenerationRequest("eng-delta", prompt_text="import json", sampling=greedy(6))
    events = live_server.call(_run(engine, request))
    assert sum(len(e.token_ids) for e in events) == 6
    assert [e.finish_reason for e in events][-1] == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert events[0].prompt_token_ids == engine.tokenizer.encode("import json")
    assert all(e.prompt_token_ids is None for e in events[1:])
    ids = [t for e in events for t in e.token_ids]
    assert "".join(e.text for e in events) == engine.tokenizer.decode(ids)


@pytest.mark.parametrize("kind", ["plain", "logprobs", "prompt logprobs"])
def test_the_consumer_serves_every_kind_of_request(
    live_server: LiveServer, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain requests, logprobs and prompt logprobs alike run on the process's consumer of
    the engine core's outputs (app.engine.vllm.consumer: the request's state in vLLM is a
    StepState when the engine core is given it), and come back as the converter made them
    on AsyncLLM's path. Its metrics: tests/engine/test_vllm_metrics.py."""
    from app.engine.vllm.consumer import StepState

    engine = live_server.engine
    prompt = engine.tokenizer.encode("def add(a, b):")
    options = {"logprobs": {"logprobs": 2}, "prompt logprobs": {"prompt_logprobs": 2}}
    sampling = greedy(7, **options.get(kind, {}))
    states: set[str] = set()
    core = engine._llm.engine_core
    add = core.add_request_async

    async def watched(request: Any) -> None:
        # Read as the core is given the request: read from the stream's reader instead,
        # a loaded machine let all 7 steps end (and the state go) before it woke.
        state = engine._llm.output_processor.request_states[request.request_id]
        if state.external_req_id.startswith("eng-kind-"):
            states.add(type(state).__name__)
        await add(request)

    monkeypatch.setattr(core, "add_request_async", watched)

    async def run(request_id: str) -> list[TokenEvent]:
        events = []
        async for event in engine.generate(
            GenerationRequest(request_id, prompt_token_ids=prompt, sampling=sampling)
        ):
            events.append(event)
        return events

    async def on_asyncllm() -> list[TokenEvent]:
        engine._stepwise = False
        try:
            return await run(f"eng-kind-asyncllm-{kind}")
        finally:
            engine._stepwise = True

    ours = live_server.call(run(f"eng-kind-{kind}"))
    assert states == {StepState.__name__}
    theirs = live_server.call(on_asyncllm())
    assert "RequestState" in states
    # How many tokens one event carries depends on how fast the reader keeps up (AsyncLLM
    # coalesces what a slow reader has not taken yet): compare the streams whole.
    assert _whole(ours) == _whole(theirs)
    assert sum(len(e.token_ids) for e in ours) == 7


def _whole(events: list[TokenEvent]) -> TokenEvent:
    """A request's events as one: what every event said, in order."""
    logprobs = [lp for e in events for lp in e.logprobs or ()] if events[0].logprobs else None
    return events[0]._replace(
        token_ids=[t for e in events for t in e.token_ids],
        text="".join(e.text for e in events),
        logprobs=logprobs,
        finish_reason=events[-1].finish_reason,
        stop_reason=events[-1].stop_reason,
        num_cached_tokens=0,
    )


def test_a_stop_string_ends_a_plain_request_in_vllm_too(live_server: LiveServer) -> None:
    """vLLM's detokenizer finds stop strings on the delta path as on its own: the text
    stops before it, the reason is the string, and the engine core is told to stop."""
    engine = live_server.engine
    base = GenerationRequest("eng-stop-ref", prompt_text="import os", sampling=greedy(40))
    text = "".join(e.text for e in live_server.call(_run(engine, base)))
    # A stop string first seen some tokens in, so text came before it.
    start = next(i for i in range(5, len(text) - 3) if text.index(text[i : i + 3]) == i)
    stop = text[start : start + 3]
    request = GenerationRequest(
        "eng-stop", prompt_text="import os", sampling=greedy(40, stop=(stop,))
    )
    events = live_server.call(_run(engine, request))
    assert "".join(e.text for e in events) == text[: text.index(stop)]
    assert events[-1].finish_reason == "stop" and events[-1].stop_reason == stop
    assert live_server.wait_idle() == 0


def test_prompt_and_sampled_logprobs(live_server: LiveServer) -> None:
    engine = live_server.engine
    prompt = engine.tokenizer.encode("def add(a, b):")
    request = GenerationRequest(
        "eng-lp", prompt_token_ids=prompt, sampling=greedy(3, logprobs=3, prompt_logprobs=2)
    )
    events = live_server.call(_run(engine, request))
    first = events[0]
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt)
    assert first.prompt_logprobs[0] is None
    for token, entry in zip(prompt[1:], first.prompt_logprobs[1:], strict=True):
        assert entry is not None and entry.token_id == token and entry.logprob <= 0
        assert len(entry.top) == 2
    for event in events:
        for token, entry in zip(event.token_ids, event.logprobs or [], strict=True):
            assert entry.rank == 1  # greedy picks the best
            assert next(iter(entry.top)) == token and len(entry.top) == 3


def test_prefill_only_scores_without_output(live_server: LiveServer) -> None:
    engine = live_server.engine
    prompt = engine.tokenizer.encode("return x + y")
    events = live_server.call(
        _run(
            engine,
            GenerationRequest(
                "eng-prefill",
                prompt_token_ids=prompt,
                sampling=SamplingOptions(max_tokens=0, prompt_logprobs=0),
            ),
        )
    )
    assert len(events) == 1
    assert events[0].token_ids == [] and events[0].finish_reason == "length"
    assert len(events[0].prompt_logprobs or []) == len(prompt)


def test_prefix_cache_is_used(live_server: LiveServer) -> None:
    engine = live_server.engine
    prompt = engine.tokenizer.encode("class Cache:\n    " * 40)
    for i in range(2):
        events = live_server.call(
            _run(
                engine,
                GenerationRequest(f"eng-pc-{i}", prompt_token_ids=prompt, sampling=greedy(1)),
            )
        )
    assert events[0].num_cached_tokens >= len(prompt) // 2


def _workload(workload: Workload, tag: str) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            f"{tag}-{i}", prompt_token_ids=prompt, sampling=greedy(workload.max_tokens)
        )
        for i, prompt in enumerate(workload.prompts)
    ]


def test_closing_the_iterators_aborts(live_server: LiveServer, abort_workload: Workload) -> None:
    engine = live_server.engine

    async def close_after_the_first_event() -> None:
        watch = await AbortWatch.start(engine, abort_workload)
        streams = [engine.generate(r) for r in _workload(abort_workload, "eng-close")]
        await asyncio.gather(*(stream.__anext__() for stream in streams))
        await watch.all_in_engine()
        for stream in streams:
            await stream.aclose()
        await watch.idle()

    live_server.call(close_after_the_first_event())


@pytest.mark.parametrize("pushed", [False, True])
def test_cancelling_the_consumers_aborts(
    live_server: LiveServer, abort_workload: Workload, pushed: bool
) -> None:
    """Cancelling the task that pulls a request's events, or that waits while they are
    pushed (`run`), aborts it in vLLM."""
    engine = live_server.engine

    def consume(request: GenerationRequest) -> Any:
        return engine.run(request, lambda event: None) if pushed else _run(engine, request)

    async def cancel_midway() -> None:
        watch = await AbortWatch.start(engine, abort_workload)
        tasks = [
            asyncio.create_task(consume(r))
            for r in _workload(abort_workload, f"eng-cancel-{pushed}")
        ]
        await watch.all_in_engine()
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(e, asyncio.CancelledError) for e in ended)
        await watch.idle()

    live_server.call(cancel_midway())


@pytest.mark.parametrize("pushed", [False, True])
def test_a_tasks_open_requests_abort_ahead_of_its_cancel(
    live_server: LiveServer, abort_workload: Workload, pushed: bool
) -> None:
    """A task that sets `OPEN_REQUESTS` (the batch lane's) can abort its engine requests
    before it cancels the task: vLLM drops them at once. A pushed request (`run`) then
    hands on nothing more, its task waiting for the cancel (which the lane spreads over
    a few turns); a pulled one's events end with the abort. Asked and cancelled in the
    same turn, they leave vLLM all the same, the unwinding awaiting the abort sent."""
    engine = live_server.engine

    async def consume(request: GenerationRequest, held: OpenRequests) -> list[TokenEvent]:
        OPEN_REQUESTS.set(held)
        if not pushed:
            return await _run(engine, request)
        events: list[TokenEvent] = []
        await engine.run(request, events.append)
        return events

    async def take_off(cancel_at_once: bool) -> None:
        watch = await AbortWatch.start(engine, abort_workload)
        helds = [OpenRequests() for _ in abort_workload.prompts]
        tag = f"eng-open-{pushed}-{cancel_at_once}"
        tasks = [
            asyncio.create_task(consume(r, held))
            for r, held in zip(_workload(abort_workload, tag), helds, strict=True)
        ]
        await watch.all_in_engine()
        for held in helds:
            held.abort()
        if not cancel_at_once:
            await watch.idle()  # vLLM dropped them, uncancelled
            if pushed:  # nothing handed on since: each still waits for its cancel
                assert not any(task.done() for task in tasks)
        for task in tasks:
            task.cancel()
        ended = await asyncio.wait_for(
            asyncio.gather(*tasks, return_exceptions=True), abort_workload.bound
        )
        if pushed or cancel_at_once:
            assert all(isinstance(e, asyncio.CancelledError) for e in ended), ended
        else:  # each pulled call ended by itself, its last event the abort
            assert all(isinstance(e, list) and e[-1].finish_reason == "abort" for e in ended), ended
        await watch.idle()

    live_server.call(take_off(cancel_at_once=False))
    live_server.call(take_off(cancel_at_once=True))


def test_priority_and_lora_requests(live_server: LiveServer) -> None:
    engine = live_server.engine
    base = live_server.call(
        _run(
            engine, GenerationRequest("eng-p", prompt_text="a = [", sampling=greedy(8), priority=-5)
        )
    )
    lora = live_server.call(
        _run(
            engine,
            GenerationRequest(
                "eng-l", prompt_text="a = [", sampling=greedy(8), lora_name=live_server.lora
            ),
        )
    )
    assert [t for e in base for t in e.token_ids] != [t for e in lora for t in e.token_ids]


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (GenerationRequest("bad-1", prompt_text="a", lora_name="nope"), ModelNotFound),
        (GenerationRequest("bad-2", prompt_token_ids=[1, 5000]), InvalidRequest),
        (GenerationRequest("bad-3", prompt_text="a b " * 600), ContextLengthExceeded),
        (GenerationRequest("bad-4", prompt_token_ids=[]), InvalidRequest),
        (
            GenerationRequest("bad-5", prompt_text="a", sampling=SamplingOptions(temperature=-1.0)),
            InvalidRequest,
        ),
    ],
)
def test_bad_requests_raise_app_errors(
    live_server: LiveServer, request_: GenerationRequest, error: type[Exception]
) -> None:
    with pytest.raises(error):
        live_server.call(_run(live_server.engine, request_))
    assert live_server.running_requests() == 0


@pytest.mark.parametrize("source", ["consumer", "pushed", "converter"])
def test_a_bug_of_ours_in_the_generate_loop_is_not_a_client_error(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Only calls into vLLM are mapped: a built-in error in our own handling of its
    outputs (the consumer's events, pulled or pushed, or AsyncLLM's RequestOutputs
    converted) escapes as itself (the transport makes it an InternalError), never as
    InvalidRequest, and the request is aborted in the engine all the same."""
    from app.engine.vllm import convert, engine

    def broken(*args: Any) -> None:
        raise ValueError("a bug in our converter")

    request = GenerationRequest(f"eng-bug-{source}", prompt_text="x = 1", sampling=greedy(200))
    live = live_server.engine

    async def run() -> None:
        if source == "pushed":
            await live.run(request, broken)
        elif source == "converter":
            live._stepwise = False
            try:
                await _run(live, request)
            finally:
                live._stepwise = True
        else:
            await _run(live, request)

    if source == "consumer":
        monkeypatch.setattr(engine, "merge_deltas", broken)
    elif source == "converter":
        monkeypatch.setattr(convert.EventConverter, "convert", broken)
    with pytest.raises(ValueError, match="a bug in our converter"):
        live_server.call(run())

    async def unfinished() -> int:  # vLLM's own count, not our wrapper's
        return int(live._llm.get_num_unfinished_requests())

    assert live_server.call(unfinished()) == 0


def test_pushed_events_are_the_pulled_ones(live_server: LiveServer) -> None:
    """`run` hands on, from the consumer's loop, the events `generate` yields: the same
    deltas, one final, a stop string ending the text before it."""
    engine = live_server.engine
    base = GenerationRequest("eng-push-ref", prompt_text="import os", sampling=greedy(40))
    text = "".join(e.text for e in live_server.call(_run(engine, base)))
    start = next(i for i in range(5, len(text) - 3) if text.index(text[i : i + 3]) == i)
    stop = text[start : start + 3]
    for options in (greedy(40), greedy(40, stop=(stop,)), greedy(9, logprobs=1)):
        request = GenerationRequest("eng-push", prompt_text="import os", sampling=options)
        pulled = live_server.call(_run(engine, request))
        pushed: list[TokenEvent] = []
        live_server.call(engine.run(request, pushed.append))
        # Steps may merge differently: compare what they add up to, then the ends.
        assert [t for e in pushed for t in e.token_ids] == [t for e in pulled for t in e.token_ids]
        assert "".join(e.text for e in pushed) == "".join(e.text for e in pulled)
        assert pushed[-1].finish_reason == pulled[-1].finish_reason
        assert pushed[-1].stop_reason == pulled[-1].stop_reason
        assert [e.finish_reason is None for e in pushed[:-1]] == [True] * (len(pushed) - 1)
        assert pushed[0].prompt_token_ids == pulled[0].prompt_token_ids
    assert live_server.wait_idle() == 0


def test_a_prompt_over_the_context_is_ours_to_refuse_before_vllm(live_server: LiveServer) -> None:
    """vLLM has no exception type for it, so the shared prompt-fit check answers it."""
    engine = live_server.engine
    limit = engine.info.max_model_len
    for ids, max_tokens, param in (([1] * limit, 0, "prompt"), ([1] * 10, limit, "max_tokens")):
        request = GenerationRequest("eng-ctx", prompt_token_ids=ids, sampling=greedy(max_tokens))
        with pytest.raises(ContextLengthExceeded) as refused:
            live_server.call(_run(engine, request))
        assert refused.value.param == param
    assert live_server.running_requests() == 0


def test_prompt_logprobs_beside_other_requests(live_server: LiveServer) -> None:
    """With --enable-lora, vLLM's CPU LoRA logits path kills the engine core when a request
    asking for prompt logprobs shares a step with another request (app.engine.batch_gate);
    found by the fuzz suite. Here they are submitted together, base model and adapter."""
    engine = live_server.engine
    prompt = engine.tokenizer.encode("def add(a, b):")

    def request(i: int) -> GenerationRequest:
        scoring = i % 2 == 0
        return GenerationRequest(
            f"eng-mix-{i}",
            prompt_token_ids=prompt,
            sampling=greedy(4, prompt_logprobs=2) if scoring else greedy(4),
            lora_name=live_server.lora if i % 3 == 0 else None,
        )

    async def together() -> list[list[TokenEvent]]:
        return await asyncio.gather(*(_run(engine, request(i)) for i in range(8)))

    for events in live_server.call(together()):
        assert sum(len(e.token_ids) for e in events) == 4
    for i, events in enumerate(live_server.call(together())):
        if i % 2 == 0:
            assert events[0].prompt_logprobs is not None
    assert live_server.wait_idle() == 0
