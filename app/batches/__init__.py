"""Batches: OpenAI's Files and Batch APIs and Anthropic's Message Batches, run in a lane
that yields to interactive traffic, durable on the store the replicas share.

- `service`: the APIs' side (create, read, list, cancel, delete, results), and the
  factory of the whole (`Batches.from_settings`), started and closed with the app;
- `files`: files on the store (uploads in parts; a batch's output and error files, read
  from its results);
- `runner`: a replica's runner, which advances every active batch (validates, claims
  chunks under leases, answers their requests, ends it), whoever created it;
- `lane`: how many batch requests may be in the engine now, from what admission holds;
- `requests`: one request answered as its endpoint would, on the shared road, in the
  lane.

Their lifecycle and shapes are sans-IO (`app.protocols.batches`,
`app.protocols.openai.batches`, `app.protocols.anthropic.batches`); what is stored and
how, `app.store.batches`. How it all runs, the limits and the figures: docs/batches.md.
"""
