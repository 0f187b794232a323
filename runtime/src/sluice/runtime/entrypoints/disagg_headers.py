"""The headers by which `sluice router --pd-disaggregation` pairs a prefill and a decode
server on one request (`constants.DISAGG_BOOTSTRAP_HEADER`, `DISAGG_ROOM_HEADER`)."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.runtime.constants import DISAGG_BOOTSTRAP_HEADER, DISAGG_ROOM_HEADER
from sluice.runtime.entrypoints.errors import ProtocolError
from sluice.runtime.ipc.messages import DisaggHandoff

ROOM_LIMIT = 2**63  # rooms are signed 64-bit on the wire


def handoff_of(headers: Mapping[str, str], mode: str) -> DisaggHandoff | None:
    """The request's transfer on a `mode` ("prefill"/"decode") server; None on a server
    that serves whole requests ("null"). A request whose headers do not fit the server's
    mode is refused (400)."""
    bootstrap = headers.get(DISAGG_BOOTSTRAP_HEADER)
    room = headers.get(DISAGG_ROOM_HEADER)
    if mode == "null":
        if bootstrap is not None or room is not None:
            raise ProtocolError(
                f"This server serves whole requests (--disaggregation-mode null); the "
                f"{DISAGG_BOOTSTRAP_HEADER} and {DISAGG_ROOM_HEADER} headers are for P/D servers.",
                code="not_disaggregated",
            )
        return None
    if bootstrap is None or room is None:
        raise ProtocolError(
            f"This is a P/D {mode} server: it serves requests that `sluice router "
            f"--pd-disaggregation` sends, with the {DISAGG_BOOTSTRAP_HEADER} and "
            f"{DISAGG_ROOM_HEADER} headers.",
            code="disaggregated_server",
        )
    host, sep, port = bootstrap.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProtocolError(f"{DISAGG_BOOTSTRAP_HEADER} {bootstrap!r} is not host:port.",
                            code="invalid_bootstrap")  # fmt: skip
    if not room.isdigit() or int(room) >= ROOM_LIMIT - 1024:
        raise ProtocolError(f"{DISAGG_ROOM_HEADER} {room!r} is not an integer in [0, 2**63 - 1024).",
                            code="invalid_bootstrap")  # fmt: skip
    return DisaggHandoff(bootstrap, int(room))
