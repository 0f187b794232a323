"""The bundled SmolLM2 answers through the real server and the official client."""

from __future__ import annotations

import pytest
from server_process import serve

pytestmark = [pytest.mark.integration, pytest.mark.bundled]
openai = pytest.importorskip("openai")


def test_the_bundled_model_knows_the_capital_of_france(bundled_model_path, tmp_path):
    with serve("smollm2-135m", tmp_path / "server.log", "--max-total-tokens", "8192") as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
        [model] = client.models.list().data
        assert model.id == "SmolLM2-135M-Instruct"
        reply = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=32,
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        srv.wait_idle()
