"""OpenAI wire shapes that the front, dispatch and the simulator share: error bodies and SSE."""
