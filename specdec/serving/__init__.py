"""The OpenAI-compatible server: protocol, async engine loop, routes, metrics."""
