// tdbg report: provenance highlighting. Every line that belongs to FX nodes carries
// data-nodes="a b"; clicking one highlights, inside the same graph, every FX, IR, C++ and
// user-source line of those nodes and scrolls each pane to its first highlighted line.
(function () {
  "use strict";
  function nodesOf(el) {
    return (el.getAttribute("data-nodes") || "").split(" ").filter(function (s) { return s.length > 0; });
  }
  function highlight(scope, nodes) {
    scope.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
    scope.querySelectorAll("[data-nodes]").forEach(function (el) {
      if (nodesOf(el).some(function (n) { return nodes.indexOf(n) >= 0; })) { el.classList.add("hl"); }
    });
    scope.querySelectorAll(".pane").forEach(function (pane) {
      var first = pane.querySelector(".hl");
      if (first) { pane.scrollTop = Math.max(0, first.offsetTop - 40); }
    });
    var label = scope.querySelector(".selected-node");
    if (label) { label.textContent = nodes.join(", "); }
  }
  document.addEventListener("click", function (event) {
    var target = event.target;
    var el = target && target.closest ? target.closest("[data-nodes]") : null;
    if (!el) { return; }
    var scope = el.closest(".graph-code");
    if (scope) { highlight(scope, nodesOf(el)); }
  });
  // the culprit's lines are marked by the page; bring them into view in every pane
  document.querySelectorAll(".graph-code").forEach(function (scope) {
    scope.querySelectorAll(".pane").forEach(function (pane) {
      var first = pane.querySelector(".culprit");
      if (first) { pane.scrollTop = Math.max(0, first.offsetTop - 40); }
    });
  });
}());
