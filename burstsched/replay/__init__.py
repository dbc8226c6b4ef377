"""Replaying recorded traffic on the simulator through one or more router configs (``burstsched replay``)."""
