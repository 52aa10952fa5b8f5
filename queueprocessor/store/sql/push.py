"""Coalesced push on PostgreSQL (docs/design.md §5): the commits that make work due send at most one NOTIFY per
PUSH_EVERY between them, however many writers commit, instead of one each.

A commit with a pending notification takes a lock that every other such commit of the server waits for (PostgreSQL's
PreCommit_Notify), so a NOTIFY per enqueue serialised many writers (a trigger enqueuing for each row of a busy log
table). So:

- An insert of a queued job queues, once per transaction (the trigger's WHEN sets FLAG, a setting local to the
  transaction, as it lets the first one through: a row of a bulk insert costs two calls of built-in functions), a
  deferred constraint trigger that runs qp_push() as the transaction commits, its last act; a release of a waiting
  job (a parent's finish, store/dependencies.py) calls qp_push() at the end of the finish's transaction.
- qp_push() notifies only if the farm's last notice is PUSH_EVERY old or more (database time), taking the one row of
  qp_push with FOR UPDATE SKIP LOCKED: a writer never waits for another, as a row locked is a commit notifying now.
- A writer that skipped its notice so commits within PUSH_EVERY of a notice sent, or while one is being sent: the
  node that answered that notice claims once more FOLLOW_UP later (node/push.py), and sees its job then. Deciding at
  commit rather than at the insert bounds that gap whatever else the writer's transaction goes on to do.
- Under REPEATABLE READ or SERIALIZABLE a writer always notifies: locking a row changed since its snapshot would
  fail its commit.

qp_push is a logged table: written at most 1/PUSH_EVERY times a second, one small in-place update each (under a
kilobyte of WAL), it costs nothing worth an unlogged table's price, which is to be emptied by a crash (and so to need
making again by whoever notifies next) and missing on a promoted standby.
"""

from .ddl import quoted

JOBS_CHANNEL = "qp_jobs"
PUSH_EVERY = 0.01  # seconds: the least time between two notices of the farm's commits
FLAG = "qp.push"  # local to the transaction: its first queued job has queued the commit's push


def push_ddl(farm_schema: str) -> str:
    """Make (again) the throttle row, qp_push(), and the trigger that runs it as an insert's transaction commits; drop
    the trigger of schema 12 and before (a NOTIFY for every insert statement). In `farm_schema`, as sqlfunctions'
    qp_enqueue. qp_push() runs with its owner's rights: a role granted only qp_enqueue, or a node's role, may read when
    the last notice went (the trigger looks, with its caller's rights, before it calls qp_push: most commits stop
    there, without the price of a change of rights) but not write it. Anyone may call qp_push(): at worst it sends
    the notice the farm would have sent."""
    s = quoted(farm_schema)
    return f"""
CREATE TABLE IF NOT EXISTS {s}.qp_push (id smallint PRIMARY KEY CHECK (id = 1), notified_at double precision NOT NULL);
INSERT INTO {s}.qp_push (id, notified_at) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION {s}.qp_push() RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $qp_push$
DECLARE
    v_now double precision := extract(epoch FROM clock_timestamp());
    v_last double precision;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('{JOBS_CHANNEL}', '');
        RETURN;
    END IF;
    SELECT notified_at INTO v_last FROM {s}.qp_push WHERE id = 1;  -- most writers stop here: a notice was just sent
    IF v_last > v_now - {PUSH_EVERY} AND v_last <= v_now THEN
        RETURN;
    END IF;
    UPDATE {s}.qp_push SET notified_at = v_now WHERE id = (
        SELECT id FROM {s}.qp_push
        WHERE id = 1 AND (notified_at <= v_now - {PUSH_EVERY} OR notified_at > v_now)  -- or the clock stepped back
        FOR UPDATE SKIP LOCKED
    );
    IF FOUND THEN
        PERFORM pg_notify('{JOBS_CHANNEL}', '');
    END IF;
END
$qp_push$;
CREATE OR REPLACE FUNCTION {s}.qp_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $qp_jobs_notify$
DECLARE
    v_now double precision := extract(epoch FROM clock_timestamp());
BEGIN
    -- most commits stop here, with their caller's rights: a notice was just sent
    IF NOT EXISTS (SELECT FROM {s}.qp_push WHERE notified_at > v_now - {PUSH_EVERY} AND notified_at <= v_now) THEN
        PERFORM {s}.qp_push();
    END IF;
    RETURN NULL;
END
$qp_jobs_notify$;
GRANT SELECT ON {s}.qp_push TO PUBLIC;
DROP TRIGGER IF EXISTS qp_jobs_notify ON {s}.qp_jobs;
DROP TRIGGER IF EXISTS qp_jobs_push ON {s}.qp_jobs;
CREATE CONSTRAINT TRIGGER qp_jobs_push AFTER INSERT ON {s}.qp_jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
WHEN (CASE WHEN NEW.state <> 'queued' OR pg_catalog.current_setting('{FLAG}', true) = 'on' THEN false
      ELSE pg_catalog.set_config('{FLAG}', 'on', true) = 'on' END)
EXECUTE FUNCTION {s}.qp_jobs_notify();
"""
