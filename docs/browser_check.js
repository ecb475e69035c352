// Run by browser_check.py in every loaded page: measures code boxes, tables,
// prose and images, and returns what the Python side checks, as JSON.
(() => {
  const problems = [];
  const vw = document.documentElement.clientWidth;
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
  return JSON.stringify({problems, links, ids, images, privates,
                         height: document.documentElement.scrollHeight});
})()
