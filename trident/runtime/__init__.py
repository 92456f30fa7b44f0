"""The host runtime: contexts, the symmetric allocator, rendezvous and launch."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # checked by mypy only (here, where importing them all makes no cycle)
    from .context import Context
    from .groups import Group
    from .nodes import NodeTeam
    from .team import Team

    def _every_team_is_a_team(ctx: Context, group: Group, node: NodeTeam) -> tuple[Team, Team, Team]:
        """The three kinds of team satisfy :class:`~trident.runtime.team.Team`."""
        return ctx, group, node
