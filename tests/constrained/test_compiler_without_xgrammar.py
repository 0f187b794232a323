"""The grammar compiler is built without xgrammar (the H200 image has none); a constraint
it is asked to compile fails with a GrammarError that names the missing package."""

from __future__ import annotations

import pytest
from tiny_model import make_tokenizer
from xgrammar_hidden import hide_xgrammar

from sluice.runtime.constrained import GrammarCompiler, GrammarError
from sluice.runtime.ipc.messages import Constraint


def test_the_grammar_compiler_is_built_without_xgrammar_and_refuses_naming_it(monkeypatch):
    hide_xgrammar(monkeypatch)
    compiler = GrammarCompiler(make_tokenizer(), 512, [2])
    try:
        future = compiler.compile_async(Constraint("regex", "[ab]+"))
        with pytest.raises(GrammarError, match="'xgrammar', which is not installed"):
            future.result(timeout=30)
    finally:
        compiler.close()
