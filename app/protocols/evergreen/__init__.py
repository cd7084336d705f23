"""Evergreen: sessions of node fragments and actions, sans-IO.

- `session`: the node state machine (fragments, seq rules, actions released as their
  inputs arrive); `dag`: the graph's walks, cycles and depth;
- `lifecycle`: the session's lifetime, ABORT and close rules;
- `generate`: a GENERATE action planned as an engine request; `inputs`: its inputs
  joined; `refs`: `file://` and `data:` references;
- `frames`: messages encoded and decoded (JSON or binary) on the websocket.
"""
