"""Code that runs inside a real vLLM replica (through vLLM's ``--middleware``), for load tests.

Each module here imports the standard library only: vLLM's interpreter imports it as a top-level module
(this folder on its ``PYTHONPATH``), without burstsched installed there.
"""
