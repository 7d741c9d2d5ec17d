"""Ray Serve's side of session affinity: each call goes to the replica the front end chose.

All replicas are one Ray Serve deployment, so Ray Serve can autoscale them. Its request router runs
in the process that holds the deployment handle, here the front end, and this router does two
things there:

- it reports the running replica set (`update_replicas`, called by Serve whenever replicas start
  or stop) to the listener the front end registered (serving/membership.py), so the routing table
  (serving/routing.py) learns of new and removed replicas;
- it routes a call carrying `replica=<id>` to that replica. If that replica is no longer among the
  candidates (it was just removed), the call goes to any other, which refuses it (ReplicaMismatch
  in serving/replica.py) and the front end treats the refusal like a failed replica: the session
  moves, and the request is sent again.

The front end keeps the placement decision (it must know where a session lives to send that
replica the client's documents); the router only carries it out.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

REPLICA_ARGUMENT = "replica"  # the keyword argument naming the replica a call is for


class SessionAffinityRouter(RequestRouter):
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        from serving.membership import report  # by reference: Serve pickles this module by value

        super().update_replicas(replicas)
        report(self.app_name, frozenset(replica.replica_id.unique_id for replica in replicas))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        wanted = pending_request.kwargs.get(REPLICA_ARGUMENT) if pending_request is not None else None
        chosen = [replica for replica in candidate_replicas if replica.replica_id.unique_id == wanted]
        return [chosen or candidate_replicas]
