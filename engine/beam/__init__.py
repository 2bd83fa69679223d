"""Beam search: its settings, each step's choice, and the beams as forks of the paged KV cache."""
