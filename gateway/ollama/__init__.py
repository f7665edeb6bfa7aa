"""Ollama's API (/api/chat, /api/generate, /api/embed, ...) on the gateway: protocol (request fields) -> serving
(onto the same jobs as chat completions) -> router (the Starlette routes), with errors in Ollama's shape."""
