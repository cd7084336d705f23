"""The playground page in a real browser (headless Chromium from the system's packages,
driven by selenium through the system chromedriver) against the live server on real
vLLM: chat over SSE, Salience (token cells, readouts, fork, cancel), Evergreen (a
conversation of three turns, an ABORT), a wrong API key on every protocol, a server
restart, and no console errors.

What the page shows is checked against what the protocols sent: a script injected
before the page's own records every websocket frame in and out (the page is not
instrumented for tests), and greedy requests are repeated with plain clients.

`UPDATE_SCREENSHOT=1` rewrites docs/playground.png (the README's) from the Salience test.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import websockets
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from app.auth import Keyring
from tests.conftest import ROOT, LiveServer, free_port
from tests.salience_client import JsonClient, tokens_of

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = ROOT / "docs" / "playground.png"
WIDTH, HEIGHT = 1280, 800

# Runs in every document before the page's scripts: keeps each websocket frame, both
# ways, and each close, in `window.__frames`.
RECORD_FRAMES = """
window.__frames = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(url, protocols) {
    super(url, protocols);
    const path = new URL(url).pathname;
    this.addEventListener("message", (e) => window.__frames.push({path, dir: "in", data: e.data}));
    this.addEventListener("close", (e) =>
      window.__frames.push({path, dir: "close", code: e.code, reason: e.reason}));
  }
  send(data) {
    window.__frames.push({path: new URL(this.url).pathname, dir: "out", data});
    super.send(data);
  }
};
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: scripts/setup installs chromium"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver's path given explicitly: selenium's driver manager never runs (nothing is
    # downloaded).
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_FRAMES})
    viewport(driver, WIDTH, HEIGHT)
    try:
        yield driver
    finally:
        driver.quit()


def viewport(driver: WebDriver, width: int, height: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def wait_for(driver: WebDriver, condition: Callable[[], Any], timeout: float = 30) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda _: condition())


def by_id(driver: WebDriver, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def text_of(driver: WebDriver, element_id: str) -> str:
    return str(driver.execute_script(f"return document.getElementById('{element_id}').textContent"))


def set_value(driver: WebDriver, element_id: str, value: object) -> None:
    field = by_id(driver, element_id)
    field.clear()
    field.send_keys(str(value))


def frames(driver: WebDriver, path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for frame in driver.execute_script("return window.__frames"):
        if frame["path"] != path:
            continue
        if "data" in frame:
            frame["data"] = json.loads(frame["data"])
        out.append(frame)
    return out


def browser_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The console's entries since the last read (read once, then gone)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]  # selenium's get_log is unannotated
    return entries


def console_errors(driver: WebDriver) -> list[str]:
    return [entry["message"] for entry in browser_log(driver) if entry["level"] == "SEVERE"]


def open_page(driver: WebDriver, base_url: str) -> None:
    driver.get(f"{base_url}/")
    assert driver.current_url == f"{base_url}/playground"
    wait_for(driver, lambda: text_of(driver, "server-status") == "server up")
    wait_for(driver, lambda: text_of(driver, "sal-socket") == "socket open")
    wait_for(driver, lambda: Select(by_id(driver, "chat-model")).options)


@pytest.fixture
def page(browser: WebDriver, live_server: LiveServer) -> Iterator[WebDriver]:
    """The page, freshly loaded; no console error may have been logged by the end."""
    browser_log(browser)  # drop what earlier tests left
    open_page(browser, live_server.base_url)
    yield browser
    assert console_errors(browser) == []


def tab(driver: WebDriver, name: str) -> None:
    by_id(driver, f"tab-{name}").click()
    assert by_id(driver, f"panel-{name}").is_displayed()


# -- OpenAI chat ---------------------------------------------------------------------


def test_chat_streams_tokens_into_the_page(page: WebDriver, live_server: LiveServer) -> None:
    # Every state the assistant's text goes through, as the page renders it.
    page.execute_script("""
        window.__seen = [];
        new MutationObserver(() => {
          const out = document.querySelector('#chat-log .assistant .content');
          if (out) window.__seen.push(out.textContent);
        }).observe(document.getElementById('chat-log'),
                   {subtree: true, childList: true, characterData: true});
    """)
    set_value(page, "chat-input", "Write a Python function.")
    set_value(page, "chat-max-tokens", 24)
    set_value(page, "chat-temperature", 0)
    by_id(page, "chat-send").click()
    wait_for(page, lambda: "finish:" in text_of(page, "chat-meta"))

    shown = page.find_element(By.CSS_SELECTOR, "#chat-log .assistant .content").text
    expected = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        json={
            "model": live_server.model,
            "messages": [{"role": "user", "content": "Write a Python function."}],
            "max_tokens": 24,
            "temperature": 0,
        },
        timeout=60,
    ).json()
    choice = expected["choices"][0]
    assert shown == choice["message"]["content"].strip()
    meta = text_of(page, "chat-meta")
    assert f"finish: {choice['finish_reason']}" in meta
    usage = expected["usage"]
    assert f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion" in meta
    seen = [s for s in page.execute_script("return window.__seen") if s]
    # Streamed: the text grew in several steps, each a prefix of the next.
    assert len(set(seen)) >= 3, seen
    assert all(b.startswith(a) for a, b in itertools.pairwise(seen))


def test_responses_mode_continues_a_stored_conversation(
    page: WebDriver, live_server: LiveServer
) -> None:
    """The page's Responses mode sends each turn alone with the last response's id: the
    server's stored record of the second turn names the first, and holds the text shown."""
    Select(by_id(page, "chat-api")).select_by_value("responses")
    set_value(page, "chat-max-tokens", 12)
    set_value(page, "chat-temperature", 0)
    ids: list[str] = []

    def shown_id() -> str | None:
        found = re.search(r"response: (resp_\w+)", text_of(page, "chat-meta"))
        return found.group(1) if found and found.group(1) not in ids else None

    for turn in ("one", "two"):
        set_value(page, "chat-input", turn)
        by_id(page, "chat-send").click()
        wait_for(page, shown_id)
        ids.append(str(shown_id()))
    stored = httpx.get(f"{live_server.base_url}/v1/responses/{ids[1]}", timeout=30).json()
    assert stored["previous_response_id"] == ids[0]
    shown = page.find_elements(By.CSS_SELECTOR, "#chat-log .assistant .content")[-1].text
    assert shown.strip() == stored["output"][0]["content"][0]["text"].strip()
    Select(by_id(page, "chat-api")).select_by_value("chat")  # leaves the page as it was


# -- Salience ------------------------------------------------------------------------

PROMPT = "def fibonacci(n):"


def salience_generate(driver: WebDriver, text: str, max_tokens: int, logprob_k: int = 3) -> None:
    set_value(driver, "sal-text", text)
    set_value(driver, "sal-max-tokens", max_tokens)
    set_value(driver, "sal-top-k", 1)
    set_value(driver, "sal-logprob-k", logprob_k)
    by_id(driver, "sal-generate").click()


def open_session(driver: WebDriver) -> str:
    before = len(Select(by_id(driver, "sal-sessions")).options)
    by_id(driver, "sal-open").click()
    wait_for(driver, lambda: len(Select(by_id(driver, "sal-sessions")).options) == before + 1)
    return str(Select(by_id(driver, "sal-sessions")).first_selected_option.get_attribute("value"))


def token_cells(driver: WebDriver) -> list[dict[str, Any]]:
    return list(
        driver.execute_script("""
        return [...document.querySelectorAll('#sal-tokens button.tok')].map((b) => ({
          position: Number(b.dataset.position), id: Number(b.dataset.tokenId),
          logprob: b.dataset.logprob === undefined ? null : Number(b.dataset.logprob)}));
    """)
    )


def heat_cells(driver: WebDriver) -> list[dict[str, Any]]:
    return list(
        driver.execute_script("""
        return [...document.querySelectorAll('#sal-heatmap td.heat')].map((td) => ({
          position: Number(td.dataset.position), concept: td.dataset.concept,
          value: Number(td.dataset.value)}));
    """)
    )


def test_salience_cells_and_readouts_are_what_the_protocol_sent(
    page: WebDriver, live_server: LiveServer
) -> None:
    tab(page, "salience")
    session_id = open_session(page)
    salience_generate(page, PROMPT, max_tokens=12)
    wait_for(page, lambda: "finish:" in text_of(page, "sal-meta"))

    sent = frames(page, "/salience/ws")
    out = [f["data"] for f in sent if f["dir"] == "out"]
    request = next(frame for frame in out if frame.get("method") == "Generate")
    call_id = request["id"]
    events = [f["data"]["event"] for f in sent if f["dir"] == "in" and f["data"]["id"] == call_id]
    tokens = tokens_of(events)
    done = events[-1]["done"]
    manifest = next(
        f["data"]["response"]
        for f in sent
        if f["dir"] == "in" and "concepts" in f["data"].get("response", {})
    )
    assert request["request"]["sessionId"] == session_id
    assert request["request"]["readoutRanges"] and request["request"]["logprobsRanges"]

    # One cell per session token, in order, each with the logprob its event carried.
    cells = token_cells(page)
    assert len(cells) == done["totalTokens"] == len(request["request"]["appendTokens"]) + 12
    assert text_of(page, "sal-offset") == str(done["totalTokens"])
    by_position = {t.get("position", 0): t for t in tokens}
    for index, cell in enumerate(cells):
        assert cell["position"] == index
        event = by_position[index]
        assert cell["id"] == event.get("id", 0)
        if event.get("hasSampledLogprob"):
            assert cell["logprob"] == event.get("sampledLogprob", 0)
        else:
            assert cell["logprob"] is None

    # The heat map: for the chosen layer, concepts x every token that carried a readout.
    concepts, layers = manifest["concepts"], manifest["layers"]
    assert len(layers) >= 1 and len(concepts) >= 1
    with_readout = [t for t in tokens if t.get("readout")]
    assert len(with_readout) == len(cells) - 1  # the last decoded token has none
    for layer in range(len(layers)):
        Select(by_id(page, "sal-layer")).select_by_index(layer)
        heat = heat_cells(page)
        assert len(heat) == len(with_readout) * len(concepts)
        for cell in heat:
            readout = by_position[cell["position"]]["readout"]
            value = readout[layer * len(concepts) + concepts.index(cell["concept"])]
            assert cell["value"] == value

    # The page asked for what a plain client asking the same gets: same tokens.
    async def reference() -> list[dict[str, Any]]:
        async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
            client = JsonClient(ws)
            opened = await client.call("OpenSession", {"model": live_server.model})
            body = dict(request["request"], sessionId=opened["response"]["sessionId"])
            return await client.generate(body)

    again = live_server.call(reference())
    assert [t.get("id", 0) for t in tokens_of(again)] == [t.get("id", 0) for t in tokens]

    # Hovering a decoded token shows its alternatives, as the event listed them.
    decoded = page.find_element(
        By.CSS_SELECTOR, f'#sal-tokens button.tok[data-position="{len(cells) - 4}"]'
    )
    page.execute_script("document.activeElement.blur()")
    ActionChains(page).move_to_element(decoded).perform()
    top = by_position[len(cells) - 4]["logprobs"]
    wait_for(page, lambda: len(page.find_elements(By.CSS_SELECTOR, "#sal-detail li")) == len(top))
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        page.execute_script("window.scrollTo(0, 0)")
        page.save_screenshot(str(SCREENSHOT))


def test_salience_fork_and_cancel(page: WebDriver, live_server: LiveServer) -> None:
    tab(page, "salience")
    first = open_session(page)
    salience_generate(page, PROMPT, max_tokens=6)
    wait_for(page, lambda: "finish:" in text_of(page, "sal-meta"))
    ids = [c["id"] for c in token_cells(page)]

    # Keyboard: Tab from Generate (Cancel is disabled) reaches the strip, one tab stop
    # on its first cell; arrows move to the fourth, Enter selects it.
    page.execute_script("document.getElementById('sal-generate').focus()")
    page.switch_to.active_element.send_keys(Keys.TAB)
    assert page.switch_to.active_element.get_attribute("data-position") == "0"
    for _ in range(3):
        page.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    page.switch_to.active_element.send_keys(Keys.ENTER)
    assert by_id(page, "sal-fork").text == "Fork before token 3"
    by_id(page, "sal-fork").click()
    wait_for(page, lambda: len(Select(by_id(page, "sal-sessions")).options) == 2)
    fork = Select(by_id(page, "sal-sessions")).first_selected_option.get_attribute("value")
    assert fork != first
    assert text_of(page, "sal-offset") == "3"
    assert [c["id"] for c in token_cells(page)] == ids[:3]
    by_id(page, "sal-dump").click()
    wait_for(page, lambda: text_of(page, "sal-dump-out").startswith("3 tokens"))
    assert (
        text_of(page, "sal-dump-out") == f"3 tokens: {json.dumps(ids[:3], separators=(',', ':'))}"
    )

    # Cancel a long generation on the fork once three tokens are shown. The tiny model
    # decodes hundreds of tokens a second, faster than selenium's round trips: Cancel is
    # pressed from the page itself, as the third token's cell appears.
    set_value(page, "sal-text", "")
    set_value(page, "sal-max-tokens", 900)
    page.execute_script("""
        const strip = document.getElementById('sal-tokens');
        new MutationObserver((_, observer) => {
          if (strip.children.length >= 6) {
            observer.disconnect();
            document.getElementById('sal-cancel').click();
          }
        }).observe(strip, {childList: true});
        document.getElementById('sal-generate').click();
    """)
    wait_for(page, lambda: "finish: cancelled" in text_of(page, "sal-meta"))
    done = [
        f["data"]["event"]["done"]
        for f in frames(page, "/salience/ws")
        if f["dir"] == "in" and "done" in f["data"].get("event", {})
    ][-1]
    assert done["finishReason"] == "FINISH_REASON_CANCELLED"
    assert 3 <= done.get("completionTokens", 0) < 900
    assert text_of(page, "sal-offset") == str(done["totalTokens"])
    assert len(token_cells(page)) == done["totalTokens"]
    assert live_server.wait_idle() == 0
    by_id(page, "sal-dump").click()
    wait_for(
        page, lambda: text_of(page, "sal-dump-out").startswith(f"{done['totalTokens']} tokens")
    )


# -- Evergreen -----------------------------------------------------------------------


def evergreen_turn(driver: WebDriver, text: str, turn: int) -> str:
    set_value(driver, "eg-input", text)
    by_id(driver, "eg-send").click()
    selector = f'#eg-log .turn[data-turn="{turn}"]'
    wait_for(
        driver,
        lambda: (
            driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-state")
            in ("done", "failed")
        ),
    )
    return str(driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-state"))


def test_evergreen_conversation_of_three_turns_then_an_abort(
    page: WebDriver, live_server: LiveServer
) -> None:
    tab(page, "evergreen")
    set_value(page, "eg-max-tokens", 12)
    set_value(page, "eg-temperature", 0)
    questions = ["Hello!", "What is a list?", "And a dict?"]
    for turn, question in enumerate(questions, start=1):
        assert evergreen_turn(page, question, turn) == "done"

    sent = [f["data"] for f in frames(page, "/evergreen/ws") if f["dir"] == "out"]
    assert len(sent) == 3
    # Each turn sends only its own text and a node listing the earlier ones by id.
    for turn, message in enumerate(sent, start=1):
        leaves = [n["id"] for n in message["nodeFragments"] if "chunkFragment" in n]
        assert leaves == [f"u{turn}"]
        parent = next(n for n in message["nodeFragments"] if n["id"] == f"c{turn}")
        earlier = [x for k in range(1, turn) for x in (f"u{k}", f"r{k}")]
        assert parent["childIds"] == [*earlier, f"u{turn}"]
    # Responses arrive as several fragments, and the page shows them joined.
    received = [f["data"] for f in frames(page, "/evergreen/ws") if f["dir"] == "in"]
    r3 = [n for m in received for n in m.get("nodeFragments", []) if n["id"] == "r3"]
    assert len(r3) > 1
    shown = page.find_elements(By.CSS_SELECTOR, "#eg-log .assistant .content")
    answers = [element.get_attribute("textContent") for element in shown]

    # The same conversation as a greedy OpenAI chat gives the third answer.
    messages: list[dict[str, str]] = []
    for question, answer in zip(questions, answers, strict=True):
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer or ""})
    body = {
        "model": live_server.model,
        "messages": messages[:-1],
        "max_tokens": 12,
        "temperature": 0,
    }
    chat = httpx.post(f"{live_server.base_url}/v1/chat/completions", json=body, timeout=60).json()
    assert answers[2] == chat["choices"][0]["message"]["content"]

    # A turn that cannot fit aborts the session: the ABORT's code and message, and the
    # close code, as the server sent them.
    set_value(page, "eg-max-tokens", 1024)
    assert evergreen_turn(page, "One more?", 4) == "failed"
    abort = received_abort(page)
    assert text_of(page, "eg-error") == f"ABORT {abort['code']}: {abort['message']}"
    close = next(f for f in frames(page, "/evergreen/ws") if f["dir"] == "close")
    assert abort["code"] == "RESOURCE_EXHAUSTED" and close["code"] == 4008
    assert f"close {close['code']}" in text_of(page, "eg-socket")

    # The next turn opens a new session and sends the earlier turns once more.
    set_value(page, "eg-max-tokens", 4)
    assert evergreen_turn(page, "Still there?", 5) == "done"
    resent = [f["data"] for f in frames(page, "/evergreen/ws") if f["dir"] == "out"][-1]
    leaves = [n["id"] for n in resent["nodeFragments"] if "chunkFragment" in n]
    assert leaves == ["u1", "r1", "u2", "r2", "u3", "r3", "u5"]


def received_abort(driver: WebDriver) -> dict[str, str]:
    for frame in frames(driver, "/evergreen/ws"):
        for action in (frame.get("data") or {}).get("actions", []):
            if action["name"] == "ABORT":
                return dict(action["configs"][0]["value"])
    raise AssertionError("no ABORT received")


# -- auth, layout --------------------------------------------------------------------


def test_wrong_api_key_shows_each_protocols_error(
    browser: WebDriver, live_server: LiveServer
) -> None:
    objects = live_server.app.state.objects
    keyring = objects.keyring
    # Every transport asks the app's keyring per call: a key for this test only, no
    # second engine.
    keyed = live_server.app.state.settings.model_copy(update={"api_key": "the-right-key"})
    objects.keyring = Keyring.from_settings(keyed)
    try:
        browser_log(browser)
        browser.get(f"{live_server.base_url}/playground")
        wait_for(browser, lambda: text_of(browser, "server-status") == "server up")
        wait_for(browser, lambda: text_of(browser, "sal-socket").startswith("socket closed (1008"))
        key = by_id(browser, "api-key")
        key.send_keys("a-wrong-key", Keys.ENTER)
        wrong = httpx.post(
            f"{live_server.base_url}/v1/chat/completions",
            headers={"Authorization": "Bearer a-wrong-key"},
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert wrong.status_code == 401

        by_id(browser, "chat-send").click()
        wait_for(browser, lambda: by_id(browser, "chat-error").is_displayed())
        error = wrong.json()["error"]
        assert text_of(browser, "chat-error") == (
            f"HTTP 401 {error['type']} {error['code']}: {error['message']}"
        )

        tab(browser, "salience")
        wait_for(browser, lambda: text_of(browser, "sal-error").startswith("UNAUTHENTICATED"))
        refusal = [
            f["data"]
            for f in frames(browser, "/salience/ws")
            if f["dir"] == "in" and "error" in f["data"]
        ][-1]
        assert refusal["error"]["code"] == "UNAUTHENTICATED"
        assert text_of(browser, "sal-error") == f"UNAUTHENTICATED: {refusal['error']['message']}"
        wait_for(browser, lambda: text_of(browser, "sal-socket").startswith("socket closed (1008"))

        tab(browser, "evergreen")
        assert evergreen_turn(browser, "Hello?", 1) == "failed"
        abort = received_abort(browser)
        assert abort["code"] == "UNAUTHENTICATED"
        assert text_of(browser, "eg-error") == f"ABORT UNAUTHENTICATED: {abort['message']}"
        assert "close 4016" in text_of(browser, "eg-socket")

        # The right key: every protocol answers again.
        key.clear()
        key.send_keys("the-right-key", Keys.ENTER)
        wait_for(browser, lambda: text_of(browser, "sal-socket") == "socket open")
        set_value(browser, "eg-max-tokens", 2)
        assert evergreen_turn(browser, "Hello?", 2) == "done"
        # Only the refused HTTP calls may have logged errors (Chromium logs any 401).
        assert all(" 401 " in error for error in console_errors(browser))
    finally:
        objects.keyring = keyring


def test_narrow_window_and_tabs_by_keyboard(page: WebDriver) -> None:
    viewport(page, 390, 800)
    try:
        for name in ("chat", "salience", "evergreen", "server"):
            tab(page, name)
            overflow = page.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{name} overflows a narrow window by {overflow}px"
        # Every control has a label.
        unlabelled = page.execute_script("""
            return [...document.querySelectorAll('input, select, textarea, button')]
              .filter((el) => !(el.labels && el.labels.length) && !el.textContent.trim()
                              && !el.getAttribute('aria-label'))
              .map((el) => el.id);
        """)
        assert unlabelled == []
        tab(page, "chat")
        by_id(page, "tab-chat").send_keys(Keys.ARROW_RIGHT)
        assert by_id(page, "panel-salience").is_displayed()
        assert page.switch_to.active_element.get_attribute("id") == "tab-salience"
    finally:
        viewport(page, WIDTH, HEIGHT)


# -- the server's figures ------------------------------------------------------------


def _metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _cell(driver: WebDriver, chart: str, attribute: str, series: str) -> float | None:
    value = driver.execute_script(
        "const cell = document.querySelector(arguments[0]);"
        "return cell ? cell.dataset.value : null;",
        f'#srv-{chart} td[data-{attribute}="{series}"]',
    )
    return None if value in (None, "") else float(value)


def test_server_tab_plots_what_metrics_says(page: WebDriver, live_server: LiveServer) -> None:
    """Scraped only while shown; once traffic has stopped, each counter's total on the
    page is /metrics' own, a rate and the time to first token were plotted, and the queue
    and KV cache read as the gauges do."""
    assert text_of(page, "srv-status") == "not scraped yet"  # hidden: no scrape
    tab(page, "server")
    wait_for(page, lambda: "scraped /metrics" in text_of(page, "srv-status"))
    body = {"model": live_server.model, "prompt": "def main():", "max_tokens": 16}
    for _ in range(4):
        assert httpx.post(f"{live_server.base_url}/v1/completions", json=body).status_code == 200
    rates: list[float] = []

    def caught_up() -> bool:
        metrics = httpx.get(f"{live_server.base_url}/metrics").text
        expected = _metric_sum(metrics, "switchboard_output_tokens_total", api="completions")
        rates.append(_cell(page, "tokens", "series", "completions") or 0.0)
        return _cell(page, "tokens", "total", "completions") == expected

    wait_for(page, caught_up, timeout=60)
    assert max(rates) > 0, "no rate of output tokens was plotted"
    ttft = _cell(page, "ttft", "series", "p99")
    assert ttft is not None and ttft > 0
    metrics = httpx.get(f"{live_server.base_url}/metrics").text
    refused = _metric_sum(metrics, "switchboard_requests_total", outcome="refused")
    assert _cell(page, "refused", "total", "requests") == refused
    for series in ("waiting", "running", "queued (admission)"):
        assert _cell(page, "queue", "series", series) is not None
    kv = _cell(page, "kv", "series", "KV cache")
    assert kv is not None and 0 <= kv <= 100
    assert page.execute_script("return document.querySelectorAll('#srv-tokens polyline').length")
    tab(page, "chat")  # hidden again: the scrapes stop
    shown = text_of(page, "srv-status")
    time.sleep(5)  # two scrape intervals and more
    assert text_of(page, "srv-status") == shown


# -- a server restart ----------------------------------------------------------------


class _FakeServer:
    """uvicorn on a fixed port with the fake engine: cheap to stop and start again."""

    def __init__(self, port: int) -> None:
        import uvicorn

        from app.config import Settings
        from app.main import create_app
        from tests.fake_engine import FakeEngine

        app = create_app(Settings(model="fake"), engine=FakeEngine())
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "fake server failed"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def test_page_reconnects_after_a_server_restart(browser: WebDriver) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = _FakeServer(port)
    try:
        browser_log(browser)
        open_page(browser, base)
        tab(browser, "salience")
        session = open_session(browser)
        server.stop()
        wait_for(browser, lambda: "reconnecting" in text_of(browser, "sal-socket"))
        wait_for(browser, lambda: "unreachable" in text_of(browser, "server-status"))
        server = _FakeServer(port)
        wait_for(browser, lambda: text_of(browser, "sal-socket") == "socket open")
        wait_for(browser, lambda: text_of(browser, "server-status") == "server up")
        # The restarted server has lost the session: the page says so as Salience does.
        wait_for(browser, lambda: f"session {session}: NOT_FOUND" in text_of(browser, "sal-error"))
        open_session(browser)
    finally:
        server.stop()
    # Refused connections while the server was down are logged as errors by Chromium;
    # nothing else may be.
    unexpected = [
        e for e in console_errors(browser) if "ERR_CONNECTION_REFUSED" not in e and "ws://" not in e
    ]
    assert unexpected == []
