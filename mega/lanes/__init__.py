"""The consume machinery that jobs and listener groups share, above the drivers.

A lane is a job's queue or an event's listener group. This package runs lanes: the consume
loop (`consumer`), the decision for each outcome (`delivery`, `backoff`), dead letters
(`dlq`), status records (`status`), presence (`presence`), flow control and rate limits
(`flow`, `ratelimit`), pause and cancels (`control`), and the endpoint a host runs its loops
through (`endpoint`). `mega.jobs` and `mega.events` build on it; it imports neither.
"""
