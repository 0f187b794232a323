"""Sluice Kubernetes operator."""
