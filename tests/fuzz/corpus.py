"""The fuzz corpus: seeded mutations of valid requests, hostile leaves and garbage bytes.

Every input is a pure function of (protocol, index): `rng(protocol, index)` seeds a
`random.Random` from that pair, so a failure names its seed index and the same input comes
back on the next run. Three kinds of mutators, independent of any protocol:

- `mutate_json`: a JSON value mutated as a tree (drop, duplicate, retype or swap fields,
  hostile leaves, unknown fields), then serialized by `dump`, which also writes what
  `json.dumps` will not: duplicate keys, NaN/Infinity, lone surrogates (as `\\ud800`
  escapes), nesting tens of thousands deep.
- `mutate_wire`: a serialized protobuf mutated field by field on its wire format (drop,
  duplicate, swap, wrong wire type, hostile varints and strings, unknown or zero field
  numbers), nested messages included, or cut short.
- `mutate_bytes`: bit flips, truncations, insertions and random bytes of any buffer (a
  flatbuffer, a protobuf, a body).

The corpus of a protocol is its inputs 0..N-1: `INPUTS` (N) is 260 unless the environment
sets `FUZZ_INPUTS`; a larger N extends the same corpus (its first 260 inputs are CI's).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any

# What CI runs: enough to find a problem, few enough that the suite stays well under its
# time budget. The seeded-corpus checks hold this many to covering every route.
DEFAULT_INPUTS = 260


def inputs_per_protocol() -> int:
    """N, the corpus size of each protocol: `FUZZ_INPUTS`, or DEFAULT_INPUTS."""
    raw = os.environ.get("FUZZ_INPUTS", "").strip()
    if not raw:
        return DEFAULT_INPUTS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"FUZZ_INPUTS must be a positive number of inputs, not {raw!r}")
    return int(raw)


INPUTS = inputs_per_protocol()


def rng(protocol: str, index: int) -> random.Random:
    """The generator of input `index` of `protocol` (str seeds are stable across runs)."""
    return random.Random(f"switchboard-fuzz:{protocol}:{index}")


@dataclass(frozen=True)
class Raw:
    """JSON text spliced into the output as is (deep nesting, bare words)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """A JSON object as a list of pairs: the same key may come twice."""

    items: tuple[tuple[str, Any], ...]


def deep(depth: int, kind: str = "list") -> Raw:
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


# Leaves no well-formed request holds: each must be refused in the protocol's shape.
HOSTILE: tuple[Any, ...] = (
    "\ud800",
    "\udfff",
    "a\udbffb",
    "\x00",
    "nul\x00inside",
    "\u202e\ufeff",
    "",
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    5e-324,
    1e308,
    2**63,
    2**63 - 1,
    -(2**63) - 1,
    -(2**63),
    2**64,
    2**31,
    -1,
    -(10**30),
    10**100,
    None,
    True,
    False,
    [],
    {},
    [None],
    {"": None},
    [0] * 10_000,
    ["x"] * 10_000,
    "x" * 100_000,
    "\u00e9" * 20_000,
    deep(64),
    deep(5_000),
    deep(50_000),
    deep(2_000, "dict"),
    Raw("NaN"),
    Raw("-Infinity"),
    Raw("1e999999"),
    Raw("-" + "9" * 5_000),
    Raw("0." + "1" * 5_000),
)

RETYPES: tuple[Any, ...] = (1, -1, 1.5, "1", "", True, None, [], {}, [1, 2], {"a": 1}, ["a"])


def hostile(r: random.Random) -> Any:
    """A hostile leaf, a copy: a later mutation of the document must not change HOSTILE
    (it did: inputs then depended on the ones made before them, and a list appended to
    itself made the generator recurse without end)."""
    return copy.deepcopy(r.choice(HOSTILE))


def retype(r: random.Random) -> Any:
    """A value of another type, a copy (as for `hostile`)."""
    return copy.deepcopy(r.choice(RETYPES))


def dump(value: Any) -> str:
    """JSON text of `value`, writing what `json.dumps` refuses or cannot say."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dump(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(value)  # ensure_ascii: a lone surrogate becomes a \ud800 escape


Path = tuple[Any, ...]


def _paths(value: Any, prefix: Path = ()) -> list[Path]:
    """Every node under `value` (itself excluded), depth first."""
    found: list[Path] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value[:8]):  # not into 10^4-element leaves
            found.append((*prefix, i))
            found += _paths(child, (*prefix, i))
    return found


def _get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: Path, new: Any) -> None:
    _get(value, path[:-1])[path[-1]] = new


def _drop(value: Any, path: Path) -> None:
    parent = _get(value, path[:-1])
    del parent[path[-1]]


UNKNOWN_KEYS = ("extra", "__proto__", "", "\ud800", "model ", "MODEL", "x" * 300)


def _mutate_once(doc: Any, r: random.Random) -> Any:
    paths = _paths(doc)
    if not paths:
        return hostile(r)
    path = r.choice(paths)
    op = r.choice(("drop", "drop", "retype", "swap", "hostile", "hostile", "dup", "add"))
    if op == "drop":
        _drop(doc, path)
    elif op == "retype":
        _set(doc, path, retype(r))
    elif op == "swap":
        other = r.choice(paths)
        if other[: len(path)] != path and path[: len(other)] != other:
            a, b = _get(doc, path), _get(doc, other)
            _set(doc, path, b)
            _set(doc, other, a)
    elif op == "hostile":
        _set(doc, path, hostile(r))
    elif op == "add":
        target = _get(doc, path[:-1])
        if isinstance(target, dict):
            target[r.choice(UNKNOWN_KEYS)] = r.choice((hostile(r), retype(r)))
        else:
            target.append(r.choice((hostile(r), retype(r))))
    else:  # dup: the same key twice, with a different value the second time
        parent = _get(doc, path[:-1])
        if isinstance(parent, dict):
            items = list(parent.items())
            items.append((path[-1], r.choice((hostile(r), retype(r)))))
            twice = Pairs(tuple(items))
            if len(path) == 1:
                return twice
            _set(doc, path[:-1], twice)
    return doc


def mutate_json(seed: Any, r: random.Random) -> Any:
    """`seed` (left untouched) with one to three mutations; may return a non-object."""
    doc = json.loads(json.dumps(seed))
    for _ in range(r.randint(1, 3)):
        if isinstance(doc, Pairs | Raw) or not isinstance(doc, dict | list):
            break
        doc = _mutate_once(doc, r)
    return doc


def garbage_text(seed_text: str, r: random.Random) -> bytes:
    """A body that is not the JSON the route wants, or not JSON at all."""
    choice = r.randrange(10)
    raw = seed_text.encode()
    if choice == 0:
        return r.randbytes(r.randint(0, 2_000))
    if choice == 1:
        return raw[: r.randrange(len(raw) + 1)]
    if choice == 2:
        return r.choice((b"", b"null", b"[]", b"1", b'"s"', b"true", b"{}", b" ", b"{"))
    if choice == 3:
        return raw + r.choice((b"}", b"garbage", b"\x00", b"{}", b",", b"\n[]"))
    if choice == 4:
        return b"\xef\xbb\xbf" + raw  # a BOM
    if choice == 5:
        return seed_text.encode("utf-16")
    if choice == 6:
        return raw.replace(b'"', b'"\xff', 1)  # invalid UTF-8 inside a string
    if choice == 7:
        return raw.replace(b'"', b'"\xed\xa0\x80', 1)  # a surrogate encoded as UTF-8
    if choice == 8:
        return mutate_bytes(raw, r)
    return dump(hostile(r)).encode()


def json_input(seed: Any, r: random.Random) -> bytes:
    """One input from a valid JSON request `seed`: as is, mutated, or garbage."""
    roll = r.random()
    if roll < 0.05:
        return dump(seed).encode()
    if roll < 0.8:
        return dump(mutate_json(seed, r)).encode()
    return garbage_text(dump(seed), r)


def mutate_bytes(buf: bytes, r: random.Random) -> bytes:
    data = bytearray(buf)
    choice = r.randrange(6)
    if choice == 0 or not data:
        return r.randbytes(r.randint(0, 512))
    if choice == 1:
        return bytes(data[: r.randrange(len(data))])
    if choice == 2:
        for _ in range(r.randint(1, 8)):
            data[r.randrange(len(data))] ^= 1 << r.randrange(8)
        return bytes(data)
    if choice == 3:
        at = r.randrange(len(data) + 1)
        return bytes(data[:at] + r.randbytes(r.randint(1, 16)) + data[at:])
    if choice == 4:
        at = r.randrange(len(data))
        data[at : at + 4] = r.choice(
            (b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f")
        )
        return bytes(data)
    return bytes(data) + r.randbytes(r.randint(1, 64))


# --- protobuf wire format ----------------------------------------------------------------

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


Field = tuple[int, int, bytes]  # (number, wire type, payload: the varint's bytes or the value)


def parse_wire(buf: bytes) -> list[Field]:
    """The top-level fields of a protobuf message; ValueError if it is not one."""
    fields: list[Field] = []
    at = 0
    while at < len(buf):
        key, at = _read_varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            start = at
            _, at = _read_varint(buf, at)
            payload = buf[start:at]
        elif wire == FIXED64:
            payload, at = buf[at : at + 8], at + 8
        elif wire == FIXED32:
            payload, at = buf[at : at + 4], at + 4
        elif wire == LEN:
            size, at = _read_varint(buf, at)
            payload, at = buf[at : at + size], at + size
        else:
            raise ValueError("unsupported wire type")
        if at > len(buf) or number == 0:
            raise ValueError("truncated")
        fields.append((number, wire, payload))
    return fields


def field(number: int, wire: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire)
    if wire == LEN:
        return key + varint(len(payload)) + payload
    return key + payload


def encode_wire(fields: list[Field]) -> bytes:
    return b"".join(field(*f) for f in fields)


HOSTILE_VARINTS = (
    varint(2**64 - 1),
    varint(2**63),
    varint(2**32),
    varint(2**31),
    varint(2**32 - 1),
    varint(0),
    b"\xff" * 10 + b"\x01",  # 11 bytes: longer than any varint
    b"\x80",  # never ends
)
HOSTILE_STRINGS = (
    b"\xed\xa0\x80",  # a lone surrogate, UTF-8 encoded: not UTF-8
    b"\xff\xfe",
    b"\x00",
    b"a\x00b",
    b"x" * 100_000,
    b"",
)


def _mutate_fields(fields: list[Field], r: random.Random, depth: int = 0) -> list[Field]:
    fields = list(fields)
    op = r.choice(("drop", "dup", "swap", "retype", "hostile", "hostile", "unknown", "nested"))
    if not fields:
        op = "unknown"
    i = r.randrange(len(fields)) if fields else 0
    if op == "drop":
        del fields[i]
    elif op == "dup":
        number, wire, _ = fields[i]
        fields.insert(r.randrange(len(fields) + 1), fields[i])
        if wire == VARINT:
            fields.append((number, wire, r.choice(HOSTILE_VARINTS)))
    elif op == "swap":
        j = r.randrange(len(fields))
        (a, aw, ap), (b, bw, bp) = fields[i], fields[j]
        fields[i], fields[j] = (a, bw, bp), (b, aw, ap)
    elif op == "retype":
        number, wire, _ = fields[i]
        new_wire = r.choice([w for w in (VARINT, FIXED64, LEN, FIXED32) if w != wire])
        payload = {
            VARINT: r.choice(HOSTILE_VARINTS[:6]),
            FIXED64: r.randbytes(8),
            FIXED32: r.randbytes(4),
            LEN: r.choice(HOSTILE_STRINGS),
        }[new_wire]
        fields[i] = (number, new_wire, payload)
    elif op == "hostile":
        number, wire, _ = fields[i]
        if wire == VARINT:
            fields[i] = (number, wire, r.choice(HOSTILE_VARINTS))
        elif wire == LEN:
            fields[i] = (number, wire, r.choice(HOSTILE_STRINGS))
        else:
            fields[i] = (number, wire, r.randbytes(8 if wire == FIXED64 else 4))
    elif op == "unknown":
        number = r.choice((15, 99, 2**29 - 1, 19_000))  # 19000: reserved by protobuf
        fields.insert(r.randrange(len(fields) + 1), (number, LEN, r.randbytes(r.randint(0, 9))))
    else:  # nested: mutate the message inside a length-delimited field, if it is one
        number, wire, payload = fields[i]
        try:
            inner = parse_wire(payload) if wire == LEN and depth < 4 else None
        except ValueError:
            inner = None
        if inner:
            fields[i] = (number, wire, encode_wire(_mutate_fields(inner, r, depth + 1)))
        else:
            return _mutate_fields(fields, r, depth + 1) if depth < 4 else fields
    return fields


def mutate_wire(message: bytes, r: random.Random) -> bytes:
    """A valid serialized protobuf mutated on its wire format, or cut short."""
    if r.random() < 0.15:
        return message[: r.randrange(len(message) + 1)]
    fields = parse_wire(message)
    for _ in range(r.randint(1, 3)):
        fields = _mutate_fields(fields, r)
    return encode_wire(fields)


def binary_input(seed: bytes, r: random.Random) -> bytes:
    """One input from a valid serialized protobuf `seed`: as is, mutated or garbage."""
    roll = r.random()
    if roll < 0.05:
        return seed
    if roll < 0.8:
        return mutate_wire(seed, r)
    return mutate_bytes(seed, r)


@dataclass
class Offence:
    index: int
    input: Any
    answer: Any


def describe(offences: list[Offence], protocol: str, total: int, shown: int = 12) -> str:
    """The failure message: how many, then the first offending inputs and answers."""

    def cut(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 400 else text[:400] + f"... ({len(text)} chars)"

    lines = [f"{protocol}: {len(offences)} of {total} inputs answered outside the shape:"]
    lines += [
        f"  #{o.index}: input {cut(o.input)}\n      answer {cut(o.answer)}"
        for o in sorted(offences, key=lambda o: o.index)[:shown]
    ]
    return "\n".join(lines)
