"""Hooks that route other libraries' attention through the fused operator."""
