"""The Salience websocket envelope: every malformed frame is a BadFrame naming its call,
never another exception (which would be reported as INTERNAL)."""

from __future__ import annotations

import orjson
import pytest

from app.protocols.salience.envelope import BadFrame, Call, Cancel, parse


@pytest.mark.parametrize("method", [["Generate"], {"a": 1}, 7, None, True, "Nope"])
def test_a_method_that_is_not_a_known_name_is_a_bad_frame(method: object) -> None:
    with pytest.raises(BadFrame) as bad:
        parse(orjson.dumps({"id": "c1", "method": method, "request": {}}).decode())
    assert bad.value.call_id == "c1"


def test_a_good_frame_and_a_cancel_parse() -> None:
    call = parse('{"id": "c1", "method": "GetReadoutManifest", "request": {}}')
    assert isinstance(call, Call) and call.method == "GetReadoutManifest"
    assert isinstance(parse('{"id": "c1", "cancel": true}'), Cancel)
