"""Limits: one policy answers "is this request admitted, and why not", over a shared store.

Request windows (fixed windows per key), concurrency slots, tokens per minute and monthly budgets
are all counters in a :class:`~llmgw.limits.store.LimitStore` (Postgres, Redis or in memory). A
request reserves its worst case before the provider is called and settles to its actual figures
when it ends; reservations that are never settled expire with their lease.
"""
