"""llm-d's token-in/token-out contract, Switchboard against `vllm serve --enable-scale-out`
(vLLM 0.32) on the same bodies (issue 42): a check, not a speed run, kept outside the
suite because the peer costs an engine start.

Each server in turn (one alive at a time), the tiny model, the same requests:

- `/inference/v1/generate`, greedy, a token-id prompt, not streamed and streamed (with
  usage and the prompt's ids), with top-2 logprobs: the token ids must be identical, and
  every key vLLM answers must be in Switchboard's answer, the choices' keys identical;
- a negative token id: both 400;
- an abort: a request of 900 tokens (`ignore_eos`), `/inference/v1/abort_requests` with
  its `request_id` once it runs: how many tokens it produced (vLLM's runs to 900);
- `/load` and `/kv_event_sources`: the same keys.

    /work/bin/heavy .venv/bin/python bench/tokens_vs_vllm.py

Writes bench/results/tokens_vs_vllm.json and prints what differs; exits 1 on a failed
check.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx
from harness import RESULTS, Server, machine, started, switchboard, vllm_serve

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [17, 300, 42, 9, 250, 11], list(range(40, 72))]
GEN = "/inference/v1/generate"


def _body(ids: list[int], **more: Any) -> dict[str, Any]:
    params = {"temperature": 0, "max_tokens": 24, "logprobs": 2}
    return {"model": "tiny", "token_ids": ids, "sampling_params": params, **more}


def _stream(client: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with client.stream("POST", GEN, json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def _abort(client: httpx.Client, server: Server) -> int:
    """Tokens a 900-token request produced when aborted by its request_id once running."""
    body = {"model": "tiny", "token_ids": [5, 6, 7], "request_id": "to-abort"}
    body["sampling_params"] = {"max_tokens": 900, "ignore_eos": True, "temperature": 0}
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(client.post(GEN, json=body)))
    thread.start()
    time.sleep(1.0)
    aborted = client.post("/inference/v1/abort_requests", json={"request_ids": ["to-abort"]})
    thread.join(300)
    reply = answer[0]
    if reply.status_code != 200:
        return -reply.status_code
    choice = reply.json()["choices"][0]
    print(f"  {server.target.name}: abort {aborted.status_code}, {choice['finish_reason']}")
    return len(choice["token_ids"])


def run(server: Server) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        out: dict[str, Any] = {"plain": [], "streamed": []}
        client.post(GEN, json=_body(PROMPTS[0])).raise_for_status()  # warm
        for ids in PROMPTS:
            out["plain"].append(client.post(GEN, json=_body(ids)).json())
            opts = {"stream": True, "stream_options": {"include_usage": True}}
            out["streamed"].append(_stream(client, _body(ids, return_token_ids=True, **opts)))
        bad = client.post(GEN, json=_body([5, -1]))
        out["negative"] = {"status": bad.status_code, "body": bad.json()}
        out["aborted_after"] = _abort(client, server)
        out["load"] = client.get("/load").json()
        out["kv_event_sources"] = client.get("/kv_event_sources").json()
    return out


def _ids_plain(answer: dict[str, Any]) -> list[int]:
    return list(answer["choices"][0]["token_ids"])


def _ids_streamed(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for c in chunks for ch in c["choices"] for t in ch["token_ids"] or ()]


def compare(ours: dict[str, Any], peer: dict[str, Any]) -> list[str]:
    problems = []
    for i, (a, b) in enumerate(zip(ours["plain"], peer["plain"], strict=True)):
        if _ids_plain(a) != _ids_plain(b):
            problems.append(f"prompt {i}: token ids {_ids_plain(a)} != {_ids_plain(b)}")
        if missing := set(b) - set(a):
            problems.append(f"prompt {i}: keys missing {sorted(missing)}")
        if set(a["choices"][0]) != set(b["choices"][0]):
            problems.append(f"prompt {i}: choice keys {sorted(a['choices'][0])}")
        ours_lp = [c["token_id"] for c in a["choices"][0]["logprobs"]["content"]]
        if ours_lp != _ids_plain(b):
            problems.append(f"prompt {i}: logprob ids {ours_lp}")
    for i, (a, b) in enumerate(zip(ours["streamed"], peer["streamed"], strict=True)):
        if _ids_streamed(a) != _ids_streamed(b):
            problems.append(f"stream {i}: token ids differ")
        if a[0].get("prompt_token_ids") != b[0].get("prompt_token_ids"):
            problems.append(f"stream {i}: prompt ids differ")
        if a[-1]["usage"] != b[-1]["usage"]:
            problems.append(f"stream {i}: usage {a[-1]['usage']} != {b[-1]['usage']}")
    if ours["negative"]["status"] != peer["negative"]["status"]:
        problems.append(f"negative id: {ours['negative']['status']}")
    for key in ("load", "kv_event_sources"):
        if set(ours[key]) != set(peer[key]):
            problems.append(f"{key}: {ours[key]} vs {peer[key]}")
    if not 0 <= ours["aborted_after"] < 900:
        problems.append(f"our abort stopped nothing: {ours['aborted_after']}")
    return problems


def main() -> None:
    found = {}
    for target in (vllm_serve("vllm serve", "--enable-scale-out"), switchboard()):
        with started(target) as server:
            found[target.name] = run(server)
    problems = compare(found["switchboard"], found["vllm serve"])
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "problems": problems,
        "vllm_aborted_after": found["vllm serve"]["aborted_after"],
        "switchboard_aborted_after": found["switchboard"]["aborted_after"],
        "answers": found,
    }
    (RESULTS / "tokens_vs_vllm.json").write_text(json.dumps(record, indent=1))
    print("\n".join(problems) or "identical token ids; every vLLM key answered")
    print(f"abort: vLLM ran {record['vllm_aborted_after']} of 900 tokens, "
          f"Switchboard {record['switchboard_aborted_after']}")  # fmt: skip
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
