"""The routing policy: in which order a route's deployments are tried, and what each attempt told.

Everything a request does here is in memory, with no store round trip: :meth:`RoutingPolicy.plan`
orders the deployments (open breakers left out, the strategy's first choice first, a half-open
breaker's probe before all), and :meth:`RoutingPolicy.attempt` counts the request in flight and
takes its outcome. Only a breaker that opens or closes is sent to the other replicas, through the
health channel of the limits store, in the background, and each replica's requests in flight a few
times a second (:mod:`llmgw.routing.load`); theirs arrive the same way. Two cases take a round trip
to the limits store before a request is sent: a provider with account caps (``rpm`` / ``tpm``,
:mod:`llmgw.limits.caps`) counts it, through the request's admission ticket (the limits' one
place that admits: routing says which provider, the ticket counts it), and a half-open breaker's probe is claimed there, so that one
replica at a time probes a deployment (:meth:`RoutingPolicy.claim`).

When every deployment of a route is open the request is not refused: the one that failed least
recently is tried (it had the longest to recover), and only that one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from llmgw.background import cancel_and_wait
from llmgw.config.providers_file import Cooldown, Strategy
from llmgw.errors import ServiceUnavailable, UpstreamBusy, UpstreamTimeout, UpstreamUnavailable
from llmgw.limits.caps import AccountCap, ProviderCaps
from llmgw.limits.store import Admission, LimitStore, Reservation
from llmgw.providers.base import Decision, Deployment, UpstreamResponse
from llmgw.routing.breaker import FAILURES_TO_OPEN, Breaker, State
from llmgw.routing.channel import HealthChange, HealthChannel, LoadReport, Message
from llmgw.routing.load import REPORT_INTERVAL_SECONDS, SharedLoad
from llmgw.routing.retry import ABOUT_THE_REQUEST, hinted_delay
from llmgw.routing.strategy import first_choice

__all__ = [
    "DEFAULT_COOLDOWN_SECONDS",
    "PROBE_CLAIM_SECONDS",
    "Attempt",
    "DeploymentHealth",
    "RoutingPolicy",
]

log = logging.getLogger(__name__)

DEFAULT_COOLDOWN_SECONDS = 30.0
_DEFAULT_COOLDOWN = Cooldown(DEFAULT_COOLDOWN_SECONDS)
# The longest a probe's claim holds other replicas back: its answer closes or reopens the breaker
# well before (which ends the claim: a new opening is claimed afresh), so this only frees the probe
# of a replica that died probing.
PROBE_CLAIM_SECONDS = 30.0
# Weight of the newest time to first token in its moving average (least-latency).
_LATENCY_WEIGHT = 0.3
# Deployments remembered at most (breakers, averages): a caller may name any "provider/model", so
# what is kept of them is bounded; the oldest is forgotten first. A deployment that never failed
# holds no breaker.
_MAX_REMEMBERED = 1000


@attrs.frozen(slots=True)
class DeploymentHealth:
    """What the admin API, ``llmgw routes`` and /metrics show of one deployment."""

    deployment: str
    state: str  # closed, open, half-open
    open_until: float | None  # wall-clock seconds
    consecutive_failures: int
    openings: int
    last_failure_at: float | None
    in_flight: int  # on this replica
    in_flight_all_replicas: int  # this replica's and what the others last reported
    latency_seconds: float | None  # moving average of the time to first token, on this replica


def _make_room(remembered: dict[str, Any]) -> None:
    if len(remembered) >= _MAX_REMEMBERED:
        del remembered[next(iter(remembered))]


def caller_tag(caller: str | None) -> str:
    """A short stand-in for an API key's id (shared with other replicas); "" for no key."""
    return "" if caller is None else hashlib.blake2b(caller.encode(), digest_size=6).hexdigest()


class Attempt:
    """One attempt on one deployment: counted in flight until :meth:`done` (or a failure)."""

    __slots__ = (
        "_answered_after",
        "_caller",
        "_ended",
        "_label",
        "_policy",
        "_probe",
        "_started",
        "once",
    )

    def __init__(
        self,
        policy: RoutingPolicy,
        label: str,
        probe: bool,
        started: float,
        caller: str,
        *,
        once: bool,
    ) -> None:
        self._policy, self._label, self._started, self._caller = policy, label, started, caller
        self._probe = probe
        # Asked once, never retried: a half-open breaker's probe, or a deployment known to be down
        # that a route with nothing else tries all the same (it probes, it does not hammer).
        self.once = once
        self._ended = False
        self._answered_after: float | None = None

    def answered(self) -> None:
        """The deployment answered: a whole answer, or a stream whose headers arrived."""
        self._answered_after = self._policy._monotonic() - self._started
        self._policy._answered(self._label, served=self._caller)

    def refused(self, response: UpstreamResponse, decision: Decision | None) -> None:
        """The deployment answered with an error status (after its retries); ``decision`` is
        ``retry.decide``'s: only a failure to move on from is the deployment's."""
        if decision is None or decision.action != "move_on" or decision.reason in ABOUT_THE_REQUEST:
            # It is up: what it refused is the request (a 400, a content-policy refusal, a
            # context too long for it, a request too large for its rate limit or beyond the
            # caller's share of it), and the caller or the next deployment gets that.
            # Not timed: a quick refusal says nothing of how fast it answers.
            self._policy._answered(self._label)
            self.done()
            return
        retry_after = None
        if response.status == 429 and response.retry_after is not None:
            retry_after = hinted_delay({"retry-after": response.retry_after}, status=429)
        self.failed(retry_after)

    def unanswered(self, error: UpstreamUnavailable | UpstreamTimeout) -> None:
        """No answer came: unreachable, silent, or its key refused; a failure of the deployment,
        unless the request was never sent (every connection to it was in use here)."""
        if isinstance(error, UpstreamBusy):
            self.abandoned()
        else:
            self.failed()

    def failed(self, retry_after: float | None = None) -> None:
        """The deployment could not serve it (after its retries); ``retry_after``: a 429's wait."""
        self._policy._failed(self._label, retry_after, probe=self._probe, caller=self._caller)
        self.done()

    def abandoned(self) -> None:
        """The request ended before the deployment told anything (the caller left)."""
        if self._probe:
            self._policy._give_back_probe(self._label)
        self.done()

    def done(self, first_token_after: float | None = None) -> None:
        """The request no longer occupies the deployment (its answer was relayed).

        ``first_token_after``: seconds from a stream's headers to its first event. The time to
        first token (to the whole answer, when not streamed) joins the deployment's average.
        """
        if self._ended:
            return
        self._ended = True
        self._policy._leave(self._label)
        if self._answered_after is not None:
            self._policy._measured(self._label, self._answered_after + (first_token_after or 0.0))


class RoutingPolicy:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        caps: ProviderCaps | None = None,
    ) -> None:
        """``caps``: the limits' provider account caps (``LimitPolicy.caps``), configured here
        with each reload's providers."""
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._breakers: dict[str, Breaker] = {}
        self._cooldowns: dict[str, Cooldown] = {}  # provider name -> its breakers' cooldown
        self._load = SharedLoad()
        self._latency: dict[str, float] = {}
        # Callers' tags, made once each (a hash per request was most of an attempt's start);
        # bounded as the deployments are (callers are keys: many, but the busy ones repeat).
        self._tags: dict[str, str] = {}
        self._channel: HealthChannel | None = None
        self._outbox: asyncio.Queue[Message] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._store: LimitStore | None = None
        self._claims: dict[str, tuple[uuid.UUID, str]] = {}  # label -> its probe's claim
        self._releases: set[asyncio.Task[None]] = set()
        self.caps = caps or ProviderCaps(clock=clock)

    # Lifecycle ---------------------------------------------------------------------------------

    def configure(
        self, cooldowns: Mapping[str, Cooldown], caps: Mapping[str, AccountCap] | None = None
    ) -> None:
        """Each provider's ``circuit_*`` settings and account caps (at start and on every
        reload)."""
        self._cooldowns = dict(cooldowns)
        self.caps.configure(caps or {})

    def use(self, store: LimitStore) -> None:
        """Claim probes on ``store`` (the limits store, shared by every replica) from now on."""
        self._store = store

    async def start(self, channel: HealthChannel) -> None:
        """Share breaker changes and load with the other replicas through ``channel`` from now
        on (the breakers the store keeps open are known when this returns)."""
        self._channel = channel
        self._outbox = asyncio.Queue()
        await channel.start(self.receive)
        self._tasks = [
            asyncio.create_task(self._send_forever(), name="llmgw-health-send"),
            asyncio.create_task(self._report_load_forever(), name="llmgw-load-report"),
        ]

    async def close(self) -> None:
        await cancel_and_wait([*self._tasks, *self._releases])
        if self._channel is not None:
            await self._channel.close()

    # Per request --------------------------------------------------------------------------------

    def plan(self, deployments: Sequence[Deployment], strategy: Strategy) -> list[Deployment]:
        """The order to try ``deployments`` in (never empty)."""
        now = self._clock()
        ready: list[int] = []
        probe: int | None = None
        for index, deployment in enumerate(deployments):
            breaker = self._breakers.get(deployment.label)
            if breaker is None or breaker.state(now) is State.CLOSED:
                ready.append(index)
            elif probe is None and breaker.take_probe(now):
                probe = index
        if not ready:
            if probe is not None:
                return [deployments[probe]]
            rested = min(deployments, key=lambda d: self._breaker(d.label).last_failure_at)
            return [rested]
        if len(ready) > 1 and strategy.name != "ordered":
            first = first_choice(
                strategy,
                ready,
                in_flight=lambda i: self._load.in_flight(deployments[i].label, self._monotonic()),
                latency=lambda i: self._latency.get(deployments[i].label),
                rng=self._rng,
            )
            ready.remove(first)
            ready.insert(0, first)
        if probe is not None:
            ready.insert(0, probe)
        return [deployments[i] for i in ready]

    def attempt(self, deployment: Deployment, caller: str | None = None) -> Attempt:
        """``deployment`` is sent a request of ``caller``'s (an API key's id; None: no key)."""
        label = deployment.label
        breaker = self._breakers.get(label)
        probe = breaker is not None and breaker.probing
        down = breaker is not None and breaker.state(self._clock()) is not State.CLOSED
        self._load.enter(label)
        return Attempt(self, label, probe, self._monotonic(), self._tag(caller), once=probe or down)

    def _tag(self, caller: str | None) -> str:
        if caller is None:
            return ""
        tag = self._tags.get(caller)
        if tag is None:
            _make_room(self._tags)
            tag = self._tags[caller] = caller_tag(caller)
        return tag

    async def claim(self, deployment: Deployment) -> bool:
        """Whether ``deployment`` may be sent the request: yes, unless :meth:`plan` made the
        request its half-open breaker's probe and another replica holds that probe.

        The claim is one reservation on the limits store (``probe:<deployment>:<open until>``,
        capacity 1, held ``PROBE_CLAIM_SECONDS``): one round trip, only for a probe. A store that
        cannot be reached does not stop the probe: each replica then probes once at most.
        """
        label = deployment.label
        breaker = self._breakers.get(label)
        if self._store is None or breaker is None or not breaker.probing:
            return True
        lease, counter = uuid.uuid4(), f"probe:{label}:{breaker.open_until}"
        try:
            result = await self._store.admit(
                Admission(
                    lease_id=lease,
                    lease_seconds=PROBE_CLAIM_SECONDS,
                    window=None,
                    reservations=(Reservation(counter, 1, 1, PROBE_CLAIM_SECONDS),),
                )
            )
        except ServiceUnavailable:
            log.warning("deployment %s is probed without a claim: the store is down", label)
            return True
        except BaseException:
            breaker.release_probe()
            raise
        if not result.admitted:
            breaker.release_probe()
            log.info("deployment %s is being probed by another replica", label)
            return False
        self._claims[label] = (lease, counter)
        return True

    def not_sent(self, deployment: Deployment) -> None:
        """``deployment`` was planned but is not sent the request (its provider is at its account
        cap, or the cap could not be counted): the probe it may have been planned as is given
        back, so a half-open breaker is probed by a later request."""
        breaker = self._breakers.get(deployment.label)
        if breaker is not None and breaker.probing:
            self._give_back_probe(deployment.label)

    def _give_back_probe(self, label: str) -> None:
        """The probe told nothing: another request (of any replica) may probe at once."""
        self._breaker(label).release_probe()
        claim = self._claims.pop(label, None)
        if claim is not None and self._store is not None:
            lease, counter = claim
            task = asyncio.create_task(
                self._store.cancel([(lease, [counter])], PROBE_CLAIM_SECONDS),
                name="llmgw-probe-release",
            )
            self._releases.add(task)
            task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releases.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Not given back: it expires after PROBE_CLAIM_SECONDS.
            failure = task.exception()
            log.warning("a probe's claim could not be given back (%s)", type(failure).__name__)

    # Outcomes -----------------------------------------------------------------------------------

    def _breaker(self, label: str) -> Breaker:
        breaker = self._breakers.get(label)
        if breaker is None:
            _make_room(self._breakers)
            breaker = self._breakers[label] = Breaker()
        return breaker

    def _leave(self, label: str) -> None:
        self._load.leave(label)

    def _measured(self, label: str, seconds: float) -> None:
        previous = self._latency.get(label)
        if previous is None:
            _make_room(self._latency)
        self._latency[label] = (
            seconds if previous is None else previous + _LATENCY_WEIGHT * (seconds - previous)
        )

    def _cooldown(self, label: str) -> Cooldown:
        return self._cooldowns.get(label.split(":", 1)[0], _DEFAULT_COOLDOWN)

    def _answered(self, label: str, *, served: str | None = None) -> None:
        """``label`` is up; ``served``: the caller it answered (not one whose request it refused)."""
        if served is not None:
            self._load.served(label, served, self._monotonic())
        breaker = self._breakers.get(label)
        if breaker is None:
            return
        # The probe's answer ends its claim: the breaker closes (or reopens, and a new opening
        # is claimed afresh).
        self._claims.pop(label, None)
        if breaker.succeeded(self._clock()):
            log.warning("deployment %s answers again: its circuit is closed", label)
            self._share(label, breaker)
        self._note_failing(label, breaker)

    def _failed(self, label: str, retry_after: float | None, *, probe: bool, caller: str) -> None:
        breaker = self._breaker(label)
        self._claims.pop(label, None)
        now, monotonic = self._clock(), self._monotonic()
        others_served = self._load.others_served(label, caller, monotonic)
        opened = breaker.failed(
            now,
            self._cooldown(label),
            retry_after=retry_after,
            probe=probe,
            caller=caller,
            others_served=others_served,
            elsewhere=self._load.failing_elsewhere(label, monotonic),
        )
        self._note_failing(label, breaker)
        if opened:
            assert breaker.open_until is not None
            log.warning(
                "deployment %s is skipped for %.0f s: its circuit is open (%s)",
                label,
                breaker.open_until - now,
                "Retry-After" if retry_after is not None else f"{breaker.failures} failures",
            )
            self._share(label, breaker)
        elif (
            others_served
            and breaker.failures >= FAILURES_TO_OPEN
            and set(breaker.failed_by) == {caller}
        ):
            log.info(
                "deployment %s failed one caller's request %d times in a row while it serves "
                "others: its circuit stays closed",
                label,
                breaker.failures,
            )

    # Between replicas ---------------------------------------------------------------------------

    def _note_failing(self, label: str, breaker: Breaker) -> None:
        """Tell the other replicas at once whose calls to ``label`` failed in a row here (nobody's
        once it answered or opened): its breaker opens on the failures of all of them."""
        closed = breaker.state(self._clock()) is State.CLOSED
        failing = breaker.failed_by if closed and breaker.failures else None
        if self._load.failing.get(label) == failing:
            return
        if failing is None:
            del self._load.failing[label]
        else:
            self._load.failing[label] = failing
        self._report_load()

    def _report_load(self) -> None:
        report = self._load.report(self._monotonic())
        if report is not None and self._outbox is not None:
            self._outbox.put_nowait(report)

    def _share(self, label: str, breaker: Breaker) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(
                HealthChange(
                    deployment=label,
                    open_until=breaker.open_until,
                    openings=breaker.openings,
                    last_failure_at=breaker.last_failure_at,
                    changed_at=breaker.changed_at,
                )
            )

    def receive(self, message: Message) -> None:
        """A replica's message (this one's included)."""
        if isinstance(message, LoadReport):
            self._load.receive(message, self._monotonic())
        else:
            self._take(message)

    def _take(self, change: HealthChange) -> None:
        """A breaker's change: taken unless what is known here is newer."""
        breaker = self._breaker(change.deployment)
        if change.changed_at < breaker.changed_at:
            return
        open_until = change.open_until
        if open_until is not None:
            # Kept before openings had a cap (or by an older replica): none outlasts it.
            open_until = min(open_until, self._clock() + self._cooldown(change.deployment).most)
        breaker.open_until, breaker.openings = open_until, change.openings
        breaker.changed_at = change.changed_at
        breaker.last_failure_at = max(breaker.last_failure_at, change.last_failure_at)
        if change.open_until is None:
            breaker.failures, breaker.failed_by = 0, []
        self._note_failing(change.deployment, breaker)

    async def _report_load_forever(self) -> None:
        assert self._outbox is not None
        while True:
            await asyncio.sleep(REPORT_INTERVAL_SECONDS)
            self._report_load()

    async def _send_forever(self) -> None:
        assert self._outbox is not None
        assert self._channel is not None
        failing = False
        while True:
            message = await self._outbox.get()
            try:
                await self._channel.publish(message)
            except Exception as exc:
                # The change stays local: other replicas find the deployment down themselves.
                if not failing:
                    log.warning(
                        "deployment health cannot be shared with other replicas (%s)",
                        type(exc).__name__,
                    )
                failing = True
            else:
                failing = False

    # Views ----------------------------------------------------------------------------------------

    def health(self, label: str) -> DeploymentHealth:
        breaker = self._breakers.get(label) or Breaker()
        return DeploymentHealth(
            deployment=label,
            state=breaker.state(self._clock()).value,
            open_until=breaker.open_until,
            consecutive_failures=breaker.failures,
            openings=breaker.openings,
            last_failure_at=breaker.last_failure_at or None,
            in_flight=self._load.own.get(label, 0),
            in_flight_all_replicas=self._load.in_flight(label, self._monotonic()),
            latency_seconds=self._latency.get(label),
        )

    def known(self) -> list[str]:
        """Every deployment this replica has tried or heard of."""
        return sorted(self._breakers.keys() | self._load.own.keys())
