-- The shop's tables of the flash sale (docs/concurrency-keys.md), beside myjob's.
CREATE TABLE products (
  id    INT PRIMARY KEY,
  stock INT NOT NULL
);
CREATE TABLE orders (
  id         BIGINT AUTO_INCREMENT PRIMARY KEY,
  product    INT NOT NULL,
  status     ENUM('new', 'sold', 'sold_out') NOT NULL DEFAULT 'new',
  handled_at TIMESTAMP(6) NULL
);
