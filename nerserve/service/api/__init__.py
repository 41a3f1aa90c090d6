"""HTTP layer: schemas, error table, routes."""
