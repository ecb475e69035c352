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
  listings;
* a table column narrower than its longest word (a word broken across lines
  other than after a hyphen, dash or slash, or running out of its cell), a
  table whose header row is hidden, and text laid out one character per
  line anywhere in the article;
* a figure wider than the content column or in a box that scrolls
  sideways; text in a figure under 9 px on screen, or a legend over its
  plotted data, from the record each image file carries (written by
  ``collectives._figure.save``: its smallest text in image px, times the
  shown width over the natural width; an SVG without a record is measured
  from its glyphs; a raster without one is a problem); a raster plot that
  does not open full size on a click;
* on a desktop (1000 px and wider), a table or a code box that scrolls
  sideways (it hides columns, or a command line's last flags), the
  compatibility matrices included; narrower, a table that scrolls sideways
  without the line above it that says so (``_theme/collectives.js``);
  inline code broken inside a word (700 px and wider); a caption
  that names code (a name with an underscore, or a call) other than the
  collectives and recipes; more than one search box on screen;
* a strategy recipe page that the strategies page neither links to nor
  shows the diagram of, and a page of the navigation's Recipes and Using it
  sections without a card on the landing page;
* a card whose title is a page's title but that opens another page, and a
  link inside a card that a click does not open (the card's own link
  covering it), or whose text is a page's title but that opens another page;
* a search, run by the site's own search page, for a core collective (the
  JAX collectives and the registry's core recipe names) whose first result
  is not that collective's recipe page.

One screenshot per page and width goes to ``SCREENSHOT_DIR`` (the top of the
page; the viewport's width, at most 2400 px tall), for a person to look at;
the pages of ``WHOLE_PAGES`` are shot whole (up to 20000 px tall).

Chromium is driven through its DevTools protocol over a WebSocket, written
here with the standard library only: no Selenium, no Playwright. The browser
is Debian's ``chromium`` (``apt-get install chromium``); ``--chromium PATH``
or ``$CHROMIUM`` picks another binary.
"""

from __future__ import annotations

import argparse
import base64
import functools
import html
import http.server
import json
import os
import re
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

# Run in each loaded page, as ``(PAGE_SCRIPT)(titles)``; returns what the
# Python side checks.
PAGE_SCRIPT = Path(__file__).with_name("browser_check.js").read_text()

# The pages that carry the project's results, shot whole (the others: their
# first 2400 px), for a person to see every figure and table.
WHOLE_PAGES = ("choosing.html", "benchmarks.html", "strategies.html",
               "_generated/gallery/fsdp.html")

# The JAX collectives the core recipes teach; each is searched for (with the
# registry's core recipe names) and must find its recipe page first.
COLLECTIVES = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter",
               "all_to_all", "ppermute", "axis_index")

# Run in the search page until the search finishes: its results in order.
SEARCH_SCRIPT = """new Promise((resolve, reject) => {
  const deadline = Date.now() + 30000;
  const poll = () => {
    if (typeof Search !== "undefined" && Search.status && Search.status.innerText) {
      resolve(JSON.stringify([...document.querySelectorAll(
        "#search-results ul.search > li > a")].map((a) => [a.href, a.innerText])));
    } else if (Date.now() > deadline) {
      reject(new Error("the search did not finish within 30 s"));
    } else {
      setTimeout(poll, 50);
    }
  };
  poll();
})"""


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


def page_titles(root: Path, pages: list[str], base: str) -> dict[str, str]:
    """Each page's title (its ``<title>`` less the site's name), by its URL."""
    titles = {}
    for page in pages:
        head = (root / page).read_text(errors="replace")[:5000]
        match = re.search(r"<title>(.*?)</title>", head, re.S)
        if match:
            title = html.unescape(match.group(1)).rsplit(" \N{EM DASH} ", 1)[0]
            titles[base + page] = " ".join(title.split())
    return titles


def check_page(tools: DevTools, url: str, width: int, shot: Path | None,
               titles: dict[str, str], names: list[str]) -> dict:
    tools.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
               deviceScaleFactor=1, mobile=width < 600)
    tools.call("Page.navigate", url=url)
    tools.wait_for("Page.loadEventFired")
    result = tools.call("Runtime.evaluate", returnByValue=True,
                        expression=f"({PAGE_SCRIPT})({json.dumps(titles)}, "
                                   f"{json.dumps(names)})")
    if "exceptionDetails" in result:
        raise RuntimeError(f"{url}: page script failed: {result['exceptionDetails']}")
    data = json.loads(result["result"]["value"])
    if shot is not None:
        whole = any(url.endswith("/" + page) for page in WHOLE_PAGES)
        height = min(int(data["height"]), 20000 if whole else 2400)
        image = tools.call("Page.captureScreenshot", format="png",
                           captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": width, "height": height,
                                 "scale": 1})
        shot.write_bytes(base64.b64decode(image["data"]))
    return data


def figure_facts(path: Path) -> dict | None:
    """The record a figure's file carries (``collectives._figure.save``); for
    an SVG drawn without one, its smallest text and width read from the SVG
    itself (matplotlib writes a glyph of F points at ``scale(F/100)``)."""
    from collectives import _figure

    facts = _figure.read_record(path)
    if facts is not None or path.suffix != ".svg":
        return facts
    svg = path.read_text(errors="replace")
    scales = [float(m) for m in re.findall(r"scale\(([\d.]+) -[\d.]+\)", svg)]
    width = re.search(r'<svg[^>]* width="([\d.]+)pt"', svg)
    if not scales or not width:
        return None
    return {"text_px": min(scales) * 100 * _figure.SVG_PX_PER_PT,
            "legend_covers": 0,
            "width_px": round(float(width.group(1)) * _figure.SVG_PX_PER_PT)}


def figure_problems(root: Path, base: str, figures: list[dict],
                    width: int) -> list[str]:
    """Text under 9 px on screen and legends over data, in the figures a
    page showed at ``width`` (their files' records, their shown widths)."""
    from collectives import _figure

    out = []
    for figure in figures:
        if not figure["src"].startswith(base):
            continue
        path = root / urllib.parse.unquote(figure["src"][len(base):].split("?")[0])
        if not path.is_file():
            continue  # (reported as a missing image)
        column = "wide" if width >= 700 else "narrow"
        for problem in _figure.problems(figure_facts(path), column, figure["shown"]):
            out.append(f"figure {path.relative_to(root)}: {problem}")
    return out


# The navigation's sections whose every page the landing page has a card for:
# what a reader comes to the site for.
LANDING_SECTIONS = ("Recipes", "Using it")


def landing_pages(root: Path) -> list[str]:
    """The top-level pages of the navigation's ``LANDING_SECTIONS``, read
    from the landing page's sidebar."""
    page = (root / "index.html").read_text()
    out = []
    for section in LANDING_SECTIONS:
        match = re.search(r'caption-text">' + re.escape(section)
                          + r'</span></p>\s*<ul[^>]*>(.*?)(?:<p aria-level|</nav>)',
                          page, re.S)
        if match:
            out += re.findall(r'<li class="toctree-l1[^"]*"><a class="reference '
                              r'internal" href="([^"#]+)"', match.group(1))
    return out


def caption_names() -> list[str]:
    """The names from the code a caption may use: the JAX collectives, the
    registry's recipes and their files."""
    import collectives

    files = {Path(recipe.recipe_file).stem for recipe in collectives.RECIPES.values()}
    return sorted({*COLLECTIVES, *collectives.RECIPES, *files, "shard_map"})


def search_pages() -> dict[str, str]:
    """Each searched name and the recipe file (stem) whose page it must find
    first: the registry's core recipes by name, and each JAX collective of
    ``COLLECTIVES`` in the file of the core recipe of that name, or else of
    the first core recipe named after it (``ppermute``: ``ppermute_ring``)."""
    import collectives

    core = {name: Path(recipe.recipe_file).stem
            for name, recipe in collectives.RECIPES.items() if recipe.family == "core"}
    wanted = dict(core)
    for name in COLLECTIVES:
        stems = [stem for recipe, stem in core.items()
                 if recipe == name or recipe.startswith(name + "_")]
        if not stems:
            raise ValueError(f"no core recipe teaches {name!r}: COLLECTIVES names a "
                             "JAX collective that no core recipe is named after")
        wanted[name] = core.get(name, stems[0])
    return wanted


def check_search(tools: DevTools, base: str, name: str, stem: str) -> str | None:
    """A problem if the site's search for ``name`` does not list ``stem``'s
    recipe page first."""
    want = f"_generated/gallery/{stem}.html"
    tools.call("Page.navigate", url=f"{base}search.html?q={urllib.parse.quote(name)}")
    tools.wait_for("Page.loadEventFired")
    result = tools.call("Runtime.evaluate", expression=SEARCH_SCRIPT,
                        awaitPromise=True, returnByValue=True)
    if "exceptionDetails" in result:
        return f"search for {name}: {result['exceptionDetails']}"
    found = [(href[len(base):].split("#")[0], title)
             for href, title in json.loads(result["result"]["value"])]
    pages = [page for page, _ in found]
    if pages[:1] == [want]:
        return None
    rank = (f"ranks it {pages.index(want) + 1} of {len(found)}" if want in pages
            else f"does not find it among {len(found)} results")
    first = f"; first: {found[0][1]} ({found[0][0]})" if found else ""
    return f"search for {name} {rank} ({want}){first}"


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
    titles = page_titles(root, [p for p in pages if p not in listing], base)
    searches = search_pages() if (root / "search.html").exists() else {}
    names = caption_names()
    strategy_pages: dict[str, str] = {}  # page -> its diagram's file name
    cards: dict[str, set[str]] = {}  # page -> the pages its cards open
    page_images: dict[str, set[str]] = {}  # page -> its images' file names
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
                    data = check_page(tools, base + page, width, shot, titles,
                                      names)
                    problems += [f"{page} @ {width}px: {p}" for p in data["problems"]
                                 + figure_problems(root, base, data["figures"], width)]
                    if data["strategy"]:
                        strategy_pages[page] = data["strategy"]
                    cards.setdefault(page, set()).update(
                        href[len(base):].split("#")[0] for href in data["cards"]
                        if href.startswith(base))
                    page_images.setdefault(page, set()).update(
                        Path(urllib.parse.urlparse(src).path).name
                        for src in data["images"])
                    if page not in listing and width == widths[0]:
                        problems += [f"{page}: private name {name} in the text"
                                     for name in data["privates"]]
                    ids[page] = set(data["ids"])
                    links.setdefault(page, set()).update(data["links"])
                    images.update(data["images"])
            tools.call("Emulation.setDeviceMetricsOverride", width=widths[0],
                       height=900, deviceScaleFactor=1, mobile=False)
            for name, stem in searches.items():
                problem = check_search(tools, base, name, stem)
                if problem:
                    problems.append(problem)
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
    # The strategies page links to every strategy's recipe page and shows
    # its diagram; the landing page has a card for every page of the
    # navigation's LANDING_SECTIONS.
    if "strategies.html" in links:
        listed = {href[len(base):].split("#")[0] for href in links["strategies.html"]
                  if href.startswith(base)}
        for page, diagram in sorted(strategy_pages.items()):
            if page not in listed:
                problems.append(f"strategies.html: no link to the strategy page {page}")
            if diagram not in page_images.get("strategies.html", set()):
                problems.append(f"strategies.html: no thumbnail of {page}'s diagram "
                                f"({diagram})")
    for page in sorted(set(landing_pages(root)) - cards.get("index.html", set())):
        problems.append(f"index.html: no card for the page {page}")
    for src in sorted(images):
        if src.startswith(base):
            path = urllib.parse.unquote(src[len(base):].split("#")[0].split("?")[0])
            if not (root / path).is_file():
                problems.append(f"missing image {path}")

    checked = sum(1 for p in pages if p not in listing) * len(widths) + len(listing)
    print(f"browser_check: {checked} page loads ({len(pages)} pages, widths "
          f"{', '.join(map(str, widths))} px) and {len(searches)} searches in "
          f"{time.monotonic() - start:.0f} s; screenshots in {args.screenshots}")
    for problem in problems:
        print(f"  {problem}")
    print(f"browser_check: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
