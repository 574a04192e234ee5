"""Private top-k mechanisms. Each reads the data store only through a CountedAccess."""
