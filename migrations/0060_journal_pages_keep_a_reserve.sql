-- depends: 0059_webhook_delivery_rules_validated
-- The journal's pages are filled to 95%, not to the last byte. VACUUM records the few hundred
-- bytes at the end of every page that the enqueue's rows left in the free space map, and a
-- later journal row small enough to fit took one of those tails: a page nobody had touched
-- since the last checkpoint, so its one new row was logged with a full image of the page
-- (8 kB of WAL for a row of about 150 bytes). With a reserve, a page is offered for a row
-- only when it has room for the row and the reserve, which a tail never has, and journal rows
-- go to the table's end, where a new page needs no image (bench/wal_history.py: 0.040 images
-- per run on run_event before, 0.0002 after; issue 11). The cost is 5% more pages for the
-- journal. Only pages filled from now on keep the reserve; setting it takes SHARE UPDATE
-- EXCLUSIVE, which journal writers do not wait for.

ALTER TABLE runrow.run_event SET (fillfactor = 95);
