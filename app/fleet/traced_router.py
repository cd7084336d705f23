"""vLLM's router with its OpenTelemetry tracing on:
`python -m app.fleet.traced_router --otlp-traces-endpoint HOST:PORT <vllm-router's flags>`.

vllm-router 0.1.17's Rust router traces (its `Router` takes `enable_trace` and
`otlp_traces_endpoint`: a SERVER span per request and a CLIENT span per call to a
replica, whose W3C context it sends on), but its command line has no flag for it. This
starts it as `vllm-router` does, with its own argument parser and launcher, the Rust
router built with tracing on. Its log filter lets only its own module's events through
unless `RUST_LOG` says otherwise, and so drops its spans (their target is `otel_trace`;
its later releases add that target themselves): `RUST_LOG` keeps the log at the level
given and lets them through.

Measured (one call at a time to a router in front of a stub worker): it exports every
500 ms, 64 spans a batch at most, but never the spans of the first request it serves (ten
starts of ten, that request sent at once or 3 s after the router answered ready); its
`OTEL_BSP_MAX_QUEUE_SIZE` shrinks its batches, and drops what overflows the queue (at 1,
five spans of twelve).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

_LEVELS = {"warning": "warn", "critical": "error"}


def main(argv: list[str]) -> None:
    from vllm_router import router as rust_router
    from vllm_router.launch_router import launch_router, parse_router_args

    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--otlp-traces-endpoint", required=True)
    known, rest = ours.parse_known_args(argv)
    args = parse_router_args(rest)
    level = _LEVELS.get(args.log_level or "info", args.log_level or "info")
    os.environ.setdefault("RUST_LOG", f"vllm_router_rs={level},otel_trace=trace")
    rust_router._Router = functools.partial(
        rust_router._Router, enable_trace=True, otlp_traces_endpoint=known.otlp_traces_endpoint
    )
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
