"""Batch scheduling: admission, decode set, retraction and the event loop."""
