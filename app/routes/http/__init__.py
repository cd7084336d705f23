"""HTTP plumbing shared by every HTTP API in `app.routes.apis`: JSON bodies (`bodies`,
`json`), errors in each API's shape (`errors`), what /openapi.json says an API answers
(`answers`), the shared road answered as SSE or JSON (`calls`), server-sent events
(`sse`), cancelling a call whose client left (`disconnect`), what a connection may hold
before it makes a request and too-large websocket messages told in their protocol
(`connections`), which web pages may drive the server (`origins`), and the `{name:rest}`
path convertor (`paths`), registered here so that every API's routes can use it.
"""

from app.routes.http import paths as paths
