"""Tidal planning: four tiers of work share the cluster's healthy GPUs; online inference's forecast load
decides how much capacity spot training (tier 3) and offline inference (tier 4) may hold per interval."""
