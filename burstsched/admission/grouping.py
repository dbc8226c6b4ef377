"""Grouping: requests sharing enough leading prefix blocks form one group (a pure function).

Block hashes are chained (each hash covers every block before it), so two chains share ``n`` leading blocks
exactly when their first ``n`` hashes are equal, and "shares at least ``m`` leading blocks" is an equivalence:
if A shares ``m`` blocks with B and B with C, A shares them with C. The groups are therefore the requests with
equal first ``min_shared_blocks`` hashes (the subtrees of a trie over the chains at that depth). Within a
group a trie over the chains gives its prefix (the longest chain all members share) and the member order
(larger sub-branches first), so when a hot group has to spill, the members that share the longest prefixes
stay next to each other.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

BlockChain = Sequence[Hashable]


@dataclass(frozen=True, slots=True)
class Group:
    """Requests placed together. ``prefix`` is the chain every member starts with (a lone request's own)."""

    members: tuple[str, ...]
    prefix: tuple[Hashable, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def shared_blocks(self) -> int:
        return len(self.prefix)


@dataclass(slots=True)
class _Node:
    count: int = 0
    first_id: str = ""
    ends: list[str] = field(default_factory=list)
    children: dict[Hashable, _Node] = field(default_factory=dict)


def group_requests(requests: Iterable[tuple[str, BlockChain]], min_shared_blocks: int) -> list[Group]:
    """Group requests sharing at least ``min_shared_blocks`` leading blocks, in placement order.

    Placement order: groups of two or more first, longest shared prefix first, then larger, then by smallest
    request id; then lone requests, longest chain first. The result depends only on the set of requests, not
    on their order. Request ids must be unique.
    """
    if min_shared_blocks < 1:
        raise ValueError("min_shared_blocks must be at least 1")
    seen: set[str] = set()
    buckets: dict[tuple[Hashable, ...], list[tuple[str, BlockChain]]] = {}
    groups: list[Group] = []
    for request_id, chain in requests:
        if request_id in seen:
            raise ValueError(f"duplicate request id {request_id!r}")
        seen.add(request_id)
        if len(chain) < min_shared_blocks:
            groups.append(Group(members=(request_id,), prefix=tuple(chain)))
        else:
            buckets.setdefault(tuple(chain[:min_shared_blocks]), []).append((request_id, chain))
    for head, members in buckets.items():
        if len(members) == 1:
            ((request_id, chain),) = members
            groups.append(Group(members=(request_id,), prefix=tuple(chain)))
        else:
            groups.append(_group_of(head, members))
    groups.sort(key=_placement_key)
    return groups


def shared_blocks(a: BlockChain, b: BlockChain) -> int:
    """How many leading blocks two chains share: hashes are chained, so equal hashes at block ``i`` mean
    equal blocks up to ``i``, and a binary search finds the longest shared run."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return low


def _group_of(head: tuple[Hashable, ...], members: list[tuple[str, BlockChain]]) -> Group:
    """One group from requests sharing ``head``: a trie over the rest of their chains gives the longest
    shared prefix and the member order."""
    root = _Node()
    for request_id, chain in members:
        node = root
        _count(node, request_id)
        for block in chain[len(head) :]:
            node = node.children.setdefault(block, _Node())
            _count(node, request_id)
        node.ends.append(request_id)
    prefix = list(head)
    node = root
    while not node.ends and len(node.children) == 1:
        ((block, node),) = node.children.items()
        prefix.append(block)
    return Group(members=tuple(_members(node)), prefix=tuple(prefix))


def _count(node: _Node, request_id: str) -> None:
    node.count += 1
    if node.count == 1 or request_id < node.first_id:
        node.first_id = request_id


def _ordered_children(node: _Node) -> list[tuple[Hashable, _Node]]:
    return sorted(node.children.items(), key=lambda item: (-item[1].count, item[1].first_id))


def _members(node: _Node) -> list[str]:
    """Request ids under ``node`` depth first: those ending at a node, then its larger branches first."""
    out = sorted(node.ends)
    stack = [child for _, child in reversed(_ordered_children(node))]
    while stack:
        current = stack.pop()
        out.extend(sorted(current.ends))
        stack.extend(child for _, child in reversed(_ordered_children(current)))
    return out


def _placement_key(group: Group) -> tuple[bool, int, int, str]:
    return (group.size == 1, -group.shared_blocks, -group.size, min(group.members))
