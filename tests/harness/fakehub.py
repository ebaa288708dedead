"""A local stand-in for a Hugging Face hub, serving one directory as repository ORG/NAME over the
HTTP API huggingface_hub uses (repo info, tree listing, resolve with its headers), so the real
download path (`entrypoint.py prefetch`, huggingface_hub, the cache layout) runs offline.
Point a client at it with HF_ENDPOINT=hub.url. Every request is recorded (method, path);
`extra` adds files the repository has besides the directory's; `chunk_delay_s` slows file bodies
down (a pause per 64 kB), so a download is seen in progress."""

from __future__ import annotations

import hashlib
import http.server
import json
import pathlib
import threading
import time
import urllib.parse

from .models import REVISION


class FakeHub:
    CHUNK = 64 * 1024

    def __init__(
        self,
        root: pathlib.Path,
        repo: str,
        extra: dict[str, bytes] | None = None,
        chunk_delay_s: float = 0.0,
    ):
        self.root, self.repo, self.chunk_delay_s = root, repo, chunk_delay_s
        self.files = {
            str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }
        self.files.update(extra or {})
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def send(self, code: int, data: bytes, headers: dict[str, str], body: bool):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for i in range(0, len(data) if body else 0, hub.CHUNK):
                    self.wfile.write(data[i : i + hub.CHUNK])
                    self.wfile.flush()
                    if hub.chunk_delay_s and len(data) > hub.CHUNK:
                        time.sleep(hub.chunk_delay_s)

            def answer(self, body: bool):
                path = urllib.parse.urlparse(self.path).path
                hub.requests.append((self.command, path))
                api = f"/api/models/{hub.repo}/"
                if path.startswith(api + "revision/"):
                    info = {
                        "id": hub.repo,
                        "sha": REVISION,
                        "siblings": [{"rfilename": f} for f in hub.files],
                    }
                    return self.send(200, json.dumps(info).encode(), {}, body)
                if path.startswith(api + "tree/"):
                    tree = [
                        {"type": "file", "path": f, "size": len(d), "oid": hub.etag(f)}
                        for f, d in hub.files.items()
                    ]
                    return self.send(200, json.dumps(tree).encode(), {}, body)
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    name = path[len(prefix) :].split("/", 1)[1]
                    if name in hub.files:
                        headers = {"X-Repo-Commit": REVISION, "ETag": f'"{hub.etag(name)}"'}
                        return self.send(200, hub.files[name], headers, body)
                self.send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def etag(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
