"""Which deployment of a model alias goes first (``strategy`` in its ``[[models]]`` table).

- ``ordered`` (the default): the first one listed;
- ``weighted``: one drawn at random in proportion to ``weights`` (one per deployment);
- ``least-busy``: the one with the fewest requests in flight, on every replica (``routing.load``);
- ``least-latency``: the one with the lowest moving average of its time to first token; one never
  measured is tried first, and one request in ten goes to a random one, so a deployment that got
  faster is noticed.

Only the first choice moves: the others keep their listed order as the fallback order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from llmgw.config.providers_file import Strategy

__all__ = ["EXPLORE_SHARE", "first_choice"]

# least-latency: the share of requests sent to a random deployment rather than the fastest.
EXPLORE_SHARE = 0.1


def first_choice(
    strategy: Strategy,
    candidates: Sequence[int],
    *,
    in_flight: Callable[[int], int],
    latency: Callable[[int], float | None],
    rng: random.Random,
) -> int:
    """The candidate (a position in the alias's list) to try first; ``candidates`` is not empty
    and in listed order."""
    name = strategy.name
    if name == "weighted":
        weights = [strategy.weights[i] for i in candidates]
        if sum(weights) > 0:
            return rng.choices(candidates, weights)[0]
    elif name == "least-busy":
        return min(candidates, key=in_flight)  # min keeps the first of equals: listed order
    elif name == "least-latency":
        unmeasured = [i for i in candidates if latency(i) is None]
        if unmeasured:
            return unmeasured[0]
        if rng.random() < EXPLORE_SHARE:
            return rng.choice(candidates)
        return min(candidates, key=lambda i: latency(i) or 0.0)
    return candidates[0]
