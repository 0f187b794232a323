"""Tensor parallelism through the real server: two ranks (gloo, the CPU) give the tokens one
gives, under chunked prefill, retraction and an abort; a dead rank takes the server down.

The oracle is the same server with `--tensor-parallel-size 1` and the same flags: the
scheduling is then the same (the hold gate admits the requests at one tick), so every
output, the number of retractions, and an abort's partial output must be the same.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import Hold, RunningServer, free_port, hold_env, serve, wait_for
from tiny_model import make_tiny_llama

pytestmark = pytest.mark.integration

# a tiny pool (with an optimistic new-token ratio, so all four are admitted at once and
# then retract), chunks of 16 (the 40-token prompt is prefilled in three)
FLAGS = ("--dtype", "float32", "--max-total-tokens", "192", "--chunked-prefill-size", "16",
         "--max-running-requests", "8", "--init-new-token-ratio", "0.1")  # fmt: skip
LONG_PROMPT = list(range(3, 43))
PROMPTS = [LONG_PROMPT, [5, 17, 33, 91], [9, 301, 77, 5, 12, 8], [250, 4, 64, 7, 19]]
MAX_NEW = 48
MODELS = {
    "heads4_kv2": {},
    "heads8_kv2": {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 128},
}


def generate(srv: RunningServer, ids: list[int], max_new: int, rid: str | None = None) -> dict:
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": {
        "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    if rid is not None:
        body["rid"] = rid
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def stats(srv: RunningServer) -> dict:
    return srv.info().get("scheduler_stats", {})


def send_in_order(pool: ThreadPoolExecutor, srv: RunningServer, queued: int, fn: Any, *args: Any) -> Any:
    """Submit a request to a paused scheduler once the `queued` before it are queued, so the
    waiting queue's order is the same on every run."""
    wait_for(lambda: stats(srv).get("queue_requests") == queued, timeout=60)
    future = pool.submit(fn, *args)
    wait_for(lambda: stats(srv).get("queue_requests") == queued + 1, timeout=60)
    return future


def scenario(srv: RunningServer, hold: Hold) -> dict:
    out: dict[str, Any] = {}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        hold.pause()  # admitted at one tick, in this order, however the sends are spread
        futures = [send_in_order(pool, srv, i, generate, srv, p, MAX_NEW) for i, p in enumerate(PROMPTS)]
        hold.resume()
        out["batch"] = [f.result()["output_ids"] for f in futures]
        final = srv.wait_idle()["scheduler_stats"]
        out["retractions"] = final["retractions_total"]
        metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
        [value] = re.findall(r"^sluice_retractions_total\{[^}]*\} (\S+)$", metrics, re.M)
        assert float(value) == out["retractions"]  # the metrics are rank 0's
        # an abort while both requests are running (frozen once both have 3 tokens), handled
        # at the same tick on every run
        hold.pause()
        victim = send_in_order(pool, srv, 0, generate, srv, PROMPTS[1], 30, "victim")
        survivor = send_in_order(pool, srv, 1, generate, srv, PROMPTS[2], 30, "survivor")
        hold.arm(3, 2)
        hold.resume()
        out["held"] = hold.wait_held()
        hold.pause()  # no tick until the abort is handled, however late it arrives
        r = httpx.post(f"{srv.url}/abort_request", json={"rid": "victim"}, timeout=30)
        assert r.json() == {"aborted": ["victim"]}
        hold.release()
        v = victim.result()
        hold.resume()
        s = survivor.result()
        assert v["meta_info"]["finish_reason"]["type"] == "abort"
        assert s["meta_info"]["finish_reason"]["type"] == "length"
        out["victim"], out["survivor"] = v["output_ids"], s["output_ids"]
        srv.wait_idle()
    return out


def run_scenario(model: Path, tmp_path: Path, tp: int, *extra: str) -> dict:
    hold, env = hold_env(tmp_path / f"hold-tp{tp}")
    flags = (*FLAGS, "--tensor-parallel-size", str(tp), *extra)
    with serve(model, tmp_path / f"tp{tp}.log", *flags, env=env) as srv:
        assert srv.info()["tensor_parallel_size"] == tp
        return scenario(srv, hold)


# both loops on the 4-head model; the 8-head one in the overlap loop
CASES = [("heads4_kv2", "overlap"), ("heads4_kv2", "normal"), ("heads8_kv2", "overlap")]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: make_tiny_llama(tmp_path_factory.mktemp(name), initializer_range=0.08, **kw)
            for name, kw in MODELS.items()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name, loop", CASES, ids=[f"{n}-{loop}" for n, loop in CASES])
def test_two_ranks_generate_what_one_does(models, tmp_path, name, loop):
    extra = ("--enable-overlap-schedule",) if loop == "overlap" else ("--disable-overlap-schedule",)
    one = run_scenario(models[name], tmp_path, 1, *extra)
    two = run_scenario(models[name], tmp_path, 2, *extra)
    assert one["retractions"] > 0  # the tiny pool did retract
    assert len(one["victim"]) < 30
    for run in (one, two):  # what differs by nature: time, and how often it went idle
        run["held"].pop("generation_throughput")
        run["held"].pop("queue_times")
        run["held"].pop("integrity_checks_total")  # one check each time the scheduler idles
    differ = {k: (v, two["held"][k]) for k, v in one["held"].items() if v != two["held"][k]}
    assert not differ  # the same scheduling: KV usage, cache, retractions, batches
    assert two == one


SAMPLED = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.9, "seed": 7,
           "frequency_penalty": 0.6, "presence_penalty": 0.4, "ignore_eos": True}  # fmt: skip
REGEX = r"[a-e]{4,8}"
CONSTRAINED = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
               "guided_regex": REGEX}  # fmt: skip


def sampling_features(model: Path, tmp_path: Path, tp: int) -> list[str]:
    """Seeded sampling with penalties, and a regex-constrained request (rank 0 samples with
    its generators, its penalties' token history and its grammar mask; the other ranks'
    schedulers must admit the constrained request at the same tick)."""
    with serve(model, tmp_path / f"features-tp{tp}.log", "--dtype", "float32",
               "--tensor-parallel-size", str(tp)) as srv:  # fmt: skip
        name = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"][0]["id"]
        texts = []
        for body in (SAMPLED, CONSTRAINED, SAMPLED):
            r = httpx.post(f"{srv.url}/v1/completions", json={"model": name, **body}, timeout=120)
            r.raise_for_status()
            texts.append(r.json()["choices"][0]["text"])
        return texts


@pytest.mark.slow
def test_seeded_sampling_penalties_and_constraints_are_those_of_one_rank(models, tmp_path):
    one = sampling_features(models["heads4_kv2"], tmp_path, 1)
    two = sampling_features(models["heads4_kv2"], tmp_path, 2)
    assert re.fullmatch(REGEX, one[1]), one[1]  # the constraint itself
    assert one[0] == one[2]  # the seed alone decides the sample
    assert two == one


def rank_pid(log: Path, rank: int) -> int:
    found = re.findall(rf"scheduler \(tp rank {rank}\): pid (\d+)", log.read_text())
    assert found, f"no pid logged for rank {rank}"
    return int(found[0])


def stream_events(url: str, body: dict) -> list[Any]:
    """The SSE events' JSON (or the error body when the response is not a stream)."""
    events: list[Any] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        if r.headers.get("content-type", "").startswith("application/json"):
            r.read()
            return [{"status": r.status_code, **r.json()}]
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[len("data: "):]))
    return events


def test_a_dead_rank_fails_every_client_and_takes_the_server_down(tmp_path):
    model = make_tiny_llama(tmp_path / "model", initializer_range=0.08)
    hold, env = hold_env(tmp_path / "hold")
    log = tmp_path / "server.log"
    flags = ("--tensor-parallel-size", "2", "--dtype", "float32", "--max-total-tokens", "4096")
    with serve(model, log, *flags, env=env) as srv:
        body = {"model": "model", "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}
        hold.arm(2, 3)  # held open by construction: frozen once all three have 2 tokens
        with ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(stream_events, srv.url, {**body, "stream": True})
                       for _ in range(2)]  # fmt: skip
            plain = pool.submit(httpx.post, f"{srv.url}/v1/completions", json=body, timeout=60)
            hold.wait_held()
            os.kill(rank_pid(log, 1), signal.SIGKILL)
            code = srv.proc.wait(timeout=30)
            events = [s.result() for s in streams]
            response = plain.result()
    assert code != 0  # within the wait above (the supervisor's forced exit comes sooner)
    for stream in events:
        assert stream[-1].get("error", {}).get("code") == "engine_error", stream[-1]
        assert "tp rank 1" in stream[-1]["error"]["message"]
    assert response.status_code == 500
    assert "tp rank 1" in response.json()["error"]["message"]
    assert "scheduler (tp rank 1) process exited with code -9" in log.read_text()


def test_two_nodes_meet_at_the_dist_init_addr(tmp_path):
    """`--nnodes 2` on one host: node 1 runs rank 1 only, node 0 the server and rank 0.
    (Two machines are not tested: the same code, another address.)"""
    model = make_tiny_llama(tmp_path / "model", initializer_range=0.08)
    addr = f"127.0.0.1:{free_port()}"
    common = ["--tensor-parallel-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
              "--dtype", "float32"]  # fmt: skip
    with (tmp_path / "node1.log").open("wb") as node1_log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "sluice.runtime", "serve", "--model", str(model),
             "--device", "cpu", *common, "--node-rank", "1"],
            stdout=node1_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            with serve(model, tmp_path / "node0.log", *common, "--node-rank", "0") as srv:
                two_nodes = generate(srv, PROMPTS[0], 16)["output_ids"]
            node1.wait(timeout=60)  # rank 0 is gone: node 1 stops
        finally:
            node1.kill()
    assert two_nodes == hf_greedy(model, PROMPTS[0], 16)
    assert "Uvicorn running" not in (tmp_path / "node1.log").read_text()


def hf_greedy(model: Path, ids: list[int], max_new: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    seq = list(ids)
    with torch.inference_mode():  # whole sequences, EOS not special (as ignore_eos)
        for _ in range(max_new):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]
