-- myjob lock on a Galera cluster. A node keeps GET_LOCK's named locks to itself, so there a
-- lock is a lease row instead, replicated like any row: its holder renews it every second,
-- and another may take it over only once it has gone unrenewed for the lease's length. Two
-- nodes that try at once are sorted out by the cluster's certification: one commit wins.
-- Elsewhere myjob lock uses GET_LOCK and never reads this table.
CREATE TABLE IF NOT EXISTS myjob_locks (
  -- The lock's name; case-insensitive, as GET_LOCK's names are.
  name        VARCHAR(64)     CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,
  -- A random number the holder chose; every renewal and the release are fenced by it.
  holder      BIGINT UNSIGNED NOT NULL,
  -- host:pid of the holder, and its CONNECTION_ID() on its node, for people reading the table.
  held_by     VARCHAR(255)    NOT NULL DEFAULT '',
  owner_conn  BIGINT UNSIGNED NULL DEFAULT NULL,
  renewed_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
