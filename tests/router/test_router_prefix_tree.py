"""The approximate prefix tree against a brute-force oracle: the longest common prefix with
any key inserted (and not evicted), and LRU eviction under the size bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.runtime.router.prefix_tree import LOW_WATER, PrefixTree


def common(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


keys = st.text(alphabet="abc", max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(keys, max_size=30), st.lists(keys, max_size=10))
def test_match_is_the_longest_common_prefix_with_any_inserted_key(inserted, queries):
    tree = PrefixTree(max_size=10_000)
    for k in inserted:
        tree.insert(k)
        tree.check_integrity()
    for q in queries:
        assert tree.match(q) == max((common(q, k) for k in inserted), default=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(keys, max_size=30))
def test_size_counts_each_shared_character_once(inserted):
    tree = PrefixTree(max_size=10_000)
    for k in inserted:
        tree.insert(k)
    # the characters of a trie of the keys: distinct non-empty prefixes
    assert tree.size == len({k[:i] for k in inserted for i in range(1, len(k) + 1)})


def test_token_id_keys_work_like_characters():
    tree = PrefixTree(100)
    tree.insert((5, 6, 7, 8))
    tree.insert("5678")
    assert tree.match((5, 6, 9)) == 2
    assert tree.match("56") == 2
    assert tree.match((9,)) == 0


def test_beyond_the_bound_the_least_recently_used_leaves_go_first():
    tree = PrefixTree(max_size=30)
    tree.insert("a" * 10)  # oldest
    tree.insert("b" * 10)
    tree.insert("c" * 10)
    assert tree.size == 30
    tree.match("aaaa")  # a is now the most recently used
    tree.insert("d" * 10)  # 40 > 30: evict down to 90% of the bound (27): b, then c go
    tree.check_integrity()
    assert tree.size <= 30 * LOW_WATER
    assert tree.match("aaaaaaaaaa") == 10 and tree.match("dddddddddd") == 10
    assert tree.match("bbbb") == 0 and tree.match("cccc") == 0


def test_eviction_removes_a_shared_branch_only_when_its_leaves_are_gone():
    tree = PrefixTree(max_size=1000)
    tree.insert("system prompt: user one")
    tree.insert("system prompt: user two")
    tree.match("system prompt: user two")  # "one" is older
    tree.evict(3)
    tree.check_integrity()
    assert tree.match("system prompt: user one") == len("system prompt: user ")
    assert tree.match("system prompt: user two") == len("system prompt: user two")


def test_clear_empties_the_tree():
    tree = PrefixTree(100)
    tree.insert("hello")
    tree.clear()
    assert tree.size == 0 and tree.match("hello") == 0
