"""第 9 章示例：直接操作一棵 RadixCache：插入、匹配（会切分边）、加锁、按最久未用淘汰。"""

import torch

from minisgl.kvcache import RadixCache

cache = RadixCache(page_size=2)


def show(title: str) -> None:
    print(f"{title}：可淘汰 {cache.evictable_size} 个 token，被锁 {cache.protected_size} 个")
    stack = [(child, 1) for child in cache.root.children.values()]
    while stack:
        node, depth = stack.pop()
        print("   " * depth + f"{node.key} → slots {node.slots.tolist()} ref={node.ref_count}")
        stack += [(child, depth + 1) for child in node.children.values()]


cache.insert_prefix([1, 2, 3, 4, 5, 6], torch.arange(10, 16, dtype=torch.int32))
show("插入 [1..6]")
already, handle = cache.insert_prefix([1, 2, 3, 4, 9, 9, 7], torch.arange(20, 27, dtype=torch.int32))
print(f"插入 [1,2,3,4,9,9,7]：前 {already} 个已在树里，只收整页，handle 长度 {handle.cached_len}")
show("边 [1..6] 在第 4 个 token 处被切开")
match = cache.match_prefix([1, 2, 3, 4, 5, 6, 8])
print(f"匹配 [1,2,3,4,5,6,8]：命中 {match.cached_len} 个，slots {match.slots.tolist()}")
cache.lock(match)
show("锁住这个前缀")
print("淘汰 2 个 token，拿回 slots", cache.evict(2).tolist())
show("淘汰后")
cache.check_integrity()
