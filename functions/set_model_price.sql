-- The five-argument form (before migration 0071) goes: beside this one, a call with five
-- arguments would be ambiguous (42725). Here rather than in 0071, so that an older migrate or
-- install.sql run by mistake on this database cannot leave it behind for good.
DROP FUNCTION IF EXISTS runrow.set_model_price(text, numeric, numeric, numeric, numeric);
-- So does the six-argument form (before migration 0076), for the same reason: a call with five
-- or six arguments would match both it and this one.
DROP FUNCTION IF EXISTS runrow.set_model_price(text, numeric, numeric, numeric, numeric, numeric);

CREATE OR REPLACE FUNCTION runrow.set_model_price(
    model text, input_per_mtok numeric, output_per_mtok numeric, cache_write_per_mtok numeric,
    cache_read_per_mtok numeric, cache_write_1h_per_mtok numeric DEFAULT NULL,
    web_search_per_request numeric DEFAULT NULL, web_fetch_per_request numeric DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    prices numeric[] := ARRAY[
        set_model_price.input_per_mtok, set_model_price.output_per_mtok,
        set_model_price.cache_write_per_mtok, set_model_price.cache_read_per_mtok];
    names text[] := ARRAY['input_per_mtok', 'output_per_mtok', 'cache_write_per_mtok', 'cache_read_per_mtok'];
BEGIN
    PERFORM runrow._require_not_null(set_model_price.model, 'model');
    PERFORM runrow._require_key(set_model_price.model, 'model');
    -- A price is matched by a run's model, which enqueue_run, create_schedule and fork_run refuse
    -- with white space around it: such a price would never apply, a typo that looks set (the SQL
    -- audit). Removing one (all four prices NULL) stored before the rule is still allowed.
    IF set_model_price.input_per_mtok IS NOT NULL AND NOT runrow._model_trimmed(set_model_price.model) THEN
        PERFORM runrow._require_model_trimmed(set_model_price.model);
    END IF;
    -- Nor one holding a control character (no run can name it since migration 0085).
    IF set_model_price.input_per_mtok IS NOT NULL THEN
        PERFORM runrow._require_printable(set_model_price.model, 'model');
    END IF;
    IF array_position(prices, NULL) IS NULL OR prices = ARRAY[NULL, NULL, NULL, NULL]::numeric[] THEN
        FOR i IN 1..4 LOOP
            -- NaN sorts above every number, so it passes < 0; >= 'Infinity' catches it (0065).
            IF prices[i] < 0 OR prices[i] >= 'Infinity' THEN
                RAISE EXCEPTION '% must be a finite number, 0 or more (USD per million tokens), got %',
                    names[i], prices[i]
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
    ELSE
        RAISE EXCEPTION '% must not be NULL (all four prices NULL removes the model''s price)',
            names[array_position(prices, NULL)]
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    IF set_model_price.cache_write_1h_per_mtok < 0 OR set_model_price.cache_write_1h_per_mtok >= 'Infinity' THEN
        RAISE EXCEPTION 'cache_write_1h_per_mtok must be NULL (2 x input_per_mtok) or a finite number, 0 or more, got %',
            set_model_price.cache_write_1h_per_mtok
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_model_price.input_per_mtok IS NULL AND set_model_price.cache_write_1h_per_mtok IS NOT NULL THEN
        RAISE EXCEPTION 'cache_write_1h_per_mtok must be NULL when the price is removed (the four prices NULL)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Server tools, USD per request (migration 0076).
    IF set_model_price.web_search_per_request < 0 OR set_model_price.web_search_per_request >= 'Infinity' THEN
        RAISE EXCEPTION 'web_search_per_request must be NULL (0.01, the documented 10 USD per 1,000 searches) '
            'or a finite number, 0 or more (USD per search), got %', set_model_price.web_search_per_request
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_model_price.web_fetch_per_request < 0 OR set_model_price.web_fetch_per_request >= 'Infinity' THEN
        RAISE EXCEPTION 'web_fetch_per_request must be NULL (0, no fee beyond the tokens) or a finite number, '
            '0 or more (USD per fetch), got %', set_model_price.web_fetch_per_request
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_model_price.input_per_mtok IS NULL AND set_model_price.web_search_per_request IS NOT NULL THEN
        RAISE EXCEPTION 'web_search_per_request must be NULL when the price is removed (the four prices NULL)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_model_price.input_per_mtok IS NULL AND set_model_price.web_fetch_per_request IS NOT NULL THEN
        RAISE EXCEPTION 'web_fetch_per_request must be NULL when the price is removed (the four prices NULL)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF set_model_price.input_per_mtok IS NULL THEN
        DELETE FROM runrow.model_price AS p WHERE p.model = set_model_price.model;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'model "%" has no price to remove', set_model_price.model USING ERRCODE = 'no_data_found';
        END IF;
        RETURN;
    END IF;
    INSERT INTO runrow.model_price AS p (
        model, input_per_mtok, output_per_mtok, cache_write_per_mtok, cache_read_per_mtok, cache_write_1h_per_mtok,
        web_search_per_request, web_fetch_per_request
    )
    VALUES (set_model_price.model, set_model_price.input_per_mtok, set_model_price.output_per_mtok,
            set_model_price.cache_write_per_mtok, set_model_price.cache_read_per_mtok,
            -- The API's rule: a 1-hour cache write costs twice the input price.
            coalesce(set_model_price.cache_write_1h_per_mtok, 2 * set_model_price.input_per_mtok),
            -- The documented prices: web search 10 USD per 1,000 searches, web fetch no fee.
            coalesce(set_model_price.web_search_per_request, 0.01),
            coalesce(set_model_price.web_fetch_per_request, 0))
    ON CONFLICT ON CONSTRAINT model_price_pkey DO UPDATE
    SET input_per_mtok = excluded.input_per_mtok, output_per_mtok = excluded.output_per_mtok,
        cache_write_per_mtok = excluded.cache_write_per_mtok, cache_read_per_mtok = excluded.cache_read_per_mtok,
        cache_write_1h_per_mtok = excluded.cache_write_1h_per_mtok,
        web_search_per_request = excluded.web_search_per_request,
        web_fetch_per_request = excluded.web_fetch_per_request,
        updated_at = now();
END
$fn$;

COMMENT ON FUNCTION runrow.set_model_price(text, numeric, numeric, numeric, numeric, numeric, numeric, numeric) IS
'The operator sets a model''s price in USD per million tokens: input (uncached), output, cache '
'write (5-minute TTL) and cache read, each 0 or more, and the 1-hour cache write '
'(cache_write_1h_per_mtok; NULL: 2 x input, the API''s rule), and USD per server-tool request '
'on top of the tokens: web_search_per_request (NULL: 0.01, the documented 10 USD per 1,000 '
'searches) and web_fetch_per_request (NULL: 0, no fee beyond the tokens); 0 leaves one unpriced. '
'Costs are settled with the price in force when a step is appended (append_step) or a response '
'paid for (record_usage), the 1-hour price for usage.cache_creation.ephemeral_1h_input_tokens, '
'the request prices for usage.server_tool_use.web_search_requests / web_fetch_requests; a run '
'with a cost_budget whose model has no price gets no model request. All four NULL (and the '
'optional prices NULL) removes the price; P0002 when there is none. Bad input (NULL or '
'over-long model, or one with white space at either end as enqueue_run refuses it (a price is '
'still removed by such a name); one price NULL, a negative or infinite price) raises '
'22004/22023 naming the argument and writes nothing.';

REVOKE ALL ON FUNCTION runrow.set_model_price(
    text, numeric, numeric, numeric, numeric, numeric, numeric, numeric
) FROM PUBLIC;
