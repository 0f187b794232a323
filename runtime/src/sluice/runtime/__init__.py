"""Sluice serving runtime. Import nothing heavy here: the operator imports `constants`."""
