// Run by browser_check.py in every loaded page: measures code boxes, tables,
// prose, figures, captions and card links, and returns what the Python side
// checks, as JSON. A function of TITLES, every page's title by its URL, and
// NAMES, the names from the code a caption may use (the collectives' and
// the recipes'), which the Python side passes in: browser_check.py
// evaluates `(<this file>)(TITLES, NAMES)`.
((TITLES, NAMES) => {
  const problems = [];
  const vw = document.documentElement.clientWidth;
  const range = document.createRange();
  // A URL without its fragment and query: the page a link opens.
  const pageOf = (href) => {
    const url = new URL(href, location.href);
    return url.origin + url.pathname;
  };
  const short = (url) => url.replace(location.origin + "/", "") || "index.html";
  const pageByTitle = new Map(
    Object.entries(TITLES).map(([url, title]) => [title.toLowerCase(), url]));
  // The line of each visible character of ``root``'s own text (text whose
  // innermost ``blocks`` element is ``root``, code left out), in order: a
  // character below the previous one and left of it starts a new line.
  const lineOfEachChar = (root, blocks) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (n) => (n.parentElement.closest("pre, .highlight, script, style") ||
                          n.parentElement.closest(blocks) !== root
        ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT)});
    const chars = [];
    let line = 0, prev = null;
    for (let node; (node = walker.nextNode());) {
      for (let i = 0; i < node.data.length; i++) {
        if (/\s/.test(node.data[i])) continue;
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const r = range.getClientRects()[0];
        if (!r || r.width === 0) continue;
        if (prev && r.top >= prev.top + prev.height / 2 && r.left < prev.right) line++;
        chars.push(line);
        prev = r;
      }
    }
    return chars;
  };
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== "hidden";
  };
  const scrolls = (el) => {
    const s = getComputedStyle(el);
    return ["auto", "scroll"].includes(s.overflowX);
  };
  const label = (el) => {
    const t = (el.innerText || el.textContent || "").trim().split("\n")[0];
    return t.slice(0, 70);
  };
  // Code boxes: content wider than the box must scroll inside it.
  for (const pre of document.querySelectorAll("article pre, .bd-article pre")) {
    if (!visible(pre)) continue;
    if (pre.scrollWidth > pre.clientWidth + 1 && !scrolls(pre)) {
      problems.push(`code box cut off (${pre.scrollWidth}px of text in a ` +
                    `${pre.clientWidth}px box, no scrollbar): ${label(pre)}`);
    }
    // The box itself must be on screen, or inside something that scrolls.
    const r = pre.getBoundingClientRect();
    if (r.right > vw + 1) {
      let el = pre.parentElement, ok = false;
      while (el && el !== document.body) {
        if (scrolls(el) && el.getBoundingClientRect().right <= vw + 1) { ok = true; break; }
        el = el.parentElement;
      }
      if (!ok) problems.push(`code box runs off the screen (right edge at ` +
                             `${Math.round(r.right)}px of ${vw}px): ${label(pre)}`);
    }
  }
  // Tables: on screen, or inside a box that scrolls.
  for (const table of document.querySelectorAll(".bd-article table")) {
    if (!visible(table)) continue;
    const r = table.getBoundingClientRect();
    if (r.right <= vw + 1) continue;
    let el = table.parentElement, ok = false;
    while (el && el !== document.body) {
      if (scrolls(el) && el.getBoundingClientRect().right <= vw + 1) { ok = true; break; }
      el = el.parentElement;
    }
    if (!ok) problems.push(`table runs off the screen (right edge at ` +
                           `${Math.round(r.right)}px of ${vw}px): ${label(table)}`);
  }
  if (document.documentElement.scrollWidth > vw + 1) {
    // Name the outermost elements that stick out, outside any scrolling box.
    const culprits = [];
    for (const el of document.body.querySelectorAll("*")) {
      if (culprits.length >= 3) break;
      const r = el.getBoundingClientRect();
      if (r.right <= vw + 1 || !visible(el) || getComputedStyle(el).position === "fixed") continue;
      const parent = el.parentElement;
      if (parent && parent !== document.body &&
          parent.getBoundingClientRect().right > vw + 1) continue;
      let inside = false;
      for (let up = parent; up && up !== document.body; up = up.parentElement) {
        if (scrolls(up) && up.getBoundingClientRect().right <= vw + 1) { inside = true; break; }
      }
      if (!inside) culprits.push(`<${el.tagName.toLowerCase()} class="${el.className}"> ` +
                                 label(el).slice(0, 40));
    }
    problems.push(`the page scrolls sideways (${document.documentElement.scrollWidth}px ` +
                  `wide at ${vw}px): ${culprits.join("; ")}`);
  }
  // Markup that did not render, in prose (code and maths excluded).
  const blocks = document.querySelectorAll(
    ".bd-article p, .bd-article li, .bd-article td, .bd-article th, " +
    ".bd-article dd, .bd-article dt, .bd-article h1, .bd-article h2, " +
    ".bd-article h3, .bd-article h4, .bd-article figcaption, .bd-article summary");
  for (const block of blocks) {
    if (block.closest(".sig, pre, .highlight")) continue;  // signatures and code
    const copy = block.cloneNode(true);
    for (const skip of copy.querySelectorAll(
        "code, pre, kbd, samp, .math, .highlight, p, li, td, th, dd, dt, " +
        ".sig, script, style")) skip.remove();
    // Parameter names in the API's field lists: *args, **kwargs.
    for (const name of copy.querySelectorAll("strong")) {
      if (/^\*{1,2}\w+$/.test(name.textContent)) name.remove();
    }
    const text = copy.textContent;
    if (text.includes("**")) problems.push(`literal ** in text: ${label(block)}`);
    const ticks = (text.match(/`/g) || []).length;
    if (ticks % 2) problems.push(`unbalanced backtick in text: ${label(block)}`);
  }
  // Tables: no column narrower than its longest word, and no header row
  // hidden. A word is measured in the pieces a line may end after a hyphen,
  // dash or slash; a piece laid out on two lines, or wider than its cell, is
  // a column too narrow. Code blocks in cells scroll: left out.
  const PIECE = /[^\s\-\u2010-\u2015\/]+[\-\u2010-\u2015\/]*|[\-\u2010-\u2015\/]+/g;
  for (const table of document.querySelectorAll(".bd-article table")) {
    if (!visible(table)) continue;
    const hidden = [...table.querySelectorAll(":scope > thead th")]
      .filter((th) => !visible(th) && th.textContent.trim());
    if (hidden.length) {
      problems.push(`table header hidden (${hidden.map((th) => `"${th.textContent.trim()}"`)
        .join(", ")}): ${label(table)}`);
    }
    const narrow = [];
    for (const cell of table.querySelectorAll("td, th")) {
      if (cell.closest("table") !== table || !visible(cell)) continue;
      const s = getComputedStyle(cell);
      const room = cell.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT, {
        acceptNode: (n) => (n.parentElement.closest("pre, .highlight")
          ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT)});
      let found = null;
      for (let node; !found && (node = walker.nextNode());) {
        for (const m of node.data.matchAll(PIECE)) {
          range.setStart(node, m.index);
          range.setEnd(node, m.index + m[0].length);
          const rects = [...range.getClientRects()].filter((r) => r.width > 0);
          const width = rects.reduce((w, r) => w + r.width, 0);
          const tops = new Set(rects.map((r) => Math.round(r.top)));
          if (tops.size > 1 || width > room + 1) {
            const at = rects.length > 1 ? rects[0].width / width : 0;
            const cut = Math.max(1, Math.round(at * m[0].length));
            found = {piece: m[0], width, room,
                     laid: tops.size > 1 ? `${m[0].slice(0, cut)}/${m[0].slice(cut)}` : null};
            break;
          }
        }
      }
      if (found) narrow.push(found);
    }
    if (narrow.length) {
      const {piece, width, room, laid} = narrow[0];
      problems.push(`table column narrower than its longest word (${narrow.length} ` +
                    `cell(s); "${piece}" needs ${Math.round(width)}px in a ` +
                    `${Math.round(room)}px column${laid ? `, laid out "${laid}"` : ""}` +
                    `): ${label(table)}`);
    }
  }
  // Text laid out one character per line, anywhere in the article: measured
  // where a block is narrow for its text (under 3 characters a line), on the
  // text whose innermost block it is.
  const BLOCKS = [".bd-article p", "li", "dt", "dd", "h1", "h2", "h3", "h4", "td", "th",
                  "figcaption", "caption", ".sd-card-title"].join(", .bd-article ");
  const squeezed = [];
  for (const block of document.querySelectorAll(BLOCKS)) {
    if (!visible(block) || block.closest("pre, .highlight")) continue;
    const n = block.textContent.replace(/\s/g, "").length;
    const s = getComputedStyle(block);
    const lineHeight = parseFloat(s.lineHeight) || 1.2 * parseFloat(s.fontSize);
    const lines = block.getBoundingClientRect().height / lineHeight;
    if (n < 3 || lines < 3 || n / lines >= 3) continue;
    const counts = new Map();
    for (const line of lineOfEachChar(block, BLOCKS)) {
      counts.set(line, (counts.get(line) || 0) + 1);
    }
    const single = [...counts.values()].filter((k) => k === 1).length;
    if (single >= 3 && single >= counts.size / 2) {
      squeezed.push(`"${label(block).slice(0, 40)}" (${single} of ${counts.size} lines, ` +
                    `${Math.round(block.getBoundingClientRect().width)}px wide)`);
    }
  }
  if (squeezed.length) {
    problems.push(`text laid out one character per line in ${squeezed.length} ` +
                  `place(s): ${squeezed.slice(0, 3).join("; ")}`);
  }
  // Figures: whole inside the column (nothing cut off, no scrollbar of their
  // own), a raster plot opening full size on a click. What they show on
  // screen (text size, a legend over data) the Python side checks from the
  // record in each image file, with the sizes measured here. Card
  // thumbnails are previews, left out.
  const figures = [];
  const column = (document.querySelector(".bd-article") || document.body)
    .getBoundingClientRect();
  for (const img of document.querySelectorAll(".bd-article img")) {
    if (!visible(img) || !img.naturalWidth || img.closest(".sd-card")) continue;
    const src = img.getAttribute("src");
    const r = img.getBoundingClientRect();
    figures.push({src: img.src, shown: r.width, natural: img.naturalWidth});
    if (r.right > column.right + 1 || r.left < column.left - 1) {
      problems.push(`figure wider than the column (${Math.round(r.width)}px in ` +
                    `${Math.round(column.width)}px): ${src}`);
    }
    for (let up = img.parentElement; up && up !== document.body; up = up.parentElement) {
      if (scrolls(up) && up.scrollWidth > up.clientWidth + 1) {
        problems.push(`figure in a box that scrolls sideways (${up.clientWidth}px of ` +
                      `${up.scrollWidth}px in view): ${src}`);
        break;
      }
    }
    const link = img.closest("a[href]");
    if (/\.(png|jpe?g|gif|webp)$/i.test(pageOf(img.src)) &&
        (!link || pageOf(link.href) !== pageOf(img.src))) {
      problems.push(`plot does not open full size on a click: ${src}`);
    }
  }
  // On a desktop (1000 px and wider) the article is read whole: every table
  // shows all its columns and every code box all its text (a command line
  // cut at the box's edge hides its last flags). On a phone they may scroll.
  if (vw >= 1000) {
    for (const box of document.querySelectorAll(".bd-article .pst-scrollable-table-container")) {
      if (!visible(box)) continue;
      if (box.scrollWidth > box.clientWidth + 1) {
        problems.push(`table hides columns (${box.clientWidth}px of ${box.scrollWidth}px ` +
                      `in view, scrolls sideways): ${label(box)}`);
      }
    }
    for (const pre of document.querySelectorAll(".bd-article pre")) {
      if (!visible(pre) || pre.closest("table")) continue;
      if (pre.scrollWidth > pre.clientWidth + 1) {
        problems.push(`code box hides text (${pre.clientWidth}px of ${pre.scrollWidth}px ` +
                      `in view, scrolls sideways): ${label(pre)}`);
      }
    }
  }
  // Narrower (a phone), a table may scroll sideways with its first column
  // pinned, and a line above it says so (collectives.js).
  if (vw < 1000) {
    for (const box of document.querySelectorAll(".bd-article .pst-scrollable-table-container")) {
      if (!visible(box) || box.scrollWidth <= box.clientWidth + 1) continue;
      const line = box.previousElementSibling;
      if (!line || !line.classList.contains("swipe-hint") || !visible(line)) {
        problems.push(`table scrolls sideways with no line saying so (${box.clientWidth}px ` +
                      `of ${box.scrollWidth}px in view): ${label(box)}`);
      }
    }
  }
  // Inline code in prose breaks between its words, never inside one (on a
  // phone a word wider than the line may).
  if (vw >= 700) {
    const broken = [];
    for (const code of document.querySelectorAll(".bd-article code.literal")) {
      if (!visible(code) || code.closest("pre, .highlight, table, .sig, dt")) continue;
      const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
      for (let node; (node = walker.nextNode());) {
        for (const m of node.data.matchAll(/\S+/g)) {
          range.setStart(node, m.index);
          range.setEnd(node, m.index + m[0].length);
          const tops = new Set([...range.getClientRects()].filter((q) => q.width > 0)
            .map((q) => Math.round(q.top)));
          if (tops.size > 1) broken.push(m[0]);
        }
      }
    }
    if (broken.length) {
      problems.push(`inline code broken inside a word in ${broken.length} place(s): ` +
                    broken.slice(0, 3).map((w) => `"${w}"`).join(", "));
    }
  }
  // Captions speak the reader's words: no names from the code (a name with
  // an underscore or a call) other than the collectives' and recipes'.
  for (const caption of document.querySelectorAll(".bd-article figcaption")) {
    if (!visible(caption)) continue;
    const names = [...new Set((caption.innerText.match(/\b\w+\(\)|\b[A-Za-z]\w*_\w+\b/g) || [])
      .filter((name) => !NAMES.includes(name)))];
    if (names.length) {
      problems.push(`caption names code (${names.slice(0, 3).join(", ")}): ` +
                    label(caption).slice(0, 50));
    }
  }
  // One search box on screen.
  const searches = [...document.querySelectorAll(
    "button.search-button-field, button.search-button, form.bd-search")]
    .filter((el) => visible(el) && el.checkVisibility());
  if (searches.length > 1) {
    problems.push(`${searches.length} search boxes on screen`);
  }
  // Cards: a card titled with a page's title opens that page, and a click on
  // a link inside a card opens that link (not the card's own target); a link
  // whose text is a page's title opens that page.
  // (dropdowns are cards too, in sphinx-design: left out)
  for (const card of document.querySelectorAll(".bd-article .sd-card:not(details)")) {
    if (!visible(card)) continue;
    const stretched = card.querySelector("a.sd-stretched-link");
    const title = (card.querySelector(".sd-card-title")?.innerText || "").trim();
    const named = pageByTitle.get(title.toLowerCase());
    if (stretched && named && pageOf(stretched.href) !== named) {
      problems.push(`card "${title}" opens ${short(pageOf(stretched.href))}, not ` +
                    `the page it names (${short(named)})`);
    }
    for (const a of card.querySelectorAll("a[href]")) {
      if (a === stretched || !visible(a) || !a.checkVisibility()) continue;
      a.scrollIntoView({block: "center"});
      const r = a.getClientRects()[0];
      const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
      const opened = hit?.closest("a[href]");
      const opens = opened ? short(pageOf(opened.href)) : "nothing";
      const text = a.innerText.trim();
      const want = short(pageByTitle.get(text.toLowerCase()) || pageOf(a.href));
      if (opens !== want) {
        problems.push(`card link "${text}" opens ${opens}, not ${want}: card "${title}"`);
      }
    }
  }
  window.scrollTo(0, 0);
  // Images: loaded, or at least present (lazy ones are checked by file).
  const images = [];
  for (const img of document.querySelectorAll("img")) {
    if (img.complete && img.naturalWidth === 0 && img.getAttribute("loading") !== "lazy") {
      problems.push(`image did not load: ${img.getAttribute("src")}`);
    }
    images.push(img.src);
  }
  // A parallelism strategy's recipe page shows the per-device body where its
  // collectives are called, and its diagram traced from a real run.
  if (document.querySelector(".strategy-page")) {
    if (!document.querySelector("section#the-per-device-body pre")) {
      problems.push("strategy page without its per-device body");
    }
    const diagram = document.querySelector("figure.strategy-diagram img");
    if (!diagram) problems.push("strategy page without its diagram");
    else if (diagram.complete && diagram.naturalWidth === 0) {
      problems.push(`strategy diagram did not load: ${diagram.getAttribute("src")}`);
    }
  }
  // Private names of the package (the source listings are exempt: Python side).
  const article = document.querySelector(".bd-article") || document.body;
  const privates = [...new Set(article.innerText.match(/collectives\._\w+/g) || [])];
  const links = [...document.querySelectorAll("a[href]")].map((a) => a.href);
  const ids = [...document.querySelectorAll("[id]")].map((el) => el.id);
  for (const a of document.querySelectorAll("a[name]")) ids.push(a.name);
  return JSON.stringify({problems, links, ids, images, privates, figures,
                         strategy: (document.querySelector(".strategy-page") &&
                                    document.querySelector("figure.strategy-diagram img")
                                      ?.getAttribute("src").split("/").pop()) || "",
                         cards: [...document.querySelectorAll(
                           ".bd-article .sd-card a.sd-stretched-link")].map((a) => a.href),
                         height: document.documentElement.scrollHeight});
})
