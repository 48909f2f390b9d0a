// idemq console: sorting and filtering of tables, live counts on the
// overview, live progress of a replay or purge. The pages work without it.
"use strict";
(function () {
  function cellValue(td) {
    var v = td.getAttribute("data-sort");
    if (v === null) v = td.textContent.trim();
    var n = Number(v.replace(/\+$/, ""));
    return v !== "" && !isNaN(n) ? n : v.toLowerCase();
  }
  function sortable(table) {
    var ths = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(ths, function (th, i) {
      if (th.classList.contains("nosort")) return;
      th.tabIndex = 0;
      function sort() {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(ths, function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[i]), y = cellValue(b.cells[i]);
          var c = x < y ? -1 : x > y ? 1 : 0;
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  }
  function filter(input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    if (!table) return;
    input.addEventListener("input", function () {
      var q = input.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        r.hidden = q !== "" && r.textContent.toLowerCase().indexOf(q) < 0;
      });
    });
  }
  function getJSON(url, done) {
    var x = new XMLHttpRequest();
    x.open("GET", url);
    x.onload = function () { if (x.status === 200) done(JSON.parse(x.responseText)); };
    x.send();
  }
  var prefix = document.body.getAttribute("data-prefix") || "";

  function liveOverview() {
    setInterval(function () {
      getJSON(prefix + "/overview.json", function (d) {
        (d.Queues || []).forEach(function (q) {
          var row = document.querySelector('tr.queue[data-queue="' + CSS.escape(q.name) + '"]');
          if (!row) return;
          row.querySelector(".count").textContent = q.display;
          row.querySelector(".count").setAttribute("data-sort", q.count);
          row.querySelector(".groups").textContent = q.groups;
        });
        var p = document.getElementById("summary-outbox-pending");
        if (p && d.Outbox) p.textContent = d.Outbox.Pending;
        (d.WorkerStatus || []).forEach(function (w) {
          var li = document.querySelector('li.worker[data-worker="' + CSS.escape(w.name) + '"]');
          if (!li) return;
          li.setAttribute("data-state", w.state);
          li.querySelector(".state").textContent = w.state;
          li.querySelector(".dot").className = "dot state-" + w.state.replace(/ /g, "-");
        });
      });
    }, 10000);
  }
  function liveJob(el) {
    if (el.getAttribute("data-running") !== "true") return;
    // Without a script the page refreshes itself (a meta refresh inside
    // <noscript>); with one, this polls the progress instead.
    var t = setInterval(function () {
      getJSON(prefix + "/jobs/" + el.getAttribute("data-job") + "/progress.json", function (j) {
        document.getElementById("job-done").textContent = j.done;
        document.getElementById("job-progress").value = j.done;
        if (j.running) return;
        clearInterval(t);
        var st = document.getElementById("job-state");
        st.textContent = j.error ? "stopped" : "done";
        st.className = j.error ? "bad" : "good";
        if (j.error) {
          var e = document.getElementById("job-error");
          e.textContent = j.error + " — nothing is lost: what was not done is still in the queue.";
          e.classList.remove("hidden");
        }
      });
    }, 1000);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(sortable);
    document.querySelectorAll("input.table-filter").forEach(filter);
    var all = document.getElementById("select-all");
    if (all) all.addEventListener("change", function () {
      document.querySelectorAll("#letters tbody tr:not([hidden]) input.select").forEach(function (c) { c.checked = all.checked; });
    });
    if (document.getElementById("queues")) liveOverview();
    var job = document.getElementById("job");
    if (job) liveJob(job);
  });
})();
