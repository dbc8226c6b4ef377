"""The HTTP front: the OpenAI routes, request parsing, keys, limits and refusal while draining."""
