"""Which replica serves a session: stick to the one holding its KV prefix, spill over when it is overloaded.

A session is one client's one document. Its first request places it on the healthy replica with
the fewest outstanding requests (ties: fewest sessions, then name), so sessions spread out before
any queue forms. Later requests go to the same replica, where the KV cache already holds the
document's prefix and the n-gram corpus holds the client's files, unless that replica is unhealthy
or overloaded; then the session moves, like a new one, and pays one cold prefill there.

Worked example (overload_at=4): replicas a (0 outstanding, 1 session) and b (0, 0). A new session
goes to b (fewer sessions). A session on a stays on a while a has 0..3 outstanding; at 4 it moves
to b if b has fewer than 4; if every replica has 4 or more it stays (moving would only add a prefill).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

# A session leaves its replica when 4 requests are already outstanding there. A move costs one cold
# prefill and the n-gram corpus; staying costs a whole completion per request queued ahead, and since
# a client's newer request supersedes its older one per document, 4 outstanding is about 4 editors
# waiting. On a GPU a cold prefill of a few thousand tokens is cheap next to that wait; on CPU in
# exact mode it is not (README: 3,058 tokens in 54 s), so CPU deployments should raise --overload-at.
# Chosen by that reasoning, not tuned.
OVERLOAD_AT = 4


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    healthy: bool
    outstanding: int  # requests sent to the replica and not yet answered
    sessions: int  # sessions placed on it


def choose_replica(
    current: str | None, loads: Mapping[str, ReplicaLoad], overload_at: int = OVERLOAD_AT
) -> str | None:
    """The replica for a session now on `current` (None: not placed yet); None when none is healthy."""
    healthy = {name: load for name, load in loads.items() if load.healthy}
    if not healthy:
        return None
    least = min(healthy, key=lambda name: (healthy[name].outstanding, healthy[name].sessions, name))
    if current not in healthy:
        return least
    if healthy[current].outstanding < overload_at or healthy[least].outstanding >= overload_at:
        return current
    return least


@dataclass(frozen=True, slots=True)
class MembershipChange:
    added: list[str]
    removed: list[str]
    moved: list[Hashable]  # sessions that were on a removed replica: placed again on their next request


class SessionTable:
    """Session -> replica assignments, with the loads the routing reads. Not thread-safe (event loop).

    The members are the replicas Ray Serve runs now (they change as it scales or replaces one); a
    member is healthy unless a call to it failed and it has not answered since. A removed replica's
    outstanding requests are still counted until they end (Serve lets them finish before it stops it).
    """

    def __init__(self, replicas: Iterable[str] = (), overload_at: int = OVERLOAD_AT) -> None:
        self.overload_at = overload_at
        self.assigned: dict[Hashable, str] = {}
        self.healthy: dict[str, bool] = {}  # member -> routable
        self.outstanding: dict[str, int] = {}  # members, and removed replicas still finishing requests
        self.set_members(replicas)

    @property
    def members(self) -> list[str]:
        return list(self.healthy)

    def set_members(self, replicas: Iterable[str]) -> MembershipChange:
        """Serve's replica set changed: new members take sessions at once, removed ones lose theirs."""
        current = set(replicas)
        added = sorted(current - set(self.healthy))
        removed = sorted(set(self.healthy) - current)
        moved: list[Hashable] = []
        for replica in removed:
            moved += self._unassign(replica)
            del self.healthy[replica]
            if self.outstanding.get(replica) == 0:
                del self.outstanding[replica]
        for replica in added:
            self.healthy[replica] = True
            self.outstanding.setdefault(replica, 0)
        return MembershipChange(added, removed, moved)

    def sessions_on(self, replica: str) -> int:
        return sum(1 for placed in self.assigned.values() if placed == replica)

    def loads(self) -> dict[str, ReplicaLoad]:
        sessions = dict.fromkeys(self.healthy, 0)
        for replica in self.assigned.values():
            sessions[replica] += 1
        return {
            name: ReplicaLoad(self.healthy[name], self.outstanding[name], sessions[name])
            for name in self.healthy
        }

    def route(self, session: Hashable) -> str | None:
        """Place (or keep) the session; returns its replica, or None when no replica is healthy."""
        chosen = choose_replica(self.assigned.get(session), self.loads(), self.overload_at)
        if chosen is None:
            self.assigned.pop(session, None)
        else:
            self.assigned[session] = chosen
        return chosen

    def begin(self, replica: str) -> None:
        """A request was sent to the replica."""
        self.outstanding[replica] += 1

    def end(self, replica: str) -> None:
        """A request on the replica ended (answered, failed or cancelled)."""
        self.outstanding[replica] -= 1
        if replica not in self.healthy and self.outstanding[replica] == 0:
            del self.outstanding[replica]

    def forget(self, session: Hashable) -> None:
        self.assigned.pop(session, None)

    def mark_down(self, replica: str) -> list[Hashable]:
        """The replica failed: its sessions lose their place (they move on their next request)."""
        if replica in self.healthy:
            self.healthy[replica] = False
        return self._unassign(replica)

    def mark_up(self, replica: str) -> None:
        if replica in self.healthy:  # not when Serve removed it meanwhile
            self.healthy[replica] = True

    def _unassign(self, replica: str) -> list[Hashable]:
        moved = [session for session, placed in self.assigned.items() if placed == replica]
        for session in moved:
            del self.assigned[session]
        return moved
