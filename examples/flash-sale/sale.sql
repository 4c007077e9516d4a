-- A sale to try the flash sale with (after schema.sql and myjob's migrate, in the same
-- database): 10 products of 10 units each, 1,000 orders across them as the web requests would
-- record them, the products interleaved, and a job per order in the order they came. With the
-- queue of myjob.toml, exactly 100 orders are sold, the first 10 of each product.
INSERT INTO products (id, stock) VALUES
  (1, 10), (2, 10), (3, 10), (4, 10), (5, 10), (6, 10), (7, 10), (8, 10), (9, 10), (10, 10);
INSERT INTO orders (product)
  SELECT (h.d * 100 + t.d * 10 + u.d) % 10 + 1
  FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
        UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8
        UNION ALL SELECT 9) AS h
  CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
        UNION ALL SELECT 8 UNION ALL SELECT 9) AS t
  CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
        UNION ALL SELECT 8 UNION ALL SELECT 9) AS u
  ORDER BY h.d, t.d, u.d;
INSERT INTO myjob_jobs (queue, concurrency_key, payload)
  SELECT 'orders', CONCAT('product-', product), id FROM orders ORDER BY id;
