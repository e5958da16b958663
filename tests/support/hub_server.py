"""A stand-in Hugging Face hub: a real HTTP server with the few endpoints huggingface_hub's downloads call.

- GET /api/models/{owner}/{name}/revision/{revision}   the listing (HfApi.model_info, files_metadata=True)
- HEAD|GET /{owner}/{name}/resolve/{revision}/{path}    a file, with ETag / X-Repo-Commit / X-Linked-* headers and
                                                        Range requests (206), as the hub answers them

Errors answer as the hub does (404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound, 401 for a
private repo without its token), so huggingface_hub raises its own exceptions. Knobs for the tests, per file:
`cut[path] = n` sends n bytes of the body and drops the connection, then answers 500 until `cut` is cleared (a
download that breaks off); `gate[path] = (n, event)` sends n bytes and waits for the event before the rest (a slow
download a test can watch without sleeping); `corrupt` serves flipped bytes. Every request is logged in `requests`.
Used by tests/turingbox/model/test_hub.py and tests/turingbox/serve/test_serve_hub_download.py (`from tests.support.hub_server import FakeHub`).
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


_FLIP = bytes(255 - b for b in range(256))


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    lfs: set[str]
    commit: str
    refs: dict[str, str]
    token: str | None = None                   # private: requests need "Authorization: Bearer <token>"

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if path in self.lfs else git_blob_id(data)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    cut: dict[str, int] = field(default_factory=dict)
    gate: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)

    def add_repo(self, repo_id: str, files: dict[str, bytes], lfs: tuple[str, ...] = (), revision: str = "main",
                 token: str | None = None) -> str:
        """Publish files as one commit of repo_id (the commit id is a hash of the content); returns the commit."""
        h = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        commit = h.hexdigest()
        self.repos[repo_id] = Repo(dict(files), set(lfs), commit, {revision: commit}, token)
        return commit

    def gets(self, path_suffix: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and unquote(r.path.split("?")[0]).endswith(path_suffix)]

    # -- the server

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, "GET")

            def do_HEAD(self) -> None:
                hub._handle(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-hub")
        self.thread.start()
        return self

    def close(self) -> None:
        for _, event in self.gate.values():
            event.set()
        self.server.shutdown()
        self.server.server_close()

    # -- answers

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        try:
            self._answer(h, method)
        except (BrokenPipeError, ConnectionResetError):       # the client went away (a test stopped it)
            h.close_connection = True

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append(Request(method, h.path, {k.lower(): v for k, v in h.headers.items()}))
        path = unquote(urlparse(h.path).path)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m and method == "GET":
            return self._listing(h, m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._file(h, method, m.group(1), m.group(2), m.group(3))
        self._error(h, 404, "", "no such endpoint")

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str,
               commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _repo(self, h: BaseHTTPRequestHandler, repo_id: str, revision: str) -> tuple[Repo | None, str | None]:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.token and h.headers.get("Authorization") != f"Bearer {repo.token}"):
            self._error(h, 401 if repo is not None else 404, "RepoNotFound", "Repository not found")
            return None, None
        commit = repo.refs.get(revision) or (revision if revision == repo.commit else None)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None, None
        return repo, commit

    def _listing(self, h: BaseHTTPRequestHandler, repo_id: str, revision: str) -> None:
        repo, commit = self._repo(h, repo_id, revision)
        if repo is None:
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            s = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name in repo.lfs:
                s["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(s)
        body = json.dumps({"_id": "x", "id": repo_id, "modelId": repo_id, "sha": commit, "private": bool(repo.token),
                           "siblings": siblings}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _file(self, h: BaseHTTPRequestHandler, method: str, repo_id: str, revision: str, name: str) -> None:
        repo, commit = self._repo(h, repo_id, revision)
        if repo is None:
            return
        if name not in repo.files:
            return self._error(h, 404, "EntryNotFound", f"{name} does not exist", commit)
        data = repo.files[name]
        if name in self.corrupt:
            data = data.translate(_FLIP)
        etag = repo.etag(name)
        start = 0
        rng = h.headers.get("Range")
        if method == "GET" and name in self.cut and rng:      # still broken: the retry fails too
            return self._error(h, 500, "", "the hub broke down")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            start = int(m.group(1)) if m else 0
        status = 206 if start else 200
        h.send_response(status)
        h.send_header("X-Repo-Commit", commit)
        h.send_header("ETag", f'"{git_blob_id(repo.files[name])}"')
        if name in repo.lfs:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if method == "HEAD":
            return
        body = data[start:]
        if name in self.cut:
            n = max(0, self.cut[name] - start)
            h.wfile.write(body[:n])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if name in self.gate:
            n, event = self.gate[name]
            n = max(0, n - start)
            h.wfile.write(body[:n])
            h.wfile.flush()
            event.wait(60)
            body = body[n:]
        h.wfile.write(body)
