from __future__ import annotations

import burstsched.tokenization as tokenization


def test_public_api_is_exactly_all() -> None:
    public = {
        name
        for name in vars(tokenization)
        if not name.startswith("_") and not isinstance(getattr(tokenization, name), type(tokenization))
    }
    assert set(tokenization.__all__) == public
