-- depends: 0022_journal_seq_assigned
-- trim_journal takes max_runs (functions/trim_journal.sql): a backlog of ended runs is trimmed
-- oldest first in bounded calls instead of one transaction. Measured (bench/trim.py, issue 11):
-- one call trimmed 200,000 runs (5.2 M journal rows) in 97.5 s, growing linearly, so about 8
-- minutes for 1 M: past a worker's statement_timeout (300 s at the default lease), the
-- reaper's trim would roll back on every pass and never catch up, and the long transaction
-- would hold back vacuum meanwhile. The one-argument form is dropped so calls by name or
-- with one argument resolve to the new function alone.
DROP FUNCTION IF EXISTS runrow.trim_journal(interval);
