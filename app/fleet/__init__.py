"""A fleet on one machine: replicas of `switchboard serve` behind a real router.

Not a router of our own: it starts the real ones (`vllm-router`, vLLM's own, and `smg`,
the Shepherd Model Gateway, both from PyPI) with the flags docs/operations.md
recommends, in front of N replicas that share one Redis (stored responses,
Conversations, Salience sessions), and nginx for what those routers do not carry
(websockets, gRPC, GraphPipe, the playground). `switchboard fleet` (scripts/fleet)
starts one for a dev box; the fleet tests (tests/fleet/) and benchmarks (bench/fleet_*.py)
start theirs with the same code, so what a user runs is what is tested.

- `members`: the processes (replicas, Redis, routers, nginx): start, ready, drain, kill.
- `ports`: ports chosen now and bound later, claimed across the machine's processes.
- `routers`: each router's command line and nginx's configuration: one place for their
  flags.
- `fleet`: `Fleet`, the whole, started and stopped in order, with rolling restarts.
- `load`: a steady streaming load through the fleet's front, every outcome kept.
- `traced_router`: vLLM's router with its OpenTelemetry tracing on.
"""
