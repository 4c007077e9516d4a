-- Lanes: on a Galera cluster, instances that claim one queue through different nodes take
-- different parts of its head, so that their claims seldom write the same rows (a write of one
-- row through two nodes at once is a certification conflict, and one of them is rolled back).
-- A row per queue and instance that claims jobs of it, with the node it claims through,
-- stamped within a couple of seconds of each claim: the instances seen lately are the queue's
-- lanes, and each takes the jobs whose CRC32(id) modulo their number is its place among them. Written on a
-- Galera node only; the primary key is NOT NULL throughout, so an instance certifies its own
-- rows only.
CREATE TABLE IF NOT EXISTS myjob_lanes (
  queue    VARBINARY(64) NOT NULL,
  server   VARCHAR(255)  NOT NULL,
  worker   VARCHAR(255)  NOT NULL,
  seen_at  TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (queue, server, worker)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
