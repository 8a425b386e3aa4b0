-- depends: 0074_key_errors
-- The worker's metrics label a model request or its tokens by the run's model only when the
-- operator priced that model: a run's model is the enqueuer's string, so labelling the first 50
-- names a process saw let 50 junk names push the real model into "other" for the life of the
-- process (the metrics audit). The worker reads the priced models through this view, once at
-- start and once a minute (pyworker/worker/metrics.py); it was the auditor's alone. Prices are
-- not secret: the worker already spends by them in acquire_model_call.
GRANT SELECT ON runrow.model_prices TO runrow_worker;
