"""I/O: the Postgres and SQLite adapters behind the ledger, breakers and threads."""
