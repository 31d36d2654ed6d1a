"""learned."""
