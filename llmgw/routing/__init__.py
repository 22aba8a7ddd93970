"""Which deployment of a route is tried first: circuit breaking per deployment, shared by every
replica through the limits store, and a load-balancing strategy per model alias."""
