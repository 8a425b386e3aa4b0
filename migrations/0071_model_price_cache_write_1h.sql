-- A cache write with the 1-hour TTL costs twice the input price, a 5-minute one 1.25 times:
-- every cache write was priced at the 5-minute rate, so a run or tenant using 1-hour caching
-- was costed 37 % low on its writes and its cost budget overspent by as much (the money
-- audit). The price table gets the 1-hour rate, 2 x input for the prices already set (the
-- API's rule); set_model_price takes it as a sixth argument (functions/set_model_price.sql,
-- which drops the five-argument form in the same transaction as it creates the new one, so
-- that the function is never missing, and an older migrate's copy is removed again).
ALTER TABLE runrow.model_price ADD COLUMN cache_write_1h_per_mtok numeric;
UPDATE runrow.model_price SET cache_write_1h_per_mtok = 2 * input_per_mtok;
ALTER TABLE runrow.model_price ALTER COLUMN cache_write_1h_per_mtok SET NOT NULL,
ADD CONSTRAINT model_price_cache_write_1h_nonnegative CHECK (
    cache_write_1h_per_mtok >= 0 AND cache_write_1h_per_mtok < 'Infinity'
);

COMMENT ON COLUMN runrow.model_price.cache_write_1h_per_mtok IS
'USD per million cache-write tokens with the 1-hour TTL (usage.cache_creation.'
'ephemeral_1h_input_tokens); cache_write_per_mtok prices the other cache writes.';

CREATE OR REPLACE VIEW runrow.model_prices AS
SELECT
    p.model,
    p.input_per_mtok,
    p.output_per_mtok,
    p.cache_write_per_mtok,
    p.cache_read_per_mtok,
    p.updated_at,
    p.cache_write_1h_per_mtok
FROM runrow.model_price AS p;
