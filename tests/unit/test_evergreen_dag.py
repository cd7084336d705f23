"""The incremental graph under Evergreen sessions against a brute-force model: after any
sequence of edges and completions, its answers (cycle, depth, heights, depths, sealed
trees, watched ancestors) are those a walk of the whole graph gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import InvalidRequest
from app.protocols.evergreen.dag import Dag

IDS = "abcdefg"
MAX_DEPTH = 4


class Model:
    """The same graph, answered by walking all of it every time."""

    def __init__(self) -> None:
        self.children: dict[str, list[str]] = {}
        self.complete: set[str] = set()

    def below(self, node: str) -> set[str]:
        seen: set[str] = set()
        stack = [node]
        while stack:
            for child in self.children.get(stack.pop(), []):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        return seen

    def height(self, node: str) -> int:
        return 1 + max((self.height(c) for c in self.children.get(node, [])), default=0)

    def depth(self, node: str) -> int:
        parents = [p for p, cs in self.children.items() if node in cs]
        return 1 + max((self.depth(p) for p in parents), default=0)

    def sealed(self, node: str) -> bool:
        return node in self.complete and self.below(node) <= self.complete


operations = st.lists(
    st.one_of(
        st.tuples(st.just("link"), st.sampled_from(IDS), st.sampled_from(IDS)),
        st.tuples(st.just("complete"), st.sampled_from(IDS), st.just("")),
        st.tuples(st.just("watch"), st.sampled_from(IDS), st.just("")),
    ),
    max_size=30,
)


@settings(max_examples=500, deadline=None)
@given(operations)
def test_the_dag_answers_as_a_walk_of_the_whole_graph(ops: list[tuple[str, str, str]]) -> None:
    dag, model = Dag(MAX_DEPTH), Model()
    watched: set[str] = set()
    for op, a, b in ops:
        if op == "complete":
            dag.completed(a)
            model.complete.add(a)
        elif op == "watch":
            dag.watch(a)
            watched.add(a)
        elif a in model.complete:
            continue  # a complete node gets no more children (the session's rule)
        elif a == b or a in model.below(b):
            with pytest.raises(InvalidRequest, match="cycle"):
                dag.link(a, b)
            return
        elif b not in model.children.get(a, []) and model.depth(a) + model.height(b) > MAX_DEPTH:
            with pytest.raises(InvalidRequest, match="deeper than"):
                dag.link(a, b)
            return
        else:
            dag.link(a, b)
            if b not in model.children.setdefault(a, []):
                model.children[a].append(b)
        for node in IDS:
            assert dag.height(node) == model.height(node), node
            assert (node in dag.sealed) is model.sealed(node), node
            if node not in dag.sealed:
                assert dag.depth(node) == model.depth(node), node
            for target in watched:
                assert dag.holds(node, target) is (target == node or target in model.below(node))
