"""`Caller`: who a connection's calls come from, for the records of those calls.

A websocket (from its upgrade's headers) or a gRPC call (from its metadata) has one: the
request id taken or minted (`app.telemetry.ids`), the client's address and its W3C trace
headers. Each call made over it (a Salience call or Generate, an Evergreen GENERATE, a
Responses-websocket response) is a request of its own to telemetry, numbered after the
caller's id (`<id>.1`, `<id>.2`, ...) unless the caller is the call itself (a gRPC
call: `numbered=False`), its span under the caller's `traceparent`, its tenant the
caller's principal's (`app.tenants`: its bounded label), decided where the connection
entered: a gRPC call's by the server's interceptor, a websocket's by its route once it
has authenticated the upgrade (kept on the connection's state, which `state` is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.telemetry.ids import REQUEST_ID_HEADER, take_or_mint
from app.telemetry.tracing import carrier_of, carrier_of_metadata


@dataclass(slots=True)
class Caller:
    request_id: str
    client: str
    carrier: dict[str, str]
    numbered: bool = True
    calls: int = 0
    tenant: str | None = None
    state: Mapping[str, Any] | None = None  # a websocket's scope state: its principal

    def tenant_of_calls(self) -> str | None:
        """The tenant of the caller's calls, once decided."""
        if self.tenant is None and self.state is not None:
            principal = self.state.get("principal")
            if principal is not None:
                self.tenant = str(principal.label)
        return self.tenant

    def call_id(self) -> str:
        """The request id of the caller's next call."""
        if not self.numbered:
            return self.request_id
        self.calls += 1
        return f"{self.request_id}.{self.calls}"

    @classmethod
    def of_headers(
        cls, headers: Iterable[tuple[bytes, bytes]], client: str, state: Mapping[str, Any]
    ) -> Caller:
        """A websocket's, from its upgrade's raw headers (`state`: its scope's)."""
        headers = list(headers)
        offered = next((v for k, v in headers if k == REQUEST_ID_HEADER.encode()), None)
        return cls(take_or_mint(offered), client, carrier_of(headers), state=state)

    @classmethod
    def of_metadata(
        cls,
        metadata: Iterable[tuple[str, str | bytes]],
        client: str,
        *,
        numbered: bool,
        tenant: str | None,
    ) -> Caller:
        """A gRPC call's, from its metadata (`numbered`: a stream of calls, an Evergreen
        session's; else the call itself is its one request)."""
        metadata = list(metadata)
        offered = next((v for k, v in metadata if k == REQUEST_ID_HEADER), None)
        carrier = carrier_of_metadata(metadata)
        return cls(take_or_mint(offered), client, carrier, numbered, tenant=tenant)
