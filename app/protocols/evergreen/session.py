"""The Evergreen session: every rule of the data model, as one state machine.

Sans-IO: `receive(SessionMessage)` takes what the client sent and returns the actions
whose inputs are now complete; `emit` writes the server's own output fragments;
`finish` ends an action. A rule broken by the client raises one of `app.errors` (the
session is then over: the caller aborts it and closes the socket).

Everything that decides what a fragment or an action does to the session lives in this
module, so the rules can be read (and tested) in one place.

Nodes. A node is in one `NodeState`. A client fragment is classified against its node
(`_classify`) as one `Event`, and `TRANSITIONS[(state, event)]` says what happens: the
fragment is stored, ignored (a retry: the first fragment for a (node, seq) wins), or the
session aborts. A pair that is not in the table aborts.

- A leaf node holds one chunk: the payloads of its fragments (bytes, a decoded `data:`
  ref, or a `FileRef`) concatenated in seq order, with seq 0's metadata. seq 0 must carry
  that metadata (a mimetype); a later fragment may repeat it unchanged (the spec's own
  example does), a different one aborts.
- A non-leaf node lists children, over one or more fragments; `child_ids` and
  `chunk_fragment` in one node abort.
- A node is complete once its final fragment (continued = false) and every fragment
  before it have arrived; a fragment past the final seq aborts.
- Children may be named before they arrive. An edge that closes a cycle aborts, and so
  does nesting deeper than `max_depth` nodes. The graph's bookkeeping (edges, cycles,
  depth, which trees are complete) is `app.protocols.evergreen.dag`, kept up to date
  edge by edge: no fragment walks the whole session.

Actions. An action reserves its output ids (they must be new: a node that has received
a fragment, or another action's output, aborts) and waits until every input tree is
complete: all its nodes, down to the leaves, complete. Outputs of earlier actions count
as nodes of the session, so later actions can use them without a resend; an action that
waits on its own output, or actions that wait on each other's, abort (they could never
run). Only the outputs an action names are produced.

Limits per session, each aborting with RESOURCE_EXHAUSTED: node ids known (received or
named), bytes held (inline data, decoded refs, node and child ids, metadata, the server's
outputs, and `FRAGMENT_OVERHEAD` per fragment kept), actions waiting or running, and the nodes
and bytes one input flattens to (a DAG that shares nodes could otherwise flatten to
exponentially many).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from app.errors import FailedPrecondition, InvalidRequest, ResourceExhausted, SwitchboardError
from app.protocols.evergreen.dag import Dag
from app.protocols.evergreen.refs import FileRef, parse_ref
from schemas import evergreen_pb2 as pb
from schemas import evergreen_service_pb2 as service_pb

Payload = bytes | FileRef
# Bytes charged for every fragment the session keeps, besides its payload, child ids and
# metadata: about what CPython spends on one (~140 bytes), so that a flood of empty
# fragments is bounded by `max_bytes` like everything else the session holds.
FRAGMENT_OVERHEAD = 128


class NodeState(enum.Enum):
    ABSENT = "absent"  # named (as a child or an input) but no fragment has arrived
    OPEN = "open"  # some fragments arrived, the node is not complete
    COMPLETE = "complete"  # the final fragment and every one before it arrived
    PRODUCED = "produced"  # an action's output: the server writes it, never the client


class Event(enum.Enum):
    """What one client fragment is, against the node it names."""

    FRESH = "fresh"  # a seq not received yet, consistent with the node
    REPEAT = "repeat"  # a seq already received (a retry)
    PAST_FINAL = "past final"  # a seq after the final one, or a final before a received seq
    MIXED = "mixed"  # child_ids and chunk_fragment in one node
    METADATA_CHANGED = "metadata changed"  # seq > 0 metadata that differs from seq 0's
    NO_METADATA = "no metadata"  # a leaf whose seq 0 has no metadata with a mimetype
    NOT_YOURS = "not yours"  # a fragment for an action's output


class Outcome(enum.Enum):
    STORE = "store"
    IGNORE = "ignore"
    ABORT = "abort"


_S, _E, _O = NodeState, Event, Outcome
TRANSITIONS: dict[tuple[NodeState, Event], Outcome] = {
    (_S.ABSENT, _E.FRESH): _O.STORE,
    (_S.ABSENT, _E.MIXED): _O.ABORT,
    (_S.ABSENT, _E.NO_METADATA): _O.ABORT,
    (_S.OPEN, _E.FRESH): _O.STORE,
    (_S.OPEN, _E.REPEAT): _O.IGNORE,
    (_S.OPEN, _E.PAST_FINAL): _O.ABORT,
    (_S.OPEN, _E.MIXED): _O.ABORT,
    (_S.OPEN, _E.METADATA_CHANGED): _O.ABORT,
    (_S.OPEN, _E.NO_METADATA): _O.ABORT,
    (_S.COMPLETE, _E.REPEAT): _O.IGNORE,
    (_S.COMPLETE, _E.PAST_FINAL): _O.ABORT,
    (_S.PRODUCED, _E.NOT_YOURS): _O.ABORT,
}


class ActionState(enum.Enum):
    WAITING = "waiting"  # some input tree is not complete yet
    RUNNING = "running"  # handed to the caller by `receive`, `finish` or `emit`
    DONE = "done"


class Plan(Protocol):
    """What the session needs to know of an action once it has been validated."""

    @property
    def input_ids(self) -> tuple[str, ...]: ...

    @property
    def output_ids(self) -> tuple[str, ...]: ...


P = TypeVar("P", bound=Plan)


@dataclass(frozen=True, slots=True)
class Limits:
    max_nodes: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_pending_actions: int = 64
    max_depth: int = 256
    files_allowed: bool = False


@dataclass(frozen=True, slots=True)
class Ready(Generic[P]):
    """An action whose inputs are complete: the caller runs it now."""

    index: int  # the action's place in the session, from 0, in arrival order
    plan: P


@dataclass(frozen=True, slots=True)
class Leaf:
    """One chunk of a flattened input: a leaf node's metadata and payloads in seq order."""

    node_id: str
    metadata: pb.ChunkMetadata
    parts: tuple[Payload, ...]


@dataclass(slots=True)
class _Piece:
    """What one stored fragment contributed to its node."""

    child_ids: tuple[str, ...]
    payload: Payload | None  # None: the fragment carried no chunk
    metadata: pb.ChunkMetadata | None


@dataclass(slots=True)
class _Node:
    state: NodeState = NodeState.ABSENT
    leaf: bool | None = None  # None until a fragment carries children or a chunk
    pieces: dict[int, _Piece] = field(default_factory=dict)
    final_seq: int | None = None
    max_seq: int = -1
    complete: bool = False
    producer: int | None = None  # the action whose output this is


@dataclass(slots=True)
class _Action(Generic[P]):
    index: int
    plan: P
    state: ActionState = ActionState.WAITING


def _has_mimetype(piece: _Piece | None) -> bool:
    return piece is not None and piece.metadata is not None and bool(piece.metadata.mimetype)


class Session(Generic[P]):
    """One client's session. `planner` validates an action (raising `app.errors`) into a
    plan; it knows the actions and the engine, this class knows neither."""

    def __init__(self, limits: Limits, planner: Callable[[pb.Action], P]) -> None:
        self.limits = limits
        self._planner = planner
        self._nodes: dict[str, _Node] = {}
        # The edges, the depth limit, and which trees are complete ("sealed").
        self._dag = Dag(limits.max_depth)
        self._pending: dict[int, _Action[P]] = {}  # waiting or running, by index
        self._action_count = 0
        self._bytes = 0
        self.ended: SwitchboardError | None = None

    # -- the client's messages -------------------------------------------------------

    def receive(self, message: service_pb.SessionMessage) -> list[Ready[P]]:
        """Apply one client message: its fragments, then its actions. Returns the
        actions that can run now. Raises (and ends the session) on a broken rule."""
        self._check_open()
        try:
            for fragment in message.node_fragments:
                self._fragment(fragment)
            for action in message.actions:
                self._action(action)
            return self._release()
        except SwitchboardError as exc:
            self.end(exc)
            raise

    def _fragment(self, fragment: pb.NodeFragment) -> None:
        if not fragment.id:
            raise InvalidRequest("a node fragment needs an id")
        if fragment.seq < 0:
            raise InvalidRequest(f"node {fragment.id!r}: seq {fragment.seq} is negative")
        node = self._nodes.get(fragment.id) or _Node()
        event = self._classify(node, fragment)
        outcome = TRANSITIONS.get((node.state, event), Outcome.ABORT)
        if outcome is Outcome.IGNORE:
            return
        if outcome is Outcome.ABORT:
            raise InvalidRequest(_why(event, fragment, node))
        self._store(node, fragment)

    def _classify(self, node: _Node, fragment: pb.NodeFragment) -> Event:
        if node.state is NodeState.PRODUCED:
            return Event.NOT_YOURS
        seq = fragment.seq
        if seq in node.pieces:
            return Event.REPEAT
        if node.final_seq is not None and seq > node.final_seq:
            return Event.PAST_FINAL
        if not fragment.continued and node.max_seq > seq:
            return Event.PAST_FINAL
        has_children = len(fragment.child_ids) > 0
        has_chunk = fragment.HasField("chunk_fragment")
        if (
            (has_children and has_chunk)
            or (has_children and node.leaf is True)
            or (has_chunk and node.leaf is False)
        ):
            return Event.MIXED
        metadata = (
            fragment.chunk_fragment.metadata
            if has_chunk and fragment.chunk_fragment.HasField("metadata")
            else None
        )
        if metadata is not None:
            if seq == 0:
                later = (p.metadata for p in node.pieces.values() if p.metadata is not None)
                if any(other != metadata for other in later):
                    return Event.METADATA_CHANGED
            else:
                first = node.pieces.get(0)
                if first is not None and first.metadata is not None and first.metadata != metadata:
                    return Event.METADATA_CHANGED
        leaf = True if has_chunk else node.leaf
        if leaf:
            first_piece = (
                _Piece((), None, metadata if has_chunk else None)
                if seq == 0
                else node.pieces.get(0)
            )
            if (seq == 0 or first_piece is not None) and not _has_mimetype(first_piece):
                return Event.NO_METADATA
        return Event.FRESH

    def _store(self, node: _Node, fragment: pb.NodeFragment) -> None:
        node_id = fragment.id
        if node.state is NodeState.ABSENT and node_id not in self._nodes:
            self._add_node(node_id, node)
        children = tuple(fragment.child_ids)
        payload: Payload | None = None
        metadata: pb.ChunkMetadata | None = None
        if fragment.HasField("chunk_fragment"):
            chunk = fragment.chunk_fragment
            if chunk.HasField("metadata"):
                # A copy: the client's message is a view into the frame's arena, and
                # keeping a view would keep the whole frame in memory.
                metadata = pb.ChunkMetadata()
                metadata.CopyFrom(chunk.metadata)
            if chunk.WhichOneof("payload") == "ref":
                payload = parse_ref(chunk.ref, self.limits.files_allowed)
            else:
                payload = chunk.data
        self._charge(
            FRAGMENT_OVERHEAD
            + (len(payload) if isinstance(payload, bytes) else 0)
            + sum(map(len, children))
            + (metadata.ByteSize() if metadata is not None else 0)
        )
        if children:
            self._link(node_id, children)
            node.leaf = False
        elif payload is not None:
            node.leaf = True
        node.pieces[fragment.seq] = _Piece(children, payload, metadata)
        node.max_seq = max(node.max_seq, fragment.seq)
        if not fragment.continued:
            node.final_seq = fragment.seq
        node.state = NodeState.OPEN
        if node.final_seq is not None and len(node.pieces) == node.final_seq + 1:
            node.state = NodeState.COMPLETE
            node.complete = True
            self._dag.completed(node_id)

    def _action(self, action: pb.Action) -> None:
        plan = self._planner(action)
        index = self._action_count
        pending = len(self._pending)
        if pending >= self.limits.max_pending_actions:
            raise ResourceExhausted(
                f"action #{index}: {pending} actions are already waiting or running "
                f"(at most {self.limits.max_pending_actions} per session)"
            )
        if len(set(plan.output_ids)) != len(plan.output_ids):
            raise InvalidRequest(f"action #{index}: an output id is named twice")
        for node_id in (*plan.input_ids, *plan.output_ids):
            if not node_id:
                raise InvalidRequest(f"action #{index}: an input or output has no node id")
        for node_id in plan.output_ids:
            node = self._nodes.get(node_id)
            if node is not None and node.state is not NodeState.ABSENT:
                raise InvalidRequest(
                    f"action #{index}: output id {node_id!r} is already a node of the "
                    "session; output ids must be new"
                )
            if node is None:
                node = self._add_node(node_id, _Node())
            node.state = NodeState.PRODUCED
            node.leaf = True
            node.producer = index
            self._dag.watch(node_id)  # while the action waits (see _release)
        for node_id in plan.input_ids:
            if node_id not in self._nodes:
                self._add_node(node_id, _Node())
            self._dag.holders.add(node_id)
        self._dag.new_holds = True  # the new action may wait on others, or they on it
        self._pending[index] = _Action(index, plan)
        self._action_count += 1

    # -- the server's side -----------------------------------------------------------

    def emit(
        self, node_id: str, data: bytes, final: bool, metadata: pb.ChunkMetadata | None = None
    ) -> pb.NodeFragment:
        """The next fragment of an output node, stored in the session (later actions may
        use it). `metadata` goes on seq 0, and only there."""
        self._check_open()
        node = self._nodes[node_id]
        if node.state is not NodeState.PRODUCED or node.complete:
            raise FailedPrecondition(f"node {node_id!r} is not an output being produced")
        seq = len(node.pieces)
        if seq == 0 and metadata is None:
            raise FailedPrecondition(f"output {node_id!r}: seq 0 needs the chunk's metadata")
        self._charge(
            FRAGMENT_OVERHEAD
            + len(data)
            + (metadata.ByteSize() if seq == 0 and metadata is not None else 0)
        )
        fragment = pb.NodeFragment(id=node_id, seq=seq, continued=not final)
        fragment.chunk_fragment.data = data
        if seq == 0 and metadata is not None:
            fragment.chunk_fragment.metadata.CopyFrom(metadata)
        node.pieces[seq] = _Piece((), data, metadata if seq == 0 else None)
        if final:
            node.final_seq = seq
            node.complete = True
            self._dag.completed(node_id)
        return fragment

    def finish(self, index: int) -> list[Ready[P]]:
        """Action `index` has finished (its named outputs are final): returns the
        actions that can run now."""
        self._check_open()
        action = self._pending.get(index)
        if action is None or action.state is not ActionState.RUNNING:
            raise FailedPrecondition(f"action #{index} is not running")
        for node_id in action.plan.output_ids:
            if not self._nodes[node_id].complete:
                raise FailedPrecondition(f"action #{index}: output {node_id!r} is not final")
        action.state = ActionState.DONE
        del self._pending[index]
        try:
            return self._release()
        except SwitchboardError as exc:
            self.end(exc)
            raise

    def leaves(self, root: str) -> list[Leaf]:
        """The chunks of a complete input tree, depth-first, shared nodes as often as
        they occur. Every node visited counts against `max_nodes`, not only the leaves:
        shared nodes without chunks would otherwise make a walk of exponential length
        that yields nothing. Each node is read once, however often it is visited."""
        self._check_open()
        if root not in self._dag.sealed:
            raise FailedPrecondition(f"node {root!r} is not complete")
        out: list[Leaf] = []
        read: dict[str, Leaf | tuple[str, ...]] = {}  # a leaf's chunk, or a node's children
        size = visits = 0
        stack: list[Iterator[str]] = [iter((root,))]
        while stack:
            node_id = next(stack[-1], None)
            if node_id is None:
                stack.pop()
                continue
            visits += 1
            content = read.get(node_id)
            if content is None:
                content = read[node_id] = self._read(node_id)
            if isinstance(content, Leaf):
                out.append(content)
                size += sum(len(p) for p in content.parts if isinstance(p, bytes))
            else:
                stack.append(iter(content))
            if visits > self.limits.max_nodes or size > self.limits.max_bytes:
                raise ResourceExhausted(
                    f"node {root!r} flattens to more than {self.limits.max_nodes} nodes "
                    f"or {self.limits.max_bytes} bytes (it shares nodes too often)"
                )
        return out

    def _read(self, node_id: str) -> Leaf | tuple[str, ...]:
        """A complete node's content: a leaf's chunk, or the children in seq order."""
        node = self._nodes[node_id]
        pieces = [node.pieces[seq] for seq in sorted(node.pieces)]
        if node.leaf:
            metadata = pieces[0].metadata
            assert metadata is not None  # _classify refuses a leaf without one
            return Leaf(
                node_id, metadata, tuple(p.payload for p in pieces if p.payload is not None)
            )
        return tuple(c for p in pieces for c in p.child_ids)

    def _check_open(self) -> None:
        if self.ended is not None:
            raise FailedPrecondition(f"the session has ended: {self.ended.message}")

    def end(self, reason: SwitchboardError | None = None) -> None:
        """The session is over (aborted, or the client left): drop every node."""
        if self.ended is None:
            self.ended = reason or FailedPrecondition("the session was closed")
        self._nodes.clear()
        self._dag = Dag(self.limits.max_depth)
        self._pending.clear()
        self._bytes = 0

    def state_of(self, node_id: str) -> NodeState:
        node = self._nodes.get(node_id)
        return NodeState.ABSENT if node is None else node.state

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    @property
    def bytes_held(self) -> int:
        return self._bytes

    # -- the DAG ---------------------------------------------------------------------

    def _add_node(self, node_id: str, node: _Node) -> _Node:
        if len(self._nodes) >= self.limits.max_nodes:
            raise ResourceExhausted(
                f"node {node_id!r}: the session already holds {self.limits.max_nodes} nodes"
            )
        self._charge(len(node_id))  # ids are the client's choice, of any length
        self._nodes[node_id] = node
        return node

    def _charge(self, size: int) -> None:
        self._bytes += size
        if self._bytes > self.limits.max_bytes:
            raise ResourceExhausted(
                f"the session would hold more than {self.limits.max_bytes} bytes"
            )

    def _link(self, parent: str, children: Sequence[str]) -> None:
        if any(not child for child in children):
            raise InvalidRequest(f"node {parent!r}: a child id is empty")
        for child in dict.fromkeys(children):  # distinct, in order: errors are repeatable
            if child not in self._nodes:
                self._add_node(child, _Node())
            self._dag.link(parent, child)

    # -- actions ---------------------------------------------------------------------

    def _release(self) -> list[Ready[P]]:
        ready: list[Ready[P]] = []
        waiting: list[_Action[P]] = []
        for action in self._pending.values():
            if action.state is not ActionState.WAITING:
                continue
            if all(root in self._dag.sealed for root in action.plan.input_ids):
                action.state = ActionState.RUNNING
                for node_id in action.plan.output_ids:
                    self._dag.unwatch(node_id)
                ready.append(Ready(action.index, action.plan))
            else:
                waiting.append(action)
        if ready:
            self._dag.holders = {root for action in waiting for root in action.plan.input_ids}
        if not self._dag.new_holds:
            return ready  # no action can have come to wait on another since the last look
        self._dag.new_holds = False
        # An action waits on another when its input trees hold the other's output.
        _refuse_deadlock(
            {
                action.index: {
                    other.index
                    for other in waiting
                    if any(
                        self._dag.holds(root, output)
                        for root in action.plan.input_ids
                        for output in other.plan.output_ids
                    )
                }
                for action in waiting
            }
        )
        return ready


def _refuse_deadlock(waits_on: dict[int, set[int]]) -> None:
    """Waiting actions that wait (through their inputs) on outputs of waiting actions
    in a cycle can never run."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in waits_on:
        if start in state:
            continue
        path: list[tuple[int, Iterable[int]]] = [(start, iter(waits_on[start]))]
        state[start] = 1
        while path:
            index, rest = path[-1]
            following = next(iter(rest), None)
            if following is None:
                state[index] = 2
                path.pop()
            elif state.get(following) == 1:
                cycle = [i for i, _ in path[[i for i, _ in path].index(following) :]]
                names = " -> ".join(f"#{i}" for i in [*cycle, following])
                raise InvalidRequest(
                    f"actions wait on their own outputs ({names}); they could never run"
                )
            elif following not in state:
                state[following] = 1
                path.append((following, iter(waits_on[following])))


def _why(event: Event, fragment: pb.NodeFragment, node: _Node) -> str:
    where = f"node {fragment.id!r} seq {fragment.seq}"
    if event is Event.PAST_FINAL:
        if node.final_seq is not None and fragment.seq > node.final_seq:
            return f"{where}: past the node's final fragment (seq {node.final_seq})"
        return f"{where}: final (continued = false), but seq {node.max_seq} already arrived"
    if event is Event.MIXED:
        return f"{where}: a node holds either child_ids or a chunk_fragment, not both"
    if event is Event.METADATA_CHANGED:
        return f"{where}: metadata differs between seq 0 and a later fragment of the node"
    if event is Event.NO_METADATA:
        return f"{where}: seq 0 of a leaf must carry the chunk's metadata with a mimetype"
    if event is Event.NOT_YOURS:
        return f"{where}: the node is the output of action #{node.producer}; only it writes it"
    return f"{where}: {event.value} fragment refused"
