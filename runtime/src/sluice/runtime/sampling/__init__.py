"""Sampling: logits to next tokens."""
