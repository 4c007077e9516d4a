-- The shop's tables of the flash sale (README, "Concurrency keys"), beside myjob's.
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
