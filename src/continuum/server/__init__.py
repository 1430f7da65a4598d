"""The OpenAI-compatible HTTP server (thin: parse, call the engine, format)."""
