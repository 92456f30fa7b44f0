"""What a collective or fused op runs over: the :class:`Team` protocol.

A team is the whole world (a :class:`~trident.runtime.context.Context`), a group of it
(:class:`~trident.runtime.groups.Group`) or a node's ranks (:class:`~trident.runtime.nodes.NodeTeam`).
The collectives, the call pipeline and the fused ops ask only what this protocol lists, in the
team's own terms (``rank`` is the place in the team, ``heap_bases`` the members' bases in team order).
It is a type, nothing at run time: ``trident.runtime.groups.team(ctx, group)`` picks the team;
mypy checks that all three satisfy it (``trident/runtime/__init__.py``).

Example::

    def my_collective(team: Team, x: torch.Tensor) -> None:
        ws = team.resource("my.workspace", lambda: team.zeros(team.world_size, dtype=torch.int64))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from ..calls.cache import CallCache
    from ..platform import Platform

T = TypeVar("T")


class Team(Protocol):
    """The questions a collective or fused op asks the ranks it runs over (read-only attributes)."""

    @property
    def rank(self) -> int: ...

    def who(self) -> str: ...

    @property
    def world_size(self) -> int: ...

    @property
    def heap_bases(self) -> torch.Tensor: ...

    @property
    def heap_bases_host(self) -> tuple[int, ...]: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def platform(self) -> Platform: ...

    @property
    def debug(self) -> bool: ...

    @property
    def spans_nodes(self) -> bool: ...

    @property
    def call_cache(self) -> CallCache: ...

    @property
    def heap_range(self) -> tuple[int, int]: ...

    @property
    def group_name(self) -> str: ...

    def resource(self, key: str, factory: Callable[[], T]) -> T: ...

    def is_symmetric(self, tensor: torch.Tensor) -> bool: ...

    def heap_offset(self, tensor: torch.Tensor) -> int: ...

    def empty(self, numel: int, *, dtype: torch.dtype = ...) -> torch.Tensor: ...

    def zeros(self, numel: int, *, dtype: torch.dtype = ...) -> torch.Tensor: ...

    def free(self, *tensors: torch.Tensor) -> None: ...

    def barrier(self) -> None: ...

    def device_barrier(self) -> None: ...

    def agree_in_debug(self, what: str, /, *facts: object) -> None: ...

    def all_gather_object(self, what: str, value: object) -> list: ...

