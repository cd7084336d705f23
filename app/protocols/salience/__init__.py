"""Salience: token sessions, sans-IO.

- `lifecycle`: sessions' lifetime (idle, running, gone; TTL, the session cap and the
  token bound with LRU eviction; close, claims and leases; the drain), over a table;
- `tables`: the tables it runs over (the process's, or a shared store's snapshot);
- `sessions`: a session's content (offset and truncation, fork, limits);
- `service`: the service's method table and its calls; `generate`: a Generate's events;
- `images`: image attachments, checked and placed;
- `envelope`: the websocket's frames (JSON or protobuf) around the calls.
"""
