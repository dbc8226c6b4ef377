"""Workloads that measure a pool through any OpenAI-compatible URL (burstsched, another router, a replica).

Each takes the URL requests go to and the replicas' base URLs, whose ``/metrics`` deltas attribute and
account for every request, so the same code measures simulated and real vLLM pools alike.
"""
