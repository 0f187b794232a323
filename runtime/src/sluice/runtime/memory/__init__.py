"""KV cache memory: request rows, the paged slot allocator, the prefix cache, the K/V buffers."""
