-- agent_run is a queue table with a long history: a small hot set (queued and running runs)
-- churns on top of a large cold one. The default triggers (vacuum after 20% of the table is
-- dead, analyze after 10% changed) fire rarer and rarer as history grows: with 1 M finished
-- runs a vacuum waits for 200 k dead row versions. Until it runs, every claimed or finished
-- run leaves dead entries in the partial indexes of live runs, and the claim's walk of
-- agent_run_claimable reads past those at the head of the queue (measured: about 3 buffers
-- per claim for each 1 000 runs finished since the last vacuum, 60 with 20 000). Fixed
-- thresholds bound that by traffic, not by history. The claim's plan does not depend on
-- these settings or on fresh statistics (see functions/_claim.sql); they only keep the
-- dead entries it reads past few.
-- depends: 0007_step_usage

ALTER TABLE runrow.agent_run SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 2000
);
