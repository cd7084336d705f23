"""Golden transcripts of the Evergreen session core: `tests/fixtures/evergreen/*.txt`.

A transcript is a list of steps, each followed by what the core must answer, in order:

    # a comment                           ignored, as are blank lines
    ! max_depth=3 files=1                 the session's limits (before the first step)
    > <SessionMessage in text format>     the client sends one message
    run #0 "Hel" "lo"                     action #0 streams these texts into its output
                                          (the last fragment final), then finishes;
                                          `run #0` alone finishes it without output
    ? p                                   the state of node p
    < ...                                 the expected answer lines of the step above:
                                            ready #N <input>: <leaf> <leaf> ...
                                            emit <NodeFragment in text format>
                                            node <id> <state>
                                            abort <CODE>: <message>

Each leaf of a ready action's input shows as [node_id mimetype role=... "payload"], a
file ref as <file path>. The test rebuilds every `<` line from what the core does and
compares whole files; `UPDATE_GOLDEN=1` rewrites them (then read the diff!).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from google.protobuf import text_format

from app.engine.base import SamplingOptions
from app.errors import SwitchboardError
from app.protocols.evergreen.generate import OUTPUT_METADATA, GeneratePlan
from app.protocols.evergreen.refs import FileRef
from app.protocols.evergreen.session import Leaf, Limits, Ready, Session
from schemas import evergreen_service_pb2 as service_pb
from tests.evergreen_frames import planner

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evergreen"


def _render_leaf(leaf: Leaf) -> str:
    words = [leaf.node_id, leaf.metadata.mimetype]
    if leaf.metadata.role:
        words.append(f"role={leaf.metadata.role}")
    for part in leaf.parts:
        if isinstance(part, FileRef):
            words.append(f"<file {part.relative_path}>")
        else:
            words.append(json.dumps(part.decode("utf-8", "backslashreplace")))
    return "[" + " ".join(words) + "]"


def _render_plan(plan: GeneratePlan) -> str:
    """The plan's settings that are not the defaults, as ` (key=value ...)`."""
    defaults = SamplingOptions()
    settings = {
        "max_tokens": plan.max_tokens,
        "lora": plan.lora_name,
        **{
            key: getattr(plan.sampling, key)
            for key in ("temperature", "top_p", "top_k", "seed", "stop")
            if getattr(plan.sampling, key) != getattr(defaults, key)
        },
    }
    words = [f"{key}={value!r}" for key, value in settings.items() if value is not None]
    return f" ({' '.join(words)})" if words else ""


class Runner:
    def __init__(self, limits: Limits) -> None:
        self.session: Session[GeneratePlan] = Session(limits, planner(loras=("tiny-lora",)))
        self.plans: dict[int, GeneratePlan] = {}

    def _ready(self, ready: list[Ready[GeneratePlan]]) -> list[str]:
        lines = []
        for action in ready:
            self.plans[action.index] = action.plan
            root = action.plan.input_ids[0]
            leaves = " ".join(_render_leaf(leaf) for leaf in self.session.leaves(root))
            lines.append(f"ready #{action.index} {root}{_render_plan(action.plan)}: {leaves}")
        return lines

    def step(self, line: str) -> list[str]:
        try:
            if line.startswith(">"):
                message = text_format.Parse(line[1:], service_pb.SessionMessage())
                return self._ready(self.session.receive(message))
            if line.startswith("?"):
                node_id = line[1:].strip()
                return [f"node {node_id} {self.session.state_of(node_id).value}"]
            if line.startswith("run "):
                index_word, *texts = shlex.split(line[4:])
                index = int(index_word.lstrip("#"))
                outputs = self.plans[index].output_ids
                lines = []
                for i, text in enumerate(texts):
                    final = i == len(texts) - 1
                    fragment = self.session.emit(outputs[0], text.encode(), final, OUTPUT_METADATA)
                    lines.append("emit " + text_format.MessageToString(fragment, as_one_line=True))
                return lines + self._ready(self.session.finish(index))
        except SwitchboardError as exc:
            return [f"abort {exc.evergreen_reason}: {exc.message}"]
        raise ValueError(f"not a transcript step: {line!r}")


def replay(text: str) -> str:
    out: list[str] = []
    runner: Runner | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("<"):
            continue
        out.append(raw)
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            settings = dict(word.split("=") for word in line[1:].split())
            runner = Runner(
                Limits(
                    max_nodes=int(settings.get("max_nodes", 10_000)),
                    max_bytes=int(settings.get("max_bytes", 1 << 20)),
                    max_pending_actions=int(settings.get("max_pending_actions", 64)),
                    max_depth=int(settings.get("max_depth", 256)),
                    files_allowed=settings.get("files") == "1",
                )
            )
            continue
        runner = runner or Runner(Limits(files_allowed=False))
        out.extend(f"< {answer}" for answer in runner.step(line))
    return "\n".join(out) + "\n"


TRANSCRIPTS = sorted(FIXTURES.glob("*.txt"))


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_transcript(path: Path) -> None:
    expected = path.read_text()
    actual = replay(expected)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(actual)
    assert actual == expected


def test_every_transcript_expects_something() -> None:
    # A transcript without answers would pass whatever the core did.
    assert len(TRANSCRIPTS) >= 10
    for path in TRANSCRIPTS:
        assert any(line.startswith("<") for line in path.read_text().splitlines()), path.name
