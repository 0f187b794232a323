"""Process entry points: CLI, launcher, HTTP server, tokenizer manager."""
