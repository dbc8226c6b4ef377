"""The server process: uvicorn with a guarded HTTP protocol, signals, and the ``serve`` command."""
