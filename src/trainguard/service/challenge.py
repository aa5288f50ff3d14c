"""The proof a server gives that it holds a token, before the CLI sends it that token.
Stdlib only: the CLI's client imports it without the server's settings (pydantic)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress


def challenge_proof(token: str, nonce: str, host: str, port: int) -> str:
    """What a server holding `token` answers to `nonce` on the socket (host, port) the
    client reached: the CLI sends a home's token only to the server that proves it.

    The address is in the proof, so a listener elsewhere that relays the challenge to
    the real server gets a proof for the real server's address, which the CLI refuses.
    """
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(host.split("%", 1)[0])
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        host = str(mapped or ip)  # a dual-stack socket sees 127.0.0.1 as ::ffff:127.0.0.1
    message = f"trainguard-challenge|{nonce}|{host}|{port}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()
