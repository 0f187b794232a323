"""Attention backends behind one interface (see `base.AttentionBackend`)."""
