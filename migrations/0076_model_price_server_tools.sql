-- depends: 0075_worker_reads_model_prices
-- Server tools are billed per request on top of their tokens: web search at $10 per 1,000
-- searches (usage.server_tool_use.web_search_requests); web fetch has no fee beyond its tokens
-- (web_fetch_requests). Costs were settled from tokens alone, so a run or tenant using web
-- search was costed low and its cost budget overspent (the audit: 50 searches, 0.50 USD billed,
-- 0.000225 USD counted). The price table gets a price per request of each, set by the operator
-- with set_model_price (two optional arguments, functions/set_model_price.sql, which drops the
-- six-argument form as it creates the new one). The prices already set get the documented ones,
-- 0.01 and 0, as set_model_price gives a NULL argument: a budget errs on the side of not
-- overspending, and an operator who never heard of the fee is no longer undercounted by it.
-- Each finite and 0 or more, the CHECK pattern of 0065 (NaN sorts above every number).
-- A column with a constant default is added without a rewrite; the CHECKs are validated as they
-- are added (one row per model).
ALTER TABLE runrow.model_price
ADD COLUMN web_search_per_request numeric NOT NULL DEFAULT 0.01
CONSTRAINT model_price_web_search_nonnegative CHECK (
    web_search_per_request >= 0 AND web_search_per_request < 'Infinity'
),
ADD COLUMN web_fetch_per_request numeric NOT NULL DEFAULT 0
CONSTRAINT model_price_web_fetch_nonnegative CHECK (
    web_fetch_per_request >= 0 AND web_fetch_per_request < 'Infinity'
);

COMMENT ON TABLE runrow.model_price IS
'USD per million tokens by model, and USD per server-tool request, filled by operators '
'(set_model_price); cost budgets and the spend views read it when append_step settles a step.';
COMMENT ON COLUMN runrow.model_price.web_search_per_request IS
'USD per web search (usage.server_tool_use.web_search_requests), on top of the tokens; the '
'documented price is 0.01 (10 USD per 1,000 searches).';
COMMENT ON COLUMN runrow.model_price.web_fetch_per_request IS
'USD per web fetch (usage.server_tool_use.web_fetch_requests), on top of the tokens; the '
'documented price is 0 (no fee beyond the tokens).';

CREATE OR REPLACE VIEW runrow.model_prices AS
SELECT
    p.model,
    p.input_per_mtok,
    p.output_per_mtok,
    p.cache_write_per_mtok,
    p.cache_read_per_mtok,
    p.updated_at,
    p.cache_write_1h_per_mtok,
    p.web_search_per_request,
    p.web_fetch_per_request
FROM runrow.model_price AS p;

COMMENT ON VIEW runrow.model_prices IS
'The price table (set_model_price): USD per million tokens, and USD per request of the server '
'tools (web search, web fetch).';
