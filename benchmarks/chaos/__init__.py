"""The chaos benchmark: the shop task suite and its runner (not part of the wheel)."""
