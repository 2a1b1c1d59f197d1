"""Whether this machine lets a test open local TCP sockets: torch.distributed's gloo backend
(the FSDP2 and torchrun tests) rendezvous over one; some sandboxes forbid them."""

from __future__ import annotations

import socket


def sockets_allowed() -> bool:
    """True where a socket can listen on ``127.0.0.1``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
        return True
    except OSError:
        return False
