"use strict";
(function () {
  var errors = document.getElementById("errors");
  function fail(msg) {
    document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
    errors.textContent += msg + "\n";
  }
  window.addEventListener("error", function (e) { fail("error: " + e.message); });
  var consoleError = console.error;
  console.error = function () {
    fail("console.error: " + Array.prototype.join.call(arguments, " "));
    consoleError.apply(console, arguments);
  };
  try {
    var start = performance.now();
    var geo = JSON.parse(document.getElementById("geometry").textContent);
    var tip = document.getElementById("tip");
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    function bytes(b) {
      var u = 0;
      while (b >= 1024 && u < units.length - 1) { b /= 1024; u++; }
      return (u === 0 ? b.toFixed(0) : b.toPrecision(3)) + " " + units[u];
    }
    function when(x) {
      if (!geo.timed) return "event " + x;
      if (x < 1e3) return x.toFixed(0) + " µs";
      if (x < 1e6) return (x / 1e3).toPrecision(3) + " ms";
      return (x / 1e6).toPrecision(3) + " s";
    }
    function show(text, ev) {
      tip.textContent = text;
      tip.style.display = "block";
      var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
      tip.style.left = Math.max(4, x) + "px";
      tip.style.top = (ev.clientY + 16) + "px";
    }
    function hide() { tip.style.display = "none"; }
    document.querySelectorAll("[data-tip]").forEach(function (el) {
      el.addEventListener("mousemove", function (ev) { show(el.dataset.tip, ev); });
      el.addEventListener("mouseleave", hide);
    });
    // The read-out of a chart: the span under the pointer.
    document.querySelectorAll("rect.hover").forEach(function (el) {
      var series = JSON.parse(document.getElementById("series-" + el.dataset.chart).textContent);
      var svg = el.ownerSVGElement;
      el.addEventListener("mousemove", function (ev) {
        var box = svg.getBoundingClientRect();
        var px = (ev.clientX - box.left) * geo.total / box.width;
        var x = (px - geo.left) / geo.width * geo.end;
        var lo = 0, hi = series.length - 1, k = -1;
        while (lo <= hi) {
          var mid = (lo + hi) >> 1;
          if (series[mid][0] <= x) { k = mid; lo = mid + 1; } else { hi = mid - 1; }
        }
        if (k < 0) { show(when(Math.max(0, Math.round(x))) + ": nothing allocated yet", ev); return; }
        var s = series[k];
        var text = when(Math.round(x)) + ": allocated " + bytes(s[2]);
        if (s[1] !== s[2]) text += " at most (" + bytes(s[1]) + " at least) in this span";
        text += ", reserved " + bytes(s[3]);
        show(text, ev);
      });
      el.addEventListener("mouseleave", hide);
    });
    // A block's lifetime, shown on its pool's chart while its row is hovered.
    document.querySelectorAll("tr.block").forEach(function (row) {
      var life = document.querySelector("#chart-" + row.dataset.chart + " rect.life");
      row.addEventListener("mouseenter", function () {
        var x0 = geo.left + Number(row.dataset.alloc) / geo.end * geo.width;
        var x1 = geo.left + Number(row.dataset.free) / geo.end * geo.width;
        life.setAttribute("x", x0.toFixed(1));
        life.setAttribute("width", Math.max(1, x1 - x0).toFixed(1));
      });
      row.addEventListener("mouseleave", function () { life.setAttribute("width", "0"); });
    });
    document.body.dataset.renderMs = (performance.now() - start).toFixed(1);
    // Since the page was asked for: the whole document parsed, and this script run.
    document.body.dataset.loadedMs = performance.now().toFixed(1);
  } catch (e) {
    fail("error: " + e);
  }
  document.body.dataset.ready = "1";
})();
