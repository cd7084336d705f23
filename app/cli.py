"""`switchboard`: serve; start a fleet of replicas behind a router on one machine
(`app.fleet`); and build the tiny local models (text, and vision-language for images) and
a LoRA adapter for the text one.

`serve` takes Switchboard's own flags (one per `Settings` field, generated from it) and
hands every other flag to vLLM's engine-argument parser. vLLM starts its engine core with
`spawn`, which re-imports `__main__`; the guard at the bottom is load-bearing.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import secrets
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, get_args, get_origin

from pydantic import ValidationError

from app.config import Settings
from app.errors import ConfigError

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

logger = logging.getLogger(__name__)


def _help(description: str | None) -> str | None:
    # argparse %-formats help strings.
    return description.replace("%", "%%") if description else description


def _settings_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard serve",
        add_help=False,
        epilog="Every other flag is a vLLM engine flag, as `vllm serve` names it.",
    )
    parser.add_argument("-h", "--help", action="store_true")
    for name, field in Settings.model_fields.items():
        if name == "engine_args":
            continue
        flag = "--" + name.replace("_", "-")
        annotation = field.annotation
        if get_origin(annotation) is list:
            # Repeatable, as SMG's `--tenant-api-key`: each use adds its values.
            parser.add_argument(
                flag, nargs="+", action="extend", dest=name, help=_help(field.description)
            )
            continue
        kinds = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        kind: Any = kinds[0]
        if kind is bool:
            # `--flag` alone means true (as vLLM's store_true flags); `--flag false` too.
            parser.add_argument(
                flag, nargs="?", const="true", dest=name, help=_help(field.description)
            )
            continue
        parser.add_argument(
            flag,
            type=kind if kind in (int, float) else str,
            dest=name,
            help=_help(field.description),
        )
    return parser


def _settings(known: argparse.Namespace, rest: list[str]) -> Settings:
    """Our flags checked, and the files they name, before vLLM's flags are parsed: that
    imports vLLM (some 20 s), which a bad flag or file should not cost."""
    from app.engine.preflight import check_files
    from app.engine.vllm.cli_args import parse_engine_args  # imports vLLM as it parses

    given = {k: v for k, v in vars(known).items() if v is not None and k != "help"}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise ConfigError(f"{where}: {first['msg']}") from None
    check_files(settings)
    # engine_args is passed through unchecked (no validator reads it).
    return settings.model_copy(update={"engine_args": parse_engine_args(rest)})


def _loopback(host: str) -> bool:
    """Whether `host` reaches this machine only (a name that resolves elsewhere, or a
    wildcard, does not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keyed_if_exposed(settings: Settings) -> Settings:
    """`settings`, with an API key generated, and shown once in the log, when the server
    would listen beyond this machine with no key at all: anyone who can reach the port
    could use, store to and delete from it (the shipped compose files and manifests
    listened on 0.0.0.0 keyless). A key the operator sets (--api-key, a tenant's or the
    control plane's) is used as it is, and loopback stays keyless."""
    keyless = not (settings.api_key or settings.tenant_api_key or settings.control_plane_api_keys)
    if not keyless or _loopback(settings.host):
        return settings
    key = "sk-" + secrets.token_urlsafe(32)
    logger.warning(
        "Listening on %s with no API key: generated one for this run (shown once, here; set "
        "--api-key or SWITCHBOARD_API_KEY to choose it): %s",
        settings.host,
        key,
    )
    return settings.model_copy(update={"api_key": key})


def uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    """How uvicorn serves the app: one place, so the tests' live servers run what
    `switchboard serve` runs."""
    import uvicorn

    from app.routes.http.connections import GuardedWebSockets, guarded_http

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        # uvicorn's httptools protocol, with a connection cap and a head timeout.
        http=guarded_http(settings.header_timeout_s, settings.max_connections),
        # The sans-IO protocol frames a message without the legacy implementation's
        # per-connection reader/writer tasks: about 0.6x its own server CPU per message
        # on paced streams (bench/transport_floor.py), and uvicorn's announced default;
        # its frames over the size limit told in the socket's protocol.
        ws=GuardedWebSockets,
        access_log=False,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        # The drain has ended the work already; what is left is idle connections.
        timeout_graceful_shutdown=5,
    )


async def _run(settings: Settings) -> None:
    """Start the engine, then serve until a signal; the engine stops either way. The
    engine starts before uvicorn so that a `ConfigError` (a bad flag or file) ends the
    command with one line rather than a failed ASGI lifespan's traceback.

    The first SIGTERM (or SIGINT) drains (`app.drain`: readiness 503, new work refused,
    running work finishes or is aborted after --drain-timeout-s, sessions say goodbye);
    only then does uvicorn's own shutdown begin. A second signal shuts down at once."""
    import uvicorn

    from app.drain import Drain
    from app.engine.vllm.startup import settle_heap, start_engine
    from app.heap import fix_mmap_threshold
    from app.main import create_app
    from app.telemetry.tracing import Tracing

    # One tracer for the app and the engine's spans, lent to vLLM before its engine is
    # built (vLLM's own would otherwise take the process's provider for good).
    tracing = Tracing.from_settings(settings)
    engine = await start_engine(settings, tracing)
    app = create_app(settings, engine=engine, tracing=tracing)
    settle_heap()
    fix_mmap_threshold()
    drain: Drain = app.state.drain
    loop = asyncio.get_running_loop()
    stopped = False

    def stop_engine() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            engine.shutdown()

    class Server(uvicorn.Server):
        draining: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Runs in Python's signal handler: hand the drain to the loop.
            if self.draining is None and not self.should_exit:
                self._captured_signals.append(sig)  # re-raised after shutdown, as uvicorn does
                loop.call_soon_threadsafe(self._start_drain, signal.Signals(sig).name)
                return
            super().handle_exit(sig, frame)

        def _start_drain(self, name: str) -> None:
            if self.draining is None:
                logger.info("%s: draining for up to %.1f s", name, drain.timeout_s)
                drain.begin()  # readiness 503 and refusals at once, not a loop turn later
                self.draining = asyncio.ensure_future(self._drain_then_exit())

        async def _drain_then_exit(self) -> None:
            try:
                await drain.run(engine.abort)
            finally:
                self.should_exit = True

        # After a signal uvicorn shuts down, then raises the signal again, which ends the
        # process: the engine must be stopped before that, with the server.
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().shutdown(sockets)
            finally:
                stop_engine()

    config = uvicorn_config(app, settings)
    try:
        await Server(config).serve()
    finally:
        stop_engine()


def _serve(argv: list[str]) -> None:
    import uvloop

    from app.telemetry.logs import configure as configure_logging

    parser = _settings_parser()
    known, rest = parser.parse_known_args(argv)
    if known.help:
        parser.print_help()
        return
    try:
        settings = _settings(known, rest)
        configure_logging(settings.log_level, settings.access_log)
        uvloop.run(_run(keyed_if_exposed(settings)))
    except ConfigError as exc:
        # The operator's mistake, not a crash: one line on stderr, exit status 2 (as
        # argparse ends on a bad flag).
        message = " ".join(str(exc).split())
        parser.exit(2, f"switchboard serve: error: {message}\n")
    except KeyboardInterrupt:  # uvicorn re-raises the signal it handled
        pass


def _fleet_parser() -> argparse.ArgumentParser:
    from app.fleet.routers import ROUTERS, SMG_POLICIES, VLLM_ROUTER, VLLM_ROUTER_POLICIES

    parser = argparse.ArgumentParser(
        prog="switchboard fleet",
        allow_abbrev=False,
        description="N replicas of `switchboard serve` on this machine, sharing a Redis, "
        "behind a router (OpenAI and Anthropic APIs) and nginx (websockets, gRPC, "
        "GraphPipe, the playground); all on 127.0.0.1. Ctrl-C stops the fronts, drains "
        "the replicas, then stops Redis.",
        epilog="Every other flag goes to each replica's `switchboard serve` (--model, ...).",
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--router", choices=ROUTERS, default=VLLM_ROUTER)
    parser.add_argument(
        "--policy",
        default="cache_aware",
        choices=sorted({*VLLM_ROUTER_POLICIES, *SMG_POLICIES}),
        help="the router's policy (docs/operations.md says which for which traffic)",
    )
    parser.add_argument("--router-port", type=int, default=8000)
    parser.add_argument("--proxy-port", type=int, default=8080, help="nginx: HTTP and websockets")
    parser.add_argument("--proxy-grpc-port", type=int, default=50051, help="nginx: gRPC")
    parser.add_argument("--no-proxy", action="store_true", help="run no nginx")
    parser.add_argument(
        "--probe-interval-s", type=int, default=1, help="how often the router probes /ready"
    )
    parser.add_argument("--workdir", type=Path, default=Path(".cache/fleet"))
    parser.add_argument(
        "--otlp-traces-endpoint",
        help="an OTLP receiver (HOST:PORT) the replicas and the router send their spans to "
        "(docs/operations.md, Traces)",
    )
    return parser


def _run_fleet(argv: list[str]) -> None:
    from app.fleet.fleet import Fleet, RouterSpec, running
    from app.fleet.routers import Probe

    parser = _fleet_parser()
    args, serve_args = parser.parse_known_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = Fleet(
        workdir=args.workdir.resolve(),
        serve_args=serve_args,
        count=args.replicas,
        routers={"router": RouterSpec(args.router, args.policy, args.router_port)},
        nginx=not args.no_proxy,
        nginx_ports=(args.proxy_port, args.proxy_grpc_port),
        probe=Probe(interval_s=args.probe_interval_s),
        otlp_traces_endpoint=args.otlp_traces_endpoint,
    )
    stop = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    try:
        with running(fleet):
            router = fleet.router()
            logger.info("%s (%s) on %s", args.router, args.policy, router.url)
            if not args.no_proxy:
                proxy = fleet.proxy
                logger.info("nginx on %s, gRPC on 127.0.0.1:%d", proxy.url, proxy.grpc_port)
            logger.info("logs in %s; Ctrl-C stops the fleet", fleet.workdir)
            asyncio.run(wait())
            logger.info("stopping: the fronts, then each replica's drain")
    except ConfigError as exc:
        parser.exit(2, f"switchboard fleet: error: {' '.join(str(exc).split())}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="switchboard")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "serve", help="serve a model (see `switchboard serve --help`)", add_help=False
    )
    commands.add_parser(
        "fleet",
        help="replicas behind a router on this machine (see `switchboard fleet --help`)",
        add_help=False,
    )
    tiny = commands.add_parser("make-tiny-model", help="build the tiny local test model")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--max-position-embeddings", type=int, default=1024)
    tiny.add_argument(
        "--ends-turns",
        action="store_true",
        help="end replies at <|im_end|> within tens of tokens, as a chat model does (for "
        "clients that send no output limit: the Codex CLI)",
    )
    tiny_vl = commands.add_parser(
        "make-tiny-vl-model", help="build the tiny local vision-language model (images)"
    )
    tiny_vl.add_argument("dir", type=Path)
    tiny_vl.add_argument("--max-position-embeddings", type=int, default=1024)
    lora = commands.add_parser("make-tiny-lora", help="build a random LoRA adapter for it")
    lora.add_argument("model_dir", type=Path)
    lora.add_argument("dir", type=Path)
    lora.add_argument("--seed", type=int, default=1)
    concepts = commands.add_parser(
        "make-concepts", help="write a random concept file (Salience readouts) for a model"
    )
    concepts.add_argument("model_dir", type=Path)
    concepts.add_argument("out", type=Path)
    concepts.add_argument("--concepts", type=int, default=4)
    concepts.add_argument("--seed", type=int, default=0)
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        _serve(rest)
        return
    if args.command == "fleet":
        _run_fleet(rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from app.tiny_model import build_tiny_lora, build_tiny_model

    if args.command == "make-concepts":
        from app.engine.concepts import make_random_concepts

        make_random_concepts(args.model_dir, args.out, n_concepts=args.concepts, seed=args.seed)
    elif args.command == "make-tiny-model":
        build_tiny_model(
            args.dir,
            max_position_embeddings=args.max_position_embeddings,
            ends_turns=args.ends_turns,
        )
    elif args.command == "make-tiny-vl-model":
        from app.tiny_vl_model import build_tiny_vl_model

        build_tiny_vl_model(args.dir, max_position_embeddings=args.max_position_embeddings)
    else:
        build_tiny_lora(args.model_dir, args.dir, seed=args.seed)


if __name__ == "__main__":
    main()
