// Relative times ("5 min ago") kept current while a page stays open; the exact UTC time is the
// element's title (shown on hover). Said the way relevo_cli.words.time_ago says them.
"use strict";

(function () {
  function ago(date, now) {
    const seconds = Math.floor((now - date) / 1000);
    if (seconds < 5) return "just now";
    if (seconds < 60) return seconds + " s ago";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h ago";
    if (seconds < 7 * 86400) { const days = Math.floor(seconds / 86400); return days + (days === 1 ? " day ago" : " days ago"); }
    return date.toISOString().slice(0, 10);
  }
  function refresh() {
    const now = Date.now();
    document.querySelectorAll("time[datetime]").forEach(function (element) {
      const date = new Date(element.getAttribute("datetime"));
      if (!isNaN(date)) element.textContent = ago(date, now);
    });
  }
  setInterval(refresh, 15000);
})();
