"""A sensor-topic subscription that hears reliable and best-effort publishers from their first
message.

Why two readers: a reliable reader never matches a best-effort writer (a lidar driver with the
sensor-data profile), and a best-effort reader loses what a reliable writer (a bag player) sends
before the transport between them is up: with Fast DDS's ``LARGE_DATA`` transports (TCP + shared
memory) a bag player that publishes the moment it sees the subscription lost the first scan in 5
of 6 start-ups, and a player that waits for each answer then waits forever. No single
subscription QoS covers both, and switching QoS after looking at the publishers races them.
So ``auto`` keeps one reader of each kind for the node's lifetime: a reliable writer is heard
through the reliable reader (retransmitted until delivered), a best-effort writer through the
best-effort one, and a sample that arrives through both is passed on once, recognised by its
writer's source timestamp and publication sequence number (not the header stamp, which drivers
may repeat).

What no subscriber can change: a best-effort writer's sample sent before the reader has
discovered that writer is lost (measured: a best-effort publisher that sends the moment it sees
the subscription loses its first scan in about half the start-ups, with any reader QoS); a
driver streaming at its rate loses at most that first scan. A best-effort driver also logs once
that the reliable reader requests an incompatible QoS; ``reliability: best_effort`` silences it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, List, Optional, Tuple

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

__all__ = ['ScanSubscription', 'WriterFollower']

_POLICIES = {
    'auto': (ReliabilityPolicy.RELIABLE, ReliabilityPolicy.BEST_EFFORT),
    'best_effort': (ReliabilityPolicy.BEST_EFFORT,),
    'reliable': (ReliabilityPolicy.RELIABLE,),
}
_SEEN = 256  # samples remembered for duplicate detection (both readers run within a few samples)


#: samples in a row from another writer after which it is the one followed (a driver restarted
#: with a new writer); fewer are another source on the topic
SWITCH_AFTER = 3


class ScanSubscription:
    """Subscribe ``topic`` with ``reliability`` ('auto' | 'best_effort' | 'reliable') and call
    ``callback(msg)`` once per published sample of the writer followed, ``other_writer(msg)``
    for a sample of another writer on the topic (told apart by the writers' publication
    sequence numbers, which each writer counts up on its own: a sample not after the followed
    writer's last one is another writer's, until :data:`SWITCH_AFTER` in a row).

    depth: history depth of each reader (KEEP_LAST). The callbacks run in the node's executor;
    readers share the node's default (mutually exclusive) callback group, so calls never overlap.
    """

    def __init__(
        self,
        node: Node,
        msg_type,
        topic: str,
        reliability: str,
        callback: Callable[[object], None],
        depth: int = 5,
        other_writer: Optional[Callable[[object], None]] = None,
    ):
        self._callback = callback
        self._other_writer = other_writer
        self._writers = WriterFollower()
        self._seen: 'OrderedDict[Tuple[int, int], None]' = OrderedDict()
        self.duplicates = 0
        policies = _POLICIES.get(reliability)
        if policies is None:
            raise ValueError(
                f"reliability must be one of {', '.join(_POLICIES)}, got {reliability!r}"
            )
        self._dedupe = len(policies) > 1
        # in 'auto' the reliable reader's mismatch with a best-effort driver is expected (the other
        # reader hears it): no warning from this side
        quiet = SubscriptionEventCallbacks(incompatible_qos=lambda info: None)
        self.subscriptions: List = [
            node.create_subscription(
                msg_type,
                topic,
                self._on_sample,
                QoSProfile(depth=depth, history=HistoryPolicy.KEEP_LAST, reliability=policy),
                event_callbacks=quiet if self._dedupe else None,
            )
            for policy in policies
        ]

    @property
    def topic_name(self) -> str:
        """The resolved topic name (after remapping)."""
        return self.subscriptions[0].topic_name

    def _on_sample(self, msg, info) -> None:
        if self._dedupe:
            key = (info.get('source_timestamp'), info.get('publication_sequence_number'))
            if key in self._seen:
                self.duplicates += 1
                self._seen.move_to_end(key)
                return
            self._seen[key] = None
            if len(self._seen) > _SEEN:
                self._seen.popitem(last=False)
        if self._other_writer is not None and not self._writers.follows(
            info.get('publication_sequence_number'), time.monotonic()
        ):
            self._other_writer(msg)
            return
        self._callback(msg)


class WriterFollower:
    """Which writer's samples a topic's reader follows, told apart by publication sequence
    numbers (each writer counts up on its own)."""

    def __init__(self):
        self.followed: Optional[int] = None  # the followed writer's last sequence number
        self._others: List[int] = []  # sequence numbers of another writer's samples in a row
        self._arrival: Optional[float] = None  # the followed writer's last arrival (s)
        self._period: Optional[float] = None  # its mean time between samples (s)

    def follows(self, seq: Optional[int], now: float) -> bool:
        """Whether a sample with sequence number ``seq`` arriving at ``now`` (monotonic s) is the
        followed writer's (after its last one), or its writer becomes the one followed: the
        followed one fell silent for over 3 of its periods (a driver restarted), or
        SWITCH_AFTER samples in a row came in order from it. No ``seq`` (0, None): True."""
        if not seq:
            return True
        last = self._arrival
        silent = last is not None and self._period is not None and now - last > 3 * self._period
        if self.followed is None or seq > self.followed or silent:
            if last is not None and not silent:
                gap = now - last
                self._period = gap if self._period is None else 0.8 * self._period + 0.2 * gap
            self._take(seq, now)
            return True
        if self._others and seq <= self._others[-1]:
            self._others = []
        self._others.append(seq)
        if len(self._others) >= SWITCH_AFTER:
            self._take(seq, now)
            return True
        return False

    def _take(self, seq: int, now: float) -> None:
        self.followed, self._others, self._arrival = seq, [], now
