"""What a shared session store costs a Salience call: sessions in Redis against sessions
in the process, per call, by session length, and per token on the real engine.

In process (the fake engine, which answers at once, so that the call is all frontend):
one session holding L tokens (200 to 200,000), then rounds of a Generate (16 appended,
16 decoded) and a DumpSession, alternating the in-process store and a real redis-server
(started here on a free loopback port) round by round. Per call: wall time, this
process's CPU, the Redis commands it sent (`INFO commandstats`); the in-process figure is
the floor, the difference the store's cost. Beside them, what SQLite would cost a single
replica per Generate (docs/salience.md says why sessions are not kept in SQLite): the
read and rewrite of the session's token blob, twice (the call's start and end).

`--live`: a conversation on the real engine (the tiny model with 8,192 positions; one
server at a time, `--salience-store memory` and the Redis URL, alternating round by
round): each turn appends 200 tokens and decodes 64 greedily; per turn, the time to the
first token, the time per decoded token after it, and the last token to Done (the
call's end, where a shared store is written); over the conversation, the frontend's CPU
per token. Writes bench/results/salience-store.json and the table between the
`bench:salience-store` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/salience_store.py \
        [--rounds 20] [--live --live-rounds 4 --turns 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import harness
import redis
import websockets
from harness import ROOT, Results, Round, Server, markdown_table, publish, run_rounds, spread

sys.path.insert(0, str(ROOT))

from app.admission import Admission
from app.protocols.salience.sessions import Limits
from app.sessions.salience import SalienceRunner
from app.store.redis_sessions import RedisSessions
from app.store.sessions import MemorySessions, SessionBackend
from schemas import salience_pb2 as pb
from tests.fake_engine import FakeEngine
from tests.redis_server import redis_server

LENGTHS = (200, 2_000, 32_000, 200_000)
APPEND, DECODE = 16, 16
LIVE_APPEND, LIVE_DECODE = 200, 64
ROUND_TRIPS = ("watch", "eval", "exec")


# -- in process --------------------------------------------------------------------------


def runner(store: SessionBackend) -> SalienceRunner:
    engine = FakeEngine(max_model_len=max(LENGTHS) + 4096)
    limits = Limits(max_model_len=engine.info.max_model_len, lease_s=store.lease_s)
    return SalienceRunner(engine, Admission(None, None), store, limits)


async def grown(target: SalienceRunner, length: int) -> str:
    opened = await target.unary("OpenSession", pb.OpenSessionRequest(model="fake"))
    assert isinstance(opened, pb.OpenSessionResponse)
    request = pb.GenerateRequest(session_id=opened.session_id, append_tokens=[7] * length)
    await call(target, request)
    return opened.session_id


async def call(target: SalienceRunner, request: pb.GenerateRequest) -> int:
    total = 0

    async def emit(event: pb.GenerateEvent) -> None:
        nonlocal total
        if event.HasField("done"):
            total = event.done.total_tokens

    await target.run_generate(await target.start_generate(request), emit)
    return total


def round_trips(client: redis.Redis) -> int:
    """The round trips clients have made: WATCH, the read script, MULTI/EXEC (sent as one)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ROUND_TRIPS)


async def in_process(url: str, rounds: int) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    targets = {
        "memory": runner(MemorySessions()),
        "redis": runner(RedisSessions(url, ttl_s=1800, lease_s=60, vision=None)),
    }
    rows = []
    for length in LENGTHS:
        sessions = {name: await grown(target, length) for name, target in targets.items()}
        offsets = dict.fromkeys(targets, length)
        figures: dict[str, dict[str, list[float]]] = {
            name: {"generate_ms": [], "generate_cpu_ms": [], "dump_ms": [], "round_trips": []}
            for name in targets
        }
        for turn in range(rounds):
            order = list(targets) if turn % 2 == 0 else list(reversed(targets))
            for name in order:
                target, session = targets[name], sessions[name]
                before = round_trips(client)
                wall, cpu = time.perf_counter(), time.process_time()
                request = pb.GenerateRequest(
                    session_id=session,
                    offset=offsets[name],
                    append_tokens=[9] * APPEND,
                    max_tokens=DECODE,
                )
                offsets[name] = await call(target, request)
                figures[name]["generate_ms"].append((time.perf_counter() - wall) * 1000)
                figures[name]["generate_cpu_ms"].append((time.process_time() - cpu) * 1000)
                figures[name]["round_trips"].append(round_trips(client) - before)
                wall = time.perf_counter()
                await target.unary("DumpSession", pb.DumpSessionRequest(session_id=session))
                figures[name]["dump_ms"].append((time.perf_counter() - wall) * 1000)
        row: dict[str, Any] = {"session_tokens": length, "sqlite_ms": sqlite_cost(length)}
        for name, values in figures.items():
            for key, samples in values.items():
                row[f"{name}_{key}"] = statistics.median(samples)
        rows.append(row)
        for name, target in targets.items():
            await target.unary("CloseSession", pb.CloseSessionRequest(session_id=sessions[name]))
    for target in targets.values():
        await target.close()
    return rows


def sqlite_cost(length: int, calls: int = 20) -> float:
    """ms per Generate if a session of `length` tokens lived in SQLite (WAL, synchronous
    NORMAL): its token blob read and rewritten at the call's start and at its end (SQLite
    has no append to a blob)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "s.sqlite3", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE s (id TEXT PRIMARY KEY, tokens BLOB)")
        db.execute("INSERT INTO s VALUES ('a', ?)", (array("I", [7] * length).tobytes(),))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            for _ in range(2):
                db.execute("BEGIN IMMEDIATE")
                (blob,) = db.execute("SELECT tokens FROM s WHERE id = 'a'").fetchone()
                db.execute("UPDATE s SET tokens = ? WHERE id = 'a'", (blob + bytes(4 * APPEND),))
                db.execute("COMMIT")
            times.append((time.perf_counter() - start) * 1000)
        db.close()
    return statistics.median(times)


# -- on the engine ----------------------------------------------------------------------


async def conversation(ws_url: str, turns: int) -> list[dict[str, float]]:
    rows = []
    async with websockets.connect(f"{ws_url}/salience/ws", max_size=None) as ws:
        await ws.send(json.dumps({"id": "o", "method": "OpenSession", "request": {}}))
        session = json.loads(await ws.recv())["response"]["sessionId"]
        offset = 0
        for turn in range(turns):
            request = {
                "sessionId": session,
                "offset": offset,
                "appendTokens": [10 + (turn * 37 + i) % 1900 for i in range(LIVE_APPEND)],
                "maxTokens": LIVE_DECODE,
                "topK": 1,
            }
            start = time.perf_counter()
            await ws.send(json.dumps({"id": f"t{turn}", "method": "Generate", "request": request}))
            first = last = 0.0
            tokens = 0
            while True:
                event = json.loads(await ws.recv())["event"]
                now = time.perf_counter()
                if "token" in event:
                    tokens += 1
                    first = first or now
                    last = now
                if "done" in event:
                    offset = int(event["done"]["totalTokens"])
                    break
            rows.append(
                {
                    "ttft_ms": (first - start) * 1000,
                    "per_token_ms": (last - first) * 1000 / max(1, tokens - 1),
                    "end_ms": (now - last) * 1000,  # the last token to Done: the call's end
                }
            )
    return rows


def live(url: str, rounds: int, turns: int) -> Results:
    targets = [
        harness.switchboard("in process", "--salience-store", "memory", long=True),
        harness.switchboard("Redis", "--salience-store", url, long=True),
    ]

    def measure(server: Server, round_: Round) -> dict[str, float]:
        asyncio.run(conversation(server.ws, 2))  # a fresh engine's first turns are slow
        with server.meter() as meter:
            rows = asyncio.run(conversation(server.ws, turns))
        figures = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        return {**figures, **meter.figures()}

    return run_rounds(targets, measure, rounds=rounds, name="salience-store")


# -- the report -----------------------------------------------------------------------


def table(rows: list[dict[str, Any]], engine: Results | None) -> str:
    lines = [
        f"In process, the fake engine: a Generate ({APPEND} tokens appended, {DECODE} decoded) "
        "and a DumpSession on a session of each length; medians of alternating rounds.",
        "",
        *markdown_table(
            [
                "session tokens",
                "Generate ms, in process",
                "Generate ms, Redis",
                "CPU ms, in process",
                "CPU ms, Redis",
                "Redis round trips per Generate",
                "DumpSession ms, in process / Redis",
                "SQLite what-if ms per Generate",
            ],
            [
                [
                    f"{row['session_tokens']:,}",
                    f"{row['memory_generate_ms']:.2f}",
                    f"{row['redis_generate_ms']:.2f}",
                    f"{row['memory_generate_cpu_ms']:.2f}",
                    f"{row['redis_generate_cpu_ms']:.2f}",
                    f"{row['redis_round_trips']:.0f}",
                    f"{row['memory_dump_ms']:.2f} / {row['redis_dump_ms']:.2f}",
                    f"{row['sqlite_ms']:.2f}",
                ]
                for row in rows
            ],
        ),
    ]
    if engine is not None:
        lines += [
            "",
            f"On the engine (tiny model, 8,192 positions): turns of {LIVE_APPEND} tokens "
            f"appended and {LIVE_DECODE} decoded greedily, medians over a conversation's "
            f"turns, then over {len(engine.rounds)} rounds alternating the two servers "
            "(its range in parentheses); the last column compares them round by round.",
            "",
            *markdown_table(
                ["figure", "in process", "Redis", "Redis against in process"],
                [
                    [
                        label,
                        spread(engine.per_round("in process", key), 2),
                        spread(engine.per_round("Redis", key), 2),
                        compare(engine, key, difference),
                    ]
                    for label, key, difference in (
                        ("time to first token, ms", "ttft_ms", False),
                        ("ms per token after the first", "per_token_ms", False),
                        ("last token to Done (the call's end), ms", "end_ms", True),
                        ("frontend CPU per token, us", "frontend_cpu_us_per_tok", False),
                    )
                ],
            ),
        ]
    return "\n".join(lines)


def compare(engine: Results, key: str, difference: bool) -> str:
    """Redis against in process, round by round: a ratio, or (`difference`) ms more."""
    if not difference:
        return spread(engine.within("Redis", "in process", key), 2) + "x"
    pairs = zip(engine.per_round("Redis", key), engine.per_round("in process", key), strict=True)
    return "+" + spread([a - b for a, b in pairs], 2)


def republish() -> None:
    """The table again from bench/results (its wording changed, not its figures)."""
    record = json.loads((harness.RESULTS / "salience-store.json").read_text())
    engine = None
    if record["engine"] is not None:
        engine = Results.from_record(record["engine"])
    harness.write_table("salience-store", table(record["in_process"], engine))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--live", action="store_true")
    parser.add_argument("--live-rounds", type=int, default=4)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--republish", action="store_true", help=republish.__doc__)
    args = parser.parse_args()
    if args.republish:
        republish()
        return
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        rows = asyncio.run(in_process(url, args.rounds))
        engine = live(url, args.live_rounds, args.turns) if args.live else None
    figures = {
        "append": APPEND,
        "decode": DECODE,
        "in_process": rows,
        "engine": None if engine is None else engine.record(),
    }
    publish("salience-store", figures, table(rows, engine))


if __name__ == "__main__":
    main()
