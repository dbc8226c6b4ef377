from __future__ import annotations

import burstsched.sim as sim


def test_public_api_is_exactly_all() -> None:
    public = {
        name
        for name in vars(sim)
        if not name.startswith("_") and not isinstance(getattr(sim, name), type(sim))
    }
    assert set(sim.__all__) == public
    assert {"SimConfig", "SimPool", "Faults"} <= set(sim.__all__)
