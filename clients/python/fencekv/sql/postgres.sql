-- fencekv's fence for data kept in PostgreSQL (12 or later).
--
-- One row per protected resource holds the highest fencing token a
-- transaction of that resource presented. A writer checks its token and
-- raises the fence in one statement, inside the same transaction as its
-- write; a token below the fence is refused and that transaction must not
-- commit. Apply this file with psql or any migration tool; it can be
-- applied again (every statement is idempotent).

CREATE TABLE IF NOT EXISTS fencekv_fences (
    -- The resource's name: usually the fencekv lock's name.
    resource text PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 1024),
    -- The highest token accepted (a fencekv token, 1 to 2^63-1).
    token bigint NOT NULL CHECK (token > 0)
);

-- fencekv_fence(resource, token) checks token against the resource's fence
-- and raises the fence to it, in the caller's transaction. It returns the
-- token when it is not below the fence (an equal token is the same holder
-- again). A stale token raises SQLSTATE FK001 (class FK, "fencekv"), with
-- the message 'stale_token: RESOURCE is fenced at FENCE; token TOKEN
-- refused' and DETAIL 'fence=FENCE token=TOKEN': any driver sees the error,
-- and PostgreSQL will not commit a transaction that raised it. A token of
-- 0 or below, or a NULL, raises SQLSTATE 22023 (invalid_parameter_value).
--
-- The upsert takes the resource's row lock, also when the token is stale:
-- a newer holder's check waits until this transaction ends, so the rule
-- holds under READ COMMITTED as under REPEATABLE READ and SERIALIZABLE.
CREATE OR REPLACE FUNCTION fencekv_fence(p_resource text, p_token bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    current bigint;
BEGIN
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('bad_request: fencing token %s: want 1 to 9223372036854775807', coalesce(p_token::text, 'NULL'));
    END IF;
    INSERT INTO fencekv_fences AS f (resource, token)
    VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token
        WHERE f.token <= excluded.token
    RETURNING f.token INTO current;
    IF NOT FOUND THEN
        SELECT f.token INTO current FROM fencekv_fences AS f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'FK001',
            MESSAGE = format('stale_token: %s is fenced at %s; token %s refused', p_resource, current, p_token),
            DETAIL = format('fence=%s token=%s', current, p_token);
    END IF;
    RETURN current;
END
$$;
