from __future__ import annotations

import heapq
import itertools

import torch

from .prefix_cache import BasePrefixCache, CacheHandle


class RadixNode:
    """An edge of the radix tree with the node it leads to: a run of tokens (whole pages) and
    the KV slots holding them. Children are keyed by their first page of tokens."""

    def __init__(self, key: list[int], slots: torch.Tensor, parent: RadixNode | None) -> None:
        self.key, self.slots, self.parent = key, slots, parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref_count = 0  # running requests whose prefix passes through this node
        self.last_access = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache(BasePrefixCache):
    """Prefixes of token sequences in a radix tree (SGLang's RadixAttention). A match that ends
    inside an edge splits it, so every handle ends at a node; locking bumps ref_count up to the
    root, and only unlocked leaves are evicted, least recently used first."""

    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self.root = RadixNode([], torch.empty(0, dtype=torch.int32), None)
        self.root.ref_count = 1  # the root is never evicted
        self._clock = itertools.count(1)

    # -- lookups -------------------------------------------------------------------------------

    def _page_key(self, token_ids: list[int], start: int) -> tuple[int, ...]:
        return tuple(token_ids[start : start + self.page_size])

    def _walk(self, token_ids: list[int]) -> tuple[RadixNode, int, list[torch.Tensor]]:
        """Follow token_ids down the tree over whole pages: the deepest node reached, how many
        tokens matched, and the slots along the way."""
        node, matched, slots = self.root, 0, []
        tick = next(self._clock)
        while matched + self.page_size <= len(token_ids):
            child = node.children.get(self._page_key(token_ids, matched))
            if child is None:
                break
            common = self._common_pages(child.key, token_ids, matched)
            ends_inside = common < len(child.key)
            if ends_inside:  # keep handles on node boundaries: cut the edge where we stop
                child = self._split(child, common)
            child.last_access = tick
            slots.append(child.slots)
            node, matched = child, matched + common
            if ends_inside:
                break
        return node, matched, slots

    def _common_pages(self, key: list[int], token_ids: list[int], start: int) -> int:
        """Length of the common prefix of key and token_ids[start:], rounded down to pages."""
        n = 0
        limit = min(len(key), len(token_ids) - start)
        while n < limit and key[n] == token_ids[start + n]:
            n += 1
        return n - n % self.page_size

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut node's edge after `at` tokens; returns the new upper node."""
        assert node.parent is not None and 0 < at < len(node.key)
        upper = RadixNode(node.key[:at], node.slots[:at], node.parent)
        upper.ref_count, upper.last_access = node.ref_count, node.last_access
        node.parent.children[self._page_key(upper.key, 0)] = upper
        node.key, node.slots, node.parent = node.key[at:], node.slots[at:], upper
        upper.children[self._page_key(node.key, 0)] = node
        return upper

    def _handle(self, node: RadixNode, matched: int, slots: list[torch.Tensor]) -> CacheHandle:
        flat = torch.cat(slots) if slots else self.root.slots
        return CacheHandle(matched, flat, node)

    def match_prefix(self, token_ids: list[int]) -> CacheHandle:
        return self._handle(*self._walk(token_ids))

    def insert_prefix(self, token_ids: list[int], slots: torch.Tensor) -> tuple[int, CacheHandle]:
        length = len(token_ids) - len(token_ids) % self.page_size
        node, matched, path_slots = self._walk(token_ids[:length])
        if matched < length:  # the rest is new: hang it below the deepest match
            leaf = RadixNode(token_ids[matched:length], slots[matched:length].clone(), node)
            leaf.last_access = next(self._clock)
            node.children[self._page_key(leaf.key, 0)] = leaf
            self.evictable_size += len(leaf.key)
            node, path_slots = leaf, [*path_slots, leaf.slots]
        return matched, self._handle(node, length, path_slots)

    # -- locking and eviction ------------------------------------------------------------------

    def _path(self, handle: CacheHandle) -> list[RadixNode]:
        node, path = handle.node, []
        while isinstance(node, RadixNode) and node is not self.root:
            path.append(node)
            node = node.parent
        return path

    def lock(self, handle: CacheHandle) -> None:
        for node in self._path(handle):
            if node.ref_count == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.ref_count += 1

    def unlock(self, handle: CacheHandle) -> None:
        for node in self._path(handle):
            node.ref_count -= 1
            if node.ref_count == 0:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens > self.evictable_size:
            raise RuntimeError(f"cannot evict {num_tokens} tokens: only "
                               f"{self.evictable_size} are unlocked")
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if n.is_leaf
                  and n.ref_count == 0]
        heapq.heapify(leaves)
        freed: list[torch.Tensor] = []
        evicted = 0
        while evicted < num_tokens:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._page_key(leaf.key, 0)]
            freed.append(leaf.slots)
            evicted += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and parent.is_leaf and parent.ref_count == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return torch.cat(freed) if freed else self.root.slots

    def _nodes(self) -> list[RadixNode]:
        nodes, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            assert node.parent is not None
            key = self._page_key(node.key, 0)
            if node.parent.children.get(key) is not node:
                raise AssertionError(f"node {key} is not filed under its first page")
            if not node.key or len(node.key) % self.page_size or len(node.key) != len(node.slots):
                raise AssertionError(f"node {key}: {len(node.key)} tokens, {len(node.slots)} "
                                     f"slots, page_size {self.page_size}")
            if node.ref_count < 0:
                raise AssertionError(f"node {key}: ref_count {node.ref_count}")
            if node.parent is not self.root and node.ref_count > node.parent.ref_count:
                raise AssertionError(f"node {key} is locked more often than its parent")
            if node.ref_count:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise AssertionError(f"sizes: counted {evictable}/{protected}, "
                                 f"tracked {self.evictable_size}/{self.protected_size}")
