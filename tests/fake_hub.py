"""A small in-process stand-in for the Hugging Face Hub's write API, on 127.0.0.1 only.

It answers the requests huggingface_hub makes for ``HfApi.create_repo``, ``create_branch`` and
``upload_folder``:

- ``POST /api/repos/create`` (409 if the repo exists, as the Hub does),
- ``POST /api/{type}s/{ns}/{name}/branch/{branch}``,
- ``POST /api/validate-yaml`` (400 if the README's front matter is not valid YAML),
- ``POST /api/{type}s/{ns}/{name}/preupload/{revision}``: every file ``uploadMode: regular``,
  so every file's content arrives inline (base64) in the commit,
- ``POST /api/{type}s/{ns}/{name}/commit/{revision}``: the NDJSON commit; the files are written
  to ``root/{ns}/{name}/{revision}/``, all or nothing,
- ``GET /api/whoami-v2``.

Every request must carry ``Authorization: Bearer <token>`` (else 401). ``fail`` maps a path
fragment (``"/commit/"``, ``"/api/repos/create"``) to a status code to answer instead (a JSON
error, or an HTML page with ``fail_html``).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

REPO_PATH = re.compile(r"^/api/(models|datasets|spaces)/([^/]+)/([^/]+)/(preupload|commit|branch)/(.+)$")


class FakeHub:
    def __init__(self, root, token="hf_fake_token_0123456789"):
        self.root = Path(root)
        self.token = token
        self.repos = {}  # repo id -> create payload
        self.branches = set()
        self.commits = []  # (repo id, revision, summary, [paths])
        self.requests = []  # (method, path)
        self.fail = {}  # path fragment -> status code to answer instead
        self.fail_html = False  # answer failures with an HTML page (a proxy's), not JSON
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="fake-hub", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def repo_folder(self, repo_id, revision="main"):
        return self.root / repo_id / revision

    # ---- request handling ------------------------------------------------------------------------

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10  # a stuck client cannot hold a thread for long

            def log_message(self, *args):  # quiet
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status >= 400 and isinstance(payload, dict) and "error" in payload:
                    self.send_header("X-Error-Message", payload["error"])
                self.end_headers()
                self.wfile.write(data)

            def _send_html(self, status):
                data = b"<html><body>Bad gateway</body></html>"
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method):
                path = urlsplit(self.path).path
                body = self._body()
                with hub.lock:
                    hub.requests.append((method, path))
                for fragment, status in hub.fail.items():
                    if fragment in path:
                        if hub.fail_html:
                            return self._send_html(status)
                        return self._send(status, {"error": f"fake hub: injected {status}"})
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                if method == "GET" and path == "/api/whoami-v2":
                    return self._send(200, {"type": "user", "name": "tester", "auth": {}})
                if method == "POST" and path == "/api/repos/create":
                    return self._create(json.loads(body or b"{}"))
                if method == "POST" and path == "/api/validate-yaml":
                    return self._validate(json.loads(body or b"{}"))
                match = REPO_PATH.match(path)
                if method == "POST" and match:
                    kind, namespace, name, action, revision = match.groups()
                    repo_id = f"{namespace}/{name}"
                    if repo_id not in hub.repos:
                        return self._send(404, {"error": "Repository not found"})
                    revision = unquote(revision)
                    if action == "branch":
                        hub.branches.add((repo_id, revision))
                        return self._send(200, {})
                    if revision != "main" and (repo_id, revision) not in hub.branches:
                        return self._send(404, {"error": f"Invalid rev id: {revision}"})
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                           "shouldIgnore": False, "oid": None} for f in files]})
                    return self._commit(repo_id, revision, body)
                return self._send(404, {"error": f"fake hub: no route for {method} {path}"})

            def _create(self, payload):
                name, organization = payload.get("name"), payload.get("organization")
                repo_id = f"{organization}/{name}" if organization else f"tester/{name}"
                with hub.lock:
                    if repo_id in hub.repos:
                        return self._send(409, {"error": "You already created this model repo",
                                                "url": f"{hub.url}/{repo_id}"})
                    hub.repos[repo_id] = payload
                return self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

            def _validate(self, payload):
                content = payload.get("content", "")
                match = re.match(r"^---\n(.*?)\n---\n", content, re.S)
                try:
                    if match:
                        yaml.safe_load(match.group(1))
                except yaml.YAMLError as error:
                    return self._send(400, {"errors": [{"message": str(error)}], "error": "Invalid metadata"})
                return self._send(200, {"errors": [], "warnings": []})

            def _commit(self, repo_id, revision, body):
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                header = next((item["value"] for item in lines if item["key"] == "header"), {})
                files = {}
                for item in lines:
                    if item["key"] == "file":
                        value = item["value"]
                        assert value.get("encoding") == "base64"
                        files[value["path"]] = base64.b64decode(value["content"])
                    elif item["key"] != "header":
                        return self._send(400, {"error": f"fake hub: unsupported commit item {item['key']}"})
                folder = hub.repo_folder(repo_id, revision)
                with hub.lock:
                    for path, data in files.items():
                        target = folder / path
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(data)
                    hub.commits.append((repo_id, revision, header.get("summary"), sorted(files)))
                    oid = f"{len(hub.commits):040x}"
                return self._send(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                                        "success": True})

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

        return Handler
