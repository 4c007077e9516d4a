-- Rate limits (`rate_limit = "N/PERIOD"` on a queue): the queue's theoretical arrival time of
-- the generic cell rate algorithm, in microseconds since the epoch by the database's clock
-- (UTC_TIMESTAMP), shared by every instance and host that serves the queue. NULL: no
-- rate-limited job of the queue has started yet. A column added to a table of a few rows.
ALTER TABLE myjob_queues ADD COLUMN rate_tat BIGINT NULL DEFAULT NULL;
