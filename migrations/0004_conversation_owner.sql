-- Conversations belong to the user who started them. The HTTP service scopes every
-- request to one user; this makes "a run of another user's conversation" unrepresentable
-- instead of a check someone could forget.

CREATE TABLE runrow.conversation (
    id uuid PRIMARY KEY,
    user_id text CHECK (user_id <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE runrow.conversation IS
'One row per conversation, created by its first enqueue_run: its owner (user_id, NULL for '
'anonymous use). Every run of the conversation has the same user_id (trigger); the owner '
'never changes.';

INSERT INTO runrow.conversation (id, user_id, created_at)
SELECT DISTINCT ON (a.conversation_id)
    a.conversation_id,
    a.user_id,
    a.created_at
FROM runrow.agent_run AS a
ORDER BY a.conversation_id ASC, a.enqueue_seq ASC;

ALTER TABLE runrow.agent_run
ADD CONSTRAINT agent_run_conversation_fk FOREIGN KEY (conversation_id)
REFERENCES runrow.conversation (id);

CREATE FUNCTION runrow._run_owner_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    IF NEW.user_id IS DISTINCT FROM (
        SELECT c.user_id FROM runrow.conversation AS c WHERE c.id = NEW.conversation_id
    ) THEN
        RAISE EXCEPTION 'run %: user % does not own conversation %', NEW.id, NEW.user_id, NEW.conversation_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER agent_run_owner_guard
BEFORE INSERT ON runrow.agent_run
FOR EACH ROW EXECUTE FUNCTION runrow._run_owner_guard();

CREATE FUNCTION runrow._conversation_immutable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    RAISE EXCEPTION 'conversation %: the owner of a conversation never changes and conversations are never deleted',
        OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

CREATE TRIGGER conversation_immutable
BEFORE UPDATE OR DELETE ON runrow.conversation
FOR EACH ROW EXECUTE FUNCTION runrow._conversation_immutable();

REVOKE ALL ON runrow.conversation FROM PUBLIC;
GRANT SELECT ON runrow.conversation TO runrow_auditor;
