/* django-semaphore admin: refresh the figures every few seconds without reloading the page.
 * Each [data-sema-refresh] element is replaced by the "html" of the JSON its URL returns,
 * except while one of its buttons is hovered or focused: rows move when holders come and
 * go, and a refresh then would put another holder's Force release button under the pointer. */
(function () {
  "use strict";
  function start(box) {
    var url = box.getAttribute("data-sema-refresh");
    var every = parseInt(box.getAttribute("data-sema-interval"), 10) || 3000;
    var busy = false;
    function aimedAt() {
      return box.querySelector("button:hover, button:focus, input:hover, input:focus") !== null;
    }
    function tick() {
      if (busy || document.hidden || aimedAt()) { return; }
      busy = true;
      fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin", cache: "no-store"})
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (data) {
          if (aimedAt()) { return; }  // aimed at since the request left: the next tick
          if (typeof data.html === "string") { box.innerHTML = data.html; }
          box.classList.remove("sema-stale");
          box.setAttribute("data-sema-updated", data.generated_at || "");
        })
        .catch(function () { box.classList.add("sema-stale"); })
        .then(function () { busy = false; });
    }
    window.setInterval(tick, every);
  }
  document.querySelectorAll("[data-sema-refresh]").forEach(start);
})();
