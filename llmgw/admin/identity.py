"""Who is asking, decided once at the edge, and the one function that says what they may do.

An :class:`Identity` is set on every admin request by the authentication in front of it (the admin
token: an admin; a console session: the role read from the identity provider's groups at sign-in).
Every admin handler calls :func:`authorize` with its action and the object it acts on; nothing
else decides. Outside the role is 403; another team's object is 404, so its existence does not
leak (docs/teams.md, "Roles").
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable
from typing import Any

import attrs
from aiohttp import web

from llmgw.errors import Forbidden, NotFound

__all__ = [
    "IDENTITY",
    "Action",
    "Identity",
    "Target",
    "authorize",
    "identity_from_groups",
]


class Action(enum.Enum):
    KEY_CREATE = "key.create"
    KEY_LIST = "key.list"
    KEY_READ = "key.read"
    KEY_UPDATE = "key.update"
    KEY_REVOKE = "key.revoke"
    KEY_ROTATE = "key.rotate"
    TEAM_CREATE = "team.create"
    TEAM_LIST = "team.list"
    TEAM_READ = "team.read"
    TEAM_UPDATE = "team.update"
    TEAM_DELETE = "team.delete"
    USAGE_READ = "usage.read"
    AUDIT_READ = "audit.read"
    SUBJECT_READ = "subject.read"
    SUBJECT_UPDATE = "subject.update"
    OVERVIEW_READ = "overview.read"
    ROUTES_READ = "routes.read"
    SESSIONS_REVOKE = "sessions.revoke"
    CACHE_CLEAR = "cache.clear"


@attrs.frozen
class Identity:
    """A person or program acting on the admin API."""

    actor: str  # as the audit log names them: token:..., console:..., user:<email or sub>
    admin: bool = False
    admin_teams: frozenset[uuid.UUID] = frozenset()  # teams they are a team admin of
    member_teams: frozenset[uuid.UUID] = frozenset()  # teams they are a member of

    @property
    def has_role(self) -> bool:
        return self.admin or bool(self.admin_teams or self.member_teams)

    @property
    def teams(self) -> frozenset[uuid.UUID]:
        return self.admin_teams | self.member_teams

    def to_json(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "admin": self.admin,
            "admin_teams": sorted(str(team) for team in self.admin_teams),
            "member_teams": sorted(str(team) for team in self.member_teams),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Identity:
        return cls(
            actor=str(value["actor"]),
            admin=bool(value.get("admin")),
            admin_teams=frozenset(uuid.UUID(team) for team in value.get("admin_teams", ())),
            member_teams=frozenset(uuid.UUID(team) for team in value.get("member_teams", ())),
        )


IDENTITY = web.RequestKey("admin_identity", Identity)


@attrs.frozen
class Target:
    """What an action is on: a key (its team and owner) or a team; nothing for global actions."""

    team_id: uuid.UUID | None = None
    owner: str | None = None


_EVERY_TEAM_MEMBER = frozenset({Action.TEAM_LIST, Action.TEAM_READ, Action.USAGE_READ})
_TEAM_ADMIN = frozenset(
    {Action.KEY_CREATE, Action.KEY_LIST, Action.KEY_READ, Action.KEY_UPDATE, Action.KEY_REVOKE,
     Action.KEY_ROTATE, Action.AUDIT_READ} | _EVERY_TEAM_MEMBER
)  # fmt: skip
_MEMBER = frozenset(
    {Action.KEY_CREATE, Action.KEY_LIST, Action.KEY_READ, Action.KEY_REVOKE, Action.KEY_ROTATE}
    | _EVERY_TEAM_MEMBER
)
_ON_KEYS = frozenset(
    {Action.KEY_READ, Action.KEY_UPDATE, Action.KEY_REVOKE, Action.KEY_ROTATE, Action.KEY_CREATE}
)


def authorize(identity: Identity, action: Action, target: Target | None = None) -> None:
    """Return if ``identity`` may do ``action`` on ``target``; else raise 403 or 404.

    ``target``: the team-scoped object acted on (a key: its team and owner; a team: its id), or
    None for an action on no one object (listings, which the handler narrows to what the identity
    may see, and global actions). Another team's object, or another member's key, is 404.
    """
    if identity.admin:
        return
    if target is None:
        allowed = (_TEAM_ADMIN if identity.admin_teams else frozenset()) | (
            _MEMBER if identity.member_teams else frozenset()
        )
    elif target.team_id is None and action is Action.KEY_CREATE:
        raise Forbidden("Your role creates keys in a team of yours: name its team_id.")
    elif target.team_id in identity.admin_teams:
        allowed = _TEAM_ADMIN
    elif target.team_id in identity.member_teams:
        allowed = _MEMBER
        owned = action is Action.KEY_CREATE or target.owner == identity.actor
        if action in _ON_KEYS and not owned:
            raise NotFound("No such key.")
    else:
        raise NotFound("No such key." if action in _ON_KEYS else "No such team.")
    if action not in allowed:
        raise Forbidden(f"Your role does not allow {action.value}.")


def identity_from_groups(
    actor: str,
    groups: frozenset[str],
    admin_groups: Iterable[str],
    teams: Iterable[tuple[uuid.UUID, str | None, str | None]],
) -> Identity:
    """A person's identity from their groups: ``teams`` is each team's (id, oidc_group,
    oidc_admin_group)."""
    admin_teams, member_teams = set(), set()
    for team_id, member_group, admin_group in teams:
        if admin_group is not None and admin_group in groups:
            admin_teams.add(team_id)
        elif member_group is not None and member_group in groups:
            member_teams.add(team_id)
    return Identity(
        actor=actor,
        admin=bool(groups & set(admin_groups)),
        admin_teams=frozenset(admin_teams),
        member_teams=frozenset(member_teams),
    )
