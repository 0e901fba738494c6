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
  // A person working in the page (focus on a link, a field or a button in it, or text
  // selected) is not interrupted: the refresh waits until they are done.
  function busy() {
    var a = document.activeElement;
    var main = document.getElementById("content");
    if (a && a !== document.body && main && main.contains(a)) { return true; }
    var sel = window.getSelection && window.getSelection();
    return !!(sel && !sel.isCollapsed);
  }
  window.setInterval(function () {
    if (paused || document.hidden || busy()) { return; }
    var url = new URL(window.location.href);
    url.searchParams.delete("flash");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/console/signin") >= 0) { throw new Error("signed out"); }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        if (paused || busy()) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("content");
        var main = document.getElementById("content");
        if (!fresh || !main) { throw new Error("no content"); }
        // The refreshed copy announces nothing again: its alerts were read the first time.
        fresh.querySelectorAll("[role=alert]").forEach(function (el) { el.removeAttribute("role"); });
        main.replaceWith(document.importNode(fresh, true));
        show();
      })
      .catch(function (e) {
        state.textContent = e.message === "signed out" ? "refresh stopped: the session has ended; reload to sign in"
          : "refresh failed (" + e.message + "); showing the page as of the last one; retrying";
      });
  }, every * 1000);
})();
