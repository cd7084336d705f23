"""The playground: a browser page for every protocol, served from package data.

`GET /` redirects to `GET /playground` (the page); `GET /playground/{name}` serves the
page's other files (CSS, JavaScript modules) from `app/playground/`. The page is plain
static files, no build step: it talks to the server only through the public protocols
(OpenAI chat over SSE, Salience and Evergreen over their websockets), exactly as an
outside client would, so it needs no credential of its own and the API key is the
user's, given in the page.

Only the files present in the package at import time are served, by name: a request can
never reach outside the directory, whatever its path.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.errors import NotFound

router = APIRouter(include_in_schema=False)

_ROOT = Path(str(resources.files("app") / "playground"))
# Module scripts are refused by browsers unless served as JavaScript.
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".png": "image/png",
}
_FILES = {p.name: p for p in _ROOT.iterdir() if p.is_file() and p.suffix in _TYPES}


def _file(name: str) -> Response:
    path = _FILES.get(name)
    if path is None:
        raise NotFound(f"no playground file {name!r}")
    # no-cache: the browser revalidates, so a page reloaded after an upgrade never mixes
    # old and new modules.
    return FileResponse(path, media_type=_TYPES[path.suffix], headers={"cache-control": "no-cache"})


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/playground", status_code=307)


@router.get("/playground")
async def page() -> Response:
    return _file("index.html")


@router.get("/playground/{name}")
async def asset(name: str) -> Response:
    return _file(name)
