-- depends: 0063_journal_lookups_never_jit
-- A tenant's fairness weight is at least 0.001 (it was any value above 0). The claim advances a
-- tenant's virtual time by 1 / weight per run; a weight of 1e-320 (a denormal, which
-- set_fairness_weight accepted) made that 1e320, a double precision overflow, and every claim
-- that weighed that tenant against another raised 22003 inside _claim_walk: no worker claimed
-- anything, of any tenant, until the weight was reset. The floor mirrors the ceiling (1000): at
-- most a 10^6 : 1 share between two tenants, and 1 / weight at most 1000 a run. A weight set
-- below it before this migration is raised to it.

UPDATE runrow.fairness_tenant SET weight = 0.001, updated_at = now()
WHERE weight < 0.001;

ALTER TABLE runrow.fairness_tenant
DROP CONSTRAINT fairness_tenant_weight_check,
ADD CONSTRAINT fairness_tenant_weight_check CHECK (weight >= 0.001 AND weight <= 1000);
