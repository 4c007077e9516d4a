-- myjob lock on a server's named locks. The server frees a named lock the moment its holder's
-- connection dies, while the holder learns of it only at its next check (once a second, each
-- given 5 s to answer) and then gives its command --kill-grace to stop: a new holder that
-- started its command at once would run beside it for those seconds. So while it holds a
-- named lock, a holder keeps a row here, and deletes it when it releases the lock itself. A
-- new holder that finds a row left behind waits out that row's stop_within_ms (the check,
-- its answer and the old holder's grace) before it starts its command; a lock released by
-- its holder passes on at once. A Galera lease leaves the column 0: it keeps its own margin.
ALTER TABLE myjob_locks
  ADD COLUMN stop_within_ms BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER renewed_at;
