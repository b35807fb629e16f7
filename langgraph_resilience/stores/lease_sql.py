"""The lease table's SQL: thread leases with fencing tokens, in single statements.

One row per leased thread in ``lgr_thread_leases``: who holds it (``holder``, unique
per acquisition: ``host:pid:nonce``, and for a run's lease ``@`` the checkpoint its
step ran from), its fencing ``token`` (from one sequence, so a thread's tokens only
grow) and when it lapses (``expires_at``, on the database's clock). Every statement
here is its own transaction (autocommit), never prepared and never relying on
session state, so it means the same straight to PostgreSQL and through a
transaction pooler (PgBouncer ``pool_mode=transaction``, RDS Proxy, Supavisor).

``lgr_lease_holds(thread_id, fences)`` is the fence inside a write: ``fences`` is the
JSON the writer carries (``{thread_id: {"token": n, "db": name}}``, the leases its
context holds); for a thread it holds a lease of this database on, the function
takes a share lock on the lease row and answers whether that token is still the
current, unexpired one. The share lock orders the write before any takeover: a
successor's ``INSERT ... ON CONFLICT DO UPDATE`` waits for the write's commit, so no
write of a stale holder lands after a successor took the thread. ``lgr_fenced`` is the
same check raising SQLSTATE `FENCE_SQLSTATE`, for writes that must not happen.
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "CHECK",
    "FENCE_SQLSTATE",
    "FORGET",
    "HOLDER_OF",
    "LEASE_DDL",
    "LEASE_TABLE",
    "RELEASE",
    "RENEW",
    "SETUP_LOCK",
    "SETUP_LOCK_TIMEOUT",
    "SETUP_PREAMBLE",
    "setup_transaction",
]

LEASE_TABLE = "lgr_thread_leases"
FENCE_SQLSTATE = "LR001"
"""What a fenced write raises when its lease was taken over or expired."""

SETUP_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('langgraph-resilience:setup', 0))"
"""Serializes our DDL across processes; transaction-scoped, so released at COMMIT (or
rollback) on whatever backend a pooler gave the transaction."""

LEASE_DDL = (
    "CREATE SEQUENCE IF NOT EXISTS lgr_thread_lease_tokens",
    """
    CREATE TABLE IF NOT EXISTS lgr_thread_leases (
        thread_id text PRIMARY KEY,
        holder text NOT NULL,
        token bigint NOT NULL,
        expires_at timestamptz NOT NULL
    )
    """,
    """
    CREATE OR REPLACE FUNCTION lgr_lease_holds(p_thread text, p_fences jsonb)
    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $lgr$
    DECLARE
        fence jsonb := p_fences -> p_thread;
    BEGIN
        IF fence IS NULL OR fence ->> 'db' IS DISTINCT FROM current_database() THEN
            RETURN true;  -- the writer holds no lease of this database on the thread
        END IF;
        PERFORM 1 FROM lgr_thread_leases
        WHERE thread_id = p_thread AND token = (fence ->> 'token')::bigint
          AND expires_at > now()
        FOR SHARE;
        RETURN FOUND;
    END
    $lgr$
    """,
    """
    CREATE OR REPLACE FUNCTION lgr_fenced(p_thread text, p_fences jsonb)
    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $lgr$
    BEGIN
        IF NOT lgr_lease_holds(p_thread, p_fences) THEN
            RAISE EXCEPTION 'the lease of thread % was taken over or expired', p_thread
                USING ERRCODE = 'LR001', DETAIL = p_thread,
                      HINT = 'another runner owns the thread now; resume it under its lease';
        END IF;
        RETURN true;
    END
    $lgr$
    """,
    """
    CREATE OR REPLACE FUNCTION lgr_acquire(p_thread text, p_holder text, p_ttl float8, p_dead text)
    RETURNS TABLE (token bigint, db text, holder text, expires_in float8)
    LANGUAGE plpgsql VOLATILE AS $lgr$
    #variable_conflict use_column
    BEGIN
        RETURN QUERY
        WITH taken AS (
            INSERT INTO lgr_thread_leases AS l (thread_id, holder, token, expires_at)
            VALUES (p_thread, p_holder, nextval('lgr_thread_lease_tokens'),
                    now() + make_interval(secs => p_ttl))
            ON CONFLICT (thread_id) DO UPDATE
            SET holder = EXCLUDED.holder, token = EXCLUDED.token,
                expires_at = EXCLUDED.expires_at
            WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder OR l.holder = p_dead
            RETURNING l.token
        )
        SELECT taken.token, current_database()::text, NULL::text, NULL::float8 FROM taken
        UNION ALL
        SELECT NULL::bigint, NULL::text, l.holder,
               EXTRACT(EPOCH FROM l.expires_at - now())::float8
        FROM lgr_thread_leases AS l
        WHERE l.thread_id = p_thread AND NOT EXISTS (SELECT 1 FROM taken);
    END
    $lgr$
    """,
)
"""The sequence, the table, the two fence functions and `ACQUIRE`'s (idempotent).
Functions, not inline statements, where planning added most to a call: PL/pgSQL
keeps its plans per server session, which a transaction pooler leaves alone, while
an inline statement is sent unprepared and planned each time."""

SETUP_LOCK_TIMEOUT = "15s"
"""How long a start-up waits for another's DDL (or a lock on our tables) before it
fails with `SetupTimeoutError` instead of hanging."""

SETUP_PREAMBLE = (f"SET LOCAL lock_timeout = '{SETUP_LOCK_TIMEOUT}'", SETUP_LOCK)
"""What every DDL transaction of ours starts with: its lock waits capped, then the
cross-process setup lock."""


def setup_transaction(statements: tuple[str, ...]) -> tuple[str, ...]:
    """`statements` as one bounded DDL transaction's body."""
    return (*SETUP_PREAMBLE, *statements)


ACQUIRE = "SELECT * FROM lgr_acquire(%(thread_id)s, %(holder)s, %(ttl)s::float8, %(dead)s::text)"
"""Take the thread's lease when it is free, expired, ours already (a retry whose
answer was lost) or held by ``dead``, a holder known to have died: one row with the
new ``token``. Else one row naming the ``holder`` and the seconds until its lease
lapses unless renewed (``expires_in``). By ``lgr_acquire`` (`LEASE_DDL`)."""

RENEW = """
UPDATE lgr_thread_leases SET expires_at = now() + make_interval(secs => %(ttl)s)
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE thread_id = %(thread_id)s AND token = %(token)s AND expires_at > now()
RETURNING token
"""
"""Extend a lease still held (no row: it lapsed or was taken over; it stays lost).
Its commit does not wait for the disk (``set_config(..., true)``: this statement's
transaction only): a renewal a server crash loses lets the lease lapse sooner, which
every check reads from the database, so it is safe; it saves a WAL flush per renewal."""

RELEASE = """
DELETE FROM lgr_thread_leases
USING (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE thread_id = %(thread_id)s AND token = %(token)s
RETURNING token
"""
"""Give a lease back; a stale token deletes nothing. Tokens come from a sequence, so
the next holder's is still greater. Not waiting for the disk either: a release a
server crash loses leaves the lease to lapse. Taking a lease does wait (its token
must never be handed out twice, even after a crash: an outside system may fence on
it)."""

FORGET = """
DELETE FROM lgr_thread_leases WHERE thread_id = %(thread_id)s AND holder = %(holder)s
"""
"""Give back whatever lease `holder` took (an acquisition whose answer never came)."""

CHECK = """
SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 AS expires_in
FROM lgr_thread_leases
WHERE thread_id = %(thread_id)s AND token = %(token)s
  AND expires_at > now() + make_interval(secs => %(margin)s)
"""
"""The fence check: a row while the token is current and has more than ``margin``
seconds left (so a write sent right after it cannot land after a takeover)."""

HOLDER_OF = """
SELECT holder, EXTRACT(EPOCH FROM expires_at - now())::float8 AS expires_in
FROM lgr_thread_leases WHERE thread_id = %(thread_id)s AND expires_at > now()
"""
"""Who holds the thread's lease now (no row: nobody); reads only."""
