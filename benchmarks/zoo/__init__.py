"""The victim zoo the attack's defaults are chosen on, its runner and the published reference recipe."""
