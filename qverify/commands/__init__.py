"""One module per CLI command; each exposes `register(app)`. Heavy imports stay inside the commands."""
