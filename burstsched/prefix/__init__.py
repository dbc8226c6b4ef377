"""How prefixes are named: block hashes of prompts (approximate index) and vLLM's KV-cache event format."""
