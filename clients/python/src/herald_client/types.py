"""Types of the parameters and results of Herald's methods (docs/openrpc.json).

Results are the daemon's JSON objects as ``dict``s; these TypedDicts name their members for
type checkers. A daemon newer than this module may add members: they are there at run time.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "Platform",
    "Form",
    "Environment",
    "Kind",
    "Priority",
    "InterruptionLevel",
    "During",
    "Weekday",
    "QuietHours",
    "MessageState",
    "DeliveryState",
    "WebPushKeys",
    "Target",
    "Alert",
    "DropStep",
    "ShortenStep",
    "KeepStep",
    "ShrinkStep",
    "DeclarativeNotification",
    "ActivityEvent",
    "ActivityRegistration",
    "ActivityToken",
    "ActivityList",
    "Channel",
    "ChannelList",
    "Registration",
    "Removed",
    "Device",
    "DeviceList",
    "UpdatedDevice",
    "Counts",
    "Accepted",
    "DeliveryDetail",
    "MessageStatus",
    "Cancelled",
    "EventKind",
    "Event",
    "Health",
    "Stats",
    "Metrics",
    "VapidPublicKey",
    "OpenRPCDocument",
]

#: ``apns_widgets``, ``apns_location`` and ``apns_pushtotalk``: APNs tokens of their own (WidgetKit,
#: Core Location, PushToTalk), reached by ``kind`` ``widgets``, ``location`` and ``pushtotalk`` only.
Platform = Literal[
    "apns", "apns_voip", "apns_widgets", "apns_location", "apns_pushtotalk", "fcm", "web", "unified_push"
]
#: How a registration is reached: an https endpoint with keys (``webpush``) or a raw vendor token.
Form = Literal["webpush", "legacy"]
Environment = Literal["production", "development"]
Kind = Literal["notification", "clear", "call_ring", "widgets", "location", "pushtotalk", "live_activity"]
#: ``push.send``'s ``event`` for ``kind="live_activity"``.
ActivityEvent = Literal["start", "update", "end"]
Priority = Literal["high", "normal", "low"]
#: ``push.send``'s ``interruption_level`` (APNs ``interruption-level``).
InterruptionLevel = Literal["passive", "active", "time-sensitive", "critical"]
#: What a push due inside a device's quiet hours does: wait for their end, go without sound or
#: banner, or be skipped (reason ``quiet_hours``).
During = Literal["hold", "silent", "drop"]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
MessageState = Literal["pending", "complete"]
#: ``held``: waiting for its time (``not_before``, ``at_local``, or quiet hours with ``hold``).
DeliveryState = Literal[
    "queued",
    "held",
    "in_flight",
    "delivered",
    "retrying",
    "failed",
    "expired",
    "superseded",
    "skipped",
    "removed_stale",
]


class WebPushKeys(TypedDict):
    """A Web Push subscription's keys (base64url): a 65-byte P-256 point and a 16-byte secret."""

    p256dh: str
    auth: str


class Target(TypedDict, total=False):
    """``push.send``'s ``to``: exactly one of ``users`` or ``devices`` (device ids)."""

    users: list[str]
    devices: list[str]


class Alert(TypedDict, total=False):
    """Localisation keys only; ``loc_key`` defaults to the app's ``alert_loc_key``."""

    loc_key: str
    loc_args: list[str]
    title_loc_key: str
    body_loc_key: str


class DropStep(TypedDict):
    """A ``shrink`` step: removes the members or elements the JSON pointers name."""

    drop: list[str]


class ShortenStep(TypedDict):
    """A ``shrink`` step: cuts the pointed string, at a character boundary and ending in ``…``,
    so that the whole ``web_payload`` fits."""

    shorten: str


class KeepStep(TypedDict):
    """A ``shrink`` step: keeps only the pointed values (the minimal payload)."""

    keep: list[str]


#: One step of ``push.send``'s ``shrink``, tried in order while ``web_payload`` does not fit.
ShrinkStep = DropStep | ShortenStep | KeepStep


class DeclarativeNotification(TypedDict):
    """``push.send``'s ``notification``: Declarative Web Push (``{"web_push": 8030, …}``), shown
    by Safari without a service worker and handed to the service worker by other browsers.
    ``title`` and ``navigate`` (an absolute https URL) are required."""

    title: str
    navigate: str
    body: NotRequired[str]
    lang: NotRequired[str]
    dir: NotRequired[Literal["auto", "ltr", "rtl"]]
    tag: NotRequired[str]
    icon: NotRequired[str]
    silent: NotRequired[bool]
    app_badge: NotRequired[int]
    mutable: NotRequired[bool]


class QuietHours(TypedDict):
    """A device's quiet hours: from ``start`` to ``end`` (``"HH:MM"``; ``"22:00"`` to
    ``"07:00"`` spans midnight) on the device's clock, every day or on the ``days`` a period
    starts on. ``device_list`` always shows ``days`` (None: every day) and ``during``."""

    start: str
    end: str
    days: NotRequired[list[Weekday] | None]
    during: NotRequired[During]


class Registration(TypedDict):
    """``device.register``: what the call did."""

    device_id: str
    token_hash: str
    created: bool
    reclaimed: bool
    evicted: list[str]


class Removed(TypedDict):
    """``device.unregister``, ``session.end``, ``user.forget``: devices deleted."""

    removed: int


class Device(TypedDict):
    """One device as ``device.list`` shows it (never a token or key)."""

    device_id: str
    platform: Platform
    environment: Environment | None
    name: str | None
    app_version: str | None
    token_hash: str
    created_at: str
    registered_at: str
    last_success_at: str | None
    last_failure_at: str | None
    last_failure_reason: str | None
    #: APNs devices: the bundle id they are sent with (``apns-topic``; VoIP adds ``.voip``): the
    #: one given at registration, else the app's default topic (None when the app configures
    #: none). None for fcm and web.
    bundle_id: str | None
    #: False when turned off with ``device_update(enabled=False)``: the device is kept and
    #: listed, and sends skip it (``skipped``, reason ``device_disabled``) until it is enabled
    #: again. Registering the same token again does not change it.
    enabled: bool
    #: ``webpush``: an https endpoint with keys, sent as an RFC 8291 record whatever the
    #: platform; ``legacy``: a raw vendor token (apns, apns_voip, fcm).
    form: Form
    #: The client build (``stable`` when none was given); part of the registration's identity.
    app_id: str
    #: The user agent given at registration; None if none.
    user_agent: str | None
    #: The device's own rules (``device_update``), each None when not set: its IANA time zone,
    #: its quiet hours, and the message topics it wants (None: every message; ``[]``: none).
    time_zone: str | None
    quiet_hours: QuietHours | None
    topics: list[str] | None


class UpdatedDevice(TypedDict):
    """``device.update``: the device as ``device.list`` shows it."""

    device: Device


class DeviceList(TypedDict):
    """``device.list``: newest registration first."""

    devices: list[Device]


class ActivityRegistration(TypedDict):
    """``activity.register``: the token's id, whether it is new, and older tokens let go."""

    token_id: str
    token_hash: str
    created: bool
    evicted: list[str]


class ActivityToken(TypedDict):
    """One Live Activity token as ``activity.list`` shows it (never the token)."""

    token_id: str
    device_id: str
    role: Literal["push_to_start", "update"]
    activity_type: str | None
    activity_id: str | None
    token_hash: str
    environment: Environment | None
    registered_at: str


class ActivityList(TypedDict):
    """``activity.list``: newest first."""

    activities: list[ActivityToken]


class Channel(TypedDict):
    """An APNs broadcast channel (``channel.create``, ``channel.list``)."""

    channel_id: str
    bundle_id: str | None
    environment: Environment
    storage: Literal["none", "latest"]
    created_at: str


class ChannelList(TypedDict):
    """``channel.list``: newest first."""

    channels: list[Channel]


class Counts(TypedDict):
    """A message's deliveries per state (every state is present)."""

    queued: int
    held: int
    in_flight: int
    delivered: int
    retrying: int
    failed: int
    expired: int
    superseded: int
    skipped: int
    removed_stale: int


class Accepted(TypedDict):
    """``push.send``: the message and its deliveries are committed. With ``wait``, also
    ``state`` and ``counts``."""

    message_id: str
    devices: int
    skipped: int
    state: NotRequired[MessageState]
    counts: NotRequired[Counts]


class DeliveryDetail(TypedDict):
    """One device's delivery in ``push.status`` with ``detail``."""

    device_id: str
    platform: Platform
    state: DeliveryState
    attempts: int
    http_status: int | None
    reason: str | None
    updated_at: str
    sent_by: str | None
    #: The last ``shrink`` step the delivery's Web Push record needed; None when none was.
    shrunk: NotRequired[int | None]
    #: When a held delivery is (or was) due (RFC 3339 UTC); None when it never waited.
    due_at: NotRequired[str | None]
    #: What its timing rules did: ``not_before``, ``at_local``, ``at_local:no_time_zone``,
    #: ``quiet_hours:hold``, ``quiet_hours:bypassed:critical``... (empty when none applied).
    timing: NotRequired[list[str]]


class MessageStatus(TypedDict):
    """``push.status``: ``state`` is ``complete`` once every delivery is final."""

    message_id: str
    created_at: str
    state: MessageState
    counts: Counts
    devices: NotRequired[list[DeliveryDetail]]


class Cancelled(TypedDict):
    """``push.cancel``: deliveries dropped."""

    cancelled: int


class CredentialHealth(TypedDict):
    """The last check of one app's credential for one platform: ``ok``,
    ``rejected`` (``reason``: the provider's answer), ``unreachable`` or
    ``unknown`` (not checked yet); times as RFC 3339 UTC, ``None`` before the first."""

    status: Literal["ok", "rejected", "unreachable", "unknown"]
    reason: NotRequired[str]
    checked_at: str | None
    last_success_at: str | None


#: What an event reports (``events.subscribe``'s ``kinds``); a ``gap`` is never asked for.
EventKind = Literal["delivery", "device_removed", "message_complete", "credential", "transport"]


class Event(TypedDict, total=False):
    """One event of ``Client.events``: ``cursor``, ``kind``, ``at`` and ``app`` always (but a
    ``gap``: ``kind``, ``cursor``, ``reason``), the other members as the kind has them.

    delivery: ``message_id``, ``device_id``, ``user``, ``platform``, ``state`` (final, or
    ``held`` when it was accepted to wait, with ``due_at`` and ``timing``), ``reason``,
    ``http_status``, ``apns_id`` (APNs), ``provider_id``. device_removed:
    ``device_id``, ``user``, ``platform``, ``reason`` (stale, cap, reclaimed, forget).
    message_complete: ``message_id``, ``counts`` (final states only). credential and
    transport: ``platform``, ``state``, ``reason``, ``detail``."""

    cursor: str
    kind: str
    at: str
    app: str
    message_id: str
    device_id: str
    user: str
    platform: Platform
    state: str
    reason: str | None
    http_status: int | None
    apns_id: str
    provider_id: str | None
    due_at: str
    timing: list[str]
    counts: dict[str, int]
    detail: Any


class Health(TypedDict):
    """``system.health``: ``store`` is ``ok`` or ``degraded:<why>``; each transport
    ``ready``, ``disabled:<why>`` or ``degraded:<why>``, per app; ``credentials``
    per app and platform (``apns``, ``fcm``, ``web``). A rejected credential makes
    ``status`` ``degraded``."""

    status: Literal["ok", "degraded"]
    store: str
    transports: dict[str, dict[str, str]]
    credentials: dict[str, dict[str, CredentialHealth]]


class Metrics(TypedDict):
    """``system.metrics``: the Prometheus text exposition."""

    content_type: str
    text: str


class VapidPublicKey(TypedDict):
    """``vapid.public_key``: base64url of the 65-byte uncompressed point
    (a browser's ``applicationServerKey``)."""

    public_key: str


#: ``system.stats``: counters (docs/interface.md lists the members), among them
#: ``web_subscriptions_by_key``: per app, its Web Push subscriptions per VAPID public key they
#: were made with (``{"<app>": {"<public key>": n}}``; the app's current and previous keys are
#: always listed).
Stats = dict[str, Any]

#: ``rpc.discover``: the OpenRPC document.
OpenRPCDocument = dict[str, Any]
