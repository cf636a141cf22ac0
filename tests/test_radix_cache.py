"""kvcache prefix caches on their own: RadixCache (matching, inserting, splitting, page
alignment, locking, LRU eviction, the integrity check), NaivePrefixCache, and the registry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from minisgl.kvcache import (PREFIX_CACHES, BasePrefixCache, CacheHandle, NaivePrefixCache,
                             RadixCache, create_prefix_cache)
from minisgl.kvcache.radix_cache import RadixNode

CHAPTER = 9  # tools/steps.py check runs this module on chapter 9's own tree


def slots(start: int, n: int) -> torch.Tensor:
    """n consecutive KV slots from `start` (whole pages when start and n are page-aligned)."""
    return torch.arange(start, start + n, dtype=torch.int32)


def insert(cache: RadixCache, ids: list[int], start: int) -> tuple[int, CacheHandle]:
    return cache.insert_prefix(ids, slots(start, len(ids)))


def assert_sizes(cache: RadixCache, evictable: int, protected: int) -> None:
    """The cache holds `evictable` unlocked and `protected` locked tokens, and its integrity
    check passes."""
    assert (cache.evictable_size, cache.protected_size) == (evictable, protected)
    cache.check_integrity()


@contextmanager
def locked(cache: RadixCache, handle: CacheHandle) -> Iterator[None]:
    """cache.lock(handle) for the block, cache.unlock(handle) after it."""
    cache.lock(handle)
    yield
    cache.unlock(handle)


def leaves(cache: RadixCache) -> list[list[int]]:
    return sorted(n.key for n in cache._nodes() if n.is_leaf)


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def page_size(request) -> int:
    return request.param


# --- matching and inserting ---------------------------------------------------------------------

def test_match_on_an_empty_tree_finds_nothing(page_size):
    handle = RadixCache(page_size).match_prefix(list(range(12)))
    assert handle.cached_len == 0 and handle.slots.numel() == 0


def test_insert_then_match_returns_the_inserted_slots(page_size):
    cache = RadixCache(page_size)
    ids = list(range(100, 112))
    insert(cache, ids, start=40)
    handle = cache.match_prefix(ids)
    assert handle.cached_len == 12
    assert handle.slots.tolist() == list(range(40, 52))


def test_match_of_a_longer_sequence_stops_at_the_cached_part(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    handle = cache.match_prefix(list(range(8)) + [50, 51, 52, 53])
    assert handle.cached_len == 8 and handle.slots.tolist() == list(range(8))


def test_insert_of_a_new_sequence_reports_nothing_cached(page_size):
    cache = RadixCache(page_size)
    already, handle = insert(cache, list(range(8)), start=0)
    assert already == 0 and handle.cached_len == 8


def test_insert_reports_how_much_was_cached_already(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    already, handle = insert(cache, list(range(8)) + [60, 61, 62, 63], start=100)
    assert already == 8 and handle.cached_len == 12
    # the cached part keeps its first slots; only the new part takes the caller's
    assert handle.slots.tolist() == list(range(8)) + [108, 109, 110, 111]
    assert cache.evictable_size == 12


def test_insert_of_a_cached_sequence_adds_nothing(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    already, handle = insert(cache, list(range(8)), start=100)
    assert already == 8 and handle.slots.tolist() == list(range(8))
    assert cache.evictable_size == 8 and len(cache._nodes()) == 1


def test_match_ending_inside_an_edge_splits_it_at_a_node(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(12)), start=0)
    query = list(range(8)) + [90] * 4  # diverges after 8 tokens (two pages of 4)
    handle = cache.match_prefix(query)
    assert handle.cached_len == 8 and handle.slots.tolist() == list(range(8))
    node = handle.node
    assert isinstance(node, RadixNode)
    assert node.key == list(range(8)) and node.parent is cache.root
    assert [c.key for c in node.children.values()] == [list(range(8, 12))]
    assert cache.evictable_size == 12  # a split moves no tokens
    cache.check_integrity()


def test_match_ending_inside_a_deeper_edge_splits_it_there(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    insert(cache, list(range(16)), start=0)  # [8..16) hangs below [0..8)
    handle = cache.match_prefix(list(range(12)))  # the query ends halfway down [8..16)
    assert handle.cached_len == 12 and handle.slots.tolist() == list(range(12))
    assert leaves(cache) == [list(range(12, 16))]
    cache.check_integrity()


def test_inserting_a_diverging_sequence_branches_the_tree(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(12)), start=0)
    insert(cache, list(range(8)) + [90, 91, 92, 93], start=100)
    assert leaves(cache) == [[8, 9, 10, 11], [90, 91, 92, 93]]
    assert cache.match_prefix(list(range(8)) + [90, 91, 92, 93]).slots.tolist() == \
        list(range(8)) + [108, 109, 110, 111]
    assert cache.evictable_size == 16
    cache.check_integrity()


def test_keys_are_page_aligned_on_insert():
    cache = RadixCache(4)
    already, handle = insert(cache, list(range(7)), start=0)  # 7 tokens: one page of 4
    assert (already, handle.cached_len) == (0, 4) and handle.slots.tolist() == [0, 1, 2, 3]
    assert cache.evictable_size == 4
    assert cache.match_prefix(list(range(7))).cached_len == 4


def test_match_is_page_aligned():
    cache = RadixCache(4)
    insert(cache, list(range(8)), start=0)
    assert cache.match_prefix(list(range(7))).cached_len == 4  # not 7: the 2nd page is partial
    assert cache.match_prefix(list(range(6)) + [99, 98]).cached_len == 4
    assert cache.match_prefix(list(range(3))).cached_len == 0


def test_page_size_one_matches_token_by_token():
    cache = RadixCache(1)
    insert(cache, list(range(8)), start=0)
    assert cache.match_prefix(list(range(5)) + [99]).cached_len == 5
    assert cache.match_prefix([0, 99]).cached_len == 1  # an edge split after one token
    cache.check_integrity()


# --- locking ------------------------------------------------------------------------------------

def test_lock_moves_the_whole_path_from_evictable_to_protected(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    _, handle = insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)  # path of 2 nodes
    insert(cache, [70, 71, 72, 73], start=200)  # another branch, not on the path
    with locked(cache, handle):
        assert_sizes(cache, 4, 12)
    assert_sizes(cache, 16, 0)


def test_two_locks_need_two_unlocks(page_size):
    cache = RadixCache(page_size)
    _, handle = insert(cache, list(range(8)), start=0)
    with locked(cache, handle):
        with locked(cache, handle):
            cache.check_integrity()  # a child of the root may be locked more often than the root
        assert_sizes(cache, 0, 8)
    assert_sizes(cache, 8, 0)


def test_locking_a_child_protects_the_shared_parent_only_once(page_size):
    cache = RadixCache(page_size)
    _, a = insert(cache, list(range(8)) + [50, 51, 52, 53], start=0)
    _, b = insert(cache, list(range(8)) + [60, 61, 62, 63], start=100)
    cache.lock(a)
    cache.lock(b)
    assert_sizes(cache, 0, 16)
    cache.unlock(a)
    assert_sizes(cache, 4, 12)


def test_a_locked_handle_stays_valid_after_its_edge_is_split(page_size):
    cache = RadixCache(page_size)
    _, handle = insert(cache, list(range(12)), start=0)
    with locked(cache, handle):
        cache.match_prefix(list(range(4)) + [99] * 8)  # splits the locked edge after one page
        assert_sizes(cache, 0, 12)
    assert_sizes(cache, 12, 0)


def test_an_empty_handle_locks_nothing(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    with locked(cache, cache.match_prefix([99] * 8)):
        assert_sizes(cache, 8, 0)
    cache.check_integrity()


# --- eviction -----------------------------------------------------------------------------------

def test_evict_frees_the_least_recently_used_leaf_first(page_size):
    cache = RadixCache(page_size)
    insert(cache, [10, 11, 12, 13], start=0)
    insert(cache, [20, 21, 22, 23], start=4)
    insert(cache, [30, 31, 32, 33], start=8)
    cache.match_prefix([10, 11, 12, 13])  # touch the oldest: [20..] is now least recent
    freed = cache.evict(4)
    assert freed.tolist() == [4, 5, 6, 7]
    assert leaves(cache) == [[10, 11, 12, 13], [30, 31, 32, 33]]
    assert cache.evictable_size == 8
    cache.check_integrity()


def test_evict_may_free_more_than_asked_but_whole_nodes():
    cache = RadixCache(4)
    insert(cache, list(range(8)), start=0)
    freed = cache.evict(4)
    assert freed.tolist() == list(range(8)) and cache.evictable_size == 0


def test_evict_frees_at_least_what_is_asked_across_leaves(page_size):
    cache = RadixCache(page_size)
    insert(cache, [10, 11, 12, 13], start=0)
    insert(cache, [20, 21, 22, 23], start=4)
    assert cache.evict(5).tolist() == list(range(8)) and cache.evictable_size == 0


def test_evict_never_takes_a_locked_node(page_size):
    cache = RadixCache(page_size)
    _, old = insert(cache, [10, 11, 12, 13], start=0)  # least recent, but locked
    insert(cache, [20, 21, 22, 23], start=4)
    cache.lock(old)
    freed = cache.evict(4)
    assert freed.tolist() == [4, 5, 6, 7]
    assert cache.match_prefix([10, 11, 12, 13]).cached_len == 4
    assert_sizes(cache, 0, 4)


def test_evicting_a_leaf_makes_its_parent_evictable(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)  # child of the 8-token node
    freed = cache.evict(12)
    assert sorted(freed.tolist()) == list(range(8)) + [108, 109, 110, 111]
    assert cache.root.children == {} and cache.evictable_size == 0
    cache.check_integrity()


def test_evict_takes_leaves_before_their_parent(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)
    cache.match_prefix(list(range(8)))  # the parent is more recent than its child anyway
    freed = cache.evict(4)
    assert freed.tolist() == [108, 109, 110, 111]
    assert cache.match_prefix(list(range(8))).cached_len == 8


def test_a_parent_with_a_locked_child_is_not_evicted(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    _, child = insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)
    insert(cache, [70, 71, 72, 73], start=200)
    cache.lock(child)
    assert cache.evictable_size == 4
    assert cache.evict(4).tolist() == [200, 201, 202, 203]
    with pytest.raises(RuntimeError):
        cache.evict(4)


def test_a_parent_that_keeps_a_child_is_not_evicted(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)) + [50, 51, 52, 53], start=0)
    insert(cache, list(range(8)) + [60, 61, 62, 63], start=100)  # splits off parent [0..8)
    # [50..53] is the oldest and goes first; [0..8) is older than [60..63] but not yet a leaf
    assert cache.evict(8).tolist() == [8, 9, 10, 11, 108, 109, 110, 111]
    assert leaves(cache) == [list(range(8))] and cache.evictable_size == 8
    cache.check_integrity()


def test_a_parent_left_a_leaf_is_evicted_by_its_own_last_access(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)) + [50, 51, 52, 53], start=0)
    insert(cache, list(range(8)) + [60, 61, 62, 63], start=100)  # splits off parent [0..8)
    insert(cache, [70, 71, 72, 73], start=200)  # the most recent leaf
    # Its children go first; then [0..8), a leaf now, is older than [70..73] and goes before it.
    assert cache.evict(16).tolist() == [8, 9, 10, 11, 108, 109, 110, 111] + list(range(8))
    assert leaves(cache) == [[70, 71, 72, 73]] and cache.evictable_size == 4
    cache.check_integrity()


def test_a_locked_parent_left_a_leaf_by_eviction_is_not_evicted(page_size):
    cache = RadixCache(page_size)
    _, held = insert(cache, list(range(8)), start=0)  # a running request holds [0..8)
    insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)  # its unlocked child
    insert(cache, [70, 71, 72, 73], start=200)  # the most recent leaf
    cache.lock(held)
    assert_sizes(cache, 8, 8)
    # The child goes first and leaves [0..8) a leaf older than [70..73], but a locked one.
    assert cache.evict(8).tolist() == [108, 109, 110, 111, 200, 201, 202, 203]
    assert_sizes(cache, 0, 8)
    assert cache.match_prefix(list(range(8))).slots.tolist() == list(range(8))
    with pytest.raises(RuntimeError, match="cannot evict 4 tokens: only 0"):
        cache.evict(4)
    assert_sizes(cache, 0, 8)


def test_evict_raises_when_asked_more_than_evictable(page_size):
    cache = RadixCache(page_size)
    _, locked = insert(cache, [10, 11, 12, 13], start=0)
    insert(cache, [20, 21, 22, 23], start=4)
    cache.lock(locked)
    with pytest.raises(RuntimeError, match="5"):
        cache.evict(5)
    assert_sizes(cache, 4, 4)  # nothing was taken


def test_evict_zero_frees_nothing(page_size):
    cache = RadixCache(page_size)
    insert(cache, [10, 11, 12, 13], start=0)
    assert cache.evict(0).numel() == 0 and cache.evictable_size == 4


# --- integrity check ----------------------------------------------------------------------------

def test_check_integrity_passes_on_a_consistent_tree(page_size):
    cache = RadixCache(page_size)
    _, a = insert(cache, list(range(12)), start=0)
    insert(cache, list(range(4)) + [80, 81, 82, 83], start=100)
    cache.lock(a)
    cache.check_integrity()  # does not raise


def test_check_integrity_catches_a_wrong_evictable_counter(page_size):
    cache = RadixCache(page_size)
    insert(cache, list(range(8)), start=0)
    cache.evictable_size += page_size
    with pytest.raises(AssertionError, match="sizes"):
        cache.check_integrity()


def test_check_integrity_catches_a_wrong_protected_counter(page_size):
    cache = RadixCache(page_size)
    _, handle = insert(cache, list(range(8)), start=0)
    cache.lock(handle)
    cache.protected_size -= page_size
    with pytest.raises(AssertionError, match="sizes"):
        cache.check_integrity()


def test_check_integrity_catches_a_child_locked_more_than_its_parent():
    cache = RadixCache(4)
    insert(cache, list(range(8)), start=0)
    _, child = insert(cache, list(range(8)) + [50, 51, 52, 53], start=100)
    child.node.ref_count = 1  # locked behind the parent's back
    cache.evictable_size -= 4
    cache.protected_size += 4
    with pytest.raises(AssertionError, match="locked more often"):
        cache.check_integrity()


def test_check_integrity_catches_a_node_filed_under_another_page():
    cache = RadixCache(4)
    _, handle = insert(cache, list(range(8)), start=0)
    handle.node.key = [99] + handle.node.key[1:]
    with pytest.raises(AssertionError, match="not filed under its first page"):
        cache.check_integrity()


@pytest.mark.parametrize("key,num_slots,ref_count,message", [
    ([], 0, 0, "0 tokens, 0 slots"),
    ([0, 1, 2, 3, 4, 5], 6, 0, "6 tokens, 6 slots, page_size 4"),  # not whole pages
    (list(range(8)), 4, 0, "8 tokens, 4 slots"),
    (list(range(8)), 8, -1, "ref_count -1"),
], ids=["empty", "unaligned", "slots", "negative-ref"])
def test_check_integrity_catches_a_malformed_node(key, num_slots, ref_count, message):
    cache = RadixCache(4)
    _, handle = insert(cache, list(range(8)), start=0)
    node = handle.node
    node.key, node.slots, node.ref_count = key, slots(0, num_slots), ref_count
    cache.root.children = {tuple(key[:4]): node}  # filed under its first page
    with pytest.raises(AssertionError, match=message):
        cache.check_integrity()


# --- the naive cache ----------------------------------------------------------------------------

def test_naive_cache_never_matches():
    cache = NaivePrefixCache(4)
    cache.insert_prefix(list(range(8)), slots(0, 8))
    handle = cache.match_prefix(list(range(8)))
    assert handle.cached_len == 0 and handle.slots.numel() == 0


def test_naive_cache_insert_reports_nothing_cached_and_keeps_nothing():
    cache = NaivePrefixCache(4)
    already, handle = cache.insert_prefix(list(range(8)), slots(0, 8))
    assert already == 0 and handle.cached_len == 0
    assert (cache.evictable_size, cache.protected_size) == (0, 0)


def test_naive_cache_evict_zero_is_fine_and_more_raises():
    cache = NaivePrefixCache(4)
    assert cache.evict(0).numel() == 0
    with pytest.raises(RuntimeError, match="1"):
        cache.evict(1)


def test_naive_cache_does_not_share_prefixes_and_radix_does():
    assert NaivePrefixCache.shares_prefixes is False and RadixCache.shares_prefixes is True


# --- registry -----------------------------------------------------------------------------------

def test_prefix_cache_registry_names():
    assert PREFIX_CACHES.names() == ["naive", "radix"]
    assert PREFIX_CACHES.get("radix") is RadixCache
    assert PREFIX_CACHES.get("naive") is NaivePrefixCache


@pytest.mark.parametrize("name,kind", [("radix", RadixCache), ("naive", NaivePrefixCache)])
def test_create_prefix_cache_builds_the_named_cache_with_its_page_size(name, kind):
    cache = create_prefix_cache(name, 16)
    assert type(cache) is kind and isinstance(cache, BasePrefixCache) and cache.page_size == 16


def test_create_prefix_cache_rejects_an_unknown_name_listing_known_ones():
    with pytest.raises(ValueError, match="unknown prefix cache 'lru'.*naive, radix"):
        create_prefix_cache("lru", 1)
