"""What a request cost and where that goes: usage records, the price table, estimates, the ledger sink.

Telemetry observes a request; accounting decides what it is charged. Storage, limits and telemetry
import from here, never the other way round.
"""
