"""A stand-in for the Hugging Face Hub's revision API, for the operator's revision pins.

Serves `GET /api/models/{org}/{name}/revision/{revision}` as the Hub does (200 with the
commit `sha`, 401 for a gated repo without the right token, 404 for an unknown repository),
from a thread on 127.0.0.1. Every repository exists with a deterministic commit per
branch until a test `push`es a new one; `gate` makes a repository need a token."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

MISSING = "missing/"  # repositories whose name starts with this do not exist


class FakeHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pushes: dict[tuple[str, str], int] = {}
        self._gated: dict[str, str] = {}
        self.requests: list[dict[str, Any]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                status, body = hub._answer(self.path, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def sha(self, repo: str, revision: str = "main") -> str:
        """The commit `revision` names now."""
        with self._lock:
            pushes = self._pushes.get((repo, revision), 0)
        return hashlib.sha1(f"{repo}@{revision}#{pushes}".encode()).hexdigest()

    def push(self, repo: str, revision: str = "main") -> str:
        """A new commit on `revision`; returns it."""
        with self._lock:
            self._pushes[(repo, revision)] = self._pushes.get((repo, revision), 0) + 1
        return self.sha(repo, revision)

    def gate(self, repo: str, token: str) -> None:
        with self._lock:
            self._gated[repo] = token

    def resolved(self, repo: str) -> int:
        """How many revision requests for `repo` were answered."""
        with self._lock:
            return sum(1 for r in self.requests if r["repo"] == repo)

    def _answer(self, path: str, authorization: str) -> tuple[int, dict[str, Any]]:
        parts = path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 6 or parts[:2] != ["api", "models"] or parts[4] != "revision":
            return 404, {"error": "Not Found"}
        repo, revision = f"{parts[2]}/{parts[3]}", unquote(parts[5])
        with self._lock:
            self.requests.append({"repo": repo, "revision": revision, "auth": authorization})
            token = self._gated.get(repo)
        if token is not None and authorization != f"Bearer {token}":
            return 401, {"error": "Access to model is restricted."}
        if repo.startswith(MISSING):
            return 404, {"error": "Repository Not Found"}
        return 200, {"id": repo, "sha": self.sha(repo, revision)}
