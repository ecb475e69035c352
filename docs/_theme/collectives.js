// Tables wider than the screen (on a phone) keep their first column pinned
// and scroll sideways; a line above each says so, with how many columns are
// out of view. Redone when the width changes.
(() => {
  const hint = (box) => {
    const table = box.querySelector(":scope > table");
    let line = box.previousElementSibling;
    if (!line || !line.classList.contains("swipe-hint")) line = null;
    const hidden = table ? [...(table.rows[0]?.cells || [])].filter((cell) => {
      const r = cell.getBoundingClientRect(), b = box.getBoundingClientRect();
      return r.right > b.right + 1 || r.left < b.left - 1;
    }).length : 0;
    if (box.scrollWidth <= box.clientWidth + 1 || !hidden) {
      if (line) line.remove();
      return;
    }
    if (!line) {
      line = document.createElement("p");
      line.className = "swipe-hint";
      box.before(line);
    }
    line.textContent = `First column pinned: swipe the table for ${hidden} more ` +
      `column${hidden === 1 ? "" : "s"} \u2192`;
  };
  const all = () => document.querySelectorAll(
    ".bd-article .pst-scrollable-table-container").forEach(hint);
  let width = 0;
  const update = () => {
    if (document.documentElement.clientWidth === width) return;
    width = document.documentElement.clientWidth;
    all();
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", update);
  } else {
    update();
  }
  window.addEventListener("resize", update);
})();
