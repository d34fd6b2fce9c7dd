// Drives the memory page as a user would, with real DOM events, and writes what it saw into
// <body data-probe> as JSON: hover over the stack at the peak, zoom with the wheel there, zoom
// out with the button, click on the peak, hover over a listed block and over a block of the
// allocator's drawing, pan by dragging.
(function () {
  var r = {}, P = window.syncmemPage, tip = document.getElementById("tip");
  var cv = document.querySelector("canvas.chart[data-pool=\"0\"]");
  var panel = document.querySelector("div.state[data-pool=\"0\"]");
  function fire(el, type, x, y, extra) {
    var o = { clientX: x, clientY: y, bubbles: true, cancelable: true, buttons: 0 };
    Object.keys(extra || {}).forEach(function (k) { o[k] = extra[k]; });
    el.dispatchEvent(type === "wheel" ? new WheelEvent(type, o) : new MouseEvent(type, o));
  }
  function tipText() { return tip.style.display === "block" ? tip.textContent : ""; }
  function centre(el) { var b = el.getBoundingClientRect(); return [b.left + b.width / 2, b.top + b.height / 2]; }
  var pk = P.peak(0);
  r.peak = pk;
  r.view0 = P.view();
  var x = P.clientX(0, pk.x), y = P.clientY(0, pk.bytes * 0.5);
  fire(cv, "mousemove", x, y);
  r.hoverChart = tipText();
  fire(cv, "wheel", x, y, { deltaY: -100 });
  r.viewWheel = P.view();
  document.getElementById("zoom-out").click();
  r.viewOut = P.view();
  P.setView(r.view0[0], r.view0[1]);
  x = P.clientX(0, pk.x);
  panel.dataset.ids = "";
  fire(cv, "mousedown", x, y, { buttons: 1 });
  fire(cv, "mouseup", x, y);
  r.clicked = Number(panel.dataset.event);
  r.ids = panel.dataset.ids.split(",").filter(function (s) { return s !== ""; }).map(Number);
  r.rows = panel.querySelectorAll("tr.block").length;
  var row = panel.querySelector("tr.block"), c = centre(row);
  r.firstOwner = row.querySelector("td.owner").textContent;
  fire(row, "mousemove", c[0], c[1]);
  r.hoverRow = tipText();
  var blk = panel.querySelector("rect.blk");
  if (blk) { c = centre(blk); fire(blk, "mousemove", c[0], c[1]); r.hoverBlock = tipText(); }
  r.segments = panel.querySelectorAll("rect.seg").length;
  fire(cv, "mousedown", x, y, { buttons: 1 });
  fire(cv, "mousemove", x + 200, y, { buttons: 1 });
  fire(cv, "mouseup", x + 200, y);
  r.viewPan = P.view();
  r.errors = Number(document.body.dataset.errors);
  document.body.dataset.probe = JSON.stringify(r);
})();
