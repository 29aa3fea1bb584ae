-- fencekv's fence for data kept in SQLite (3.24 or later).
--
-- One row per protected resource holds the highest fencing token a
-- transaction of that resource presented. A writer checks its token and
-- raises the fence in one statement, inside the same transaction as its
-- write:
--
--   INSERT INTO fencekv_fences (resource, token) VALUES (?, ?)
--   ON CONFLICT (resource) DO UPDATE SET token = excluded.token
--       WHERE fencekv_fences.token <= excluded.token
--   RETURNING token;                       -- 3.35 or later
--
-- One row changed (or returned) means the token holds; none means it is
-- below the fence and the transaction must roll back. Before 3.35, use
-- changes() after the upsert instead of RETURNING. SQLite has one writer
-- at a time: begin the transaction with BEGIN IMMEDIATE so that it takes
-- the write lock before it reads what it will change.

CREATE TABLE IF NOT EXISTS fencekv_fences (
    resource TEXT PRIMARY KEY CHECK (length(CAST(resource AS BLOB)) BETWEEN 1 AND 1024),
    token INTEGER NOT NULL CHECK (token > 0)
);
