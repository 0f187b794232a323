"""The OpenAI API through real HTTP: `python -m sluice.runtime serve` on a tiny random
Llama, driven by the official `openai` client.

One server (with an API key) serves the whole module. After every test no request is in
flight and the scheduler's KV pool is all free again (cached prefixes count as free: they
are evictable).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration
pytest.importorskip(
    "sluice.runtime.launch", reason="the launcher (sluice.runtime.launch) is missing"
)
openai = pytest.importorskip("openai")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tiny_model.py
from server_process import Hold, RunningServer, hold_env, serve, wait_for  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402

API_KEY = "sk-test-sluice"
MODEL = "tiny-llama"  # the served name: the model folder's name
CONTEXT = 512  # the tiny model's max_position_embeddings
START_TIMEOUT_S = 300
GREEDY = {"temperature": 0.0}
NO_EOS = {"extra_body": {"ignore_eos": True}}


@dataclass
class Server:
    srv: RunningServer
    tokenizer: Any
    hold: Hold

    @property
    def url(self) -> str:
        return self.srv.url

    def info(self) -> dict[str, Any]:
        return self.srv.info()

    def log_tail(self, lines: int = 60) -> str:
        return self.srv.log_tail(lines)


AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("openai-client")
    model = make_tiny_llama(folder / MODEL, max_position_embeddings=CONTEXT)
    extra = ("--max-total-tokens", "4096", "--max-running-requests", "16")
    hold, env = hold_env(folder / "hold")
    with serve(model, folder / "server.log", *extra, api_key=API_KEY, env=env) as srv:
        yield Server(srv, AutoTokenizer.from_pretrained(model), hold)


@pytest.fixture
def client(server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def nothing_left_behind(server):
    """After each test: nothing in flight, the KV pool all free (polled: stats are
    published about once a second)."""
    yield
    try:
        server.srv.wait_idle(timeout=15)
    except AssertionError as err:
        pytest.fail(f"requests or KV pages left behind: {err}\n{server.log_tail()}")


def chat_prompt_len(server: Server, messages: list[dict]) -> int:
    text = server.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return len(server.tokenizer.encode(text, add_special_tokens=False))


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


# --- the happy paths ------------------------------------------------------------------------
def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_completion_returns_text_and_exact_usage(server, client):
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, **GREEDY, **NO_EOS
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    prompt_len = chat_prompt_len(server, MESSAGES)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_len, 8)
    assert r.usage.total_tokens == prompt_len + 8


def test_completion_returns_text_and_exact_usage(server, client):
    prompt = "Once upon a time"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY, **NO_EOS)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(server.tokenizer.encode(prompt))
    assert r.usage.completion_tokens == 6
    ids = client.completions.create(
        model=MODEL, prompt=server.tokenizer.encode(prompt), max_tokens=6, **GREEDY, **NO_EOS
    )
    assert ids.choices[0].text == r.choices[0].text


def test_greedy_chat_is_deterministic(client):
    texts = {
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, **GREEDY, **NO_EOS
        )
        .choices[0]
        .message.content
        for _ in range(2)
    }
    assert len(texts) == 1


def test_chat_stream_matches_the_non_streamed_text_and_reports_usage(server, client):
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, **GREEDY, **NO_EOS
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
            stream_options={"include_usage": True}, **GREEDY, **NO_EOS,
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 12
    assert usage.prompt_tokens == chat_prompt_len(server, MESSAGES)


def test_completion_stream_matches_the_non_streamed_text(client):
    kwargs = dict(model=MODEL, prompt="The quick brown fox", max_tokens=10, **GREEDY, **NO_EOS)
    whole = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices
    )
    assert streamed == whole


def _stop_string(text: str) -> str | None:
    """Two printable, non-space ASCII characters from the second half of `text`."""
    for k in range(len(text) // 2, len(text) - 1):
        s = text[k : k + 2]
        if s.isascii() and s.isprintable() and not s.isspace() and " " not in s:
            return s
    return None


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_cuts_the_text_before_it(client, stream):
    kwargs = dict(model=MODEL, prompt="Hello, world! Numbers:", **GREEDY, **NO_EOS)
    full = client.completions.create(max_tokens=40, **kwargs).choices[0].text
    stop = _stop_string(full)
    if stop is None:
        pytest.skip(f"no ASCII stop string candidate in {full!r}")
    expected = full[: full.index(stop)]
    if stream:
        chunks = list(client.completions.create(max_tokens=40, stop=[stop], stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.completions.create(max_tokens=40, stop=[stop], **kwargs)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert text == expected and stop not in text
    assert finish == "stop"


def test_n_returns_n_choices(client):
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, n=3, seed=1, **NO_EOS
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15


def test_concurrent_requests_all_complete_with_their_own_counts(server):
    async def main() -> list[Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0
        ) as c:
            return await asyncio.gather(
                *(
                    c.completions.create(
                        model=MODEL, prompt=f"Request number {i}:", max_tokens=4 + i,
                        **GREEDY, **NO_EOS,
                    )
                    for i in range(10)
                )
            )  # fmt: skip

    results = asyncio.run(main())
    assert [r.usage.completion_tokens for r in results] == [4 + i for i in range(10)]
    assert all(r.choices[0].finish_reason == "length" for r in results)


def test_a_client_leaving_mid_stream_aborts_its_request(server, client):
    server.hold.arm(16)  # the request cannot finish before the client leaves
    try:
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=CONTEXT - 64, stream=True, **NO_EOS
        )
        next(chunk for chunk in stream if chunk.choices)
        server.hold.wait_held()  # frozen at 16 tokens: the request is still running
        stream.close()
    finally:
        server.hold.disarm()
    # the autouse check then proves the slot and KV pages came back; the log says why
    wait_for(lambda: "reason=client-gone" in server.srv.log.read_text(errors="replace"), 15)


# --- bad input: a 4xx in OpenAI's shape, and no state touched ---------------------------------
def _error(exc: Any) -> dict[str, Any]:
    body = exc.body if isinstance(exc.body, dict) else {}
    return body.get("error", body)


def test_malformed_json_is_a_400(server):
    r = httpx.post(
        f"{server.url}/v1/chat/completions", content=b"{not json",
        headers={**AUTH, "content-type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert info.value.code == "model_not_found"


def test_a_prompt_longer_than_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="word " * (2 * CONTEXT), max_tokens=1)
    assert "maximum context length" in _error(info.value)["message"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": CONTEXT},  # prompt + max_tokens beyond the context
        {"temperature": -0.5},
        {"temperature": "hot"},  # wrong type
        {"max_tokens": "ten"},  # wrong type
        {"messages": [{"role": "user"}, 5]},  # wrong type
    ],
)
def test_bad_parameters_are_a_400(client, kwargs):
    args = {"model": MODEL, "messages": MESSAGES, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    assert info.value.status_code == 400
    assert _error(info.value)["type"] == "invalid_request_error"


def test_the_api_key_is_required_except_for_health(server):
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_server_info_hides_the_api_key(server):
    info = server.info()
    assert info["model"].endswith(MODEL) and "api_key" not in info
    assert API_KEY not in str(info)


# --- the wider OpenAI surface -----------------------------------------------------------------
def test_a_batched_prompt_gives_each_prompt_its_own_greedy_completion(client):
    prompts = ["Once upon a time", "The quick brown fox"]
    kwargs = dict(model=MODEL, max_tokens=5, **GREEDY, **NO_EOS)
    batch = client.completions.create(prompt=prompts, n=2, **kwargs)
    singles = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [singles[0]] * 2 + [singles[1]] * 2
    assert batch.usage.completion_tokens == 20


def test_a_refused_field_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"use_beam_search": True}
        )
    assert _error(info.value)["param"] == "use_beam_search"


def test_abort_request_ends_a_streaming_request_in_band(server, client):
    server.hold.arm(16)  # the request cannot finish before the abort arrives
    try:
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=CONTEXT - 64, stream=True,
            extra_body={"ignore_eos": True, "rid": "to-abort"},
        )  # fmt: skip
        finishes = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not finishes:
                server.hold.wait_held()  # frozen at 16 tokens: the request is still running
                r = httpx.post(f"{server.url}/abort_request", json={"rid": "to-abort"}, headers=AUTH)
                assert r.json() == {"aborted": ["to-abort"]}
                finishes.append(None)
                server.hold.release()
            if chunk.choices and chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
    finally:
        server.hold.disarm()
    assert finishes[-1] == "abort"


def test_server_info_says_which_dtype_and_why(server):
    info = server.info()
    assert info["dtype"] in ("bfloat16", "float32")
    assert info["dtype_reason"].startswith("auto: the CPU has")  # the CPU was asked
    assert info["kv_cache_dtype"] == info["dtype"] and info["quantization"] == "none"
    assert info["attention_backend"] == "cpu" and info["torch_threads"] >= 1
