"""The playground's files: `/` redirects to the page, each file has the type a browser
needs (module scripts are refused unless served as JavaScript), and only the package's
own files are served, whatever the path asks for. No API key guards them: the page holds
no secret, and the key is typed into it."""

from __future__ import annotations

import re

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.fake_engine import FakeEngine


def client() -> httpx.AsyncClient:
    app = create_app(Settings(model="fake", api_key="k"), engine=FakeEngine())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_root_redirects_to_the_page() -> None:
    async with client() as http:
        response = await http.get("/")
        assert response.status_code == 307
        assert response.headers["location"] == "/playground"
        page = await http.get("/playground")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")


async def test_every_file_the_page_names_is_served_with_its_type() -> None:
    async with client() as http:
        html = (await http.get("/playground")).text
        assert set(re.findall(r'(?:href|src)="/playground/([^"]+)"', html)) == {
            "playground.css",
            "main.js",
        }
        css = await http.get("/playground/playground.css")
        assert css.headers["content-type"].startswith("text/css")
        seen, todo = set(), ["main.js"]  # the entry module, then its static imports
        while todo:
            name = todo.pop()
            seen.add(name)
            response = await http.get(f"/playground/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith("text/javascript")
            todo += [n for n in re.findall(r'from "\./([^"]+)"', response.text) if n not in seen]
        assert len(seen) >= 6


@pytest.mark.parametrize("path", ["nope.js", "..%2Fmain.py", "%2E%2E/errors.py", "__init__.py"])
async def test_only_the_packages_own_files_are_served(path: str) -> None:
    async with client() as http:
        response = await http.get(f"/playground/{path}")
        assert response.status_code == 404
