-- Which database servers are alive, as their reapers see them. Every reaper stamps the server
-- it is connected to (`host:port/start`, as in myjob_jobs.owner_server) at each pass. A claim
-- made through another server whose row has gone stale belongs to connections that are all
-- gone (a primary replaced after a failover, a server restarted under a new name), so the
-- reaper of the server now answering puts it back. One row per server start: a few rows.
CREATE TABLE IF NOT EXISTS myjob_servers (
  server        VARCHAR(255)  NOT NULL,
  heartbeat_at  TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (server)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
