"""Fault injection against our own infrastructure: nothing lost, nothing doubled."""
