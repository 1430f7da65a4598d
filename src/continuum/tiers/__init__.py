"""The reuse tiers, one module each: memo, prefix_kv, layer_kv (semantic and memory_graph come
with their own issue). A tier knows keys, tokens and handles; it never calls a backend."""
