"""vigil_eval."""
