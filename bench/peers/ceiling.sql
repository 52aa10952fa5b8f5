-- The database's own ceiling for bench/throughput.py (pgbench -M prepared -D batch=N): what a queue's worker
-- must do for a batch of jobs, with no worker. Claim :batch queued jobs (FOR UPDATE SKIP LOCKED, committed,
-- as any queue commits a claim before the work), then mark them done in a second transaction. The claimed ids are
-- an array (`id = ANY(ARRAY(...))`): written `id IN (SELECT ...)`, the planner hash-semi-joined the subquery over
-- the whole table on every claim, which halved the ceiling (54k against 116k jobs/s with one client).
WITH claimed AS (
    UPDATE ceiling_jobs SET state = 1
    WHERE id = ANY(ARRAY(SELECT id FROM ceiling_jobs WHERE state = 0 ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED))
    RETURNING id)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \gset
UPDATE ceiling_jobs SET state = 2 WHERE id = ANY(:ids::bigint[]);
