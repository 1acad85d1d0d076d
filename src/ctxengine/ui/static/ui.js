// ctxengine dashboard: sort and filter the sessions table, and refresh the page while agents run.
(function () {
  "use strict";
  var filterText = "";
  var sortCol = -1, sortDir = 1;

  function applyTable() {
    var table = document.querySelector("table.sortable");
    if (!table) return;
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    if (sortCol >= 0) {
      rows.sort(function (a, b) {
        var x = a.cells[sortCol].getAttribute("data-v"), y = b.cells[sortCol].getAttribute("data-v");
        var numeric = a.cells[sortCol].classList.contains("num") || sortCol === a.cells.length - 1;
        var c = numeric ? parseFloat(x) - parseFloat(y) : String(x).localeCompare(String(y));
        return c * sortDir;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    }
    rows.forEach(function (r) {
      r.style.display = !filterText || r.getAttribute("data-text").indexOf(filterText) >= 0 ? "" : "none";
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.classList.toggle("asc", i === sortCol && sortDir === 1);
      th.classList.toggle("desc", i === sortCol && sortDir === -1);
    });
  }

  // the table's state lives in the address (#filter=…&sort=N&dir=-1): a view can be shared
  function readHash() {
    var h = new URLSearchParams(location.hash.slice(1));
    filterText = (h.get("filter") || "").toLowerCase();
    sortCol = h.has("sort") ? parseInt(h.get("sort"), 10) : -1;
    sortDir = h.get("dir") === "-1" ? -1 : 1;
  }
  function writeHash() {
    var h = new URLSearchParams();
    if (filterText) h.set("filter", filterText);
    if (sortCol >= 0) { h.set("sort", String(sortCol)); h.set("dir", String(sortDir)); }
    history.replaceState(null, "", location.pathname + location.search + (String(h) ? "#" + h : ""));
  }

  function bind() {
    var table = document.querySelector("table.sortable");
    if (table) {
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
        th.addEventListener("click", function () {
          sortDir = sortCol === i ? -sortDir : (th.classList.contains("num") ? -1 : 1);
          sortCol = i;
          applyTable();
          writeHash();
        });
      });
    }
    var input = document.getElementById("filter");
    if (input) {
      input.value = filterText;
      input.addEventListener("input", function () { filterText = input.value.trim().toLowerCase(); applyTable(); writeHash(); });
    }
    applyTable();
  }

  var poll = document.body.getAttribute("data-poll");
  var version = null;
  function refresh() {
    fetch(poll, { credentials: "same-origin", headers: { "accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        var live = document.getElementById("live");
        if (live) live.textContent = "live · " + new Date().toLocaleTimeString();
        if (version !== null && d.version !== version) {
          var input = document.getElementById("filter");
          if (input && document.activeElement === input) return;  // not while someone types
          return fetch(location.href, { credentials: "same-origin" }).then(function (r) { return r.text(); }).then(function (html) {
            var doc = new DOMParser().parseFromString(html, "text/html");
            var fresh = doc.getElementById("main");
            if (fresh) { document.getElementById("main").innerHTML = fresh.innerHTML; bind(); }
            version = d.version;
          });
        }
        version = d.version;
      })
      .catch(function () {});
  }
  if (document.querySelector("table.sortable")) readHash();
  bind();
  if (poll) { refresh(); setInterval(refresh, 5000); }
})();
