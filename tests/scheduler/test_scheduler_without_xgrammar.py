"""A scheduler starts and serves without xgrammar; a constrained request that reaches it
anyway (the API refuses them first) ends with an abort naming the package."""

from __future__ import annotations

from xgrammar_hidden import hide_xgrammar

from sluice.runtime.ipc.messages import Constraint


def test_a_scheduler_without_xgrammar_serves_and_aborts_constrained_requests(make_harness, monkeypatch):
    hide_xgrammar(monkeypatch)
    h = make_harness()
    h.submit("plain", [5, 6, 7], max_new_tokens=3)
    h.submit("json", [5, 6, 7], max_new_tokens=3, constraint=Constraint("regex", "[ab]+"))
    h.run_until_idle()
    assert len(h.outputs["plain"]) == 3
    assert h.finished["plain"].kind == "length"
    assert h.finished["json"].kind == "abort"
    assert "xgrammar" in h.finished["json"].message
