"""One dialect per SQL store (adapters/sql/dialect.py): only what differs from the others."""
