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

  document.addEventListener("DOMContentLoaded", function () { syncSelection(); });
  document.addEventListener("htmx:afterSettle", function () { syncSelection(); });
})();
