"""Routing sessions to replicas: affinity, spreading, overload spill-over, failures; the document mirror."""

from __future__ import annotations

from serving.front import DocumentMirror, client_of
from serving.routing import ReplicaLoad, SessionTable, choose_replica


def loads(**spec: tuple[int, int]) -> dict[str, ReplicaLoad]:
    """name=(outstanding, sessions); every replica healthy."""
    return {name: ReplicaLoad(True, outstanding, sessions) for name, (outstanding, sessions) in spec.items()}


def test_a_new_session_goes_to_the_least_loaded_replica():
    assert choose_replica(None, loads(a=(2, 0), b=(1, 5))) == "b"  # fewer outstanding wins
    assert choose_replica(None, loads(a=(0, 1), b=(0, 0))) == "b"  # then fewer sessions
    assert choose_replica(None, loads(a=(0, 0), b=(0, 0))) == "a"  # then the name: deterministic


def test_a_session_stays_on_its_replica_below_the_threshold():
    # a is busier than b, but a holds the session's KV prefix: 3 outstanding is below overload_at=4
    assert choose_replica("a", loads(a=(3, 4), b=(0, 0)), overload_at=4) == "a"


def test_an_overloaded_replica_moves_its_sessions_to_a_replica_that_is_not():
    assert choose_replica("a", loads(a=(4, 4), b=(1, 1)), overload_at=4) == "b"


def test_when_every_replica_is_overloaded_the_session_stays():
    assert choose_replica("a", loads(a=(6, 2), b=(4, 2)), overload_at=4) == "a"


def test_unhealthy_replicas_are_skipped_and_none_when_all_are_down():
    down = {"a": ReplicaLoad(False, 0, 3), "b": ReplicaLoad(True, 2, 0)}
    assert choose_replica("a", down) == "b"
    assert choose_replica(None, {"a": ReplicaLoad(False, 0, 0)}) is None


def test_session_table_spreads_sessions_and_keeps_them():
    table = SessionTable(["r0", "r1"])
    first, second = (1, "file:///a.py"), (2, "file:///b.py")
    assert table.route(first) == "r0"
    assert table.route(second) == "r1"  # both idle: the replica with fewer sessions
    assert [table.route(first) for _ in range(3)] == ["r0"] * 3


def test_a_failed_replica_loses_its_sessions_until_it_is_back():
    table = SessionTable(["r0", "r1"])
    session = (1, "file:///a.py")
    assert table.route(session) == "r0"
    assert table.mark_down("r0") == [session]
    assert table.route(session) == "r1"
    table.mark_up("r0")
    assert table.route(session) == "r1"  # it stays where it moved: that replica has its prefix now


def test_the_mirror_sends_a_replica_only_what_it_has_not_seen():
    mirror = DocumentMirror()
    mirror.update("1:file:///a.py", "a = 1")
    mirror.update("1:file:///b.py", "b = 2")
    mirror.update("2:file:///c.py", "c = 3")
    assert sorted(mirror.updates_for("r0", 1)) == [("1:file:///a.py", "a = 1"), ("1:file:///b.py", "b = 2")]
    assert mirror.updates_for("r0", 1) == []  # nothing new
    mirror.update("1:file:///a.py", "a = 10")
    mirror.remove("1:file:///b.py")
    assert mirror.updates_for("r0", 2) == [("1:file:///b.py", None), ("2:file:///c.py", "c = 3")]
    assert mirror.updates_for("r0", 1) == [("1:file:///a.py", "a = 10")]
    mirror.forget("r0")  # the replica died: its replacement gets everything again
    assert mirror.updates_for("r0", 1) == [("1:file:///a.py", "a = 10")]


def test_client_of_reads_the_doc_id_prefix():
    assert client_of("12:file:///x:y.py") == 12


def test_replicas_that_serve_adds_take_sessions_and_removed_ones_give_theirs_up():
    table = SessionTable(["r0"])
    first, second = (1, "file:///a.py"), (2, "file:///b.py")
    assert table.route(first) == "r0"
    table.begin("r0")  # a request of `first` runs on r0
    change = table.set_members(["r0", "r1"])
    assert (change.added, change.removed, change.moved) == (["r1"], [], [])
    assert table.route(second) == "r1"  # the newcomer is idle
    change = table.set_members(["r1"])  # scaled down: r0 goes
    assert (change.added, change.removed, change.moved) == ([], ["r0"], [first])
    assert table.members == ["r1"] and table.outstanding["r0"] == 1  # its request still counts...
    table.end("r0")
    assert "r0" not in table.outstanding  # ...until it ends
    assert table.route(first) == "r1"
    table.mark_up("r0")  # a late ping answer from a removed replica does not bring it back
    assert table.members == ["r1"]
