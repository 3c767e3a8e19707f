/* The demo's burst button: 10 fetches in parallel, then a row per response. */
(function () {
  "use strict";
  var COUNT = 10;
  var form = document.getElementById("burst-form");
  var button = document.getElementById("burst");
  var table = document.getElementById("burst-results");
  var summary = document.getElementById("burst-summary");

  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = text;
    if (className) { td.className = className; }
    row.appendChild(td);
    return td;
  }

  function fire(url, n, started) {
    return fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        return response.text().then(function (body) {
          return {n: n, status: response.status, retryAfter: response.headers.get("Retry-After"),
                  body: body, ms: Math.round(performance.now() - started)};
        });
      })
      .catch(function (error) {
        return {n: n, status: 0, retryAfter: null, body: String(error), ms: Math.round(performance.now() - started)};
      });
  }

  function describe(result) {
    try {
      var data = JSON.parse(result.body);
      if (data.error) { return data.error + " (" + data.semaphore + ")"; }
      if (data.token !== undefined) { return "token " + data.token; }
    } catch (e) { /* not JSON: a download */ }
    return result.body.split("\n").filter(Boolean).length + " lines streamed";
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var url = document.getElementById("burst-target").value;
    var tbody = table.querySelector("tbody");
    tbody.textContent = "";
    table.hidden = false;
    button.disabled = true;
    summary.textContent = "Waiting for 10 responses…";
    var rows = [];
    for (var i = 1; i <= COUNT; i++) {
      var row = document.createElement("tr");
      row.className = "pending";
      cell(row, String(i), "num");
      cell(row, "…", "status");
      cell(row, "", "num");
      cell(row, "", "num");
      cell(row, "");
      tbody.appendChild(row);
      rows.push(row);
    }
    var started = performance.now();
    var calls = [];
    for (var j = 1; j <= COUNT; j++) {
      var target = new URL(url, window.location.href);
      target.searchParams.set("burst", String(j));
      calls.push(fire(target.toString(), j, started).then(function (result) {
        var row = rows[result.n - 1];
        var cells = row.children;
        row.className = "status-" + result.status;
        row.setAttribute("data-status", String(result.status));
        cells[1].textContent = result.status === 0 ? "network error" : String(result.status);
        cells[2].textContent = result.ms + " ms";
        cells[3].textContent = result.retryAfter ? result.retryAfter + " s" : "";
        cells[4].textContent = describe(result);
        return result;
      }));
    }
    Promise.all(calls).then(function (results) {
      var counts = {};
      var retry = [];
      results.forEach(function (r) {
        counts[r.status] = (counts[r.status] || 0) + 1;
        if (r.retryAfter) { retry.push(Number(r.retryAfter)); }
      });
      var parts = Object.keys(counts).sort().map(function (status) {
        return counts[status] + " × " + status;
      });
      var text = "Done: " + parts.join(", ") + ".";
      if (retry.length) {
        var low = Math.min.apply(null, retry);
        var high = Math.max.apply(null, retry);
        text += " The refused were told Retry-After: " + (low === high ? low : low + "–" + high) + " s.";
      }
      summary.textContent = text;
      summary.setAttribute("data-done", "1");
      button.disabled = false;
    });
  });
})();
