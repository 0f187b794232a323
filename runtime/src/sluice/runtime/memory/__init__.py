"""KV cache memory: the request->token table, the paged slot allocator, the K/V buffers."""
