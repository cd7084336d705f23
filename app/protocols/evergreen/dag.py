"""The nodes of an Evergreen session as a graph, kept up to date edge by edge. Sans-IO.

The session (`app.protocols.evergreen.session`) decides what a fragment means; this
module answers the graph's questions for it without walking the whole session on every
fragment, so that a session's cost stays linear in what the client sends:

- Heights and depths. Every node knows the longest chain of nodes below it (`height`; a
  node without children: 1) and, while its tree is not complete, the longest chain from a
  root down to it (`depth`; a root: 1). A new edge p -> c makes a chain of
  depth(p) + height(c) nodes at most, so the depth limit needs no walk. Heights grow
  upward and depths downward, only where they grow; both are bounded by the depth limit,
  so each node's can grow only that many times.
- Cycles. A new edge p -> c closes a cycle when p is below c. Every node on such a path
  is higher and less deep than p, so the search below c skips every other node (and
  every sealed one: p is not complete, so nothing above it is).
- Sealing. A node is sealed once it is complete (all its own fragments in) and all its
  children are sealed: its tree can never change again. Each node counts its children
  that are not sealed; sealing one tells its parents. Completing a tree costs one step
  per edge, once, however many fragments it took.
- Watched nodes (the outputs of waiting actions) keep the set of their ancestors, so
  whether an input tree holds such an output is one lookup. `new_holds` says when one
  of the `holders` (the inputs of waiting actions) has come to hold a watched node: only
  then can actions have come to wait on each other.
"""

from __future__ import annotations

from app.errors import InvalidRequest


class Dag:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.sealed: set[str] = set()
        self._children: dict[str, list[str]] = {}  # distinct, in the order first linked
        self._parents: dict[str, set[str]] = {}
        self._height: dict[str, int] = {}  # absent: 1
        self._depth: dict[str, int] = {}  # absent: 1; dropped once sealed
        self._unsealed_children: dict[str, int] = {}
        self._complete: set[str] = set()  # complete, not sealed yet
        self._ancestors: dict[str, set[str]] = {}  # per watched node, itself included
        self.holders: set[str] = set()
        self.new_holds = False

    def height(self, node_id: str) -> int:
        return self._height.get(node_id, 1)

    def depth(self, node_id: str) -> int:
        return self._depth.get(node_id, 1)

    def link(self, parent: str, child: str) -> None:
        """Add the edge parent -> child (nothing if it exists). Raises InvalidRequest if
        it would close a cycle or make a chain of more than `max_depth` nodes."""
        if parent in self._parents.get(child, ()):
            return
        if self._below(parent, child):
            raise InvalidRequest(f"node {parent!r} would contain itself (a cycle)")
        chain = self.depth(parent) + self.height(child)
        if chain > self.max_depth:
            raise InvalidRequest(
                f"node {parent!r}: nesting child {child!r} makes a chain of {chain} nodes, "
                f"deeper than {self.max_depth}"
            )
        self._parents.setdefault(child, set()).add(parent)
        self._children.setdefault(parent, []).append(child)
        self._grow_height(parent, self.height(child) + 1)
        if child not in self.sealed:
            self._unsealed_children[parent] = self._unsealed_children.get(parent, 0) + 1
            self._grow_depth(child, self.depth(parent) + 1)
        for ancestors in self._ancestors.values():
            if child in ancestors:
                self._add_ancestors(ancestors, parent)

    def completed(self, node_id: str) -> None:
        """Every fragment of the node has arrived: seal it, and what it completes above."""
        if node_id in self.sealed:
            return
        self._complete.add(node_id)
        stack = [node_id]
        while stack:
            node = stack.pop()
            if node not in self._complete or self._unsealed_children.get(node, 0):
                continue
            self._complete.discard(node)
            self._unsealed_children.pop(node, None)
            self._depth.pop(node, None)
            self.sealed.add(node)
            for parent in self._parents.get(node, ()):
                self._unsealed_children[parent] -= 1
                stack.append(parent)

    def watch(self, node_id: str) -> None:
        """Track the ancestors of `node_id` from now on (see `holds`)."""
        ancestors: set[str] = set()
        self._add_ancestors(ancestors, node_id)
        self._ancestors[node_id] = ancestors

    def unwatch(self, node_id: str) -> None:
        self._ancestors.pop(node_id, None)

    def holds(self, root: str, watched: str) -> bool:
        """Whether the tree under `root` contains the watched node `watched`."""
        return root in self._ancestors[watched]

    def _below(self, target: str, start: str) -> bool:
        """Whether `target` is `start` or below it."""
        if start == target:
            return True
        height, depth = self.height(target), self.depth(target)

        def may_lead(node: str) -> bool:
            return (
                node not in self.sealed and self.height(node) > height and self.depth(node) < depth
            )

        if not may_lead(start):
            return False
        seen = {start}
        stack = [start]
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if child == target:
                    return True
                if child not in seen and may_lead(child):
                    seen.add(child)
                    stack.append(child)
        return False

    def _grow_height(self, node_id: str, height: int) -> None:
        if height <= self.height(node_id):
            return
        self._height[node_id] = height
        stack = [node_id]
        while stack:
            node = stack.pop()
            above = self._height[node] + 1
            for parent in self._parents.get(node, ()):
                if self.height(parent) < above:
                    self._height[parent] = above
                    stack.append(parent)

    def _grow_depth(self, node_id: str, depth: int) -> None:
        if depth <= self.depth(node_id):
            return
        self._depth[node_id] = depth
        stack = [node_id]
        while stack:
            node = stack.pop()
            below = self._depth[node] + 1
            for child in self._children.get(node, ()):
                if child not in self.sealed and self.depth(child) < below:
                    self._depth[child] = below
                    stack.append(child)

    def _add_ancestors(self, into: set[str], start: str) -> None:
        """Add `start` and everything above it to `into`, stopping where it already is."""
        stack = [start]
        while stack:
            node = stack.pop()
            if node not in into:
                into.add(node)
                self.new_holds = self.new_holds or node in self.holders
                stack.extend(self._parents.get(node, ()))
