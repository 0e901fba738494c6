// The console refreshes pages that ask for it (body data-refresh, in seconds) by
// fetching the same address and swapping the main content, unless the person paused it,
// is typing, or the tab is hidden. The pages work without it.
(function () {
  "use strict";
  var every = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var toggle = document.getElementById("refresh-toggle");
  var state = document.getElementById("refresh-state");
  if (!every || !toggle) { return; }
  var paused = window.localStorage.getItem("console-refresh") === "paused";
  function show() {
    toggle.textContent = paused ? "Resume refresh" : "Pause refresh";
    toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    state.textContent = paused ? "refresh paused" : "refreshes every " + every + " s";
  }
  toggle.hidden = false;
  show();
  toggle.addEventListener("click", function () {
    paused = !paused;
    window.localStorage.setItem("console-refresh", paused ? "paused" : "on");
    show();
  });
  function busy() {
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
  }
  window.setInterval(function () {
    if (paused || document.hidden || busy()) { return; }
    var url = new URL(window.location.href);
    url.searchParams.delete("flash");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html || paused || busy()) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("content");
        var main = document.getElementById("content");
        if (fresh && main) { main.replaceWith(document.importNode(fresh, true)); }
      })
      .catch(function () { state.textContent = "refresh failed; retrying"; });
  }, every * 1000);
})();
