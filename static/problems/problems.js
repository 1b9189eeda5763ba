// Problems dashboard: the little that htmx attributes do not cover. No inline scripts exist
// (the CSP forbids them); everything here is progressive — the pages work without it.
(function () {
  "use strict";

  // "Select every job on this page" and the count on the "Apply to selected" button.
  function syncSelection(root) {
    var form = document.getElementById("bulk-form");
    if (!form) return;
    var boxes = form.querySelectorAll('input[name="ids"]');
    var checked = form.querySelectorAll('input[name="ids"]:checked').length;
    var all = form.querySelector(".js-select-all");
    if (all) {
      all.hidden = boxes.length === 0;
      all.checked = boxes.length > 0 && checked === boxes.length;
      all.indeterminate = checked > 0 && checked < boxes.length;
    }
    var counter = form.querySelector(".js-selected-count");
    if (counter) counter.textContent = checked ? "(" + checked + ")" : "";
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.classList && target.classList.contains("js-select-all")) {
      var form = document.getElementById("bulk-form");
      form.querySelectorAll('input[name="ids"]').forEach(function (box) {
        box.checked = target.checked;
      });
    }
    if (target.name === "ids" || (target.classList && target.classList.contains("js-select-all"))) {
      syncSelection();
    }
  });

  // No click is lost to a refresh. A part that refreshes itself (".js-refresh": a table
  // page's results, a job's detail) is replaced by its refresh's reply, so nothing may wait
  // on it: actions (".js-action") wait only on themselves, and searches, filters and pager
  // links queue on the toolbar form, which is never replaced. What remains is order: a
  // refresh read before an action, a search or a page change was sent must not overwrite
  // that request's answer. So a refresh does not start while an action is in flight (the
  // action's reply announces "jobs-changed", which refreshes the table after it), and a
  // refresh reply is dropped when another request was sent since it left, or when its part
  // has been replaced meanwhile; a fresh refresh follows.
  var sent = 0; // requests other than refreshes, so far

  function actionPending() {
    return document.querySelector(".js-action.htmx-request") !== null;
  }

  function isRefresh(elt) {
    return !!(elt && elt.classList && elt.classList.contains("js-refresh"));
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    if (isRefresh(elt)) {
      if (actionPending()) {
        event.preventDefault();
        return;
      }
      elt.jsSentAfter = sent;
    } else {
      sent += 1;
    }
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    var config = event.detail.requestConfig; // event.detail.elt is the target here
    var elt = config && config.elt;
    if (!isRefresh(elt)) return;
    if (elt.jsSentAfter === sent && document.body.contains(elt)) return;
    event.detail.shouldSwap = false; // stale: read before the latest request was sent
    window.setTimeout(function () {
      if (!actionPending()) htmx.trigger(document.body, "jobs-changed");
    }, 0);
  });

  document.addEventListener("DOMContentLoaded", function () { syncSelection(); });
  document.addEventListener("htmx:afterSettle", function () { syncSelection(); });
})();
