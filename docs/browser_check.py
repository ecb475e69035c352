"""Load every page of the built site in headless Chromium and check it.

Usage::

    python docs/browser_check.py BUILD_DIR SCREENSHOT_DIR [--widths 1400,390]

``BUILD_DIR`` is Sphinx's HTML output (``docs/_build/html``). Each page is
served over loopback HTTP and loaded at every width (desktop and phone by
default). The check fails (exit status 1, one line per problem) on:

* a code block (``pre``) whose content is wider than its visible box while
  the box neither scrolls nor wraps, and a table or the page itself running
  off the screen;
* literal ``**`` or an odd number of backticks in rendered prose (markup
  that did not render);
* an internal link to a page that does not exist, or to an anchor that is
  not on its page;
* an image that did not load;
* a parallelism strategy's recipe page without its per-device body or its
  diagram;
* a private name of the package (``collectives._...``) outside the source
  listings.

One screenshot per page and width goes to ``SCREENSHOT_DIR`` (the top of the
page; the viewport's width, at most 2400 px tall), for a person to look at.

Chromium is driven through its DevTools protocol over a WebSocket, written
here with the standard library only: no Selenium, no Playwright. The browser
is Debian's ``chromium`` (``apt-get install chromium``); ``--chromium PATH``
or ``$CHROMIUM`` picks another binary.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

# Pages that are not the site's reading material: Sphinx's search page is
# filled in by JavaScript, the index pages only list names.
SKIP = {"search.html", "genindex.html", "py-modindex.html"}

# Run in each loaded page; returns what the Python side checks.
PAGE_SCRIPT = Path(__file__).with_name("browser_check.js").read_text()


# -- a minimal WebSocket client (RFC 6455), enough for the DevTools protocol --

class WebSocket:
    def __init__(self, url: str, timeout: float = 60.0):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port),
                                             timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                   "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection in the handshake")
            response += chunk
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"WebSocket handshake refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])  # FIN, text frame
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        header += mask
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes(header) + masked)

    def recv(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            if second & 0x80:
                mask = self._read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self._read(n)))
            else:
                data = self._read(n)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the WebSocket")
            if opcode in (0x9, 0xA):  # ping / pong: not used by DevTools
                continue
            message += data
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class DevTools:
    """One page target of a headless Chromium, driven by CDP commands."""

    def __init__(self, ws: WebSocket):
        self.ws = ws
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method,
                                 "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    del self.events[: i + 1]
                    return
            self.events.clear()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout:.0f} s")
            self.events.append(json.loads(self.ws.recv()))


def find_chromium(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("CHROMIUM"), "chromium",
                      "chromium-browser", "google-chrome", "google-chrome-stable"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    sys.exit("browser_check: no Chromium found; install it with "
             "`apt-get install -y chromium` or pass --chromium PATH")


def start_chromium(binary: str, profile: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--mute-audio", "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port_file = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if process.poll() is not None:
            error = process.stderr.read().decode()[-2000:]
            raise RuntimeError(f"chromium exited: {error}")
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError("chromium did not open its DevTools port within 60 s")
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        targets = json.load(r)
    page = next(t for t in targets if t["type"] == "page")
    return process, page["webSocketDebuggerUrl"]


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check_page(tools: DevTools, url: str, width: int, shot: Path | None) -> dict:
    tools.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
               deviceScaleFactor=1, mobile=width < 600)
    tools.call("Page.navigate", url=url)
    tools.wait_for("Page.loadEventFired")
    result = tools.call("Runtime.evaluate", expression=PAGE_SCRIPT, returnByValue=True)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{url}: page script failed: {result['exceptionDetails']}")
    data = json.loads(result["result"]["value"])
    if shot is not None:
        height = min(int(data["height"]), 2400)
        image = tools.call("Page.captureScreenshot", format="png",
                           captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": width, "height": height,
                                 "scale": 1})
        shot.write_bytes(base64.b64decode(image["data"]))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="the built HTML site")
    parser.add_argument("screenshots", type=Path, help="folder for the screenshots")
    parser.add_argument("--widths", default="1400,390",
                        help="viewport widths in px, comma separated")
    parser.add_argument("--chromium", help="the Chromium binary")
    args = parser.parse_args(argv)
    root = args.build.resolve()
    if not (root / "index.html").exists():
        sys.exit(f"browser_check: {root} has no index.html; build the site first")
    widths = [int(w) for w in args.widths.split(",")]
    args.screenshots.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html")
                   if p.name not in SKIP and p.relative_to(root).parts[0] != "_static")
    # The generated source listings are checked for links and anchors at the
    # first width only, without screenshots: they are code, not prose.
    listing = {p for p in pages if p.startswith("_modules/")}

    server, base = serve(root)
    problems: list[str] = []
    ids: dict[str, set[str]] = {}
    links: dict[str, set[str]] = {}
    images: set[str] = set()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        process, ws_url = start_chromium(find_chromium(args.chromium), profile)
        try:
            tools = DevTools(WebSocket(ws_url))
            tools.call("Page.enable")
            for width in widths:
                for page in pages:
                    if page in listing and width != widths[0]:
                        continue
                    shot = None
                    if page not in listing:
                        shot = args.screenshots / f"{width}px" / (
                            page.replace("/", "__").removesuffix(".html") + ".png")
                        shot.parent.mkdir(parents=True, exist_ok=True)
                    data = check_page(tools, base + page, width, shot)
                    problems += [f"{page} @ {width}px: {p}" for p in data["problems"]]
                    if page not in listing and width == widths[0]:
                        problems += [f"{page}: private name {name} in the text"
                                     for name in data["privates"]]
                    ids[page] = set(data["ids"])
                    links.setdefault(page, set()).update(data["links"])
                    images.update(data["images"])
            tools.ws.close()
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    server.shutdown()

    # Links and anchors, against the files and the ids every page showed.
    for page, hrefs in sorted(links.items()):
        for href in sorted(hrefs):
            if not href.startswith(base):
                continue
            path, _, fragment = href[len(base):].partition("#")
            path = urllib.parse.unquote(path.split("?")[0]) or "index.html"
            if path.endswith("/"):
                path += "index.html"
            if not (root / path).is_file():
                problems.append(f"{page}: broken link to {path}")
            elif fragment and path.endswith(".html"):
                fragment = urllib.parse.unquote(fragment)
                target = ids.get(path)
                if target is not None and fragment not in target:
                    problems.append(f"{page}: link to a missing anchor "
                                    f"{path}#{fragment}")
    for src in sorted(images):
        if src.startswith(base):
            path = urllib.parse.unquote(src[len(base):].split("#")[0].split("?")[0])
            if not (root / path).is_file():
                problems.append(f"missing image {path}")

    checked = sum(1 for p in pages if p not in listing) * len(widths) + len(listing)
    print(f"browser_check: {checked} page loads ({len(pages)} pages, widths "
          f"{', '.join(map(str, widths))} px) in {time.monotonic() - start:.0f} s; "
          f"screenshots in {args.screenshots}")
    for problem in problems:
        print(f"  {problem}")
    print(f"browser_check: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
