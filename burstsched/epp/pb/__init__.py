"""Envoy's ext_proc messages as the picker uses them, generated from ``ext_proc.proto`` (see there)."""
