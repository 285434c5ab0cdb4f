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

from collections import OrderedDict
from typing import Callable, List, Tuple

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

__all__ = ['ScanSubscription']

_POLICIES = {
    'auto': (ReliabilityPolicy.RELIABLE, ReliabilityPolicy.BEST_EFFORT),
    'best_effort': (ReliabilityPolicy.BEST_EFFORT,),
    'reliable': (ReliabilityPolicy.RELIABLE,),
}
_SEEN = 256  # samples remembered for duplicate detection (both readers run within a few samples)


class ScanSubscription:
    """Subscribe ``topic`` with ``reliability`` ('auto' | 'best_effort' | 'reliable') and call
    ``callback(msg)`` once per published sample.

    depth: history depth of each reader (KEEP_LAST). The callback runs in the node's executor;
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
    ):
        self._callback = callback
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
        self._callback(msg)
