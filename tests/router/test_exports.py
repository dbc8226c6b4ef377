from __future__ import annotations

import burstsched.config
import burstsched.dispatch
import burstsched.framework
import burstsched.pool
import burstsched.scheduling


def test_public_facades_export_exactly_their_all() -> None:
    for module in (
        burstsched.framework,
        burstsched.config,
        burstsched.scheduling,
        burstsched.pool,
        burstsched.dispatch,
    ):
        public = {name for name in vars(module) if not name.startswith("_")}
        exported = set(module.__all__)
        assert exported <= public, module.__name__
        submodules = {name for name in public if type(vars(module)[name]).__name__ == "module"}
        assert public - submodules - exported == set(), module.__name__
