"""The model worker: weights, KV pool and the forward+sample step the scheduler calls."""
