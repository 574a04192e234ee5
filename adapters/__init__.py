"""One module per data store; each serves the Source protocol of topk_middleware.access."""
