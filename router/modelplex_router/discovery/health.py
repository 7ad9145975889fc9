"""When a polled replica leaves rotation: on evidence, not on one slow poll.

A replica computing for its users answers polls slower; taking it out after one slow answer
sends its traffic elsewhere (or to a 503) exactly when it is busiest. So, like a kubelet's
readiness probe with ``failureThreshold``, a replica leaves rotation only on evidence:

- its own word: ``/readyz`` answered and said "not ready" (prewarming, draining);
- nothing listens: the connection was refused or reset;
- ``failure_threshold`` polls in a row failed (timed out or answered garbage), and no request
  of real traffic was answered by it in the meantime (an answer proves it alive).

It comes back on the first poll that finds it ready (``successThreshold`` 1, as in Kubernetes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Failed polls in a row before a replica leaves rotation.
FAILURE_THRESHOLD = 3


class Poll(enum.Enum):
    READY = "ready"
    NOT_READY = "not ready"  # it answered, and said so
    REFUSED = "refused"  # connection refused or reset: nothing serves there
    FAILED = "failed"  # timed out, or an unreadable answer


@dataclass
class PollHealth:
    """One replica's standing, from its polls and its traffic."""

    failure_threshold: int = FAILURE_THRESHOLD
    ready: bool = False
    failures: int = 0

    def observe(self, poll: Poll, *, answered_traffic: bool = False) -> bool:
        """Take in one poll's outcome; ``answered_traffic``: the replica answered a request
        since the poll began. Returns whether the replica is in rotation now."""
        if poll is Poll.FAILED and answered_traffic:
            poll = Poll.READY if self.ready else Poll.FAILED
        if poll is Poll.FAILED:
            self.failures += 1
            if self.failures >= self.failure_threshold:
                self.ready = False
        else:
            self.failures = 0
            self.ready = poll is Poll.READY
        return self.ready
