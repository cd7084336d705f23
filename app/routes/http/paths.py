"""The `rest` path convertor: a route's tail that may hold any character.

Starlette's own `path` convertor is the regex `.*`, which stops at a newline, so a
percent-encoded `%0A` in a model name left the route unmatched and the request was
answered by the app's default responder (OpenAI's JSON) instead of the API's own (a
GraphPipe client got JSON where its spec promises a flatbuffer). `{name:rest}` matches
every character, newlines included; the route then judges the value itself.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class RestConvertor(Convertor[str]):
    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("rest", RestConvertor())
