"""The transactional outbox: events and jobs written in the caller's database transaction
(`store`), and the relay that publishes them once it commits (`relay`). It sits above both
`mega.events` and `mega.jobs`, which know nothing of it."""
