"""Without xgrammar a constrained request is a 400 naming the package; others are served."""

from __future__ import annotations

from http_fakes import MODEL
from xgrammar_hidden import hide_xgrammar

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def test_a_constrained_request_is_a_400_naming_xgrammar(client, tm, monkeypatch):
    hide_xgrammar(monkeypatch)
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": SCHEMA})
    assert r.status_code == 400
    assert "'xgrammar', which is not installed" in r.json()["error"]["message"]
    assert tm.requests == []
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
