"""Multi-LoRA through the HTTP API of a real server, against PEFT on the same fp32 weights:
adapters named in `model` (and /generate's lora_path / lora_name), mixed concurrent
batches, run-time load and unload (vLLM's routes and codes), refusals naming the reason,
/v1/models and the metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from lora_adapters import PeftOracle, make_adapter
from server_process import serve
from tiny_model import make_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [[5, 17, 33, 42, 9, 11], [60, 61, 62, 63, 64, 65, 66, 67, 68], [100, 7, 3, 250, 31]]
NEW = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("lora-http")
    base = make_tiny_llama(root / "base", seed=7, initializer_range=0.08)
    adapters = {
        "a8": make_adapter(base, root / "a8", rank=8, seed=1),
        "b16": make_adapter(base, root / "b16", rank=16, seed=2),
        "c8": make_adapter(base, root / "c8", rank=8, seed=3, targets=["q_proj", "v_proj"]),
    }
    flags = ("--enable-lora", "--lora-modules", f"a8={adapters['a8']}",
             "--lora-modules", json.dumps({"name": "b16", "path": str(adapters["b16"])}),
             "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "3",
             "--dtype", "float32", "--max-total-tokens", "4096", "--metrics-compat", "vllm",
             "--drain-timeout", "60")  # fmt: skip
    with serve(base, root / "server.log", *flags) as srv:
        yield srv, base, adapters, PeftOracle(base), root


async def _complete(
    client: httpx.AsyncClient, model: str, prompt: list[int], new: int = NEW
) -> list[int]:
    r = await client.post("/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": new, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _run(coro):
    return asyncio.run(coro)


def test_models_lists_each_adapter_with_its_parent_and_root(setup):
    srv, base, adapters, _, _ = setup
    data = httpx.get(f"{srv.url}/v1/models").json()["data"]
    by_id = {m["id"]: m for m in data}
    base_name = data[0]["id"]
    assert by_id["a8"]["parent"] == base_name and by_id["a8"]["root"] == str(adapters["a8"])
    assert by_id["b16"]["parent"] == base_name and by_id["b16"]["root"] == str(adapters["b16"])


def test_a_concurrent_mixed_batch_gives_each_row_its_own_peft_output(setup):
    srv, _, adapters, oracle, _ = setup
    base_name = httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"]
    jobs = [(model, p) for p in PROMPTS for model in (base_name, "a8", "b16")]

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
            return await asyncio.gather(*(_complete(client, m, p) for m, p in jobs))

    outs = _run(go())
    for (model, prompt), got in zip(jobs, outs, strict=True):
        want = oracle.generate(adapters.get(model), prompt, NEW)
        assert got == want, (model, prompt)
    assert outs[1] != outs[0] and outs[2] != outs[1]  # the adapters change the answer
    # SGLang's /generate: lora_path (a name or the folder) per prompt, and lora_name
    r = httpx.post(f"{srv.url}/generate", timeout=300, json={
        "input_ids": PROMPTS[:2], "lora_path": [str(adapters["b16"]), "a8"],
        "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()[0]["output_ids"] == oracle.generate(adapters["b16"], PROMPTS[0], NEW)
    assert r.json()[1]["output_ids"] == oracle.generate(adapters["a8"], PROMPTS[1], NEW)
    r = httpx.post(f"{srv.url}/generate", timeout=300, json={
        "input_ids": PROMPTS[2], "lora_name": "a8",
        "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}})  # fmt: skip
    assert r.json()["output_ids"] == oracle.generate(adapters["a8"], PROMPTS[2], NEW)


def test_an_unknown_model_or_adapter_is_404_model_not_found(setup):
    srv = setup[0]
    r = httpx.post(
        f"{srv.url}/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 2}
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{srv.url}/generate", json={"text": "hi", "lora_path": "/no/such"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_bad_adapters_are_refused_with_400_naming_the_reason(setup):
    srv, base, _, _, root = setup
    big = make_adapter(base, root / "r32", rank=32, seed=4)
    head = make_adapter(base, root / "head", rank=8, seed=5, targets=["q_proj", "lm_head"])
    other = make_adapter(base, root / "other", rank=8, seed=6)
    cfg = json.loads((other / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "meta-llama/Llama-3.1-70B"
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    empty = root / "empty"
    empty.mkdir()
    (empty / "adapter_config.json").write_text((root / "a8" / "adapter_config.json").read_text())
    cases = [
        (root / "missing", "does not exist"),
        (empty, "has no adapter_model.safetensors"),
        (big, "rank 32 exceeds --max-lora-rank 16"),
        (head, "lm_head"),
    ]
    for i, (path, reason) in enumerate(cases):
        r = httpx.post(f"{srv.url}/v1/load_lora_adapter", timeout=60,
                       json={"lora_name": f"bad{i}", "lora_path": str(path)})  # fmt: skip
        assert r.status_code == 400, (path, r.text)
        assert reason in r.json()["error"]["message"], r.text
    names = {m["id"] for m in httpx.get(f"{srv.url}/v1/models").json()["data"]}
    assert not {f"bad{i}" for i in range(len(cases))} & names
    # another base model's name, this model's shapes: the shapes decide (a warning is logged)
    r = httpx.post(f"{srv.url}/v1/load_lora_adapter", timeout=60,
                   json={"lora_name": "named-other", "lora_path": str(other)})  # fmt: skip
    assert r.status_code == 200, r.text
    r = httpx.post(f"{srv.url}/v1/unload_lora_adapter", timeout=60, json={"lora_name": "named-other"})
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "a8", "lora_path": str(big)}
    )
    assert r.status_code == 400 and "already been loaded" in r.text
    r = httpx.post(f"{srv.url}/v1/unload_lora_adapter", json={"lora_name": "never"})
    assert r.status_code == 404


def test_load_unload_and_reload_at_run_time(setup):
    srv, _, adapters, oracle, _ = setup

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
            r = await client.post(
                "/v1/load_lora_adapter", json={"lora_name": "c8", "lora_path": str(adapters["c8"])}
            )
            assert (
                r.status_code == 200 and r.text == "Success: LoRA adapter 'c8' added successfully."
            )
            assert await _complete(client, "c8", PROMPTS[0]) == oracle.generate(
                adapters["c8"], PROMPTS[0], NEW
            )
            r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "a8"})
            assert (
                r.status_code == 200
                and r.text == "Success: LoRA adapter 'a8' removed successfully."
            )
            r = await client.post(
                "/v1/completions", json={"model": "a8", "prompt": "hi", "max_tokens": 2}
            )
            assert r.status_code == 404
            r = await client.post(
                "/v1/load_lora_adapter", json={"lora_name": "a8", "lora_path": str(adapters["a8"])}
            )
            assert r.status_code == 200
            # three adapters, two slots: c8, a8 and b16 rotate through them
            for model in ("a8", "b16", "c8", "a8"):
                assert await _complete(client, model, PROMPTS[1]) == oracle.generate(
                    adapters[model], PROMPTS[1], NEW
                )

    _run(go())
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert "sluice_lora_adapters_loaded{model=" in metrics
    lines = metrics.splitlines()
    assert [x for x in lines if x.startswith("sluice_lora_adapters_loaded")][0].endswith(" 3.0")
    assert [x for x in lines if x.startswith("sluice_lora_load_seconds_count")][0].split()[
        -1
    ] != "0.0"
    assert 'vllm:lora_requests_info{max_lora="2"' in metrics


def test_unloading_an_adapter_in_use_waits_for_its_requests(setup):
    srv, _, adapters, oracle, _ = setup
    long = 48

    async def go():
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
            body = {"model": "b16", "prompt": PROMPTS[2], "max_tokens": long, "temperature": 0,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            tokens: list[str] = []
            async with client.stream("POST", "/v1/completions", json=body) as stream:
                lines = stream.aiter_lines()
                async for line in lines:  # the request is running once its first token came
                    if line.startswith("data: {"):
                        tokens.append(line)
                        break
                unload = asyncio.ensure_future(
                    client.post("/v1/unload_lora_adapter", json={"lora_name": "b16"})
                )
                async for line in lines:
                    if line.startswith("data: {"):
                        tokens.append(line)
            r = await unload
            return tokens, r

    events, unload = _run(go())
    assert unload.status_code == 200, unload.text
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events)
    want = oracle.generate(adapters["b16"], PROMPTS[2], long)
    from transformers import AutoTokenizer  # the model folder's tokenizer decodes the oracle's ids

    assert text == AutoTokenizer.from_pretrained(oracle.base).decode(want)
