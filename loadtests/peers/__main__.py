"""``python -m loadtests.peers``: build (or reuse) every peer router's venv and say where it is."""

from __future__ import annotations

import sys

from loadtests.peers.routers import PEERS
from loadtests.peers.venvs import PeerVenvError, ensure_venv


def main() -> int:
    failed = 0
    for peer in PEERS.values():
        try:
            print(f"{peer.kind}: {peer.package.requirement} in {ensure_venv(peer.package).parent}")
        except PeerVenvError as exc:
            failed += 1
            print(f"{peer.kind}: cannot build {peer.package.requirement}: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
