"""`Caller`: who a connection's calls come from, for the records of those calls.

A websocket (from its upgrade's headers) or a gRPC call (from its metadata) has one: the
request id taken or minted (`app.telemetry.ids`), the client's address and its W3C trace
headers. Each call made over it (a Salience call or Generate, an Evergreen GENERATE, a
Responses-websocket response) is a request of its own to telemetry, numbered after the
caller's id (`<id>.1`, `<id>.2`, ...) unless the caller is the call itself (a gRPC
call: `numbered=False`), its span under the caller's `traceparent`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.telemetry.ids import REQUEST_ID_HEADER, take_or_mint
from app.telemetry.tracing import carrier_of, carrier_of_metadata


@dataclass(slots=True)
class Caller:
    request_id: str
    client: str
    carrier: dict[str, str]
    numbered: bool = True
    calls: int = 0

    def call_id(self) -> str:
        """The request id of the caller's next call."""
        if not self.numbered:
            return self.request_id
        self.calls += 1
        return f"{self.request_id}.{self.calls}"

    @classmethod
    def of_headers(cls, headers: Iterable[tuple[bytes, bytes]], client: str) -> Caller:
        """A websocket's, from its upgrade's raw headers."""
        headers = list(headers)
        offered = next((v for k, v in headers if k == REQUEST_ID_HEADER.encode()), None)
        return cls(take_or_mint(offered), client, carrier_of(headers))

    @classmethod
    def of_metadata(
        cls, metadata: Iterable[tuple[str, str | bytes]], client: str, *, numbered: bool
    ) -> Caller:
        """A gRPC call's, from its metadata (`numbered`: a stream of calls, an Evergreen
        session's; else the call itself is its one request)."""
        metadata = list(metadata)
        offered = next((v for k, v in metadata if k == REQUEST_ID_HEADER), None)
        return cls(take_or_mint(offered), client, carrier_of_metadata(metadata), numbered)
