"""HTTP plumbing shared by every HTTP API in `app.routes.apis`: JSON bodies (`bodies`,
`json`), errors in each API's shape (`errors`), server-sent events (`sse`), cancelling a
call whose client left (`disconnect`), several engine requests as one stream
(`generations`), and the `{name:rest}` path convertor (`paths`), registered here so
that every API's routes can use it."""

from app.routes.http import paths as paths
